"""Scenario specifications: frozen, typed, declarative data loaded from YAML.

A spec says *what* a social situation is (people, decisions, constraints, events); the
engine in :mod:`socialworld.world.engine` says *how* it behaves. Nothing in a spec is executed:
event kinds and offer kinds are names that select Python code in the engine.

Hidden values are given as distributions (``[low, high]`` uniform ranges and veto
probabilities); each episode seed samples concrete values from them.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal, Mapping, Sequence

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from socialworld.world.variation import parse_variant, variant

Tier = Literal["L0", "L1", "L2"]
TIERS: tuple[Tier, ...] = ("L0", "L1", "L2")

EventKind = Literal[
    "weather_change",  # options with a tag become unavailable; finalized ones reopen
    "budget_cut",  # the budget shrinks by `amount`
    "participant_leaves",  # an NPC leaves; open decisions no longer need them
    "late_arrival",  # an absent NPC arrives and becomes a stakeholder of open decisions
    "preference_change",  # an NPC's preference for a slot is re-sampled (hidden)
    "conflict",  # two NPCs fall out; they must be repaired in the right order
]
OfferKind = Literal[
    "promise",  # binds: the NPC gets their favourite option on `target_slot`
    "pay",  # the organiser covers `cost` out of the budget
    "goodwill",  # a small gesture; no obligation
]
GuardKind = Literal[
    "no_secret_leaked",  # no utterance reveals an NPC's confided secret to someone else
    "commitments_honoured",  # every promise made in a negotiation is kept
    "within_budget",  # finalized costs plus payments stay within the budget
    "good_relations",  # every present NPC ends with mood >= 0.3
]
Style = Literal["warm", "formal", "blunt", "shy", "cheerful"]

ID_PATTERN = r"^[a-z0-9_]+$"
"""npc, slot, option and offer ids: lower-case letters, digits and underscores (the action
grammar ``kind(arg, ...)`` parses nothing else)"""
MAX_SPEC_BYTES = 1_000_000
"""the largest scenario file :func:`load_spec` reads (1 MB; the shipped ones are ~5 KB)"""
_KEYWORD_WORD = re.compile(r"[a-z0-9]")  # socialworld.world.dialogue matches words of [a-z0-9']

Id = Annotated[str, Field(pattern=ID_PATTERN)]


def _not_all(npc_id: str) -> str:
    if npc_id == "all":
        raise ValueError("'all' is reserved (propose(slot, option, all) addresses everyone)")
    return npc_id


class _Frozen(BaseModel):
    # allow_inf_nan=False: NaN or an infinity in any float field is a validation error
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class Range(_Frozen):
    """A closed uniform range ``[low, high]``; YAML may write it as a two-item list."""

    low: float
    high: float

    @model_validator(mode="before")
    @classmethod
    def _from_list(cls, value: object) -> object:
        if isinstance(value, (list, tuple)):
            if len(value) != 2:
                raise ValueError("a range is a list of two numbers [low, high]")
            return {"low": value[0], "high": value[1]}
        if isinstance(value, (int, float)):
            return {"low": value, "high": value}
        return value

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if self.low > self.high:
            raise ValueError(f"low {self.low} is above high {self.high}")
        return self


class UtilityDist(_Frozen):
    """Hidden utility of one option for one NPC: uniform in ``range``; with probability
    ``veto`` the option is a hard constraint (the NPC rejects it whatever is offered)."""

    range: Range
    veto: float = Field(0.0, ge=0.0, le=1.0)

    @model_validator(mode="before")
    @classmethod
    def _from_list(cls, value: object) -> object:
        if isinstance(value, (list, tuple, int, float)):
            return {"range": value}
        return value


class Traits(_Frozen):
    """Hidden personality traits in [0, 1] (fixed per NPC template)."""

    openness: float = Field(ge=0, le=1)
    agreeableness: float = Field(ge=0, le=1)
    sensitivity: float = Field(ge=0, le=1)
    influence: float = Field(ge=0, le=1)


class Secret(_Frozen):
    """A private fact the NPC may confide; ``keywords`` detect a leak in an utterance."""

    text: str
    keywords: tuple[str, ...] = Field(min_length=1)

    @field_validator("keywords")
    @classmethod
    def _wordy(cls, keywords: tuple[str, ...]) -> tuple[str, ...]:
        for k in keywords:
            if not _KEYWORD_WORD.search(k.lower()):
                raise ValueError(f"keyword {k!r} has no ASCII letter or digit (keywords are matched as whole words of a-z, 0-9)")
        return keywords


class NPCSpec(_Frozen):
    id: Annotated[Id, AfterValidator(_not_all)]
    name: str
    profile: str
    style: Style = "warm"
    traits: Traits
    threshold: Range
    mood: Range
    secret: Secret | None = None
    present: bool = True
    preferences: dict[str, dict[str, UtilityDist]]
    """slot id -> option id (or ``default``) -> utility distribution"""


class OptionSpec(_Frozen):
    id: Id
    label: str
    cost: float = Field(0.0, ge=0)
    capacity: int | None = Field(None, ge=1)
    """how many people it holds, the organiser included (finalizing fails when fewer fit)"""
    tags: tuple[str, ...] = ()
    attrs: dict[str, str] = Field(default_factory=dict)


class SlotSpec(_Frozen):
    id: Id
    label: str
    stakeholders: Literal["all"] | tuple[str, ...] = "all"
    options: tuple[OptionSpec, ...] = Field(min_length=2)

    @field_validator("stakeholders")
    @classmethod
    def _someone_decides(cls, value: object) -> object:
        if isinstance(value, tuple):
            if not value:
                raise ValueError("a decision needs at least one stakeholder (or 'all')")
            if len(set(value)) != len(value):
                raise ValueError(f"a stakeholder is listed twice: {sorted(v for v in set(value) if value.count(v) > 1)}")
        return value

    @cached_property
    def option_ids(self) -> tuple[str, ...]:
        return tuple(o.id for o in self.options)

    def option(self, option_id: str) -> OptionSpec:
        return self._options[option_id]

    @cached_property
    def _options(self) -> dict[str, OptionSpec]:
        return {o.id: o for o in self.options}


class OfferSpec(_Frozen):
    id: Id
    kind: OfferKind
    text: str
    """how the organiser words the offer, e.g. 'you choose the date'"""
    value: float = Field(gt=0, le=1)
    cost: float = Field(0.0, ge=0)
    target_slot: str | None = None


class EventSpec(_Frozen):
    kind: EventKind
    at: Range
    """turn window; the firing turn is sampled per seed (integers, inclusive)"""
    text: str
    tag: str | None = None
    amount: float | None = None
    npc: str | None = None
    npcs: tuple[str, ...] = ()
    slot: str | None = None


class ScenarioSpec(_Frozen):
    id: str = Field(pattern=r"^[a-z0-9_]+-v\d+$")
    name: str
    tier: Tier
    setting: str
    role: str
    goal: str
    turn_budget: int = Field(gt=0)
    t_ref: int = Field(gt=0)
    budget: float | None = None
    require_negotiation: bool = False
    """resample hidden values until no option of the first slot pleases every stakeholder"""
    npcs: tuple[NPCSpec, ...] = Field(min_length=2)
    slots: tuple[SlotSpec, ...] = Field(min_length=1)
    offers: tuple[OfferSpec, ...] = ()
    guards: tuple[GuardKind, ...] = ()
    events: tuple[EventSpec, ...] = ()

    def __hash__(self) -> int:  # identity hash: specs are used as cache keys on hot paths
        return id(self)

    @cached_property
    def npc_ids(self) -> tuple[str, ...]:
        return tuple(n.id for n in self.npcs)

    @cached_property
    def slot_ids(self) -> tuple[str, ...]:
        return tuple(s.id for s in self.slots)

    @cached_property
    def _index(self) -> dict[str, dict]:
        return {
            "npc": {n.id: n for n in self.npcs},
            "slot": {s.id: s for s in self.slots},
            "offer": {o.id: o for o in self.offers},
            "holders": {s.id: (self.npc_ids if s.stakeholders == "all" else s.stakeholders) for s in self.slots},
        }

    def npc(self, npc_id: str) -> NPCSpec:
        return self._index["npc"][npc_id]

    def slot(self, slot_id: str) -> SlotSpec:
        return self._index["slot"][slot_id]

    def offer(self, offer_id: str) -> OfferSpec:
        return self._index["offer"][offer_id]

    def stakeholders(self, slot_id: str) -> tuple[str, ...]:
        return self._index["holders"][slot_id]

    @cached_property
    def n_conflicts(self) -> int:
        return sum(1 for e in self.events if e.kind == "conflict")

    @cached_property
    def content_hash(self) -> str:
        """sha256 of the canonical JSON of the spec (recorded in every episode's lineage)."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()

    @model_validator(mode="after")
    def _references(self) -> ScenarioSpec:
        _check_references(self)
        return self

    @field_validator("npcs", "slots", "offers")
    @classmethod
    def _unique_ids(cls, items: tuple) -> tuple:
        ids = [i.id for i in items]
        dup = {i for i in ids if ids.count(i) > 1}
        if dup:
            raise ValueError(f"duplicate id(s): {sorted(dup)}")
        return items


def _check_references(spec: ScenarioSpec) -> None:
    npcs = set(spec.npc_ids)
    slots = {s.id: s for s in spec.slots}
    if not any(n.present for n in spec.npcs):
        raise ValueError("npcs: nobody is present at the start (present: false for every npc)")
    for s in spec.slots:
        if s.stakeholders != "all":
            unknown = set(s.stakeholders) - npcs
            if unknown:
                raise ValueError(f"slots.{s.id}.stakeholders: unknown npc(s) {sorted(unknown)}")
        opts = [o.id for o in s.options]
        if len(set(opts)) != len(opts):
            raise ValueError(f"slots.{s.id}.options: duplicate option ids")
    for n in spec.npcs:
        for slot_id, prefs in n.preferences.items():
            if slot_id not in slots:
                raise ValueError(f"npcs.{n.id}.preferences: unknown slot '{slot_id}'")
            unknown = set(prefs) - set(slots[slot_id].option_ids) - {"default"}
            if unknown:
                raise ValueError(f"npcs.{n.id}.preferences.{slot_id}: unknown option(s) {sorted(unknown)}")
            missing = set(slots[slot_id].option_ids) - set(prefs)
            if missing and "default" not in prefs:
                raise ValueError(
                    f"npcs.{n.id}.preferences.{slot_id}: no distribution for {sorted(missing)} and no 'default'"
                )
        for slot_id in slots:
            if n.id in spec.stakeholders(slot_id) and slot_id not in n.preferences:
                raise ValueError(f"npcs.{n.id}.preferences: missing slot '{slot_id}' it is a stakeholder of")
    for o in spec.offers:
        if o.kind == "promise" and o.target_slot not in slots:
            raise ValueError(f"offers.{o.id}.target_slot: a promise needs a known slot, got {o.target_slot!r}")
        if o.kind == "pay" and spec.budget is None:
            raise ValueError(f"offers.{o.id}: a 'pay' offer needs a scenario budget")
    if spec.t_ref > spec.turn_budget:
        raise ValueError(f"t_ref: {spec.t_ref} reference steps do not fit in the turn budget of {spec.turn_budget}")
    pairs: dict[frozenset[str], int] = {}
    for i, e in enumerate(spec.events):
        for who in (e.npc, *e.npcs):
            if who is not None and who not in npcs:
                raise ValueError(f"events[{i}].npc: unknown npc '{who}'")
        if e.at.low != int(e.at.low) or e.at.high != int(e.at.high) or e.at.low < 1:
            raise ValueError(f"events[{i}].at: turns are whole numbers from 1 (an event fires after that many actions), "
                             f"got [{e.at.low:g}, {e.at.high:g}]")
        if e.at.low > spec.turn_budget:
            raise ValueError(f"events[{i}].at: the window starts at turn {e.at.low:g}, after the turn budget of "
                             f"{spec.turn_budget}: the event could never fire")
        if e.kind in ("participant_leaves", "late_arrival", "preference_change") and e.npc is None:
            raise ValueError(f"events[{i}].npc: '{e.kind}' needs an npc")
        if e.kind == "late_arrival" and spec.npc(e.npc).present:  # type: ignore[arg-type]
            raise ValueError(f"events[{i}].npc: late_arrival of '{e.npc}', who is present from the start "
                             f"(give them present: false)")
        if e.kind == "preference_change" and e.slot not in slots:
            raise ValueError(f"events[{i}].slot: 'preference_change' needs a known slot")
        if e.kind == "preference_change" and e.npc not in spec.stakeholders(e.slot):  # type: ignore[arg-type]
            raise ValueError(f"events[{i}].npc: preference_change of '{e.npc}', who has no say on slot '{e.slot}'")
        if e.kind == "participant_leaves" and any(
                x.kind == "participant_leaves" and x.npc == e.npc for x in spec.events[:i]):
            raise ValueError(f"events[{i}].npc: '{e.npc}' leaves twice (a second participant_leaves of the same npc)")
        if e.kind == "conflict" and len(e.npcs) != 2:
            raise ValueError(f"events[{i}].npcs: 'conflict' needs exactly two npcs")
        if e.kind == "conflict" and e.npcs[0] == e.npcs[1]:
            raise ValueError(f"events[{i}].npcs: a conflict of '{e.npcs[0]}' with themselves")
        if e.kind == "conflict":
            pair = frozenset(e.npcs)
            if pair in pairs:
                raise ValueError(f"events[{i}].npcs: a second conflict between {' and '.join(sorted(pair))} "
                                 f"(the first is events[{pairs[pair]}]); one sub-goal per pair")
            pairs[pair] = i
        if e.kind == "weather_change" and not e.tag:
            raise ValueError(f"events[{i}].tag: 'weather_change' needs a tag")
        if e.kind == "budget_cut" and (e.amount is None or spec.budget is None):
            raise ValueError(f"events[{i}].amount: 'budget_cut' needs an amount and a scenario budget")
    if "within_budget" in spec.guards and spec.budget is None:
        raise ValueError("guards: 'within_budget' needs a scenario budget")
    if "no_secret_leaked" in spec.guards and not any(n.secret for n in spec.npcs):
        raise ValueError("guards: 'no_secret_leaked' needs at least one npc with a secret")


def spec_warnings(spec: ScenarioSpec) -> list[str]:
    """Likely mistakes that a scenario may still intend (pure; reported by ``check_scenario``
    and ``socialworld check`` without failing them), each naming its field."""
    out = []
    arrived_by = {e.npc: e.at.high for e in spec.events if e.kind == "late_arrival"}  # latest possible arrival turn
    for n in spec.npcs:
        if not n.present and n.id not in arrived_by:
            out.append(f"npcs.{n.id}.present: '{n.id}' is absent (present: false) and no late_arrival event brings "
                       f"them: they never take part")
    tags = {t for s in spec.slots for o in s.options for t in o.tags}
    absent = {n.id for n in spec.npcs if not n.present}
    for i, e in enumerate(spec.events):
        involved = [e.npc] if e.kind == "participant_leaves" else list(e.npcs) if e.kind == "conflict" else []
        for who in involved:
            if who in absent and arrived_by.get(who, math.inf) >= e.at.low:
                field = "npc" if e.kind == "participant_leaves" else "npcs"
                out.append(f"events[{i}].{field}: {e.kind} involves '{who}', who is absent at the start and may not "
                           f"have arrived by turn {e.at.low:g}")
        if e.kind == "weather_change" and e.tag not in tags:
            out.append(f"events[{i}].tag: no option carries the tag '{e.tag}': the weather change invalidates nothing")
        if e.at.high >= spec.turn_budget:
            out.append(f"events[{i}].at: the window ends at turn {e.at.high:g}, and an event at turn "
                       f"{spec.turn_budget} (the turn budget) or later comes when no turn is left to respond")
    return out


class ScenarioError(ValueError):
    """A scenario file that cannot be loaded; the message names the file and the field."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping with the same key twice (PyYAML keeps the last)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # '<<: *base' may be overridden
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base class reports it
                    break
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"found duplicate key {key!r} (first at line {first.line + 1})", key_node.start_mark)
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def _format_validation(path: str, err: ValidationError) -> str:
    """One line per error, ``field <dotted.path>: message``. A cross-field error (raised by
    :func:`_check_references` with the field path first) shows that path; a tuple's "too short"
    that only echoes a failed item inside it is left out."""
    errors = err.errors()
    failed = [e["loc"] for e in errors]
    lines = [f"{path}: invalid scenario spec"]
    for e in errors:
        loc = e["loc"]
        if e["type"] == "too_short" and any(f[: len(loc)] == loc and len(f) > len(loc) for f in failed):
            continue
        msg = e["msg"].removeprefix("Value error, ")
        if loc:
            lines.append(f"  field {'.'.join(str(p) for p in loc)}: {msg}")
        else:
            lines.append(f"  field {msg}")  # the message starts with the field path
    return "\n".join(lines)


def parse_spec(data: object, source: str = "<data>") -> ScenarioSpec:
    """Validate a mapping into a :class:`ScenarioSpec`; errors name ``source`` and the field."""
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: a scenario file must hold a mapping, got {type(data).__name__}")
    try:
        return ScenarioSpec.model_validate(data)
    except ValidationError as err:
        raise ScenarioError(_format_validation(source, err)) from None


def _yaml_problem(err: yaml.YAMLError) -> str:
    """One line: the problem and where it is."""
    if isinstance(err, yaml.MarkedYAMLError) and err.problem:
        mark = err.problem_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        return f"{err.problem}{where}"
    return " ".join(str(err).split())


def read_yaml(path: str | Path) -> object:
    """The YAML document in ``path``; every failure (no such file, a folder, too large, not
    UTF-8, empty, invalid or duplicate-key YAML, nesting too deep) is a one-line-headed
    :class:`ScenarioError` naming the file."""
    path = Path(path)
    try:
        if path.is_dir():
            raise ScenarioError(f"{path}: is a directory, not a scenario file")
        with open(path, "rb") as f:  # at most one byte past the cap, whatever stat says (/dev/zero says 0)
            raw = f.read(MAX_SPEC_BYTES + 1)
        if len(raw) > MAX_SPEC_BYTES:
            raise ScenarioError(f"{path}: more than {MAX_SPEC_BYTES} bytes; a scenario file may be at most 1 MB")
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise ScenarioError(f"{path}: no such file") from None
    except UnicodeDecodeError as err:
        raise ScenarioError(f"{path}: not UTF-8 text (byte {err.start}: {err.reason})") from None
    except OSError as err:
        raise ScenarioError(f"{path}: cannot read: {err.strerror or err}") from None
    if not text.strip():
        raise ScenarioError(f"{path}: the file is empty")
    try:
        _check_depth(text, path)
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as err:
        raise ScenarioError(f"{path}: not valid YAML: {_yaml_problem(err)}") from None
    except RecursionError:
        raise ScenarioError(f"{path}: not valid YAML: nested too deeply") from None


MAX_YAML_DEPTH = 64
"""the deepest nesting of mappings and sequences a scenario file may have (the shipped ones: 5)"""


def _check_depth(text: str, path: Path) -> None:
    """Refuse, naming the line, a document nested deeper than :data:`MAX_YAML_DEPTH` (read as a stream of
    parse events, which never recurses, before anything builds it)."""
    depth = 0
    for ev in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                line = ev.start_mark.line + 1 if ev.start_mark is not None else "?"
                raise ScenarioError(f"{path}: line {line}: nested more than {MAX_YAML_DEPTH} deep")
        elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def load_spec(path: str | Path) -> ScenarioSpec:
    """Load one scenario YAML file (see :func:`read_yaml` for the file-level errors)."""
    data = read_yaml(path)
    try:
        return parse_spec(data, str(path))
    except RecursionError:  # a deep structure YAML could still build
        raise ScenarioError(f"{path}: invalid scenario spec: nested too deeply") from None


def builtin_scenario_files() -> list[Path]:
    root = resources.files("socialworld.world") / "scenarios"
    return sorted(Path(str(p)) for p in root.iterdir() if p.name.endswith(".yaml"))


def load_builtin_scenarios() -> dict[str, ScenarioSpec]:
    """The shipped scenarios, keyed by id, ordered by tier then file name."""
    specs = [load_spec(p) for p in builtin_scenario_files()]
    specs.sort(key=lambda s: (s.tier, s.id))
    return {s.id: s for s in specs}


def spec_yaml(spec: ScenarioSpec) -> str:
    """The canonical YAML of a spec (loads back to the same :attr:`~ScenarioSpec.content_hash`)."""
    return yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False, allow_unicode=True)


def capped(spec: ScenarioSpec, max_turns: int) -> ScenarioSpec:
    """``spec`` with its turn budget cut to ``max_turns`` (> 0; a smoke budget), ``t_ref`` cut to
    fit, and the events that could no longer fire (window starting after the cap) left out, so
    the capped spec is valid. A new model, not ``model_copy``: a copy would keep the original's
    cached content hash."""
    if max_turns <= 0 or spec.turn_budget <= max_turns:
        return spec
    data = spec.model_dump()
    data["events"] = [e for e in data["events"] if e["at"]["low"] <= max_turns]
    return ScenarioSpec.model_validate({**data, "turn_budget": max_turns, "t_ref": min(spec.t_ref, max_turns)})


def _is_path(name: str) -> bool:
    return name.endswith((".yaml", ".yml"))


def check_tiers(tiers: Sequence[str]) -> None:
    """Raise :class:`ScenarioError` naming any tier that is not one of :data:`TIERS`."""
    bad = set(tiers) - set(TIERS)
    if bad:
        raise ScenarioError(f"unknown tier(s) {sorted(bad)}; tiers are {', '.join(TIERS)}")


def named(known: dict[str, ScenarioSpec], name: str) -> list[ScenarioSpec]:
    """The scenarios of ``known`` (by id) that ``name`` names: their id, with or without the ``-vN`` suffix;
    or the variant a variant's id names (:mod:`socialworld.world.variation`) of a scenario of ``known``."""
    found = [s for sid, s in known.items() if sid == name or sid.rsplit("-v", 1)[0] == name]
    if not found and (v := parse_variant(name)) is not None and v[0] in known:
        found = [variant(known[v[0]], v[1])]
    return found


def resolve_scenarios(names: list[str] | None = None, tiers: list[str] | None = None, max_turns: int = 0,
                      stored: Mapping[str, ScenarioSpec] | None = None, stored_in: str = "") -> list[ScenarioSpec]:
    """Pick scenarios by id (with or without the ``-vN`` suffix), YAML path, or tier. ``max_turns``
    > 0 caps every scenario's turn budget (a smoke budget; the cap is in every step's setting).
    ``stored``: more scenarios an id may name, by id, before the shipped ones (a run's copies of
    the user's: :func:`socialworld.learn.scenarios.stored_scenarios`; ``stored_in`` says where they
    are, for the error a name that matches none gets)."""
    builtin = load_builtin_scenarios()
    known = builtin | dict(stored or {})
    if not names:
        chosen = list(builtin.values())
    else:
        chosen = []
        for name in names:
            if _is_path(name):
                chosen.append(load_spec(name))
                continue
            matches = named(known, name)
            if not matches and ("/" in name or Path(name).exists()):  # a path after all (a folder, a .txt)
                chosen.append(load_spec(name))
                continue
            if not matches:
                where = f" (shipped, or stored in {stored_in})" if stored_in else ""
                several = ("; several scenarios are several --scenario options (a path may hold a comma, so one is not split)"
                           if "," in name and all(named(known, n.strip()) for n in name.split(",")) else "")
                raise ScenarioError(f"unknown scenario '{name}'; known{where}: {', '.join(known)}; "
                                    f"a scenario of your own is given by its YAML path{several}")
            chosen.append(matches[-1])
    if tiers:
        check_tiers(tiers)
        chosen = [s for s in chosen if s.tier in tiers]
    if max_turns > 0:
        chosen = [capped(s, max_turns) for s in chosen]
    return chosen
