"""Evaluation: run a policy over scenarios and seeds, score, aggregate, write records."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Final, Literal

from socialworld.agents.lm.backends import EndpointFailure
from socialworld.agents.models import SCRIPTED, check_loads
from socialworld.agents.registry import check_voice, make_policy, make_voice
from socialworld.metric_registry import KEYS
from socialworld.metrics.core import METRICS_CONTRACT, Aggregate, aggregate, group_by
from socialworld.metrics.stats import PerMetric, paired_difference
from socialworld.records import Document, EpisodeRecord, JudgeRec, atomic_write_text, write_jsonl, write_parquet
from socialworld.rollout.config import EvalConfig
from socialworld.rollout.judge import judge_episodes, summarise, write_judged
from socialworld.rollout.runner import EpisodeJob, run_episodes
from socialworld.rollout.scale import ray_init, rollouts
from socialworld.world.rng import derive_seed
from socialworld.world.spec import resolve_scenarios
from socialworld.world.voice import KEPT, VOICE_STATUSES


def episode_seeds(run_seed: int, scenario_id: str, n: int) -> list[int]:
    """Evaluation seeds of a scenario: derived from (run seed, 'eval', scenario, index)."""
    return [derive_seed(run_seed, "eval", scenario_id, i) for i in range(n)]


EVAL_SUMMARY_SCHEMA: Final = "eval-summary-v2"


class TierScores(Aggregate):
    """A scenario's aggregate, with its tier."""

    tier: str


class JudgeSummaries(Document):
    """The LM judge's means (source ``proxy``), over all episodes and by tier."""

    all: dict[str, Any]
    by_tier: dict[str, dict[str, Any]]


class VoiceCounts(Document):
    """What became of the NPC lines of voiced episodes (:mod:`socialworld.world.voice`): each status's
    count; ``heard`` is the share of lines the agent heard in the voice's words."""

    model: str
    lines: int
    by_status: dict[str, int]
    heard: float


def voice_counts(episodes: list[EpisodeRecord]) -> VoiceCounts | None:
    """The :class:`VoiceCounts` of ``episodes`` (None when none was voiced)."""
    voiced = [e for e in episodes if e.lineage.voice is not None]
    if not voiced:
        return None
    statuses = [r.voice.status for e in voiced for s in e.steps for r in s.dialogue.replies if r.voice is not None]
    by: dict[str, int] = {k: statuses.count(k) for k in VOICE_STATUSES}
    models = sorted({e.lineage.voice.model for e in voiced if e.lineage.voice is not None})
    return VoiceCounts(model=", ".join(models), lines=len(statuses), by_status=by,
                       heard=sum(by[k] for k in KEPT) / len(statuses) if statuses else 0.0)


class VoiceEffect(Document):
    """``eval --npc-voice M --paired``: voiced − template on the same seeds, for every registered metric,
    paired bootstrap intervals (:func:`~socialworld.metrics.stats.paired_difference`, matched on scenario and
    seed) over all episodes and by tier. The rules decide both sides alike; a difference is the policy
    reading other words for the same responses."""

    voice: str
    all: PerMetric
    by_tier: dict[str, PerMetric]


def voice_effect(template: list[EpisodeRecord], voiced: list[EpisodeRecord], seed: int = 0) -> VoiceEffect:
    """The :class:`VoiceEffect` of ``voiced`` against ``template`` (the same episodes, templated)."""
    models = sorted({e.lineage.voice.model for e in voiced if e.lineage.voice is not None})
    if not models:
        raise ValueError("voice_effect: none of the voiced episodes names a voice")
    ta, va = group_by(template, "tier"), group_by(voiced, "tier")
    return VoiceEffect(voice=", ".join(models),
                       all={k: paired_difference(template, voiced, k, seed=seed) for k in KEYS},
                       by_tier={t: {k: paired_difference(ta.get(t, []), va[t], k, seed=seed) for k in KEYS} for t in sorted(va)})


class EvalSummary(Document):
    """``metrics.json`` (and ``eval --json``): a policy's scores by tier and by scenario.
    v1 (no ``schema_version``; before the metric registry) held each aggregate flat; it reads as v2
    (:func:`socialworld.metrics.core.migrate_flat_aggregate`)."""

    schema_version: Literal["eval-summary-v2"] = EVAL_SUMMARY_SCHEMA
    policy: str
    metrics_contract: str
    episodes: int
    by_tier: dict[str, Aggregate]
    by_scenario: dict[str, TierScores]
    judge: JudgeSummaries | None = None
    voice: VoiceCounts | None = None
    """what became of the NPC lines of voiced episodes (None under the templates)"""
    voice_effect: VoiceEffect | None = None
    """``--paired``: voiced − template on the same seeds"""


