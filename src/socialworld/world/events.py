"""Scheduled events (L2 dynamics): one handler per event kind changes the world through its public
effects and returns the announcement."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from socialworld.text.templates import ANNOUNCEMENTS
from socialworld.world.npc import CONFLICT_DROP
from socialworld.world.spec import EventSpec
from socialworld.world.state import ConflictState

if TYPE_CHECKING:
    from socialworld.world.engine import World


def _ev_weather(w: World, e: EventSpec) -> str:
    p = w.pub
    assert e.tag is not None  # the spec requires a tag of every weather event
    p.invalid_tags = p.invalid_tags | {e.tag}
    for slot_id, s in p.slots.items():
        slot = w.spec.slot(slot_id)
        if s.proposal is not None and e.tag in slot.option(s.proposal).tags:
            s.proposal, s.responses = None, {}
        if s.status == "finalized" and e.tag in slot.option(s.choice).tags:  # type: ignore[arg-type]
            if p.budget_left is not None:
                p.budget_left += w.spec.slot(slot_id).option(s.choice).cost  # type: ignore[arg-type]
            s.status, s.choice, s.proposal, s.responses = "open", None, None, {}
    return e.text


def _ev_budget_cut(w: World, e: EventSpec) -> str:
    w.pub.budget_left = (w.pub.budget_left or 0.0) - (e.amount or 0.0)
    return e.text


def _ev_leaves(w: World, e: EventSpec) -> str:
    p = w.pub
    p.present[e.npc] = False  # type: ignore[index]
    for s in p.slots.values():
        s.responses.pop(e.npc, None)  # type: ignore[arg-type]
    for i, c in enumerate(p.commitments):
        if c.npc == e.npc and c.status == "pending":
            p.commitments[i] = replace(c, status="void")
    return e.text or ANNOUNCEMENTS["participant_leaves"].format(name=w.spec.npc(e.npc).name)  # type: ignore[arg-type]


def _ev_arrives(w: World, e: EventSpec) -> str:
    w.pub.present[e.npc] = True  # type: ignore[index]
    return e.text or ANNOUNCEMENTS["late_arrival"].format(name=w.spec.npc(e.npc).name)  # type: ignore[arg-type]


def _ev_pref_change(w: World, e: EventSpec) -> str:
    npc, slot = e.npc, e.slot
    assert npc is not None and slot is not None
    h = w.hid[npc]
    if slot not in h.utilities:  # no say on the slot (validation refuses it): nothing to change
        return e.text or ANNOUNCEMENTS["preference_change"].format(name=w.spec.npc(npc).name, slot=w.spec.slot(slot).label)
    us = dict(h.utilities[slot])
    fav = w.preferred(npc, slot)
    others = [o for o in us if o != fav and o not in h.vetoes[slot] and w.available(slot, o)]
    if others:
        new = w.rng.choice(others)
        us[fav], us[new] = us[new], us[fav]
        h.utilities = {**h.utilities, slot: us}
    p = w.pub
    p.revealed = frozenset(x for x in p.revealed if x != (npc, slot))
    p.slots[slot].responses.pop(npc, None)
    w.add_fact(npc, "unsettled", slot, None)
    return e.text or ANNOUNCEMENTS["preference_change"].format(name=w.spec.npc(npc).name, slot=w.spec.slot(slot).label)


def _ev_conflict(w: World, e: EventSpec) -> str:
    a, b = e.npcs
    order = tuple(w.rng.shuffled((a, b)))
    first = w.rng.choice((a, b))
    w.pub.conflicts.append(ConflictState(order, []))  # type: ignore[arg-type]
    w.conflict_first.append(first)
    second = b if first == a else a
    w.hurt(first, CONFLICT_DROP[0])
    w.hurt(second, CONFLICT_DROP[1])
    for npc in (a, b):
        w.hid[npc].grievance = True
        for s in w.pub.slots.values():
            if s.status == "open":
                s.responses.pop(npc, None)
    return e.text


EVENTS: dict[str, Callable[[World, EventSpec], str]] = {
    "weather_change": _ev_weather,
    "budget_cut": _ev_budget_cut,
    "participant_leaves": _ev_leaves,
    "late_arrival": _ev_arrives,
    "preference_change": _ev_pref_change,
    "conflict": _ev_conflict,
}

