"""The agent's actions: one handler per action kind applies a legal action to a :class:`~socialworld.world.engine.World`
through its public effects (``say``, ``cue``, ``hurt``, ``cheer``, ``add_fact``, ``respond``...) and
returns a waste reason (penalised) or None."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from socialworld.core import Action, Commitment, Line
from socialworld.text.templates import NPC_REPLIES
from socialworld.world.npc import (
    APPROACH_GAIN,
    DIALOGUE_MOOD_NUDGE,
    REPAIR_GAIN,
    REPAIR_NEEDED_BELOW,
    TRUST_VIOLATION_MOOD,
    WRONG_ORDER_DROP,
)

if TYPE_CHECKING:
    from socialworld.world.engine import World

def _nudge(w: World, npc: str, q: float) -> None:
    w.cheer(npc, DIALOGUE_MOOD_NUDGE * (q - 0.5))


def _approach(w: World, a: Action, q: float, replies: list[Line]) -> str | None:
    h = w.hid[a.npc]  # type: ignore[index]
    wasted = h.engagement >= 0.8
    h.engagement = min(1.0, h.engagement + APPROACH_GAIN)
    if not wasted:
        w.cheer(a.npc, 0.03)  # type: ignore[arg-type]
    _nudge(w, a.npc, q)  # type: ignore[arg-type]
    w.say(a.npc, "approach_again" if wasted else "approach", replies)  # type: ignore[arg-type]
    w.cue(a.npc)  # type: ignore[arg-type]
    return "wasted_approach" if wasted else None


def _inquire(w: World, a: Action, q: float, replies: list[Line]) -> str | None:
    npc, slot = a.npc, a.slot
    assert npc is not None and slot is not None
    h, n = w.hid[npc], w.spec.npc(npc)
    slot_label = w.spec.slot(slot).label
    _nudge(w, npc, q)
    waste = None
    if (npc, slot) in w.pub.revealed:
        w.hurt(npc, 0.04 * (1 + n.traits.sensitivity))
        w.say(npc, "inquire_repeat", replies, slot=slot_label)
        waste = "redundant_inquiry"
    else:
        p_truth = min(0.98, max(0.05, 0.25 + 0.4 * n.traits.openness + 0.3 * h.engagement + 0.2 * (h.mood - 0.5)))
        if w.rng.bernoulli(p_truth):
            fav = w.preferred(npc, slot)
            vetoes = sorted(h.vetoes[slot])
            vtext = NPC_REPLIES["inquire_vetoes"].format(vetoes=", ".join(w.label(slot, v) for v in vetoes)) if vetoes else ""
            w.say(npc, "inquire_truth", replies, slot=slot_label, fav=w.label(slot, fav), vetoes=vtext)
            w.add_fact(npc, "prefers", slot, fav)
            for v in vetoes:
                w.add_fact(npc, "vetoes", slot, v)
            w.pub.revealed = w.pub.revealed | {(npc, slot)}
            if n.secret is not None and npc not in w.pub.confided and h.engagement >= 0.5:
                w.say(npc, "confide", replies, secret=n.secret.text)
                w.add_fact(npc, "secret", None, None, n.secret.text)
                w.pub.confided = w.pub.confided | {npc}
        else:
            w.say(npc, "inquire_vague", replies, slot=slot_label)
            w.add_fact(npc, "vague", slot, None)
    h.engagement = min(1.0, h.engagement + 0.1)
    w.cue(npc)
    return waste


def _addressed(w: World, a: Action) -> list[str]:
    assert a.slot is not None
    return w.holders(a.slot) if a.npc == "all" else [a.npc]  # type: ignore[list-item]


def _propose(w: World, a: Action, q: float, replies: list[Line]) -> str | None:
    slot, option = a.slot, a.option
    assert slot is not None and option is not None
    s = w.pub.slots[slot]
    if s.proposal != option:
        s.proposal, s.responses = option, {}
    for npc in _addressed(w, a):
        if w.stated_against(npc, slot, option):
            w.hurt(npc, 0.06 * (1 + w.spec.npc(npc).traits.sensitivity))
        _nudge(w, npc, q)
        w.respond(npc, slot, option, q, replies)
        w.cue(npc)
    return None


def _negotiate(w: World, a: Action, q: float, replies: list[Line]) -> str | None:
    npc, slot, option = a.npc, a.slot, a.option
    assert npc is not None and slot is not None and option is not None
    offer = w.spec.offer(a.offer)  # type: ignore[arg-type]
    p = w.pub
    _nudge(w, npc, q)
    key = (npc, slot, option)
    if p.concessions.get(key, 0.0) >= offer.value:
        w.say(npc, "negotiate_noted", replies)
        w.cue(npc)
        return "repeated_offer"
    p.concessions[key] = offer.value
    target_option = None
    if offer.kind == "promise":
        target_option = w.preferred(npc, offer.target_slot)  # type: ignore[arg-type]
        w.add_fact(npc, "prefers", offer.target_slot, target_option)
    if offer.kind == "pay":
        p.budget_left = (p.budget_left or 0.0) - offer.cost
    p.commitments.append(
        Commitment(npc, offer.id, slot, option, offer.target_slot, target_option,
                   "pending" if offer.kind == "promise" else "kept", p.t)
    )
    if p.slots[slot].proposal == option:
        ok = w.accepts(npc, slot, option, q)
        p.slots[slot].responses[npc] = ok
    else:
        ok = w.accepts(npc, slot, option, q)
    label = w.label(slot, option)
    w.say(npc, "negotiate_accept" if ok else "negotiate_reject", replies, option=label)
    if offer.kind == "promise" and ok:
        replies[-1] = Line(replies[-1].step, npc, replies[-1].text + NPC_REPLIES["promise_terms"].format(
            target=w.label(offer.target_slot, target_option), target_slot=w.spec.slot(offer.target_slot).label))  # type: ignore[arg-type]
    w.cue(npc)
    return None


def _soothe(w: World, npc: str, q: float, replies: list[Line]) -> None:
    w.hid[npc].grievance = False
    w.cheer(npc, REPAIR_GAIN)
    _nudge(w, npc, q)
    w.say(npc, "repair_ok", replies)
    w.cue(npc)


def _repair(w: World, a: Action, q: float, replies: list[Line]) -> str | None:
    """In a quarrel: the aggrieved party first, then the other; repairing the other first hurts
    the aggrieved party. Outside a quarrel: helps a grievance or a low mood, else is wasted."""
    npc = a.npc
    assert npc is not None
    h = w.hid[npc]
    for i, c in enumerate(w.pub.conflicts):
        if c.resolved or npc not in c.npcs:
            continue
        first = w.conflict_first[i]
        second = c.npcs[1] if c.npcs[0] == first else c.npcs[0]
        if npc == first and not c.repaired:
            c.repaired.append(first)
        elif npc == second and c.repaired == [first]:
            c.repaired.append(second)
            c.resolved = True
        elif npc == second:  # wrong order: the aggrieved party feels sidelined
            w.hurt(first, WRONG_ORDER_DROP)
            w.say(first, "repair_wrong_order", replies, other=w.spec.npc(second).name)
            w.cue(first)
            w.cheer(npc, REPAIR_GAIN / 2)
            w.cue(npc)
            return None
        else:
            break  # already repaired, waiting for the other party: wasted
        _soothe(w, npc, q, replies)
        return None
    else:
        if h.grievance or h.mood < REPAIR_NEEDED_BELOW:
            _soothe(w, npc, q, replies)
            return None
    w.say(npc, "repair_wasted", replies)
    w.cue(npc)
    return "wasted_repair"


def _wait(w: World, a: Action, q: float, replies: list[Line]) -> str | None:
    p = w.pub
    if any(s.status == "open" for s in p.slots.values()) or any(not c.resolved for c in p.conflicts):
        return "avoidable_wait"
    return None if w.pending_events() else "avoidable_wait"


def _finalize(w: World, a: Action, q: float, replies: list[Line]) -> str | None:
    slot, option = a.slot, a.option
    assert slot is not None and option is not None
    p = w.pub
    s = p.slots[slot]
    holders = w.holders(slot)
    opt = w.spec.slot(slot).option(option)
    agreed = s.proposal == option and all(s.responses.get(h) for h in holders)
    fits = (opt.capacity is None or opt.capacity >= sum(p.present.values()) + 1) and (
        p.budget_left is None or opt.cost <= p.budget_left
    )
    label = w.label(slot, option)
    if agreed and fits:
        s.status, s.choice = "finalized", option
        if p.budget_left is not None:
            p.budget_left -= opt.cost
        for h in holders:
            _nudge(w, h, q)
        replies.append(Line(p.t, "world", f"{w.spec.slot(slot).label.capitalize()} finalized: {label}."))
        _settle_commitments(w, slot, replies)
    else:
        s.status = "lost"
        why = "not everyone agreed" if not agreed else "it breaks a constraint (budget or capacity)"
        replies.append(Line(p.t, "world", f"Finalizing {label} failed: {why}; the {w.spec.slot(slot).label} is lost."))
        for h in holders:
            if not (s.proposal == option and s.responses.get(h)):
                w.hurt(h, 0.1)
                w.say(h, "finalize_refuse", replies, option=label)
                w.cue(h)
        _settle_commitments(w, slot, replies)
    return None


def _settle_commitments(w: World, slot: str, replies: list[Line]) -> None:
    p = w.pub
    s = p.slots[slot]
    for i, c in enumerate(p.commitments):
        if c.status != "pending" or c.target_slot != slot:
            continue
        if s.status == "finalized" and s.choice == c.target_option:
            p.commitments[i] = replace(c, status="kept")
        else:
            p.commitments[i] = replace(c, status="broken")
            w.hurt(c.npc, TRUST_VIOLATION_MOOD)
            w.hid[c.npc].trust = max(0.0, w.hid[c.npc].trust - 0.5)
            w.say(c.npc, "broken_promise", replies, target=w.label(slot, c.target_option),  # type: ignore[arg-type]
                   target_slot=w.spec.slot(slot).label)
            w.cue(c.npc)


def _end(w: World, a: Action, q: float, replies: list[Line]) -> str | None:
    return None


HANDLERS: dict[str, Callable[[World, Action, float, list[Line]], str | None]] = {
    "approach": _approach,
    "inquire": _inquire,
    "propose": _propose,
    "negotiate": _negotiate,
    "repair": _repair,
    "wait": _wait,
    "finalize": _finalize,
    "end": _end,
}

