"""Lifelong metrics (contract §5.3) as pure functions over per-cycle evaluation records.

``R[c][l]`` = PassRate of tier ``l`` in cycle ``c`` (defined once ``l`` is unlocked), each with
a seeded bootstrap interval. From an arm's R table:

* forgetting ``F_l = max_{c < last} R[c][l] - R[last][l]`` (zero forgetting: ``F_l <= 0``),
  defined for tiers unlocked before the last cycle;
* forward transfer ``FWT_l = R[u_l][l] - R_untrained[u_l][l]`` where ``u_l`` is the cycle tier
  ``l`` is first unlocked;
* adaptive unlocking: the next tier unlocks only once the current cycle's pass rate on the
  newest unlocked tier reaches a threshold (:func:`next_unlocked`).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from socialworld.metric_registry import PASS
from socialworld.metrics.core import group_by
from socialworld.metrics.stats import Interval, metric_interval
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


def forward_transfer(r: RTable, r_untrained: RTable) -> dict[str, float]:
    """FWT_l = R[u_l][l] - R_untrained[u_l][l], u_l = the cycle tier l is first unlocked."""
    out = {}
    for tier, c in unlock_cycles(r).items():
        if c in r_untrained and tier in r_untrained[c]:
            out[tier] = r[c][tier].mean - r_untrained[c][tier].mean
    return out
