"""Confidence intervals (contract §5.3): seeded percentile bootstrap over episodes, and the paired
bootstrap over shared (scenario, seed) episodes for comparing two policies or arms.

Pure functions over records; every interval names its seed and its resample count, so a report
can be reproduced exactly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from socialworld.metrics.core import episode_metrics, metric_of, require_contract
from socialworld.records import EpisodeRecord


def metric_value(ep: EpisodeRecord, key: str) -> float:
    """One episode's value of the registered metric ``key`` (``pass``, ``solve``: 1.0 / 0.0)."""
    v = metric_of(ep.metrics or episode_metrics(ep), key)
    if v is None:
        raise ValueError(f"episode {ep.episode_id} has no value for {key}")
    return v


@dataclass(frozen=True)
class Interval:
    """``mean`` and its percentile-bootstrap interval [lo, hi] at ``level``."""

    mean: float
    lo: float
    hi: float
    n: int
    level: float
    resamples: int
    seed: int

    def excludes_zero(self) -> bool:
        return self.lo > 0 or self.hi < 0

    def as_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.mean:+.3f} [{self.lo:+.3f}, {self.hi:+.3f}]"


def bootstrap(values: Sequence[float], resamples: int = 10_000, level: float = 0.95, seed: int = 0) -> Interval:
    """Percentile bootstrap of the mean: resample the n values with replacement ``resamples``
    times (``numpy.random.default_rng(seed)``); the interval is the (1-level)/2 and (1+level)/2
    quantiles of the resampled means."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("cannot bootstrap zero values")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return Interval(float(x.mean()), float(lo), float(hi), int(x.size), level, resamples, seed)


def metric_interval(episodes: Sequence[EpisodeRecord], key: str, **kw) -> Interval:
    """Bootstrap interval of the mean of ``key`` over ``episodes``."""
    require_contract(episodes)
    return bootstrap([metric_value(e, key) for e in episodes], **kw)


def paired_difference(a: Sequence[EpisodeRecord], b: Sequence[EpisodeRecord], key: str, **kw) -> Interval:
    """Paired bootstrap of mean(b - a) over the episodes both sides ran (matched on
    (scenario_id, seed)): per shared episode d_i = value_b - value_a, then :func:`bootstrap` of d.
    Unmatched episodes are an error, not silently dropped."""
    return bootstrap(_differences(a, b, key), **kw)


def pooled_paired_difference(groups: Sequence[tuple[Sequence[EpisodeRecord], Sequence[EpisodeRecord]]], key: str, **kw) -> Interval:
    """Paired bootstrap of mean(b - a) pooled over independent runs: each group ``(a, b)`` is one
    run's two sides, matched on (scenario_id, seed) within the group as :func:`paired_difference`
    matches them (runs of other run seeds may share no episode, or share one by chance: pairs never
    cross runs); d = the concatenation of every group's differences, then :func:`bootstrap` of d
    (n = all the groups' episodes)."""
    return bootstrap([d for a, b in groups for d in _differences(a, b, key)], **kw)


def _differences(a: Sequence[EpisodeRecord], b: Sequence[EpisodeRecord], key: str) -> list[float]:
    """value_b - value_a per (scenario_id, seed), in key order; the two sides must hold the same episodes."""
    ka = {(e.scenario_id, e.seed): e for e in a}
    kb = {(e.scenario_id, e.seed): e for e in b}
    if ka.keys() != kb.keys():
        raise ValueError(f"paired comparison needs the same episodes on both sides; "
                         f"only in a: {sorted(ka.keys() - kb.keys())[:3]}, only in b: {sorted(kb.keys() - ka.keys())[:3]}")
    require_contract([*a, *b])
    return [metric_value(kb[k], key) - metric_value(ka[k], key) for k in sorted(ka)]
