"""The optional LM judge (contract §3.5): SOTOPIA-style scores of whole episodes, beside the rules.

A judge model (any model spec: ``bundled``, a local folder, ``openai:<model>@<url>``) reads what
happened in public — the scenario's setting and goal, the people and decisions, and the
conversation (the organiser's moves and words, everyone's replies) — and scores the organiser from 0 to 10 on
``goal`` and ``believability`` (SOTOPIA's goal completion and believability, Lifelong-SOTOPIA's
GOAL and BEL). The prompt is ``templates.JUDGE_*`` (``judge-v1``).

Each score is a :class:`~socialworld.records.Signal` with source ``proxy`` and detail
``llm_judge:<model>``: an inferred judgement, the kind of evidence strict gating keeps out of the
action track. The judge never replaces or changes a rule metric. A local judge decodes under the
reply grammar (two integers), so it always answers; an endpoint's reply is parsed strictly, and
a missing or unusable reply is recorded as a failure of that episode's judgement, counted apart,
never scored 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import Any, Sequence

from socialworld.records import EpisodeRecord, JudgeRec, Signal, atomic_write_text, record_from_json, record_json
from socialworld.rollout.config import check_judge
from socialworld.text.templates import JUDGE_DIMENSIONS, JUDGE_PROMPT_VERSION, JUDGE_REPLY, JUDGE_SYSTEM, JUDGE_TURN, JUDGE_USER
from socialworld.world.spec import ScenarioSpec

SCALE = range(0, 11)
"""the score scale: integers 0..10, as SOTOPIA's"""
_LINE = {dim: re.compile(rf"^[ \t]*{label}[ \t]*:[ \t]*(\d{{1,2}})[ \t]*$", re.MULTILINE) for dim, label in JUDGE_DIMENSIONS.items()}


def judge_messages(spec: ScenarioSpec, ep: EpisodeRecord) -> list[dict[str, str]]:
    """The judge's chat messages for ``ep``: public facts only (no hidden preference or mood)."""
    lines = []
    for s in ep.steps:
        lines.append(JUDGE_TURN.format(step=s.setting.step + 1, action=s.action.executed,
                                       words=" ".join(s.dialogue.utterance.split()) or "(says nothing)"))
        lines += [JUDGE_REPLY.format(step=s.setting.step + 1, speaker=r.speaker, text=" ".join(r.text.split()))
                  for r in s.dialogue.replies]
    decisions = "; ".join(f"{sl.label} ({', '.join(o.label for o in sl.options)})" for sl in spec.slots)
    user = JUDGE_USER.format(setting=spec.setting, goal=spec.goal, people=", ".join(n.name for n in spec.npcs),
                             decisions=decisions, transcript="\n".join(lines) or "(nothing happened)")
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]


def judge_program() -> list[Any]:
    """The reply grammar a local judge decodes under: each dimension's line with one score."""
    from socialworld.agents.lm.constrained import Choice, Forced

    segs: list[Any] = []
    for i, (dim, label) in enumerate(JUDGE_DIMENSIONS.items()):
        segs += [Forced(("\n" if i else "") + f"{label}:"), Choice(dim, tuple(f" {v}" for v in SCALE))]
    return segs


def parse_scores(text: str) -> dict[str, int] | None:
    """Every dimension's score from a judge's reply (its first line for each), or None when one is
    missing or off the 0..10 scale."""
    out = {}
    for dim, pattern in _LINE.items():
        m = pattern.search(text)
        if m is None or int(m.group(1)) not in SCALE:
            return None
        out[dim] = int(m.group(1))
    return out


def write_judged(path: str | Path, recs: Sequence[JudgeRec]) -> None:
    """``judge.jsonl``: one record per line (atomic)."""
    atomic_write_text(path, "".join(record_json(r) + "\n" for r in recs))


def read_judged(path: str | Path) -> dict[str, JudgeRec]:
    """A ``judge.jsonl`` file's records by episode id."""
    recs = [record_from_json(JudgeRec, ln) for ln in Path(path).read_text(encoding="utf-8").split("\n") if ln.strip()]
    return {r.episode_id: r for r in recs}


def judge_episodes(judge: str, episodes: Sequence[EpisodeRecord], specs: dict[str, ScenarioSpec],
                   batch_size: int = 8, timeout_s: float = 60.0) -> list[JudgeRec]:
    """One :class:`~socialworld.records.JudgeRec` per episode from the ``judge`` model."""
    from socialworld.agents.registry import make_backend

    check_judge(judge)
    backend = make_backend(judge, max_new_tokens=24, batch_size=batch_size, timeout_s=timeout_s)
    convs = [judge_messages(specs[ep.scenario_id], ep) for ep in episodes]
    comps = backend.constrained(convs, [judge_program()] * len(convs)) if backend.local else backend.complete(convs)
    detail = f"llm_judge:{judge}"
    out = []
    for ep, c in zip(episodes, comps):
        if c.error is not None:
            out.append(JudgeRec(episode_id=ep.episode_id, judge=judge, prompt_version=JUDGE_PROMPT_VERSION, scores={},
                                raw="", failure="endpoint", error=c.error))
            continue
        scores = parse_scores(c.text)
        if scores is None:
            out.append(JudgeRec(episode_id=ep.episode_id, judge=judge, prompt_version=JUDGE_PROMPT_VERSION, scores={},
                                raw=c.text, failure="unparseable",
                                error=f"no {' and '.join(JUDGE_DIMENSIONS.values())} lines with scores 0-10"))
            continue
        out.append(JudgeRec(episode_id=ep.episode_id, judge=judge, prompt_version=JUDGE_PROMPT_VERSION, raw=c.text,
                            scores={d: Signal(value=float(v), source="proxy", confidence=1.0, detail=detail)
                                    for d, v in scores.items()}))
    return out


