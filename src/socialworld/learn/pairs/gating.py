"""Screening, strict provenance gating and replay (contract §7), and the report that counts every
exclusion by reason (``gating.json``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Final, Literal, Sequence

import numpy as np

from socialworld.learn.config import SleepConfig
from socialworld.learn.pairs.record import Pair, signature
from socialworld.records import Document, read_document
from socialworld.rollout.judge import RankAgreement
from socialworld.world.rng import derive_seed

GOOD_SOURCES = ("direct", "fused")


@dataclass
class GatingReport:
    candidates: int = 0
    kept: dict[str, int] = field(default_factory=dict)
    excluded: Counter = field(default_factory=Counter)
    """(track, reason) -> count"""
    replayed: dict[str, int] = field(default_factory=dict)
    """track -> pairs added from earlier cycles (not in ``kept``)"""
    replaced: int = 0
    """lone surrogates in the written pairs' text replaced by U+FFFD (Parquet strings are UTF-8)"""
    judge_agreement: RankAgreement = field(default_factory=RankAgreement)
    """with an LM judge: how often its goal scores ordered each wake episode and its reference
    episode as their returns do (in ``gating.json`` only where a judge ranked any)"""

    def exclude(self, track: str, reason: str) -> None:
        self.excluded[f"{track}:{reason}"] += 1

    def document(self) -> Gating:
        """``gating.json``."""
        return Gating.model_validate(self.as_dict())

    def as_dict(self) -> dict:
        return {"candidates": self.candidates, "kept": dict(self.kept), "excluded": dict(sorted(self.excluded.items())),
                "replayed": dict(self.replayed), "replaced_surrogates": self.replaced,
                **({"judge_agreement": self.judge_agreement.as_dict()} if self.judge_agreement != RankAgreement() else {})}


GATING_SCHEMA: Final = "gating-v1"


class Gating(Document):
    """A cycle's ``gating.json``: a :class:`GatingReport` as written (:meth:`GatingReport.document`)
    and read back. Files written before the field named no ``schema_version``; they read as v1."""

    schema_version: Literal["gating-v1"] = GATING_SCHEMA
    candidates: int
    kept: dict[str, int]
    """pairs kept per track (before replay)"""
    excluded: dict[str, int]
    """candidate pairs excluded, by ``track:reason``"""
    replayed: dict[str, int] = {}
    """pairs replayed from earlier cycles, per track"""
    replaced_surrogates: int = 0
    """(written since 2026-11-24; 0 before)"""
    judge_agreement: dict[str, float | int | None] | None = None
    """with an LM judge that ranked any episode (:meth:`RankAgreement.as_dict`)"""


def read_gating(path: str | Path) -> Gating:
    """A ``gating.json``; a malformed one raises naming the file."""
    return read_document(path, Gating)


def screen_and_gate(pairs: Sequence[Pair], cfg: SleepConfig, report: GatingReport,
                    already_right: Callable[[Pair], bool] | None = None) -> list[Pair]:
    """Dedup, template cap, capability filter, quality threshold, then provenance gating."""
    kept: list[Pair] = []
    seen: set[tuple] = set()
    per_template: Counter = Counter()
    for p in pairs:
        sig = signature(p)
        if sig in seen:
            report.exclude(p.track, "duplicate")
            continue
        seen.add(sig)
        if per_template[p.template_key] >= cfg.template_cap:
            report.exclude(p.track, "template_cap")
            continue
        if already_right is not None and already_right(p):
            report.exclude(p.track, "capability")
            continue
        if p.track == "action" and p.quality < cfg.quality_threshold and not (cfg.wake_chosen == "label" and p.chosen_by == "label"):
            report.exclude(p.track, "low_quality")
            continue
        if cfg.gating == "strict":
            if p.track == "action":
                bad = [k for k, src in p.evidence.items() if src not in GOOD_SOURCES]
                if bad:
                    src = p.evidence[bad[0]]
                    report.exclude(p.track, f"{src}_evidence")
                    continue
            elif p.evidence.get("D") == "missing":
                report.exclude(p.track, "missing_evidence")
                continue
        per_template[p.template_key] += 1
        kept.append(p)
    for track in ("action", "dialogue"):
        report.kept[track] = sum(p.track == track for p in kept)
    return kept


def add_replay(kept: Sequence[Pair], earlier: Sequence[Pair], cfg: SleepConfig, report: GatingReport,
               key: Sequence[int | str]) -> list[Pair]:
    """``kept`` plus pairs replayed from ``earlier`` (pairs earlier cycles kept, which may repeat
    one another): per track, ``n = floor(cfg.replay * kept_t)`` distinct earlier pairs equal to no
    pair in ``kept``, drawn without replacement by an RNG seeded from ``(cfg.seed, "replay", *key)``
    (all of them when fewer). Counted in ``report.replayed``; an earlier pair equal to a kept one
    is counted as ``replay_duplicate``."""
    out = list(kept)
    now = {signature(p) for p in kept}
    for track in ("action", "dialogue"):
        pool: list[Pair] = []
        seen: set[tuple] = set()
        for p in earlier:
            sig = signature(p)
            if p.track != track or sig in seen:
                continue
            seen.add(sig)
            if sig in now:
                report.exclude(track, "replay_duplicate")
            else:
                pool.append(p)
        n = min(len(pool), int(cfg.replay * sum(p.track == track for p in kept)))
        rng = np.random.default_rng(derive_seed(cfg.seed, "replay", track, *key))
        picked = sorted(rng.choice(len(pool), size=n, replace=False).tolist()) if n else []
        out += [pool[i] for i in picked]
        report.replayed[track] = n
    return out
