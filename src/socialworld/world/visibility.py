"""Visibility: the one pure function from public state to what the agent sees.

:func:`observe` takes the spec and :class:`~socialworld.world.engine.PublicState` — never the hidden
NPC state — so no hidden value can reach an observation except through what NPCs *said*
(facts, replies) and mood *cues* (proxies, marked as such in the records).
"""

from __future__ import annotations

from functools import lru_cache

from socialworld.core import (
    MOOD_BUCKETS,
    Action,
    ConflictView,
    NPCView,
    Observation,
    OfferView,
    OptionView,
    SlotView,
)
from socialworld.text.templates import CUES, OBSERVATION_TEXT
from socialworld.world.engine import subgoal_names
from socialworld.world.spec import ScenarioSpec
from socialworld.world.state import PublicState

RECENT_LINES = 6

# Per-field provenance of an observation: everything is read from structured public state
# (direct) except mood cues, which are inferred signals (proxy).
OBSERVATION_PROVENANCE: dict[str, str] = {
    "setting": "direct",
    "slots": "direct",
    "facts": "direct",
    "commitments": "direct",
    "conflicts": "direct",
    "announcements": "direct",
    "recent": "direct",
    "moves": "direct",
    "budget_left": "direct",
    "npcs.cue": "proxy",
}


@lru_cache(maxsize=256)
def _option_views(spec: ScenarioSpec, slot_id: str, invalid: frozenset[str]) -> tuple[OptionView, ...]:
    return tuple(
        OptionView(o.id, o.label, o.cost, o.capacity, o.tags, tuple(sorted(o.attrs.items())), not (invalid & set(o.tags)))
        for o in spec.slot(slot_id).options
    )


@lru_cache(maxsize=64)
def _offer_views(spec: ScenarioSpec) -> tuple[OfferView, ...]:
    return tuple(OfferView(o.id, o.kind, o.text, o.target_slot, o.cost, o.value) for o in spec.offers)


@lru_cache(maxsize=64)
def _static(spec: ScenarioSpec) -> tuple[tuple, tuple, tuple[str, ...]]:
    npcs = tuple((n.id, n.name, n.profile, {b: f"{n.name} {c}" for b, c in zip(MOOD_BUCKETS, CUES[n.style])}) for n in spec.npcs)
    slots = tuple((s.id, s.label, spec.stakeholders(s.id)) for s in spec.slots)
    return npcs, slots, subgoal_names(spec)


def observe(spec: ScenarioSpec, pub: PublicState) -> Observation:
    """Build the agent's observation from public state."""
    npc_static, slot_static, subgoals = _static(spec)
    present, cues = pub.present, pub.cues
    npcs = tuple(
        NPCView(nid, name, profile, present[nid], None if (b := cues.get(nid)) is None else cue_text[b], b)  # type: ignore[arg-type]
        for nid, name, profile, cue_text in npc_static
    )
    slots = []
    for sid, label, all_holders in slot_static:
        s = pub.slots[sid]
        holders = tuple(h for h in all_holders if present[h])
        r = s.responses
        acc = tuple(h for h in holders if r.get(h) is True) if r else ()
        rej = tuple(h for h in holders if r.get(h) is False) if r else ()
        slots.append(SlotView(sid, label, s.status, s.choice, s.proposal, acc, rej, holders,
                              _option_views(spec, sid, pub.invalid_tags)))
    return Observation(
        scenario_id=spec.id,
        scenario_name=spec.name,
        tier=spec.tier,
        step=pub.t,
        turn_budget=spec.turn_budget,
        turns_left=pub.turns_left,
        setting=spec.setting,
        role=spec.role,
        goal=spec.goal,
        budget=spec.budget,
        budget_left=pub.budget_left,
        npcs=npcs,
        slots=tuple(slots),
        offers=_offer_views(spec),
        facts=tuple(pub.facts),
        commitments=tuple(pub.commitments),
        conflicts=tuple(ConflictView(c.npcs, tuple(c.repaired), c.resolved) for c in pub.conflicts),
        announcements=tuple(pub.announcements),
        recent=tuple(pub.transcript[-RECENT_LINES:]),
        subgoals=subgoals,
        moves=tuple(pub.moves),  # all of them: the agent's own memory (a prompt shows what its version shows)
    )


def to_plain(x):
    """JSON-ready form of an observation (or any slotted dataclass tree); far cheaper than
    :func:`dataclasses.asdict`, which deep-copies every leaf."""
    slots = getattr(type(x), "__slots__", None)
    if slots is not None and hasattr(x, "__dataclass_fields__"):
        return {f: to_plain(getattr(x, f)) for f in x.__dataclass_fields__}
    if isinstance(x, (tuple, list)):
        return [to_plain(v) for v in x]
    if isinstance(x, dict):
        return {k: to_plain(v) for k, v in x.items()}
    return x