def checked_judgement(judge: str, recs: list[JudgeRec], max_endpoint_failures: float) -> list[JudgeRec]:
    """``recs``, unless the judge's endpoint gave no reply on more than ``max_endpoint_failures`` of
    them: then an :class:`~socialworld.agents.lm.backends.EndpointFailure` with its first error (a run keeps
    no judgement that only measured a dead endpoint, and retries it when rerun)."""
    from socialworld.agents.lm.backends import EndpointFailure

    failed = [r for r in recs if r.failure == "endpoint"]
    if recs and len(failed) / len(recs) > max_endpoint_failures:
        raise EndpointFailure(f"the judge {judge} gave no reply on {len(failed)} of {len(recs)} episodes (more than "
                              f"max_endpoint_failures {max_endpoint_failures:g}; the first error: {failed[0].error})")
    return recs


@dataclass(frozen=True)
class JudgeSummary:
    """A judge's scores over a set of episodes: per dimension the mean over the judged episodes
    (None when none was), with how many were judged and how many judgements failed, by kind."""

    judge: str
    prompt_version: str
    episodes: int
    judged: int
    endpoint_failures: int
    unparseable: int
    means: dict[str, float | None]

    def as_dict(self) -> dict[str, Any]:
        return {"judge": self.judge, "prompt_version": self.prompt_version, "source": "proxy", "episodes": self.episodes,
                "judged": self.judged, "endpoint_failures": self.endpoint_failures, "unparseable": self.unparseable,
                "means": self.means}


def summarise(recs: Sequence[JudgeRec]) -> JudgeSummary:
    ok = [r for r in recs if r.failure is None]
    return JudgeSummary(
        judge=recs[0].judge if recs else "", prompt_version=JUDGE_PROMPT_VERSION, episodes=len(recs), judged=len(ok),
        endpoint_failures=sum(r.failure == "endpoint" for r in recs), unparseable=sum(r.failure == "unparseable" for r in recs),
        means={d: (fmean(r.scores[d].value for r in ok) if ok else None) for d in JUDGE_DIMENSIONS},  # type: ignore[misc]
    )


def episode_return(ep: EpisodeRecord) -> float:
    """The world's own score of a whole episode: the sum of its step rewards (an unscored step counts 0)."""
    return sum(s.signals.reward.value or 0.0 for s in ep.steps)


@dataclass(frozen=True)
class RankAgreement:
    """How often a judge orders two episodes of the same scenario and seed as the world does (by
    :func:`episode_return`). Over the pairs the world orders strictly,

        agreement = agree / (agree + disagree + judge_ties)

    (a judge that scores both alike has not ranked them: a tie counts against it); pairs the world
    scores alike are counted apart (``world_ties``) and never compared. 0.5 is a coin's agreement."""

    agree: int = 0
    disagree: int = 0
    judge_ties: int = 0
    world_ties: int = 0

    @property
    def compared(self) -> int:
        return self.agree + self.disagree + self.judge_ties

    @property
    def agreement(self) -> float | None:
        """None when no pair was compared."""
        return self.agree / self.compared if self.compared else None

    def __add__(self, other: RankAgreement) -> RankAgreement:
        return RankAgreement(self.agree + other.agree, self.disagree + other.disagree, self.judge_ties + other.judge_ties,
                             self.world_ties + other.world_ties)

    def as_dict(self) -> dict[str, Any]:
        return {"agree": self.agree, "disagree": self.disagree, "judge_ties": self.judge_ties, "world_ties": self.world_ties,
                "compared": self.compared, "agreement": self.agreement}


def rank_agreement(pairs: Sequence[tuple[float, float, float, float]]) -> RankAgreement:
    """:class:`RankAgreement` of ``(judge_a, judge_b, world_a, world_b)`` score pairs."""
    out = RankAgreement()
    for ja, jb, wa, wb in pairs:
        world, judge = (wa > wb) - (wa < wb), (ja > jb) - (ja < jb)
        out += RankAgreement(world_ties=1) if world == 0 else RankAgreement(judge_ties=1) if judge == 0 else \
            RankAgreement(agree=1) if judge == world else RankAgreement(disagree=1)
    return out


def judge_agreement(episodes: Sequence[EpisodeRecord], judged: dict[str, JudgeRec], dimension: str = "goal") -> RankAgreement:
    """:func:`rank_agreement` of the judge's ``dimension`` score against :func:`episode_return` over
    every two of ``episodes`` that share a scenario and seed (different policies on the same task),
    each judged without failure; episodes without a usable judgement are left out."""
    by_task: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for e in episodes:
        rec = judged.get(e.episode_id)
        score = rec.scores[dimension].value if rec is not None and rec.failure is None else None
        if score is not None:
            by_task.setdefault((e.scenario_id, e.seed), []).append((score, episode_return(e)))
    pairs = [(a[0], b[0], a[1], b[1]) for task in sorted(by_task) for i, a in enumerate(by_task[task]) for b in by_task[task][i + 1:]]
    return rank_agreement(pairs)
