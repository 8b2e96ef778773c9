"""Finished benches of one config over several run seeds, pooled (contract §5.3, §8): a learning
claim is a mean over run seeds, never one run, so the numbers the bench's goals are stated in are
these — each arm's PassRate per tier over every run's last-cycle episodes, B's paired differences
pooled over the runs (:func:`~socialworld.metrics.stats.pooled_paired_difference`: pairs within a
run, one bootstrap over all of them), each run's forgetting, and the held-out scenarios pooled the
same way. Nothing is run: the benches' folders are read.
"""

from __future__ import annotations

from pathlib import Path
from statistics import fmean
from typing import Final, Literal, Sequence

from socialworld.bench.document import BenchDoc
from socialworld.bench.protocol import arm_episodes, holdout_episodes, phase_seconds
from socialworld.metric_registry import PASS
from socialworld.metrics.core import aggregate, group_by
from socialworld.metrics.lifelong import Lost, lost_episodes, pooled_forgetting_intervals
from socialworld.metrics.stats import Interval, metric_interval, pooled_paired_difference
from socialworld.records import Document, EpisodeRecord, read_document
from socialworld.rundir import RunDir

POOL_SCHEMA: Final = "pool-v1"
ALL: Final = "all"
"""the key of the numbers over every tier"""
PER_RUN: Final = ("seed", "out")
"""config fields that differ between the runs of one pool (everything else must be equal)"""


class PoolRun(Document):
    """One bench of the pool."""

    folder: str
    seed: int
    minutes: float
    """wall minutes of the bench's phases: the sum of its artifacts' wall times (``timings.json``), its loop's and its arms'"""
    passed: dict[str, dict[str, float]]
    """arm -> tier (and ``all``) -> PassRate of the last cycle"""
    forgetting: dict[str, float]
    """B's forgetting per tier (contract §5.3: F_l = max_{c<last} R[c][l] - R[last][l])"""
    lost: list[Lost] = []
    """B's earlier-tier episodes that passed in an earlier cycle and fail in the last, each with whether arm C
    passes it"""
    holdout: dict[str, float] = {}
    """arm -> PassRate on the held-out scenarios (empty without ``--holdout``)"""


class PoolDoc(Document):
    """``pool.json``: benches of one config over run seeds, pooled (:func:`pool_benches`)."""

    schema_version: Literal["pool-v1"] = POOL_SCHEMA
    metrics_contract: str
    config: dict
    """the benches' shared config (without :data:`PER_RUN`)"""
    runs: list[PoolRun]
    main: dict[str, dict[str, Interval]]
    """arm -> tier (and ``all``) -> PassRate interval over every run's last-cycle episodes"""
    paired: dict[str, dict[str, Interval]]
    """``B-A``, ``B-C`` -> tier (and ``all``) -> PassRate difference, paired within runs, pooled over them"""
    mean_forgetting: dict[str, float]
    """B's forgetting per tier, the mean over the runs"""
    forgetting: dict[str, Interval] = {}
    """B's mean forgetting per tier with a stratified bootstrap interval (each run's episodes resampled within
    the run: :func:`~socialworld.metrics.lifelong.pooled_forgetting_intervals`)"""
    holdout_scenarios: list[str] = []
    holdout: dict[str, Interval] = {}
    """arm -> PassRate interval on the held-out scenarios, pooled"""
    holdout_paired: dict[str, Interval] = {}
    """``B-A``, ``B-C`` -> PassRate difference on the held-out scenarios, paired within runs, pooled"""


def pool_benches(folders: Sequence[str | Path], resamples: int = 10_000, seed: int = 0) -> PoolDoc:
    """Read the finished benches in ``folders`` (each with ``bench.json``) and pool them. They must
    share their config but for :data:`PER_RUN` and their metrics contract, and be at least two with
    distinct seeds; else ``ValueError`` naming the folder and the field. Intervals: ``resamples``
    resamples, bootstrap seed ``seed``."""
    if len(folders) < 2:
        raise ValueError("pool needs at least two finished benches (run seeds) to pool")
    docs = [_bench_doc(f) for f in folders]
    first, shared = docs[0], _shared(docs[0])
    for f, d in zip(folders[1:], docs[1:]):
        if d.metrics_contract != first.metrics_contract:
            raise ValueError(f"{f}: scored under {d.metrics_contract}, {folders[0]} under {first.metrics_contract}")
        diff = sorted(k for k in shared.keys() | _shared(d).keys() if shared.get(k) != _shared(d).get(k))
        if diff:
            raise ValueError(f"{f}: its config differs from {folders[0]}'s in {', '.join(diff)}: only runs of one config pool")
    seeds = [d.run_config.seed for d in docs]
    if len(set(seeds)) < len(seeds):
        raise ValueError(f"the benches must be of distinct run seeds, not {seeds}")
    kw = {"resamples": resamples, "seed": seed}
    last, held, runs, b_cycles = [], [], [], []
    for f, d in zip(folders, docs):
        per_cycle = {int(c): t for c, t in d.tiers_per_cycle.items()}
        proxies = [a for a in d.main if a not in ("A", "B")]
        scenarios = d.holdout.scenarios if d.holdout else []
        cycles = arm_episodes(f, per_cycle, proxies, scenarios)
        eps = {arm: cyc[max(per_cycle)] for arm, cyc in cycles.items()}
        b_cycles.append(cycles["B"])
        aside = holdout_episodes(f, max(per_cycle), proxies, scenarios)
        last.append(eps)
        held.append(aside)
        runs.append(PoolRun(folder=str(f), seed=d.run_config.seed, minutes=round(sum(s for _, s in phase_seconds(f)) / 60, 1),
                            passed={arm: _pass_by_tier(e) for arm, e in eps.items()}, forgetting=d.forgetting.get("B", {}),
                            lost=lost_episodes(cycles["B"], eps.get("C", ())), holdout={arm: _pass(e) for arm, e in aside.items()}))
    arms = [a for a in last[0] if all(a in run for run in last)]
    tiers = [*sorted({t for run in last for t in group_by(run["B"], "tier")}), ALL]
    main = {arm: {t: metric_interval(_tier([r[arm] for r in last], t), PASS, **kw) for t in tiers} for arm in arms}
    paired = {f"B-{o}": {t: pooled_paired_difference([(_tier([r[o]], t), _tier([r["B"]], t)) for r in last], PASS, **kw)
                         for t in tiers} for o in ("A", "C") if o in arms}
    forgotten = sorted({t for r in runs for t in r.forgetting})
    aside_arms = [a for a in held[0] if all(a in h for h in held)]
    return PoolDoc(
        metrics_contract=first.metrics_contract, config=shared, runs=runs, main=main, paired=paired,
        mean_forgetting={t: fmean(r.forgetting.get(t, 0.0) for r in runs) for t in forgotten},
        forgetting=pooled_forgetting_intervals(b_cycles, **kw),
        holdout_scenarios=first.holdout.scenarios if first.holdout else [],
        holdout={arm: metric_interval([e for h in held for e in h[arm]], PASS, **kw) for arm in aside_arms},
        holdout_paired={f"B-{o}": pooled_paired_difference([(h[o], h["B"]) for h in held], PASS, **kw)
                        for o in ("A", "C") if o in aside_arms})


