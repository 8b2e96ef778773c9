"""Wake-sleep-deploy (DESIGN §7–§9), resumable in a run directory.

Per cycle ``c``::

    cycle-c/wake/episodes.jsonl         the current policy on *training* seeds
    cycle-c/wake/reference.jsonl        the continuation policy on the same seeds (dialogue pairs)
    cycle-c/sleep/pairs-action.parquet  gated step-level pairs
    cycle-c/sleep/pairs-dialogue.parquet
    cycle-c/sleep/gating.json           every exclusion counted by reason
    cycle-c/train/<track>/adapter/      PEFT LoRA adapter per track (resumed from cycle c-1)
    cycle-c/eval/episodes.jsonl         the deployed policy (base + both adapters) on eval seeds
    cycle-c/summary.json                with paired-bootstrap differences against cycle 0
    cycle-0/eval/episodes.jsonl         the untrained policy on the same eval seeds (the baseline)

Every artifact goes through :class:`~socialworld.rundir.RunDir`, so a killed loop resumes from
its last complete artifact.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from .evaluate import episode_seeds
from .metrics import aggregate
from .policies import make_policy
from .records import EpisodeRecord, atomic_write_text, read_jsonl, write_jsonl
from .rng import derive_seed
from .rundir import RunDir
from .runner import EpisodeJob, run_episodes
from .sleep import GatingReport, SleepConfig, action_pairs, dialogue_pairs, read_pairs, screen_and_gate, write_pairs
from .spec import resolve_scenarios
from .stats import paired_difference
from .train import TrainConfig, grpo_rows, train_adapter

TRACKS = ("action", "dialogue")
COMPARED = ("pass", "D", "CR", "U", "A_e", "S_npc")


@dataclass(frozen=True)
class LoopConfig:
    out: str = field(default="runs/loop", metadata={"help": "run folder (resumed if it exists with the same config)"})
    model: str = field(default="bundled", metadata={"help": "base model: bundled or a local folder"})
    cycles: int = field(default=1, metadata={"help": "wake-sleep-train-deploy cycles"})
    tiers: tuple[str, ...] = field(default=("L0",), metadata={"help": "tiers trained and evaluated"})
    train_episodes: int = field(default=4, metadata={"help": "wake episodes per scenario per cycle (training seeds)"})
    eval_episodes: int = field(default=3, metadata={"help": "evaluation episodes per scenario (fixed held-out seeds)"})
    seed: int = field(default=0, metadata={"help": "run seed"})
    lm_batch_size: int = field(default=12, metadata={"help": "prompts per forward pass"})
    baseline: bool = field(default=True, metadata={"help": "evaluate the untrained policy first (cycle 0) and compare each cycle with it"})
    reuse_from: str = field(default="", metadata={"help": "copy the untrained policy's artifacts (cycle-0 eval, cycle-1 wake) from this run "
                                                       "folder instead of re-running them: ablations on the same data"})
    sleep: SleepConfig = field(default_factory=SleepConfig)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(method="dpo", steps=20))


def train_seeds(run_seed: int, scenario_id: str, cycle: int, n: int) -> list[int]:
    """Training seeds of a scenario in a cycle; never equal to an evaluation seed."""
    seeds = [derive_seed(run_seed, "train", scenario_id, cycle, i) for i in range(n)]
    if set(seeds) & set(episode_seeds(run_seed, scenario_id, 1000)):
        raise RuntimeError("a training seed collides with an evaluation seed")
    return seeds


UNTRAINED = ("cycle-0/eval/episodes.jsonl", "cycle-1/wake/episodes.jsonl", "cycle-1/wake/reference.jsonl")
"""Artifacts made by the untrained policy alone: the same in every run of the same model, seeds and tiers."""
SAME_DATA_KEYS = ("model", "tiers", "train_episodes", "eval_episodes", "seed")


def _reuse(run: RunDir, cfg: LoopConfig) -> None:
    """Copy :data:`UNTRAINED` artifacts from ``cfg.reuse_from`` (checked complete there, and
    made under the same model, tiers, episode counts and seed)."""
    import yaml

    if not Path(cfg.reuse_from, "manifest.json").exists():
        raise ValueError(f"--reuse-from {cfg.reuse_from}: not a run folder (no manifest.json)")
    src = RunDir(cfg.reuse_from)

    theirs = yaml.safe_load(src.path("config.yaml").read_text()) if src.path("config.yaml").exists() else {}
    mine = json.loads(json.dumps(asdict(cfg)))
    diff = [k for k in SAME_DATA_KEYS if theirs.get(k) != mine[k]]
    if diff:
        raise ValueError(f"--reuse-from {cfg.reuse_from}: differs in {diff}, so its artifacts are not the same data")
    for rel in UNTRAINED:
        if not src.complete(rel):
            raise ValueError(f"--reuse-from {cfg.reuse_from}: {rel} is missing or incomplete there")
        run.produce(rel, f"copied:{src.root}@{src.sha(rel)[:12]}", lambda p, r=rel: shutil.copyfile(src.path(r), p))


def _policy(cfg: LoopConfig, adapters: dict[str, str] | None):
    return make_policy(cfg.model, batch_size=cfg.lm_batch_size, adapters=adapters)


Progress = Callable[[str, int], Callable[[EpisodeRecord], None]]
"""``progress(description, total)`` -> a per-episode callback (the CLI draws bars with it)."""


def run_loop(cfg: LoopConfig, log: Callable[[str], None] = print, progress: Progress | None = None) -> list[dict]:
    def rollout(policy, jobs: list[EpisodeJob], what: str) -> list[EpisodeRecord]:
        return run_episodes(policy, jobs, on_episode=progress(what, len(jobs)) if progress else None)

    run = RunDir(cfg.out)
    run.write_config(json.loads(json.dumps(asdict(cfg))))
    specs = {s.id: s for s in resolve_scenarios(None, list(cfg.tiers))}
    if cfg.reuse_from:
        _reuse(run, cfg)
    adapters: dict[str, str] | None = None
    summaries = []
    eval_jobs = [EpisodeJob(s, seed) for s in specs.values() for seed in episode_seeds(cfg.seed, s.id, cfg.eval_episodes)]
    if cfg.baseline:
        run.produce("cycle-0/eval/episodes.jsonl", "eval",
                    lambda p: write_jsonl(p, rollout(_policy(cfg, None), eval_jobs, "cycle 0 eval (untrained)")))
        m0 = aggregate(read_jsonl(run.path("cycle-0/eval/episodes.jsonl"))).as_dict()
        log(f"cycle 0 (untrained): eval pass {m0['pass_rate']:.2f} D {m0['D']:.2f} CR {m0['CR']:.2f}")
    for c in range(1, cfg.cycles + 1):
        d = f"cycle-{c}"
        prev = [rel for rel in (str(Path(p).relative_to(run.root)) for p in (adapters or {}).values())]
        jobs = [EpisodeJob(s, seed) for s in specs.values() for seed in train_seeds(cfg.seed, s.id, c, cfg.train_episodes)]
        if run.produce(f"{d}/wake/episodes.jsonl", "wake", lambda p: write_jsonl(p, rollout(_policy(cfg, adapters), jobs, f"cycle {c} wake")),
                       inputs=prev):
            log(f"cycle {c}: wake {len(jobs)} episodes")
        run.produce(f"{d}/wake/reference.jsonl", f"wake:{cfg.sleep.continuation}",
                    lambda p: write_jsonl(p, run_episodes(make_policy(cfg.sleep.continuation), jobs)))
        wake = read_jsonl(run.path(f"{d}/wake/episodes.jsonl"))
        ref = {(e.scenario_id, e.seed): e for e in read_jsonl(run.path(f"{d}/wake/reference.jsonl"))}

        def sleep_all(_p: Path) -> None:
            report = GatingReport()
            pairs = [p for e in wake for p in action_pairs(specs[e.scenario_id], e, cfg.sleep, report)]
            pairs += [p for e in wake for p in dialogue_pairs(specs[e.scenario_id], e, ref[(e.scenario_id, e.seed)], cfg.sleep, report)]
            kept = screen_and_gate(pairs, cfg.sleep, report)
            _p.mkdir()
            for t in TRACKS:
                write_pairs(_p / f"pairs-{t}.parquet", [p for p in kept if p.track == t])
            atomic_write_text(_p / "gating.json", json.dumps(report.as_dict(), indent=1, sort_keys=True) + "\n")

        run.produce(f"{d}/sleep", "sleep", sleep_all, inputs=[f"{d}/wake/episodes.jsonl", f"{d}/wake/reference.jsonl"])
        gating = json.loads(run.path(f"{d}/sleep/gating.json").read_text())
        log(f"cycle {c}: pairs kept {gating['kept']}, excluded {gating['excluded']}")
        losses: dict[str, list[float]] = {}
        trained: dict[str, str] = dict(adapters or {})
        for t in TRACKS:
            rel = f"{d}/train/{t}/adapter"
            pairs_path = run.path(f"{d}/sleep/pairs-{t}.parquet")
            if not read_pairs(pairs_path):  # nothing passed gating: the track keeps its adapter
                log(f"cycle {c}: no {t} pairs passed gating; the {t} adapter is not retrained")
                continue
            if cfg.train.method == "grpo" and t != "action":
                log(f"cycle {c}: grpo trains the action track only (its reward is the simulator's step return)")
                continue
            run.produce(rel, f"train:{cfg.train.method}",
                        lambda p, pp=pairs_path, r=trained.get(t): train_adapter(
                            _base_path(cfg), p, cfg.train, resume_from=r,
                            **({"grpo_rows": grpo_rows(read_pairs(pp)), "specs": specs} if cfg.train.method == "grpo"
                               else {"pairs": pp})),
                        inputs=[f"{d}/sleep"] + prev)
            losses[t] = json.loads(run.path(f"{rel}/socialworld-train.json").read_text())["losses"]
            trained[t] = str(run.path(rel))
        adapters = trained or None
        run.produce(f"{d}/eval/episodes.jsonl", "eval",
                    lambda p: write_jsonl(p, rollout(_policy(cfg, adapters), eval_jobs, f"cycle {c} eval")),
                    inputs=[str(Path(p).relative_to(run.root)) for p in (adapters or {}).values()])
        evaluated = read_jsonl(run.path(f"{d}/eval/episodes.jsonl"))
        m = aggregate(evaluated).as_dict()
        summary = {"cycle": c, "pairs": gating["kept"], "excluded": gating["excluded"],
                   "final_loss": {t: (v[-1] if v else None) for t, v in losses.items()}, "eval": m}
        if cfg.baseline:
            base = read_jsonl(run.path("cycle-0/eval/episodes.jsonl"))
            summary["vs_baseline"] = {k: paired_difference(base, evaluated, k, seed=cfg.seed).as_dict() for k in COMPARED}
        run.produce(f"{d}/summary.json", "summary",
                    lambda p: atomic_write_text(p, json.dumps(summary, indent=1, sort_keys=True) + "\n"),
                    inputs=[f"{d}/eval/episodes.jsonl"])
        log(f"cycle {c}: eval pass {m['pass_rate']:.2f} D {m['D']:.2f} CR {m['CR']:.2f}")
        for k, iv in summary.get("vs_baseline", {}).items():
            log(f"cycle {c}: {k} - untrained = {iv['mean']:+.3f}, 95% paired bootstrap [{iv['lo']:+.3f}, {iv['hi']:+.3f}]")
        summaries.append(summary)
    return summaries


def _base_path(cfg: LoopConfig) -> str:
    from .lm.models import bundled_path, parse_model_spec

    ms = parse_model_spec(cfg.model)
    return str(bundled_path()) if ms.kind == "bundled" else ms.name