@dataclass(frozen=True)
class EvalResult:
    policy: str
    episodes: list[EpisodeRecord]
    judged: list[JudgeRec] = field(default_factory=list)
    """the LM judge's record of each episode (empty without ``--judge``)"""
    template: list[EpisodeRecord] = field(default_factory=list)
    """``--paired``: the same episodes with the template lines (empty otherwise)"""
    seed: int = 0
    """the run seed (the paired bootstrap's)"""

    def summary(self) -> EvalSummary:
        """The ``metrics.json`` (and ``eval --json``) document."""
        by_tier = {t: aggregate(eps) for t, eps in sorted(group_by(self.episodes, "tier").items())}
        by_scenario = {sid: TierScores(**dict(aggregate(eps)), tier=eps[0].tier)
                       for sid, eps in group_by(self.episodes, "scenario_id").items()}
        judge = None
        if self.judged:
            tier = {e.episode_id: e.tier for e in self.episodes}
            judge = JudgeSummaries(all=summarise(self.judged).as_dict(),
                                   by_tier={t: summarise([r for r in self.judged if tier[r.episode_id] == t]).as_dict()
                                            for t in sorted(set(tier.values()))})
        return EvalSummary(policy=self.policy, metrics_contract=METRICS_CONTRACT, episodes=len(self.episodes),
                           by_tier=by_tier, by_scenario=by_scenario, judge=judge, voice=voice_counts(self.episodes),
                           voice_effect=voice_effect(self.template, self.episodes, self.seed) if self.template else None)


def evaluate(cfg: EvalConfig, on_episode: Callable[[EpisodeRecord], None] | None = None,
             on_steps: Callable[[int], None] | None = None) -> EvalResult:
    """Run, score and write ``cfg``'s episodes. ``on_episode`` as each is scored; ``on_steps`` (one
    process only) as each lockstep step uses up turns (:func:`~socialworld.rollout.runner.run_episodes`)."""
    specs = resolve_scenarios(cfg.scenarios, cfg.tiers)
    if not specs:
        raise ValueError("no scenario matches the chosen scenarios and tiers")
    jobs = [EpisodeJob(s, seed) for s in specs for seed in episode_seeds(cfg.seed, s.id, cfg.episodes)]
    lm = {} if cfg.policy in SCRIPTED else {"batch_size": cfg.lm_batch_size, "decoding": cfg.decoding,
                                            "max_new_tokens": cfg.max_new_tokens, "timeout_s": cfg.request_timeout}
    if lm:
        check_loads(cfg.policy, "--policy")  # a missing extra or an unknown model: one line, at once
    policy = make_policy(cfg.policy, seed=cfg.seed, **lm)
    if lm:  # auto, resolved once (an endpoint is asked once, not by every Ray task)
        lm["decoding"] = getattr(policy, "decoding", cfg.decoding)
    if cfg.judge:
        check_loads(cfg.judge, "--judge")  # the judge is built after the rollouts: its typo fails now
    check_voice(cfg.npc_voice, loads=True)
    out = cfg.check_out()  # before any episode: nothing run is lost to an unwritable or occupied folder
    if cfg.ray:
        ray_init(cfg.ray)
    if cfg.ray:  # the same records, one episode per Ray task
        eps = rollouts(cfg.policy, jobs, ray=cfg.ray, seed=cfg.seed, run_seed=cfg.seed, tick=on_episode, **lm)
    else:
        voice = make_voice(cfg.npc_voice, batch_size=cfg.lm_batch_size, timeout_s=cfg.request_timeout)
        eps = run_episodes(policy, jobs, batch_size=cfg.batch_size, on_episode=on_episode, run_seed=cfg.seed, on_steps=on_steps,
                           voice=voice)
    for stale in ("metrics.json", "judge.jsonl", "template/episodes.jsonl"):  # an earlier evaluation's (--overwrite)
        (out / stale).unlink(missing_ok=True)
    write_jsonl(out / "episodes.jsonl", eps)
    write_parquet(out / "episodes.parquet", eps)
    template: list[EpisodeRecord] = []
    if cfg.paired:  # the same seeds, the same policy, the rules' own lines
        template = run_episodes(policy, jobs, batch_size=cfg.batch_size, on_episode=on_episode, run_seed=cfg.seed, on_steps=on_steps)
        (out / "template").mkdir(exist_ok=True)
        write_jsonl(out / "template" / "episodes.jsonl", template)
    failed = aggregate(eps + template).endpoint_failure_rate
    if failed > cfg.max_endpoint_failures:  # scores of a dead endpoint would only measure the endpoint
        raise EndpointFailure(f"the endpoint of {cfg.policy} gave no reply on {failed:.0%} of the steps (more than "
                              f"--max-endpoint-failures {cfg.max_endpoint_failures:g}; the first error: {first_endpoint_error(eps)}): "
                              f"no scores; the records are in {out}")
    judged = judge_episodes(cfg.judge, eps, {s.id: s for s in specs}, batch_size=cfg.lm_batch_size,
                            timeout_s=cfg.request_timeout) if cfg.judge else []
    if judged:
        write_judged(out / "judge.jsonl", judged)
    result = EvalResult(cfg.policy, eps, judged, template, cfg.seed)
    atomic_write_text(out / "metrics.json", result.summary().to_json())
    return result


def first_endpoint_error(eps: list[EpisodeRecord]) -> str:
    """The error of the first step whose endpoint gave no reply ("" if none)."""
    return next((s.action.error or "" for e in eps for s in e.steps if s.action.failure == "endpoint"), "")
