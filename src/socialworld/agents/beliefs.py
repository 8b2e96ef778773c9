"""The expert's belief tracker: what an observer can infer from the public record (the fact log,
and in a chained episode what NPCs said in earlier ones). The expert decides by it, and the
language-model prompt shows what it infers (``agents.lm.prompts``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

from socialworld.core import MOOD_BUCKETS, Action, ConflictView, MentalState, Observation, SlotView


@dataclass
class Beliefs:
    """What an observer can infer from the public record."""

    prefers: dict[str, dict[str, str]] = field(default_factory=dict)
    vetoes: dict[str, dict[str, set[str]]] = field(default_factory=dict)
    dislikes: dict[str, dict[str, set[str]]] = field(default_factory=dict)
    vague: Counter = field(default_factory=Counter)
    confided: set[str] = field(default_factory=set)

    seen: int = 0
    """how many facts of the (append-only) fact log have been absorbed"""
    remembered: bool = False
    """whether the chain memory's facts (earlier episodes) have been absorbed"""

    def update(self, obs: Observation) -> Beliefs:
        """Absorb the facts added since the last update (facts are append-only); on the first
        update of a chained episode, first what NPCs said in earlier episodes."""
        b = self
        new, b.seen = obs.facts[b.seen :], len(obs.facts)
        if not b.remembered and obs.memory is not None:
            b.remembered = True
            new = obs.memory.facts + new
        for f in new:
            if f.kind == "prefers":
                assert f.slot is not None and f.option is not None  # a preference names both
                b.prefers.setdefault(f.npc, {})[f.slot] = f.option
            elif f.kind == "vetoes":
                b.vetoes.setdefault(f.npc, {}).setdefault(f.slot, set()).add(f.option)  # type: ignore[arg-type]
            elif f.kind == "dislikes":
                b.dislikes.setdefault(f.npc, {}).setdefault(f.slot, set()).add(f.option)  # type: ignore[arg-type]
            elif f.kind == "vague":
                b.vague[(f.npc, f.slot)] += 1
            elif f.kind == "secret":
                b.confided.add(f.npc)
            elif f.kind == "unsettled":  # second thoughts: forget what we knew of that slot
                b.prefers.get(f.npc, {}).pop(f.slot, None)  # type: ignore[arg-type]
                b.dislikes.get(f.npc, {}).pop(f.slot, None)  # type: ignore[arg-type]
                b.vague[(f.npc, f.slot)] = 0
        return b

    def vetoed(self, holders: Sequence[str], slot: str, option: str) -> bool:
        """Someone of ``holders`` is known to have vetoed ``option`` on ``slot``."""
        return any(option in self.vetoes.get(h, {}).get(slot, ()) for h in holders)

    def want_score(self, holders: Sequence[str], slot: str, option: str) -> int:
        """How far the known wants of ``holders`` favour ``option`` on ``slot``: two for each known
        to prefer it, minus one for each known to dislike it."""
        return sum(2 * (self.prefers.get(h, {}).get(slot) == option) - (option in self.dislikes.get(h, {}).get(slot, ()))
                   for h in holders)

    def mental_state(self, obs: Observation) -> MentalState:
        moods = {n.id: (n.cue_bucket or "mid") for n in obs.npcs if n.present}
        return MentalState({k: dict(v) for k, v in self.prefers.items()}, moods)


@dataclass(frozen=True)
class Done:
    """What the agent did, read from the observation's moves (its own public record): whom it asked
    about which decision and how often, whom it approached, which offers it made for which option,
    whom it asked again one-to-one. Illegal and unparseable moves changed nothing and are skipped."""

    asked: Counter = field(default_factory=Counter)
    """(npc, slot) -> inquiries made"""
    approached: frozenset[str] = frozenset()
    offered: frozenset[tuple[str, str, str, str]] = frozenset()
    """(npc, slot, option, offer) of every negotiation"""
    pressed: frozenset[tuple[str, str, str]] = frozenset()
    """(npc, slot, option) of every one-to-one proposal"""

    @classmethod
    def of(cls, moves: Sequence[str]) -> Done:
        asked: Counter = Counter()
        approached: set[str] = set()
        offered: set[tuple[str, str, str, str]] = set()
        pressed: set[tuple[str, str, str]] = set()
        for a in _taken(moves):
            if a.kind == "inquire":
                asked[(a.npc, a.slot)] += 1
            elif a.kind == "approach" and a.npc is not None:
                approached.add(a.npc)
            elif a.kind == "negotiate" and a.npc and a.slot and a.option and a.offer:
                offered.add((a.npc, a.slot, a.option, a.offer))
            elif a.kind == "propose" and a.npc != "all" and a.npc and a.slot and a.option:
                pressed.add((a.npc, a.slot, a.option))
        return cls(asked, frozenset(approached), frozenset(offered), frozenset(pressed))


def repair_next(obs: Observation, quarrel: ConflictView, since: int = 0) -> str:
    """Whom to repair next in the open ``quarrel`` (the expert's rule, on the public record): once one
    side is repaired, the other; else, when a side was repaired among the moves from ``since`` on (the
    move count when the quarrel was first seen) and nobody counts as repaired (it was the wrong side),
    the other side of the latest such repair; else the more hurt by mood cue, the first listed on a
    tie. Illegal and unparseable moves changed nothing and are skipped."""
    a, b = quarrel.npcs
    if quarrel.repaired:
        return b if quarrel.repaired[0] == a else a
    tries = [m.npc for m in _taken(obs.moves[since:]) if m.kind == "repair" and m.npc in quarrel.npcs]
    if tries:
        return b if tries[-1] == a else a
    cue = {n.id: n.cue_bucket for n in obs.npcs}
    return min(quarrel.npcs, key=lambda n: MOOD_BUCKETS.index(cue[n] or "mid"))


CARRIED_BY = 3
"""how many present stakeholders, and more than half of them, must have said yes for a standing proposal
to be :func:`carried`"""


def present(obs: Observation, slot: SlotView) -> list[str]:
    """The stakeholders of ``slot`` who are here now (``SlotView.stakeholders`` lists absent ones too)."""
    here = {n.id for n in obs.npcs if n.present}
    return [h for h in slot.stakeholders if h in here]


def carried(obs: Observation, b: Beliefs, slot: SlotView) -> str | None:
    """The standing proposal on ``slot`` when the group has mostly taken it (the expert's rule since
    expert-v5, on the public record): at least ``CARRIED_BY`` of the present stakeholders, and more than
    half of them, said yes, and none of them is known to have vetoed it. Then whoever said no is won
    over (an offer, then the proposal once more to them alone) rather than asked what they want, which
    would turn the organiser to that one person's favourite and lose the rest's yes. None otherwise."""
    here = present(obs, slot)
    o = slot.proposal
    if o is None or b.vetoed(here, slot.id, o):
        return None
    yes = sum(h in slot.accepted_by for h in here)
    return o if yes >= CARRIED_BY and 2 * yes > len(here) else None


def _taken(moves: Sequence[str]) -> list[Action]:
    """The moves the world executed, parsed (illegal and unparseable ones changed nothing)."""
    return [Action.parse(k) for k in moves if not k.endswith("(illegal)") and k != "(unparseable)"]
