"""The world's state as plain dataclasses, and their one codec.

:class:`PublicState` holds what anyone in the room could know (the visibility function reads only
it); :class:`NPCHidden` what each NPC keeps to themself. :func:`to_plain` and :func:`from_plain`
turn any of them into JSON-ready data and back, driven by the dataclasses' own fields and type
hints: a snapshot lists no field by hand. A field added to a state dataclass is snapshotted and
restored without another edit; a snapshot written before it existed restores when the field has a
default (else :func:`from_plain` names it, or takes it from ``missing``). The ``clone`` methods stay
written out: a fork copies only what a step may change, and it must stay cheap (``benchmarks/world_speed.py``)."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from socialworld.core import Commitment, Fact, Line


@dataclass(slots=True)
class NPCHidden:
    utilities: dict[str, dict[str, float]]  # copy-on-write: replaced, never mutated in place
    vetoes: dict[str, frozenset[str]]  # copy-on-write
    threshold: float
    mood: float
    trust: float
    engagement: float
    patience: int
    grievance: bool

    def clone(self) -> NPCHidden:
        return NPCHidden(
            self.utilities, self.vetoes, self.threshold, self.mood, self.trust, self.engagement, self.patience, self.grievance
        )


@dataclass(slots=True)
class SlotState:
    status: Literal["open", "finalized", "lost"] = "open"
    choice: str | None = None
    proposal: str | None = None
    responses: dict[str, bool] = field(default_factory=dict)  # npc -> accepted current proposal

    def clone(self) -> SlotState:
        return SlotState(self.status, self.choice, self.proposal, dict(self.responses))


@dataclass(slots=True)
class ConflictState:
    npcs: tuple[str, str]  # in announcement order (public)
    repaired: list[str]  # correctly ordered repairs so far (public)
    resolved: bool = False

    def clone(self) -> ConflictState:
        return ConflictState(self.npcs, list(self.repaired), self.resolved)


@dataclass(slots=True)
class PublicState:
    t: int
    turns_left: int
    budget_left: float | None
    present: dict[str, bool]
    cues: dict[str, str]  # npc -> mood bucket as last observed (a proxy)
    slots: dict[str, SlotState]
    facts: list[Fact]
    commitments: list[Commitment]
    conflicts: list[ConflictState]
    announcements: list[str]
    transcript: list[Line]
    moves: list[str]  # the agent's own actions so far, canonical form (see observe)
    invalid_tags: frozenset[str]
    concessions: dict[tuple[str, str, str], float]  # (npc, slot, option) -> bonus offered
    revealed: frozenset[tuple[str, str]]  # (npc, slot) answered truthfully
    confided: frozenset[str]
    leaks: int
    done: bool
    end_reason: str | None

    def clone(self) -> PublicState:
        return PublicState(
            self.t,
            self.turns_left,
            self.budget_left,
            dict(self.present),
            dict(self.cues),
            {k: s.clone() for k, s in self.slots.items()},
            list(self.facts),
            list(self.commitments),
            [c.clone() for c in self.conflicts],
            list(self.announcements),
            list(self.transcript),
            list(self.moves),
            self.invalid_tags,
            dict(self.concessions),
            self.revealed,
            self.confided,
            self.leaks,
            self.done,
            self.end_reason,
        )


def to_plain(obj: Any, tp: Any = None) -> Any:
    """JSON-ready data of a state value of type ``tp`` (the value's own dataclass when omitted): a
    dataclass as a mapping of its fields, a tuple as a list, a set as a sorted list, a mapping with
    tuple keys as a list of ``[*key, value]`` rows."""
    kind: Any = type(obj) if tp is None else tp
    return _encoder(kind)(obj)


def from_plain(tp: Any, data: Any, missing: dict[str, Any] | None = None) -> Any:
    """The inverse of :func:`to_plain` for a value of type ``tp`` (a type hint). ``missing``: the
    value of a top-level dataclass field that ``data`` lacks (a snapshot written before the field
    existed)."""
    if missing:
        data = {**missing, **data}
    return _decoder(tp)(data)


def _identity(x: Any) -> Any:
    return x


@functools.cache
def _encoder(tp: Any) -> Callable[[Any], Any]:
    """The encoding function of type ``tp``, built once per type from its hints."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        parts = [(f.name, _encoder(hints[f.name])) for f in dataclasses.fields(tp)]
        return lambda obj: {name: enc(getattr(obj, name)) for name, enc in parts}
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        enc = _encoder(inner[0]) if len(inner) == 1 else _identity
        return lambda x: None if x is None else enc(x)
    if origin is dict:
        kt, vt = args
        venc = _encoder(vt)
        if typing.get_origin(kt) is tuple:
            return lambda d: [[*k, venc(v)] for k, v in d.items()]
        return lambda d: {k: venc(v) for k, v in d.items()}
    if origin in (frozenset, set):
        enc = _encoder(args[0])
        return lambda xs: sorted(enc(x) for x in xs)
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        encs = [_encoder(a) for a in args]
        return lambda xs: [e(x) for e, x in zip(encs, xs)]
    if origin in (list, tuple):
        enc = _encoder(args[0]) if args else _identity
        return lambda xs: [enc(x) for x in xs]
    return _identity


@functools.cache
def _decoder(tp: Any) -> Callable[[Any], Any]:
    """The decoding function of type ``tp`` (the inverse of :func:`_encoder`'s)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        parts = [(f.name, _decoder(hints[f.name])) for f in dataclasses.fields(tp)]
        cls: Any = tp

        defaulted = {f.name for f in dataclasses.fields(tp)
                     if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}

        def dec(d: Any) -> Any:
            lacking = [name for name, _ in parts if name not in d and name not in defaulted]
            if lacking:
                raise ValueError(f"{cls.__name__}: no {lacking[0]!r} in the data")
            return cls(**{name: f(d[name]) for name, f in parts if name in d})  # a field with a default may be absent
        return dec
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        f = _decoder(inner[0]) if len(inner) == 1 else _identity
        return lambda x: None if x is None else f(x)
    if origin is dict:
        kt, vt = args
        vdec = _decoder(vt)
        if typing.get_origin(kt) is tuple:
            return lambda rows: {tuple(row[:-1]): vdec(row[-1]) for row in rows}
        return lambda d: {k: vdec(v) for k, v in d.items()}
    if origin in (frozenset, set):
        f, kind = _decoder(args[0]), origin
        return lambda xs: kind(f(x) for x in xs)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            f = _decoder(args[0])
            return lambda xs: tuple(f(x) for x in xs)
        fs = [_decoder(a) for a in args]
        return lambda xs: tuple(g(x) for g, x in zip(fs, xs))
    if origin is list:
        f = _decoder(args[0])
        return lambda xs: [f(x) for x in xs]
    return _identity
