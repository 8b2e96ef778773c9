"""The core protocol: what a policy sees, what it says, and what it does.

Everything else plugs into these few types:

* :class:`Observation` — the agent's view of the world, built by
  :func:`socialworld.world.visibility.observe` from public state only. It has no field that can
  hold a hidden value (utilities, thresholds, moods, trust, unconfided secrets).
* :class:`MentalState` — the agent's stated estimate of each NPC's preferred option per
  slot and mood bucket (what the U metric scores).
* :class:`Action` — the strategic move plus its utterance (the dialogue dimension).
* :class:`Decision` — one policy output: mental state, action, raw text, parse status.
* :class:`Policy` — ``act(observations) -> decisions``, batched so episodes run in lockstep.
  A :class:`PrivilegedPolicy` (the oracle) additionally receives :class:`HiddenView`\\ s;
  the runner hands hidden state to nothing else, so "the expert sees only the observation"
  is enforced by the call signature, not by convention.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Literal, Mapping, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:
    from socialworld.records import PolicyRec

ActionKind = Literal["approach", "inquire", "propose", "negotiate", "repair", "wait", "finalize", "end"]
ACTION_KINDS: tuple[ActionKind, ...] = (
    "approach",
    "inquire",
    "propose",
    "negotiate",
    "repair",
    "wait",
    "finalize",
    "end",
)
MoodBucket = Literal["low", "mid", "high"]
MOOD_BUCKETS: tuple[MoodBucket, ...] = ("low", "mid", "high")
ParseStatus = Literal["ok", "unparseable", "illegal"]

# Which arguments each action kind takes, in order (the text form follows this order).
ACTION_ARGS: dict[str, tuple[str, ...]] = {
    "approach": ("npc",),
    "inquire": ("npc", "slot"),
    "propose": ("slot", "option", "npc"),  # npc may be "all"
    "negotiate": ("npc", "slot", "option", "offer"),
    "repair": ("npc",),
    "wait": (),
    "finalize": ("slot", "option"),
    "end": (),
}


def mood_bucket(mood: float) -> MoodBucket:
    """Bucket a mood in [0, 1]: low < 0.35 <= mid < 0.65 <= high."""
    if mood < 0.35:
        return "low"
    if mood < 0.65:
        return "mid"
    return "high"


class ActionParseError(ValueError):
    """Raised by :meth:`Action.parse` for text that is not exactly one well-formed action."""


_ACTION_RE = re.compile(r"^\s*([a-z_]+)\s*\(([^()]*)\)\s*$")
"""linear in the text's length: no two adjacent parts can match the same whitespace (a lazy group
between two ``\\s*`` took 28 s on ``propose(`` and 4,000 spaces)"""


@dataclass(frozen=True, slots=True)
class Action:
    """A strategic move. ``npc`` is an NPC id or ``"all"`` (propose only)."""

    kind: ActionKind
    npc: str | None = None
    slot: str | None = None
    option: str | None = None
    offer: str | None = None
    utterance: str = ""

    @property
    def key(self) -> str:
        """Canonical text form without the utterance, e.g. ``propose(venue, park, all)``."""
        args = [getattr(self, a) for a in ACTION_ARGS[self.kind]]
        return f"{self.kind}({', '.join(a for a in args if a is not None)})"

    def without_utterance(self) -> Action:
        return Action(self.kind, self.npc, self.slot, self.option, self.offer)

    def with_utterance(self, utterance: str) -> Action:
        return Action(self.kind, self.npc, self.slot, self.option, self.offer, utterance)

    @classmethod
    def parse(cls, text: str, utterance: str = "") -> Action:
        """Strictly parse the canonical form (``kind(arg, ...)``); no guessing, no repair."""
        m = _ACTION_RE.match(text)
        if not m:
            raise ActionParseError(f"not of the form kind(args): {text!r}")
        kind, argtext = m.group(1), m.group(2)
        if kind not in ACTION_ARGS:
            raise ActionParseError(f"unknown action kind {kind!r}")
        args = [a.strip() for a in argtext.split(",")] if argtext.strip() else []
        names = ACTION_ARGS[kind]
        if len(args) != len(names) or any(not re.fullmatch(r"[A-Za-z0-9_]+", a) for a in args):
            raise ActionParseError(f"{kind} takes ({', '.join(names)}), got {args}")
        return cls(kind=kind, utterance=utterance, **dict(zip(names, args)))  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, str | None]:
        return {"kind": self.kind, "npc": self.npc, "slot": self.slot, "option": self.option, "offer": self.offer}


@dataclass(frozen=True, slots=True)
class MentalState:
    """The agent's stated beliefs: ``preferences[npc][slot] = option`` and ``moods[npc]``.

    Unstated facts are simply absent (and count as wrong for U)."""

    preferences: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    moods: Mapping[str, MoodBucket] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "preferences": {n: dict(s) for n, s in self.preferences.items()},
            "moods": dict(self.moods),
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> MentalState:
        return cls(
            preferences={n: dict(s) for n, s in (data.get("preferences") or {}).items()},
            moods=dict(data.get("moods") or {}),
        )


@dataclass(frozen=True, slots=True)
class Decision:
    """One policy output for one step.

    ``action`` is None when the raw output could not be parsed; the world then records the
    raw text, charges the penalty and executes ``wait``."""

    action: Action | None
    mental_state: MentalState | None
    raw: str = ""
    parse_error: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    latency_s: float = 0.0
    foresight: Mapping | None = None
    """a :class:`~socialworld.swm.foresee.ForeseeAndAct` trace (draft, foreseen candidates, choice)"""
    prompt: tuple[str, tuple[tuple[str, str], ...]] | None = None
    """a language model's prompt: (template version, ((role, content), ...)) as sent"""
    failure: Literal["endpoint"] | None = None
    """``endpoint``: the policy got no reply at all (a transport or API failure: unreachable, HTTP
    error, broken or malformed response), which is not a bad reply; ``raw`` is then empty"""