def legal_actions(obs: Observation) -> list[Action]:
    """Every legal action (without utterance) in this observation. Matches
    :meth:`socialworld.world.engine.World.check_legal` (a test holds them equal)."""
    out = [Action("wait"), Action("end")]
    here = [n.id for n in obs.npcs if n.present]
    for n in here:
        out.append(Action("approach", npc=n))
        out.append(Action("repair", npc=n))
    budget_left = obs.budget_left
    for s in obs.slots:
        if s.status != "open":
            continue
        holders = [h for h in s.stakeholders if h in here]
        for h in holders:
            out.append(Action("inquire", npc=h, slot=s.id))
        for o in s.options:
            if not o.available:
                continue
            out.append(Action("propose", slot=s.id, option=o.id, npc="all"))
            out.extend(Action("propose", slot=s.id, option=o.id, npc=h) for h in holders)
            out.append(Action("finalize", slot=s.id, option=o.id))
            for off in obs.offers:
                to = holders
                if off.kind == "promise":
                    target = obs.slot(off.target_slot)  # type: ignore[arg-type]
                    if off.target_slot == s.id or target.status != "open":
                        continue
                    to = [h for h in holders if h in target.stakeholders]  # a promise needs a say there
                if off.kind == "pay" and (budget_left or 0) < off.cost:
                    continue
                out.extend(Action("negotiate", npc=h, slot=s.id, option=o.id, offer=off.id) for h in to)
    return out


def memory_text(obs: Observation) -> str:
    """The observation's chain memory as text (``memory-v1``), or "" when it has none."""
    from socialworld.text.templates import MEMORY_HEADER

    if obs.memory is None:
        return ""
    return "\n".join((MEMORY_HEADER.format(mode=obs.memory.mode), *obs.memory.lines)) + "\n"


def render(obs: Observation) -> str:
    """The observation as text (template ``observation-text-v1``; a chain's memory, when there
    is one, follows it)."""
    names = {n.id: n.name for n in obs.npcs}
    people = "\n".join(
        f"- {n.name} [{n.id}]: {n.profile}" + (f" ({n.cue})" if n.cue else "") + ("" if n.present else " (not here)")
        for n in obs.npcs
    )
    slot_lines = []
    for s in obs.slots:
        opts = ", ".join(
            f"{o.id} ({o.label}"
            + (f", cost {o.cost:g}" if o.cost else "")
            + (f", fits {o.capacity}" if o.capacity else "")
            + (f", {', '.join(o.tags)}" if o.tags else "")
            + ")"
            + ("" if o.available else " [unavailable]")
            for o in s.options
        )
        line = f"- {s.id} [{s.status}{': ' + s.choice if s.choice else ''}] options: {opts}"
        if s.status == "open" and s.proposal:
            line += f"; proposed {s.proposal}, accepted by {', '.join(names[a] for a in s.accepted_by) or 'nobody'}"
            if s.rejected_by:
                line += f", rejected by {', '.join(names[a] for a in s.rejected_by)}"
        slot_lines.append(line)
    said = [
        f"{names[f.npc]}: {f.kind} {f.option or ''} ({f.slot})".replace(" ()", "") if f.kind != "secret" else f"{names[f.npc]} confided: {f.text}"
        for f in obs.facts
        if f.kind != "vague"
    ]
    facts = ("Known: " + "; ".join(said) + "\n") if said else ""
    commitments = (
        "Commitments: "
        + "; ".join(f"{names[c.npc]} {c.offer} on {c.slot}={c.option} ({c.status})" for c in obs.commitments)
        + "\n"
        if obs.commitments
        else ""
    )
    conflicts = (
        "Conflicts: "
        + "; ".join(
            f"{names[c.npcs[0]]} vs {names[c.npcs[1]]} ({'resolved' if c.resolved else 'unresolved'})" for c in obs.conflicts
        )
        + "\n"
        if obs.conflicts
        else ""
    )
    announcements = ("News: " + " ".join(obs.announcements) + "\n") if obs.announcements else ""
    recent = ("Recent:\n" + "\n".join(f"  {names.get(x.speaker, x.speaker)}: {x.text}" for x in obs.recent) + "\n") if obs.recent else ""
    offers = "; ".join(f"{o.id} ({o.text})" for o in obs.offers) or "none"
    budget_line = f"Budget: {obs.budget_left:g} of {obs.budget:g} left\n" if obs.budget is not None else ""
    text = OBSERVATION_TEXT.format(
        name=obs.scenario_name,
        tier=obs.tier,
        step=obs.step,
        budget=obs.turn_budget,
        left=obs.turns_left,
        role=obs.role,
        goal=obs.goal,
        budget_line=budget_line,
        people=people,
        slots="\n".join(slot_lines),
        facts=facts,
        commitments=commitments,
        conflicts=conflicts,
        announcements=announcements,
        recent=recent,
        offers=offers,
    )
    return text + memory_text(obs)

