"""Lifelong metrics (contract §5.3) as pure functions over per-cycle evaluation records.

``R[c][l]`` = PassRate of tier ``l`` in cycle ``c`` (defined once ``l`` is unlocked), each with
a seeded bootstrap interval. From an arm's R table:

* forgetting ``F_l = max_{c < last} R[c][l] - R[last][l]`` (zero forgetting: ``F_l <= 0``),
  defined for tiers unlocked before the last cycle, with a paired bootstrap interval over the tier's
  evaluation episodes (:func:`forgetting_intervals`) and the episodes it lost (:func:`lost_episodes`);
* forward transfer ``FWT_l = R[u_l][l] - R_untrained[u_l][l]`` where ``u_l`` is the cycle tier
  ``l`` is first unlocked;
* adaptive unlocking: the next tier unlocks only once the current cycle's pass rate on the
  newest unlocked tier reaches a threshold (:func:`next_unlocked`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from socialworld.metric_registry import PASS
from socialworld.metrics.core import group_by
from socialworld.metrics.stats import Interval, bootstrap_statistic, metric_interval, metric_value
from socialworld.records import EpisodeRecord

TIERS = ("L0", "L1", "L2")

RTable = dict[int, dict[str, Interval]]
"""cycle -> tier -> PassRate interval"""


def progressive_schedule(cycles: int = 3, tiers: Sequence[str] = TIERS) -> list[tuple[str, ...]]:
    """The protocol's unlocking: cycle c (1-based) unlocks the first c tiers (all after that)."""
    return [tuple(tiers[: min(c, len(tiers))]) for c in range(1, cycles + 1)]


def static_schedule(cycles: int = 1, tiers: Sequence[str] = TIERS) -> list[tuple[str, ...]]:
    """E6, static one-shot evaluation: every tier in every cycle."""
    return [tuple(tiers)] * cycles


def next_unlocked(unlocked: Sequence[str], pass_rate_newest: float, threshold: float,
                  tiers: Sequence[str] = TIERS) -> tuple[str, ...]:
    """Adaptive difficulty: add the next tier when the pass rate on the newest unlocked tier is
    at least ``threshold``; otherwise keep the current set."""
    unlocked = tuple(unlocked)
    if len(unlocked) < len(tiers) and pass_rate_newest >= threshold:
        return unlocked + (tiers[len(unlocked)],)
    return unlocked


def r_table(per_cycle: Mapping[int, Sequence[EpisodeRecord]], seed: int = 0, resamples: int = 10_000) -> RTable:
    """R[c][l] with a bootstrap interval, from each cycle's evaluation episodes."""
    return {c: {tier: metric_interval(eps, PASS, seed=seed, resamples=resamples)
                for tier, eps in sorted(group_by(list(episodes), "tier").items())}
            for c, episodes in sorted(per_cycle.items())}


def unlock_cycles(r: RTable) -> dict[str, int]:
    """The cycle each tier first appears in."""
    out: dict[str, int] = {}
    for c in sorted(r):
        for tier in r[c]:
            out.setdefault(tier, c)
    return out


def forgetting(r: RTable) -> dict[str, float]:
    """F_l = max_{c<last} R[c][l] - R[last][l], for each tier evaluated before the last cycle
    and in it."""
    last = max(r)
    out = {}
    for tier in r[last]:
        earlier = [r[c][tier].mean for c in r if c < last and tier in r[c]]
        if earlier:
            out[tier] = max(earlier) - r[last][tier].mean
    return out


def _pass_matrix(per_cycle: Mapping[int, Sequence[EpisodeRecord]], tier: str) -> tuple[list[int], list[tuple[str, int]], np.ndarray] | None:
    """The cycles that evaluated ``tier`` (the last one last), its episodes' (scenario_id, seed) keys and
    their pass values as a cycles x episodes matrix; None unless the last cycle and an earlier one
    evaluated the tier. Every such cycle must hold the same episodes (the protocol evaluates the same
    seeds each cycle): anything else is an error naming the first keys that differ."""
    last = max(per_cycle)
    cycles = [c for c in sorted(per_cycle) if any(e.tier == tier for e in per_cycle[c])]
    if last not in cycles or len(cycles) < 2:
        return None
    rows = [{(e.scenario_id, e.seed): metric_value(e, PASS) for e in per_cycle[c] if e.tier == tier} for c in cycles]
    keys = sorted(rows[-1])
    for c, row in zip(cycles, rows):
        if sorted(row) != keys:
            raise ValueError(f"tier {tier}: cycle {c} evaluated other episodes than cycle {last} "
                             f"(only in cycle {c}: {sorted(row.keys() - set(keys))[:3]}, only in cycle {last}: {sorted(set(keys) - row.keys())[:3]})")
    return cycles, keys, np.array([[row[k] for k in keys] for row in rows])