def write_pool(doc: PoolDoc, out: str | Path) -> None:
    """``<out>/pool.json`` and ``<out>/pool.md``, each written atomically."""
    run = RunDir(out)
    run.derive("pool.json", "pool", doc.to_json())
    run.derive("pool.md", "pool", pool_markdown(doc))


def pool_markdown(doc: PoolDoc) -> str:
    """The pool as a short Markdown page: the runs, the pooled PassRate per tier and B's differences."""
    tiers = list(next(iter(doc.main.values())))
    lines = [f"# Pooled over run seeds {', '.join(str(r.seed) for r in doc.runs)} ({doc.metrics_contract})", "",
             "## Each run (PassRate of the last cycle)", "",
             "| seed | minutes | " + " | ".join(f"B {t}" for t in tiers) + " | B forgetting |", "|---" * (len(tiers) + 3) + "|"]
    for r in doc.runs:
        f = ", ".join(f"{t} {v:+.2f}" for t, v in r.forgetting.items()) or "none"
        if r.lost:
            f += f" ({len(r.lost)} lost, {sum(x.reference_passed is False for x in r.lost)} of them failed by C too)"
        lines.append(f"| {r.seed} | {r.minutes:g} | " + " | ".join(f"{r.passed['B'].get(t, float('nan')):.2f}" for t in tiers) + f" | {f} |")
    lines += ["", "## Pooled", "", "| | " + " | ".join(tiers) + " |", "|---" * (len(tiers) + 1) + "|"]
    for arm, row in doc.main.items():
        lines.append(f"| {arm} | " + " | ".join(_iv(row[t], signed=False) for t in tiers) + " |")
    for name, row in doc.paired.items():
        lines.append(f"| {name} | " + " | ".join(_iv(row[t]) for t in tiers) + " |")
    lines += ["", "Intervals: 95% percentile bootstrap over the pooled episodes; differences paired within each run.",
              "Mean forgetting of B: " + (", ".join(f"{t} {_iv(doc.forgetting[t])}" if t in doc.forgetting else f"{t} {v:+.3f}"
                                                    for t, v in doc.mean_forgetting.items()) or "none")
              + " (intervals: each run's episodes resampled within the run)."]
    if doc.holdout:
        lines += ["", f"## Scenarios never trained on ({', '.join(doc.holdout_scenarios)})", "",
                  "| | PassRate |", "|---|---|"]
        lines += [f"| {arm} | {_iv(iv, signed=False)} |" for arm, iv in doc.holdout.items()]
        lines += [f"| {name} | {_iv(iv)} |" for name, iv in doc.holdout_paired.items()]
    return "\n".join(lines) + "\n"


def _iv(iv: Interval, signed: bool = True) -> str:
    f = "+.2f" if signed else ".2f"
    return f"{iv.mean:{f}} [{iv.lo:{f}}, {iv.hi:{f}}]"


def _bench_doc(folder: str | Path) -> BenchDoc:
    if not Path(folder).is_dir() or not RunDir(folder).complete("bench.json"):
        raise ValueError(f"{folder}: not a finished bench (no complete bench.json)")
    return read_document(Path(folder) / "bench.json", BenchDoc)


def _shared(doc: BenchDoc) -> dict:
    return {k: v for k, v in doc.config.items() if k not in PER_RUN}


def _tier(runs: Sequence[Sequence[EpisodeRecord]], tier: str) -> list[EpisodeRecord]:
    return [e for eps in runs for e in eps if tier == ALL or e.tier == tier]


def _pass(eps: Sequence[EpisodeRecord]) -> float:
    return aggregate(eps)[PASS]


def _pass_by_tier(eps: Sequence[EpisodeRecord]) -> dict[str, float]:
    return {**{t: _pass(v) for t, v in sorted(group_by(eps, "tier").items())}, ALL: _pass(eps)}