# ---------------------------------------------------------------- observation (public only)


@dataclass(frozen=True, slots=True)
class OptionView:
    id: str
    label: str
    cost: float
    capacity: int | None
    tags: tuple[str, ...]
    attrs: tuple[tuple[str, str], ...]
    available: bool


@dataclass(frozen=True, slots=True)
class SlotView:
    id: str
    label: str
    status: Literal["open", "finalized", "lost"]
    choice: str | None
    proposal: str | None
    accepted_by: tuple[str, ...]
    rejected_by: tuple[str, ...]
    stakeholders: tuple[str, ...]
    options: tuple[OptionView, ...]


@dataclass(frozen=True, slots=True)
class NPCView:
    id: str
    name: str
    profile: str
    present: bool
    cue: str | None
    """last observed mood cue (a proxy, e.g. 'sounds annoyed'); None before any contact"""
    cue_bucket: MoodBucket | None


@dataclass(frozen=True, slots=True)
class Fact:
    """Something an NPC said about itself: ``prefers``/``vetoes``/``dislikes`` an option,
    ``vague`` (an unhelpful answer), ``secret`` (a confidence), ``unsettled`` (second thoughts)."""

    npc: str
    kind: Literal["prefers", "vetoes", "dislikes", "vague", "secret", "unsettled"]
    slot: str | None
    option: str | None
    step: int
    text: str = ""


@dataclass(frozen=True, slots=True)
class OfferView:
    id: str
    kind: str
    text: str
    target_slot: str | None
    cost: float
    value: float
    """how much the offer sways an NPC (public: a promise weighs more than a gesture)"""


@dataclass(frozen=True, slots=True)
class Commitment:
    npc: str
    offer: str
    slot: str
    option: str
    target_slot: str | None
    target_option: str | None
    status: Literal["pending", "kept", "broken", "void"]
    """void: the NPC left before the promise came due"""
    step: int


@dataclass(frozen=True, slots=True)
class ConflictView:
    npcs: tuple[str, str]
    repaired: tuple[str, ...]
    resolved: bool


@dataclass(frozen=True, slots=True)
class Line:
    step: int
    speaker: str
    text: str


@dataclass(frozen=True, slots=True)
class Memory:
    """What the agent remembers of earlier episodes with the same cast (episode chains), built
    from those episodes' public records only (see :mod:`socialworld.swm.chain`)."""

    mode: Literal["full", "summary"]
    lines: tuple[str, ...]
    """the memory as text (shown to language models)"""
    facts: tuple[Fact, ...]
    """what NPCs said about themselves before (``step`` = -k: k episodes ago)"""
    aggrieved: tuple[str, ...]
    """NPCs the agent let down or left unhappy (a broken promise, a low last cue, walked out)"""