def _forgetting_of(m: np.ndarray, idx: np.ndarray) -> float:
    """F over the episodes ``idx`` (columns of a cycles x episodes pass matrix, the last cycle last)"""
    means = m[:, idx].mean(axis=1)
    return float(means[:-1].max() - means[-1])


def forgetting_intervals(per_cycle: Mapping[int, Sequence[EpisodeRecord]], seed: int = 0, resamples: int = 10_000,
                         level: float = 0.95) -> dict[str, Interval]:
    """F_l with a paired percentile-bootstrap interval, for each tier evaluated in the last cycle and
    before it. The cycles evaluate the same n episodes of the tier, so one resample draws n of them
    with replacement and recomputes ``F_l = max_{c<last} mean_c - mean_last`` over the drawn episodes
    in every cycle (:func:`socialworld.metrics.stats.bootstrap_statistic`; ``mean`` is :func:`forgetting`'s
    value). The interval says whether an F above 0 could be the draw of the evaluation seeds: with 6 or
    9 episodes a tier, one episode is 0.17 or 0.11."""
    out = {}
    for tier in sorted({e.tier for e in per_cycle[max(per_cycle)]}):
        found = _pass_matrix(per_cycle, tier)
        if found is None:
            continue
        m = found[2]
        iv = bootstrap_statistic(m.shape[1], functools.partial(_forgetting_of, m), resamples=resamples, level=level, seed=seed)
        assert iv is not None  # _forgetting_of is defined on every draw
        out[tier] = iv
    return out


def pooled_forgetting_intervals(runs: Sequence[Mapping[int, Sequence[EpisodeRecord]]], seed: int = 0, resamples: int = 10_000,
                                level: float = 0.95) -> dict[str, Interval]:
    """The mean of F_l over independent runs (each ``per_cycle`` of one run seed) with a stratified
    percentile bootstrap: a resample draws each run's n_r episodes of the tier from that run alone (the
    same draw in all its cycles, as :func:`forgetting_intervals` does) and averages the runs' F_l; for the
    tiers every run has F for. ``n`` counts the episodes of all the runs."""
    out = {}
    tiers = set.intersection(*({e.tier for e in run[max(run)]} for run in runs)) if runs else set()
    for tier in sorted(tiers):
        found = [_pass_matrix(run, tier) for run in runs]
        mats = [f[2] for f in found if f is not None]
        if len(mats) < len(runs):
            continue
        rng = np.random.default_rng(seed)
        values = [float(np.mean([_forgetting_of(m, np.asarray(rng.integers(0, m.shape[1], size=m.shape[1]))) for m in mats]))
                  for _ in range(resamples)]
        lo, hi = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
        whole = float(np.mean([_forgetting_of(m, np.arange(m.shape[1])) for m in mats]))
        out[tier] = Interval(whole, float(lo), float(hi), sum(m.shape[1] for m in mats), level, resamples, seed)
    return out


@dataclass(frozen=True)
class Lost:
    """An episode of an earlier tier that passed in an earlier cycle and fails in the last."""

    tier: str
    scenario_id: str
    seed: int
    passed_in: tuple[int, ...]
    """the earlier cycles it passed in"""
    reference_passed: bool | None = None
    """whether the reference policy (the bench's arm C, the teacher by default) passes the same episode
    (None: no reference given)"""


def lost_episodes(per_cycle: Mapping[int, Sequence[EpisodeRecord]], reference: Sequence[EpisodeRecord] = ()) -> list[Lost]:
    """The episodes behind forgetting: each (scenario, seed) of a tier evaluated before the last cycle
    that passed in some earlier cycle and fails in the last (an F above 0 needs at least one), with
    whether ``reference`` (episodes of another policy on the same seeds) passes it. A lost episode its
    teacher fails too is one the student had passed beyond its teacher."""
    ref = {(e.scenario_id, e.seed): metric_value(e, PASS) > 0 for e in reference}
    out = []
    for tier in sorted({e.tier for e in per_cycle[max(per_cycle)]}):
        found = _pass_matrix(per_cycle, tier)
        if found is None:
            continue
        cycles, keys, m = found
        for j, (sid, s) in enumerate(keys):
            passed = tuple(c for c, v in zip(cycles[:-1], m[:-1, j]) if v > 0)
            if passed and m[-1, j] == 0:
                out.append(Lost(tier, sid, s, passed, ref.get((sid, s))))
    return out


def forward_transfer(r: RTable, r_untrained: RTable) -> dict[str, float]:
    """FWT_l = R[u_l][l] - R_untrained[u_l][l], u_l = the cycle tier l is first unlocked."""
    out = {}
    for tier, c in unlock_cycles(r).items():
        if c in r_untrained and tier in r_untrained[c]:
            out[tier] = r[c][tier].mean - r_untrained[c][tier].mean
    return out
