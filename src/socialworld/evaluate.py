"""Evaluation: run a policy over scenarios and seeds, score, aggregate, write records."""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .config import at_least
from .lm.models import parse_model_spec
from .metrics import METRICS_CONTRACT, aggregate, group_by
from .policies import SCRIPTED, make_policy
from .judge import check_judge, judge_episodes, summarise, write_judged
from .records import TMP_MARK, EpisodeRecord, JudgeRec, atomic_write_text, dumps_canonical, write_jsonl, write_parquet
from .rng import derive_seed
from .runner import EpisodeJob, run_episodes
from .scale import RAY_HELP, check_ray, ray_init, rollouts
from .spec import resolve_scenarios


@dataclass
class EvalConfig:
    """Configuration of ``socialworld eval``; each field's help is the CLI's help."""

    policy: str = field(
        default="expert",
        metadata={"help": ("policy: random, expert, oracle, bundled, a model path or hub id, or openai:<model>@<base_url>; "
                           "a local model with a trained run's adapters as <model>+<run folder>")},
    )
    tiers: list[str] | None = field(default=None, metadata={"help": "tiers to evaluate (L0, L1, L2); default all"})
    scenarios: list[str] | None = field(
        default=None, metadata={"help": "scenario ids or YAML paths; default all shipped scenarios"}
    )
    episodes: int = field(default=3, metadata={"help": "episodes per scenario"})
    seed: int = field(default=0, metadata={"help": "run seed; episode seeds are derived from it"})
    batch_size: int = field(default=64, metadata={"help": "episodes advanced in lockstep per batch"})
    lm_batch_size: int = field(default=12, metadata={"help": "language models: prompts per forward pass (or concurrent API calls)"})
    decoding: str = field(
        default="auto",
        metadata={"help": ("language models: free (parse BELIEF/ACTION/SAY), constrained (greedy under the reply grammar: "
                           "parseable by construction; for an openai: endpoint the grammar goes as a regex in vLLM's "
                           "structured_outputs field), auto (constrained for local models, free for endpoints)")},
    )
    max_new_tokens: int = field(default=64, metadata={"help": "language models: tokens generated per free-form reply"})
    judge: str = field(default="", metadata={"help": (
        "an LM judge's model spec (off when empty): scores every episode 0-10 on goal and believability "
        "(SOTOPIA-style) from its public transcript, beside the rule metrics (source proxy, written to judge.jsonl)")})
    request_timeout: float = field(default=60.0, metadata={"help": (
        "openai: endpoints: the most seconds one request may take, from connecting to the reply's last byte")})
    out: Path | None = field(
        default=None,
        metadata={"help": "folder for episodes.jsonl, episodes.parquet, metrics.json [default: runs/eval-<policy>-s<seed>]"},
    )
    overwrite: bool = field(default=False, metadata={"help": "replace the records already in the output folder"})
    ray: str = field(default="", metadata={"help": RAY_HELP + "; scripted and openai: policies only, one episode per task"})
    max_endpoint_failures: float = field(default=0.2, metadata={"help": (
        "language models: when more than this share of steps got no reply (a transport or API failure), the "
        "evaluation ends with an error instead of scores (the records are kept)")})

    def __post_init__(self) -> None:
        check_ray(self.ray)
        kind = parse_model_spec(self.policy).kind  # a typo (or adapters that are not there) fails now
        check_judge(self.judge)
        if self.ray and kind not in ("scripted", "openai"):
            raise ValueError(f"--ray spreads scripted and openai: policies; {self.policy!r} is a local model (run it without --ray)")
        if self.decoding not in ("auto", "free", "constrained"):
            raise ValueError(f"decoding must be auto, free or constrained, got {self.decoding!r}")
        at_least(self, 1, "episodes", "batch_size", "lm_batch_size", "max_new_tokens")
        if not self.request_timeout > 0:
            raise ValueError(f"request_timeout must be > 0 seconds, got {self.request_timeout!r}")
        if not 0 <= self.max_endpoint_failures <= 1:
            raise ValueError(f"max_endpoint_failures must be a share in [0, 1], got {self.max_endpoint_failures}")

    def out_dir(self) -> Path:
        """``out``, or ``runs/eval-<policy>-s<seed>`` with every character of the policy spec that is
        not a letter, digit, ``.``, ``_`` or ``-`` written ``_`` (an ``openai:m@http://h:1/v1`` spec
        would otherwise nest folders, with colons no file system takes everywhere)."""
        if self.out is not None:
            return Path(self.out)
        return Path("runs") / f"eval-{re.sub(r'[^A-Za-z0-9._-]', '_', self.policy)}-s{self.seed}"

    def check_out(self) -> Path:
        """Before any work: the output folder is writable, and holds no records unless ``overwrite``."""
        out = self.out_dir()
        if (out / "episodes.jsonl").exists() and not self.overwrite:
            raise ValueError(f"{out} already holds an evaluation's records: use another --out, or --overwrite to replace them")
        try:
            out.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(dir=out, prefix=f".probe.{TMP_MARK}", suffix=".tmp")
            os.close(fd)
            os.unlink(probe)
        except OSError as err:
            raise ValueError(f"cannot write the records to {out}: {err.strerror or err}") from None
        return out


