"""The sleep phase: candidate pairs from the recipe's sources, screened and gated, plus replay."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Sequence

from socialworld.learn.config import PairBuild, SleepConfig
from socialworld.learn.pairs.gating import GatingReport, add_replay, screen_and_gate
from socialworld.learn.pairs.record import Pair
from socialworld.learn.pairs.sources import SOURCES, SleepInputs, Unit


def _score(cfg: PairBuild, named: tuple[str, Unit]) -> tuple[list[Pair], GatingReport]:
    """One piece of one source's work, with its own gating counts: a pure function of its inputs
    (a Ray task under ``ray``)."""
    source, unit = named
    report = GatingReport()
    return SOURCES[source].build(unit, cfg, report), report


def candidate_pairs(inputs: SleepInputs, cfg: PairBuild, report: GatingReport,
                    progress: Callable[[str, int], Callable[[Any], None]] | None = None, ray: str = "") -> list[Pair]:
    """All pairs of a wake before screening and gating: each source the recipe names
    (``cfg.sources``), in :data:`~socialworld.learn.pairs.sources.SOURCES`' order, over the pieces of
    work its ``units`` finds in ``inputs``. ``progress(what, total)``, when given, returns a callback
    ticked once per piece scored (the CLI's bars). Each piece is scored apart (:func:`_score`), as a
    Ray task with ``ray`` (:func:`socialworld.rollout.scale.pmap`); the pairs and counts are the
    same either way."""
    from socialworld.rollout.scale import pmap

    work = [(name, u) for name, source in SOURCES.items() if name in cfg.sources for u in source.units(inputs, report)]
    tick = progress("sleep: scoring counterfactuals (episodes)", len(work)) if progress else None
    pairs: list[Pair] = []
    for made, part in pmap(partial(_score, cfg), work, ray=ray, tick=tick):
        pairs += made
        report.candidates += part.candidates
        report.excluded.update(part.excluded)
        report.judge_agreement += part.judge_agreement
    return pairs


@dataclass
class SleepResult:
    """One sleep phase's pairs and counts."""

    candidates: list[Pair]
    """every pair built, before screening and gating"""
    built: GatingReport
    """the counts of building alone (what each source excluded), before screening and gating"""
    kept: list[Pair]
    """the pairs screened and gated, then those replayed from earlier cycles"""
    report: GatingReport
    """every count: building, screening, gating, replay"""


def run_sleep(inputs: SleepInputs, cfg: SleepConfig, *, earlier: Sequence[Pair] = (),
              replay_key: Sequence[int | str] = (), progress: Callable[[str, int], Callable[[Any], None]] | None = None,
              ray: str = "") -> SleepResult:
    """The sleep phase, the one entry point (the loop and ``socialworld gate``): candidate pairs from
    every source (:func:`candidate_pairs`), screened and gated (:func:`screen_and_gate`), plus up to
    ``cfg.replay`` times as many pairs from ``earlier`` cycles (:func:`add_replay`, keyed by ``replay_key``)."""
    report = GatingReport()
    candidates = candidate_pairs(inputs, cfg, report, progress, ray=ray)
    built = GatingReport(candidates=report.candidates, excluded=report.excluded.copy())
    kept = screen_and_gate(candidates, cfg, report)
    if cfg.replay > 0 and earlier:
        kept = add_replay(kept, earlier, cfg, report, key=replay_key)
    return SleepResult(candidates, built, kept, report)
