"""Confidence intervals (contract §5.3): seeded percentile bootstrap over episodes, and the paired
bootstrap over shared (scenario, seed) episodes for comparing two policies or arms.

Pure functions over records; every interval names its seed and its resample count, so a report
can be reproduced exactly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Annotated, Any, Callable, Sequence

import numpy as np
from pydantic import AfterValidator

from socialworld.metric_registry import KEYS
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


def only_registered(table: dict[str, Any]) -> dict[str, Any]:
    """``table`` as it is when every key is a registered metric; raises ValueError naming the others."""
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise ValueError(f"unknown metric(s) {', '.join(unknown)}; the registered metrics are {', '.join(KEYS)}")
    return table


PerMetric = Annotated[dict[str, Interval], AfterValidator(only_registered)]
"""registered metric key -> its interval (a document's field: a key the registry does not know fails the read)"""


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


# ------------------------------------------------------------------ agreement of a judge with the rules


def cohen_kappa(a: Sequence[bool], b: Sequence[bool]) -> float | None:
    """Cohen's kappa of two binary ratings of the same items: ``(p_o - p_e) / (1 - p_e)``, with p_o the
    share of items they agree on and ``p_e = p_a p_b + (1 - p_a)(1 - p_b)`` (p_a, p_b: each side's share
    of True) the agreement expected by chance. None where it is undefined (p_e = 1: both sides give one
    and the same rating to every item)."""
    x, y = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    if x.size == 0 or x.size != y.size:
        raise ValueError(f"kappa needs two equally long non-empty ratings, got {x.size} and {y.size}")
    pa, pb = x.mean(), y.mean()
    pe = pa * pb + (1 - pa) * (1 - pb)
    if pe >= 1:
        return None
    return float(((x == y).mean() - pe) / (1 - pe))


def ranks(values: Sequence[float]) -> np.ndarray:
    """1-based ranks, ties sharing the mean of the ranks they span (``[3, 1, 3] -> [2.5, 1, 2.5]``)."""
    x = np.asarray(values, dtype=float)
    order = np.argsort(x, kind="stable")
    r = np.empty(x.size)
    r[order] = np.arange(1, x.size + 1)
    for v in np.unique(x):
        tied = x == v
        r[tied] = r[tied].mean()
    return r


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rho: the Pearson correlation of :func:`ranks` of ``x`` and of ``y``. None where it is
    undefined (one side constant)."""
    rx, ry = ranks(x), ranks(y)
    if rx.size != ry.size or rx.size < 2:
        raise ValueError(f"rho needs two equally long ratings of at least two items, got {rx.size} and {ry.size}")
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


def bootstrap_statistic(n: int, statistic: Callable[[np.ndarray], float | None], resamples: int = 2_000, level: float = 0.95, seed: int = 0) -> Interval | None:
    """Percentile bootstrap of ``statistic(indices)`` over ``n`` items resampled with replacement (``mean``
    is the statistic on all n items). A resample where the statistic is undefined (None) is left out, so
    the interval's ``resamples`` counts those it rests on; None when it is undefined on all n items, or on
    every resample (no interval can be drawn)."""
    whole = statistic(np.arange(n))
    if whole is None:
        return None
    rng = np.random.default_rng(seed)
    values = [v for v in (statistic(rng.integers(0, n, size=n)) for _ in range(resamples)) if v is not None]
    if not values:
        return None
    lo, hi = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return Interval(float(whole), float(lo), float(hi), n, level, len(values), seed)