def help_for(cfg_type: type, name: str) -> str:
    return cfg_type.__dataclass_fields__[name].metadata["help"]


def episode_seeds(run_seed: int, scenario_id: str, n: int) -> list[int]:
    """Evaluation seeds of a scenario: derived from (run seed, 'eval', scenario, index)."""
    return [derive_seed(run_seed, "eval", scenario_id, i) for i in range(n)]


@dataclass(frozen=True)
class EvalResult:
    policy: str
    episodes: list[EpisodeRecord]
    judged: list[JudgeRec] = field(default_factory=list)
    """the LM judge's record of each episode (empty without ``--judge``)"""

    def summary(self) -> dict:
        """The ``eval --json`` document."""
        by_tier = {t: aggregate(eps).as_dict() for t, eps in sorted(group_by(self.episodes, "tier").items())}
        by_scenario = {}
        for sid, eps in group_by(self.episodes, "scenario_id").items():
            by_scenario[sid] = {**aggregate(eps).as_dict(), "tier": eps[0].tier}
        doc = {"policy": self.policy, "metrics_contract": METRICS_CONTRACT, "episodes": len(self.episodes),
               "by_tier": by_tier, "by_scenario": by_scenario}
        if self.judged:
            tier = {e.episode_id: e.tier for e in self.episodes}
            doc["judge"] = {"all": summarise(self.judged).as_dict(),
                            "by_tier": {t: summarise([r for r in self.judged if tier[r.episode_id] == t]).as_dict()
                                        for t in sorted(set(tier.values()))}}
        return doc


def evaluate(cfg: EvalConfig, on_episode: Callable[[EpisodeRecord], None] | None = None,
             on_steps: Callable[[int], None] | None = None) -> EvalResult:
    """Run, score and write ``cfg``'s episodes. ``on_episode`` as each is scored; ``on_steps`` (one
    process only) as each lockstep step uses up turns (:func:`~socialworld.runner.run_episodes`)."""
    specs = resolve_scenarios(cfg.scenarios, cfg.tiers)
    if not specs:
        raise ValueError("no scenario matches the chosen scenarios and tiers")
    jobs = [EpisodeJob(s, seed) for s in specs for seed in episode_seeds(cfg.seed, s.id, cfg.episodes)]
    lm = {} if cfg.policy in SCRIPTED else {"batch_size": cfg.lm_batch_size, "decoding": cfg.decoding,
                                            "max_new_tokens": cfg.max_new_tokens, "timeout_s": cfg.request_timeout}
    policy = make_policy(cfg.policy, seed=cfg.seed, **lm)
    out = cfg.check_out()  # before any episode: nothing run is lost to an unwritable or occupied folder
    if cfg.ray:
        ray_init(cfg.ray)
    if cfg.ray:  # the same records, one episode per Ray task
        eps = rollouts(cfg.policy, jobs, ray=cfg.ray, seed=cfg.seed, run_seed=cfg.seed, tick=on_episode, **lm)
    else:
        eps = run_episodes(policy, jobs, batch_size=cfg.batch_size, on_episode=on_episode, run_seed=cfg.seed, on_steps=on_steps)
    write_jsonl(out / "episodes.jsonl", eps)
    write_parquet(out / "episodes.parquet", eps)
    failed = aggregate(eps).endpoint_failure_rate
    if failed > cfg.max_endpoint_failures:  # scores of a dead endpoint would only measure the endpoint
        (out / "metrics.json").unlink(missing_ok=True)
        raise EndpointFailure(f"the endpoint of {cfg.policy} gave no reply on {failed:.0%} of the steps (more than "
                              f"--max-endpoint-failures {cfg.max_endpoint_failures:g}; the first error: {first_endpoint_error(eps)}): "
                              f"no scores; the records are in {out}")
    judged = judge_episodes(cfg.judge, eps, {s.id: s for s in specs}, batch_size=cfg.lm_batch_size,
                            timeout_s=cfg.request_timeout) if cfg.judge else []
    if judged:
        write_judged(out / "judge.jsonl", judged)
    else:  # an earlier evaluation's judgement (--overwrite) is not this one's
        (out / "judge.jsonl").unlink(missing_ok=True)
    result = EvalResult(cfg.policy, eps, judged)
    atomic_write_text(out / "metrics.json", dumps_canonical(result.summary()) + "\n")
    return result


class EndpointFailure(ValueError):
    """An evaluation whose endpoint failed too often to score (:attr:`EvalConfig.max_endpoint_failures`)."""


def first_endpoint_error(eps: list[EpisodeRecord]) -> str:
    """The error of the first step whose endpoint gave no reply ("" if none)."""
    return next((s.action.error or "" for e in eps for s in e.steps if s.action.failure == "endpoint"), "")
