"""The metric registry: every number an episode is scored with, declared once (contract §5.1).

A :class:`Metric` names its key (the one spelling every record column, document, comparison and
table uses), its label (how tables and the contract write it), its plot axis, its range and which
direction is better. The records' Parquet columns, :func:`socialworld.metrics.core.aggregate`, the
bootstrap intervals, the loop's comparisons against the untrained policy, the bench and suite
documents, the report's tables and plots and the CLI's tables all iterate :data:`METRICS`; none
keeps a list of its own.

Adding a metric: a :class:`~socialworld.records.Signal` field on
:class:`~socialworld.records.Metrics`, its pure function in :mod:`socialworld.metrics.core` (called
from ``episode_metrics``), and one entry here. ``tests/test_metric_registry.py`` checks the
registry against the record.

This module is part of the kernel (it imports nothing), so the records can read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal


@dataclass(frozen=True)
class Metric:
    """One scored number."""

    key: str
    """its one spelling in records, documents and code (``pass``)"""
    label: str
    """how tables write it (``PassRate``)"""
    axis: str
    """a plot axis's title"""
    range: tuple[float, float]
    """the values it can take, for plot limits"""
    direction: Literal["higher", "lower"]
    """which values are better"""
    field: str
    """the :class:`~socialworld.records.Metrics` field it is read from: a ``Signal`` (its value)
    or a bool (1.0 / 0.0, so a mean over episodes is a rate)"""
    doc: str
    """what it measures, in a line"""

    @property
    def is_rate(self) -> bool:
        """True for an outcome per episode (a bool field) whose mean is a share of episodes."""
        return self.field in ("passed", "solved")


METRICS: Final[tuple[Metric, ...]] = (
    Metric("U", "U", "U (understanding)", (0.0, 1.0), "higher", "U",
           "mean over steps of the share of hidden facts the stated mental state gets right"),
    Metric("A_e", "A_e", "A_e (efficiency)", (-1.0, 1.0), "higher", "A_e",
           "potential gained less the waste cost, discounted by steps beyond the reference"),
    Metric("S_npc", "S_npc", "S_npc (Likert 1–5)", (1.0, 5.0), "higher", "S_npc",
           "the NPCs' satisfaction: their moods fused with the goal outcome"),
    Metric("D", "D", "D (diagnostic)", (0.0, 1.0), "higher", "D", "0.4 U + 0.4 clip(A_e) + 0.2 (S_npc - 1) / 4"),
    Metric("CR", "CR", "CR (completion)", (0.0, 1.0), "higher", "CR", "share of achievement sub-goals completed"),
    Metric("pass", "PassRate", "PassRate", (0.0, 1.0), "higher", "passed",
           "CR and D at their thresholds and no guard broken"),
    Metric("solve", "SolveRate", "SolveRate", (0.0, 1.0), "higher", "solved",
           "every decision finalized and no guard broken"),
)
"""every metric, in the order tables show them"""

KEYS: Final[tuple[str, ...]] = tuple(m.key for m in METRICS)
SIGNAL_KEYS: Final[tuple[str, ...]] = tuple(m.key for m in METRICS if not m.is_rate)
"""the metrics held as :class:`~socialworld.records.Signal` values (the records' float columns)"""
PASS: Final = "pass"
SOLVE: Final = "solve"
CR: Final = "CR"
D: Final = "D"
_BY_KEY: Final = {m.key: m for m in METRICS}


def metric(key: str) -> Metric:
    """The registered metric ``key``; an unknown key raises naming the known ones."""
    try:
        return _BY_KEY[key]
    except KeyError:
        raise KeyError(f"unknown metric {key!r}; the registered metrics are {', '.join(KEYS)}") from None