@dataclass(frozen=True, slots=True)
class Observation:
    scenario_id: str
    scenario_name: str
    tier: str
    step: int
    turn_budget: int
    turns_left: int
    setting: str
    role: str
    goal: str
    budget: float | None
    budget_left: float | None
    npcs: tuple[NPCView, ...]
    slots: tuple[SlotView, ...]
    offers: tuple[OfferView, ...]
    facts: tuple[Fact, ...]
    commitments: tuple[Commitment, ...]
    conflicts: tuple[ConflictView, ...]
    announcements: tuple[str, ...]
    recent: tuple[Line, ...]
    subgoals: tuple[str, ...]
    """names of every sub-goal (public: the organiser knows what success means)"""
    memory: Memory | None = None
    """episode chains only: what the agent remembers of earlier episodes"""
    moves: tuple[str, ...] = ()
    """every action of the agent's own this episode, oldest first, canonical form (``propose(venue,
    park, all)``; an illegal one is marked ``(illegal)``, an unparseable reply is
    ``(unparseable)``): public, the agent knows what it did"""

    def npc(self, npc_id: str) -> NPCView:
        for n in self.npcs:
            if n.id == npc_id:
                return n
        raise KeyError(npc_id)

    def slot(self, slot_id: str) -> SlotView:
        for s in self.slots:
            if s.id == slot_id:
                return s
        raise KeyError(slot_id)


# ---------------------------------------------------------------- hidden view (oracle only)


@dataclass(frozen=True, slots=True)
class HiddenNPC:
    utilities: Mapping[str, Mapping[str, float]]
    vetoes: Mapping[str, frozenset[str]]
    threshold: float
    mood: float
    engagement: float
    secret: str | None


@dataclass(frozen=True, slots=True)
class HiddenView:
    """Read-only hidden state, handed only to :class:`PrivilegedPolicy` instances."""

    npcs: Mapping[str, HiddenNPC]
    conflict_first: Mapping[tuple[str, str], str]
    """for each announced conflict (as ordered in the observation), who must be repaired first"""
    tags_to_invalidate: frozenset[str] = frozenset()
    """option tags a scheduled (not yet fired) event will make unavailable"""
    spec: object = None
    """the full :class:`~socialworld.world.spec.ScenarioSpec` (hidden distributions included)"""
    fork: Callable[[], object] | None = None
    """an independent copy of the world, RNG position included (the simulator as an exact world
    model for lookahead; stepping the copy never changes the episode)"""

    def preferred(self, npc: str, slot: str) -> str:
        return preferred_option(self.npcs[npc].utilities[slot], self.npcs[npc].vetoes.get(slot, frozenset()))


def preferred_option(utilities: Mapping[str, float], vetoes: frozenset[str]) -> str:
    """The NPC's preferred option: the highest-utility non-vetoed option (first on ties)."""
    best, best_u = None, float("-inf")
    for opt, u in utilities.items():
        if opt not in vetoes and u > best_u:
            best, best_u = opt, u
    assert best is not None, "every NPC has at least one acceptable option"
    return best


# ---------------------------------------------------------------- policies


@runtime_checkable
class Policy(Protocol):
    """Decides for a batch of episodes at once (lockstep). Sees observations only."""

    policy_id: str

    def reset(self, episode_keys: Sequence[str]) -> None:
        """Called once before a batch of episodes starts; keys identify episodes."""

    def act(self, episode_keys: Sequence[str], observations: Sequence[Observation]) -> list[Decision]: ...


@runtime_checkable
class PrivilegedPolicy(Protocol):
    """A policy with hidden-state access (the oracle, the ceiling)."""

    policy_id: str
    privileged: Literal[True]

    def reset(self, episode_keys: Sequence[str]) -> None: ...

    def act(
        self,
        episode_keys: Sequence[str],
        observations: Sequence[Observation],
        hidden: Sequence[HiddenView],
    ) -> list[Decision]: ...


@runtime_checkable
class DescribedPolicy(Protocol):
    """An optional capability of a policy: it describes itself for the records (its version, base
    model, adapters, decoding, as a :class:`~socialworld.records.PolicyRec`). The runner records a
    policy without it by its ``policy_id`` alone."""

    policy_id: str

    def info(self) -> PolicyRec: ...
