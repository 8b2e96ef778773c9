"""A training pair (:class:`Pair`, pair-v4), how it names its evidence and what chose it, and its
Parquet file: TRL's conversational preference columns (``prompt``/``chosen``/``rejected`` as message
lists) plus our metadata columns."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Final, Literal, Sequence

from pydantic import BaseModel, ConfigDict, model_validator

from socialworld.records import EpisodeRecord

PAIR_SCHEMA: Final = "pair-v4"
"""pair-v4: an action pair may carry the value of every candidate scored at its state (``candidates``)
and the keys of every legal action there (``legal``), what a listwise objective trains on. pair-v3: a
pair names what chose its chosen side (``chosen_by``); pair-v2's told a continuation policy's label
only by a suffix of its provenance. pair-v2: an action-track turn ends in a SAY line (the words of
its action); pair-v1's ended at the ACTION line. Files of all four read back (an
older pair's ``chosen_by`` is None: not recorded; before pair-v4 ``candidates`` and ``legal`` are None); a run
folder never mixes them (``rundir.PAIRS_KEY``)."""


EVIDENCE_KEYS = ("U", "A_e", "S_npc", "D", "ranking")
"""the source of each of the episode's metrics, and of what ranks chosen over rejected (``ranking``:
``direct`` for the simulator's rollouts, ``proxy`` for an LM judge's scores)"""


ChosenBy = Literal["rollouts", "label", "reference", "return", "q_t", "judge"]
"""What chose a pair's chosen side: ``rollouts`` (the best candidate by the simulator's rollouts),
``label`` (the continuation policy's action at a wake state: DAgger's expert label), ``reference``
(a reference episode's own action), ``return`` (the higher-return episode of two, trajectory level),
``q_t`` (the words the world assesses higher), ``judge`` (an LM judge's higher goal score)."""


class Candidate(BaseModel):
    """One candidate action scored at a pair's state: its key and its value (the mean return of the
    continuations after it; the pair's ``provenance`` says how they were rolled out)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    value: float


class Pair(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal["pair-v1", "pair-v2", "pair-v3", "pair-v4"] = PAIR_SCHEMA
    id: str
    track: Literal["action", "dialogue"]
    scenario_id: str
    tier: str
    seed: int
    step: int
    episode_id: str
    prompt: list[dict[str, str]]
    chosen: list[dict[str, str]]
    rejected: list[dict[str, str]]
    chosen_value: float
    rejected_value: float
    quality: float
    """action: share of paired rollouts where chosen beats rejected; dialogue: q_chosen - q_rejected"""
    provenance: str
    evidence: dict[str, str]
    """source of each of the episode's metrics (U, A_e, S_npc, D) and of the ranking (see ``EVIDENCE_KEYS``)"""
    template_key: str
    snapshot: str | None = None
    """action track: the world just before the step (``World.snapshot_json``), for GRPO rewards"""
    chosen_by: ChosenBy | None = None
    """what chose the chosen side (:data:`ChosenBy`); None only in pair-v1/v2 files, which did not record it"""
    candidates: list[Candidate] | None = None
    """action track with ``PairBuild.values``: every candidate scored at the state with its value (chosen's
    and rejected's actions among them), in the order scored; None where values were not recorded"""
    legal: list[str] | None = None
    """action track: the keys of every legal action at the state (the set constrained decoding chooses from: a
    listwise objective's decision); None in files written before it was recorded on every action pair"""

    @model_validator(mode="after")
    def _chosen_by_recorded(self) -> Pair:
        if (self.chosen_by is None) != (self.schema_version in ("pair-v1", "pair-v2")):
            raise ValueError(f"a {self.schema_version} pair {'records' if self.chosen_by else 'lacks'} chosen_by")
        return self


def assistant(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def pair_id(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def evidence(ep: EpisodeRecord, ranking: str = "direct") -> dict[str, str]:
    m = ep.metrics
    metrics = EVIDENCE_KEYS[:-1]
    if m is None:
        return {**{k: "missing" for k in metrics}, "ranking": ranking}
    return {**{k: (getattr(m, k).source if getattr(m, k).value is not None else "missing") for k in metrics}, "ranking": ranking}


def signature(p: Pair) -> tuple:
    return (p.track, json.dumps(p.prompt), p.chosen[0]["content"], p.rejected[0]["content"])


_SURROGATE = re.compile("[\ud800-\udfff]")


def _replace_surrogates(obj: Any) -> tuple[Any, int]:
    """``obj`` with every lone surrogate in its strings replaced by U+FFFD, and how many were."""
    if isinstance(obj, str):
        return _SURROGATE.subn("\ufffd", obj)
    if isinstance(obj, dict):
        fixed = {k: _replace_surrogates(v) for k, v in obj.items()}
        return {k: v for k, (v, _) in fixed.items()}, sum(n for _, n in fixed.values())
    if isinstance(obj, list):
        items = [_replace_surrogates(v) for v in obj]
        return [v for v, _ in items], sum(n for _, n in items)
    return obj, 0


def write_pairs(path: str | Path, pairs: Sequence[Pair]) -> int:
    """Parquet with TRL's conversational preference columns (prompt/chosen/rejected as lists of
    {role, content}) plus the metadata columns. Parquet strings are UTF-8, so a lone surrogate a
    model wrote (kept exactly in the episode records) is replaced by U+FFFD here; returns how many
    were (the sleep phase counts them in ``gating.json``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, replaced = _replace_surrogates([p.model_dump() for p in pairs])
    msg = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    schema = pa.schema([
        ("schema_version", pa.string()), ("id", pa.string()), ("track", pa.string()), ("scenario_id", pa.string()),
        ("tier", pa.string()), ("seed", pa.int64()), ("step", pa.int64()), ("episode_id", pa.string()),
        ("prompt", msg), ("chosen", msg), ("rejected", msg), ("chosen_value", pa.float64()),
        ("rejected_value", pa.float64()), ("quality", pa.float64()), ("provenance", pa.string()),
        ("evidence", pa.struct([(k, pa.string()) for k in EVIDENCE_KEYS])), ("template_key", pa.string()), ("snapshot", pa.string()),
        ("chosen_by", pa.string()),
        ("candidates", pa.list_(pa.struct([("key", pa.string()), ("value", pa.float64())]))), ("legal", pa.list_(pa.string())),
    ])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), str(path))
    return replaced


def read_pairs(path: str | Path) -> list[Pair]:
    """Pairs from :func:`write_pairs`' Parquet. Files written before the ``ranking`` evidence
    existed (or their pairs, replayed into a newer file, where it reads back null) hold pairs the
    simulator ranked: ``ranking`` is ``direct`` there."""
    import pyarrow.parquet as pq

    rows = pq.read_table(str(path)).to_pylist()
    for r in rows:
        if r["evidence"].get("ranking") is None:
            r["evidence"] = {**r["evidence"], "ranking": "direct"}
    return [Pair(**r) for r in rows]
