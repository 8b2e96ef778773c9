"""Prompt building for language-model policies (templates live in ``socialworld.text.templates``)
and the strict parser of their output."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from socialworld.agents.beliefs import Beliefs, Done, carried, present, repair_next
from socialworld.core import MOOD_BUCKETS, Action, ActionParseError, MentalState, Observation, OfferView, SlotView
from socialworld.text.reply import BELIEF_ITEM, reply_fields
from socialworld.text.templates import (
    POLICY_ALL_AGREE,
    POLICY_FAVOURED,
    POLICY_HEARD,
    POLICY_LAST_MOVES,
    POLICY_NO_MOVES,
    POLICY_PROMPT_VERSION,
    POLICY_PROMPTS,
    POLICY_REPAIR_NEXT,
    POLICY_STILL_BEST,
    POLICY_UNANSWERED,
    PolicyStateView,
)
from socialworld.world.visibility import memory_text


def brief(obs: Observation, view: PolicyStateView = PolicyStateView()) -> str:
    """The scenario's static part (the same at every step of every episode of a scenario):
    goal, cast, decisions with all their options, offers. It goes into the system message so a
    backend can cache its KV state once per scenario. With ``view.terms`` (policy-v8) each option
    shows its cost where the scenario has a budget, and the offers come in the order to try them
    (gestures and payments strongest first, then promises, each with what it costs or binds)."""
    lines = [obs.goal, "People: " + ", ".join(n.id for n in obs.npcs)]
    if not view.terms:
        lines += [f"{s.id}: options {'|'.join(o.id for o in s.options)}" for s in obs.slots]
        if obs.offers:
            lines.append("Offers: " + ", ".join(o.id for o in obs.offers))
        return "\n".join(lines)
    priced = obs.budget is not None
    lines += [f"{s.id}: " + "|".join(o.id + (f" {o.cost:g}" if priced else "") for o in s.options) for s in obs.slots]
    if obs.offers:
        lines.append("Offers, in the order to try: " + ", ".join(_offer_term(o) for o in offer_order(obs.offers)))
    return "\n".join(lines)


def offer_order(offers: Sequence[OfferView]) -> list[OfferView]:
    """Offers in the order an organiser tries them: gestures and payments first, the strongest first,
    then promises (they bind a later decision), the strongest first; ties as listed."""
    return sorted(offers, key=lambda o: (o.kind == "promise", -o.value))


def _offer_term(o: OfferView) -> str:
    if o.kind == "promise":
        return f"{o.id} (promise: {o.target_slot})"
    return o.id + (f" (costs {o.cost:g})" if o.kind == "pay" else "")


def wants(b: Beliefs, slot: SlotView) -> str:
    """What each stakeholder of ``slot`` is known to want, from beliefs built on the public fact
    log (the expert's inference): its preferred option, ``vague<n>`` after n vague answers only, or ``?``."""
    def one(h: str) -> str:
        n = b.vague[(h, slot.id)]
        return b.prefers.get(h, {}).get(slot.id) or (f"vague{n}" if n else "?")

    return " ".join(f"{h}={one(h)}" for h in slot.stakeholders)


def favoured(obs: Observation, b: Beliefs, slot: SlotView) -> str | None:
    """The option of ``slot`` the known wants favour (policy-v6), or None while nobody present is
    known to prefer an option there: two points for each present stakeholder known to prefer it,
    minus one for each known to dislike it; options a present stakeholder vetoed, unavailable ones
    and ones over the budget left are out; ties go to the cheaper, then the first listed. Public
    facts only (the expert's choice also weighs promises, a budget reserve and what it gave up on)."""
    here = present(obs, slot)
    if not any(slot.id in b.prefers.get(h, {}) for h in here):
        return None
    eligible = [o for o in slot.options if o.available and not b.vetoed(here, slot.id, o.id)
                and (obs.budget_left is None or o.cost <= obs.budget_left)]
    best = max(eligible, key=lambda o: (b.want_score(here, slot.id, o.id), -o.cost), default=None)  # first of equals
    return None if best is None else best.id


def moves_text(moves: Sequence[str], tally: bool) -> str:
    """The agent's own earlier moves as "You did:" shows them: the last ``POLICY_LAST_MOVES`` in
    order, or (``tally``, policy-v6) every distinct move once, in the order first made, with how
    often it was made, and the latest apart: ``propose(gift, book_bundle, all); inquire(raj, gift)
    x2; approach(raj) (last: inquire(raj, gift))``."""
    if not moves:
        return POLICY_NO_MOVES
    if not tally:
        return "; ".join(moves[-POLICY_LAST_MOVES:])
    counts = Counter(moves)
    return "; ".join(m + (f" x{counts[m]}" if counts[m] > 1 else "") for m in counts) + f" (last: {moves[-1]})"


def compact(obs: Observation, view: PolicyStateView = PolicyStateView()) -> str:
    """The state at this step, short enough for small models (ids, not labels). What it shows
    beyond the basics is the prompt version's ``view``: ``wants`` (policy-v4): each open decision
    says what its stakeholders want, and "Known:" keeps only vetoes and dislikes; ``agreed``
    (policy-v5): a proposal every present stakeholder accepted says so; ``favoured`` (policy-v6):
    the option the known wants favour (:func:`favoured`)."""
    beliefs = Beliefs().update(obs) if view.wants or view.favoured else None
    lines = [f"Turn {obs.step + 1}/{obs.turn_budget}."]
    if obs.budget is not None:
        lines.append(f"Budget left: {obs.budget_left:g}")
    lines.append("Here: " + ", ".join(
        n.id + (f" ({n.cue.split(' ', 1)[1]})" if n.cue else "") for n in obs.npcs if n.present))
    here = {n.id for n in obs.npcs if n.present}
    for s in obs.slots:
        if s.status != "open":
            lines.append(f"{s.id}: {s.status}" + (f" {s.choice}" if s.choice else ""))
            continue
        gone = [o.id for o in s.options if not o.available]
        line = f"{s.id}: open" + (f", gone {'|'.join(gone)}" if gone else "")
        if view.wants and beliefs is not None:
            line += f"; wants: {wants(beliefs, s)}"
        if view.favoured and beliefs is not None and (fav := favoured(obs, beliefs, s)) is not None:
            line += f"; {POLICY_FAVOURED}: {fav}"
        if s.proposal:
            line += f"; proposed {s.proposal}, yes: {' '.join(s.accepted_by) or '-'}, no: {' '.join(s.rejected_by) or '-'}"
            if view.agreed and all(h in s.accepted_by for h in s.stakeholders if h in here):
                line += f", {POLICY_ALL_AGREE}"
        lines.append(line)
    kinds = ("vetoes", "dislikes") if view.wants else ("prefers", "vetoes", "dislikes")
    known = [f"{f.npc} {f.kind} {f.option}" for f in obs.facts if f.kind in kinds]
    if known:
        lines.append("Known: " + "; ".join(known[-8:]))
    open_conflicts = [c for c in obs.conflicts if not c.resolved]
    if open_conflicts:
        lines.append("Quarrel: " + "; ".join(" vs ".join(c.npcs) for c in open_conflicts))
    if obs.announcements:
        lines.append("News: " + obs.announcements[-1])
    if obs.recent:
        last = obs.recent[-1]
        lines.append(f"Last: {last.speaker}: {last.text}")
    if obs.memory is not None:
        lines.append(memory_text(obs).rstrip("\n"))
    return "\n".join(lines)


def ranked(obs: Observation, b: Beliefs, slot: SlotView, first: str | None = None) -> list[str]:
    """The options of ``slot`` an organiser could still win, best first by the public record (policy-v8):
    a promised option first, then by how far the known wants of the present stakeholders favour it
    (:meth:`Beliefs.want_score`), then the cheaper, then as listed; options a present stakeholder
    vetoed, unavailable ones and ones the budget left cannot pay while keeping enough for the other
    open decisions' cheapest options are out. ``first`` (policy-v13: a :func:`~socialworld.agents.beliefs.carried`
    proposal) goes before all of them when it is not out."""
    here = slot.stakeholders
    promised = [c.target_option for c in obs.commitments if c.status == "pending" and c.target_slot == slot.id]
    reserve = sum(min((o.cost for o in s.options if o.available), default=0.0)
                  for s in obs.slots if s.status == "open" and s.id != slot.id)
    eligible = [o for o in slot.options if o.available and not b.vetoed(here, slot.id, o.id)
                and (obs.budget_left is None or o.cost <= obs.budget_left - reserve)]
    order = sorted(enumerate(eligible), key=lambda io: (-(5 * promised.count(io[1].id) + b.want_score(here, slot.id, io[1].id)),
                                                        io[1].cost, io[0]))
    ids = [o.id for _, o in order]
    return [first] + [o for o in ids if o != first] if first in ids else ids


RANKED_SHOWN = 3
"""how many of a decision's :func:`ranked` options policy-v8 shows"""


def tried(obs: Observation, done: Done, npc: str, slot: str, option: str) -> str:
    """What the agent already tried with ``npc`` for ``option`` on ``slot`` (policy-v9), as the state
    shows it after their name: `` (tried chip_in card_credit, one-to-one)``: the offers made, in the
    brief's order (:func:`offer_order`), and ``one-to-one`` for the proposal repeated to them alone;
    empty when nothing was."""
    offers = [o.id for o in offer_order(obs.offers) if (npc, slot, option, o.id) in done.offered]
    items = [" ".join(offers)] if offers else []
    if (npc, slot, option) in done.pressed:
        items.append("one-to-one")
    return f" (tried {', '.join(items)})" if items else ""


def state(obs: Observation, view: PolicyStateView = PolicyStateView(terms=True)) -> str:
    """The state at this step as policy-v8 shows it: the same facts as ``compact`` in fewer tokens and
    one place per decision, in words that are the same in every scenario. Each person present with
    the mood bucket their cue shows (``?`` before any contact); each open decision with its proposal
    and who said yes and no, what each stakeholder is known to want, and the options it can still
    win best first (:func:`ranked`: what the known vetoes and dislikes leave); quarrels; the latest news.
    ``view.tried`` (policy-v9): a standing proposal that is still the best option says so, and each one
    who said no carries what was :func:`tried` with them on it. ``view.pending`` (policy-v10): a standing
    proposal names who present has not answered it, and each quarrel whom to repair next
    (:func:`~socialworld.agents.beliefs.repair_next`, counting the episode's moves since its start: the
    expert counts those since it first saw the quarrel). ``view.carried`` (policy-v13): a proposal the group has
    mostly taken (:func:`~socialworld.agents.beliefs.carried`) is its decision's best option, so it says
    ``still best`` while whoever said no is won over."""
    b = Beliefs().update(obs)
    done = Done.of(obs.moves) if view.tried else None
    lines = [f"Turn {obs.step + 1}/{obs.turn_budget}." + (f" Budget left {obs.budget_left:g}." if obs.budget_left is not None else "")]
    lines.append("Moods: " + ", ".join(f"{n.id} {n.cue_bucket or '?'}" for n in obs.npcs if n.present))
    for s in obs.slots:
        if s.status != "open":
            lines.append(f"{s.id}: {s.status}" + (f" {s.choice}" if s.choice else ""))
            continue
        line = f"{s.id}:"
        best = ranked(obs, b, s, first=carried(obs, b, s) if view.carried else None)
        if s.proposal:
            mark = f" ({POLICY_STILL_BEST})" if done is not None and best[:1] == [s.proposal] else ""
            no = [h + (tried(obs, done, h, s.id, s.proposal) if done is not None else "") for h in s.rejected_by]
            line += f" proposed {s.proposal}{mark}, yes {' '.join(s.accepted_by) or '-'}, no {(', ' if done is not None else ' ').join(no) or '-'}"
            if all(h in s.accepted_by for h in s.stakeholders):
                line += f", {POLICY_ALL_AGREE}"
            silent = [h for h in s.stakeholders if obs.npc(h).present and h not in s.accepted_by + s.rejected_by]
            if view.pending and silent:
                line += f", {POLICY_UNANSWERED} {' '.join(silent)}"
            line += ";"
        else:
            line += " open;"
        line += f" wants {wants(b, s)}; best {' '.join(best[:RANKED_SHOWN]) or '-'}"
        lines.append(line)
    open_conflicts = [c for c in obs.conflicts if not c.resolved]
    if open_conflicts:
        lines.append("Quarrel: " + "; ".join(
            " vs ".join(c.npcs) + (f", repaired {' '.join(c.repaired)}" if c.repaired else "")
            + (", " + POLICY_REPAIR_NEXT.format(npc=repair_next(obs, c)) if view.pending else "") for c in open_conflicts))
    if obs.announcements:
        lines.append("News: " + obs.announcements[-1])
    if obs.memory is not None:
        lines.append(memory_text(obs).rstrip("\n"))
    return "\n".join(lines)


HEARD_SHOWN_ELSEWHERE = frozenset({"propose", "finalize"})
"""the moves whose answers :func:`heard` leaves to the decision's line"""


def heard(obs: Observation) -> str:
    """What was said back to the agent's last move (policy-v11), ``speaker: line`` one after another on one
    line, as the observation's recent talk holds it (voiced lines where an NPC voice spoke). Empty before
    the first move, when nobody answered, and after a proposal or a finalize, whose answers the decision's
    line already holds (who said yes and no, finalized or lost)."""
    if not obs.moves or obs.moves[-1].split("(", 1)[0] in HEARD_SHOWN_ELSEWHERE:
        return ""
    said = [f"{x.speaker}: {x.text}" for x in obs.recent if x.step == obs.step - 1 and x.speaker != "agent"]
    return POLICY_HEARD + " ".join(said) if said else ""


def build_messages(obs: Observation, version: str = POLICY_PROMPT_VERSION) -> list[dict[str, str]]:
    prompt = POLICY_PROMPTS[version]
    view = prompt.view
    shown = state(obs, view) if view.terms else compact(obs, view)
    if view.heard and (said := heard(obs)):
        shown += "\n" + said
    return [
        {"role": "system", "content": prompt.system.format(brief=brief(obs, view))},
        {"role": "user", "content": prompt.user.format(obs=shown, moves=moves_text(obs.moves, view.tally))},
    ]


def parse_belief(text: str, obs: Observation) -> MentalState:
    """``<npc> <slot>=<option> ... mood=<bucket>; ...`` with known ids only; raises ValueError."""
    npcs = {n.id for n in obs.npcs}
    slots = {s.id: {o.id for o in s.options} for s in obs.slots}
    prefs: dict[str, dict[str, str]] = {}
    moods: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        npc, *items = part.split()
        if npc not in npcs or not items:
            raise ValueError(f"belief about unknown npc {npc!r}")
        for item in items:
            m = BELIEF_ITEM.match(item.strip(","))
            if not m:
                raise ValueError(f"belief item {item!r} is not key=value")
            key, val = m.groups()
            if key == "mood":
                if val not in MOOD_BUCKETS:
                    raise ValueError(f"mood must be low|mid|high, got {val!r}")
                moods[npc] = val
            elif key in slots and val in slots[key]:
                prefs.setdefault(npc, {})[key] = val
            else:
                raise ValueError(f"unknown decision/option {key}={val}")
    return MentalState(prefs, moods)  # type: ignore[arg-type]


def parse_output(text: str, obs: Observation) -> tuple[Action | None, MentalState | None, str | None]:
    """Strictly parse a model's reply. The ACTION line is required and must be one canonical
    action; SAY gives the utterance (empty if absent); BELIEF, if malformed, is dropped (the
    step then has no stated mental state). Returns (action, mental_state, error). Lines break at
    ``\n`` (and ``\r\n``) only: ``SAY: hi\u2028ACTION: end()`` is one SAY line, no action."""
    fields = reply_fields(text)
    if "ACTION" not in fields:
        return None, None, "no ACTION line"
    try:
        action = Action.parse(fields["ACTION"], fields.get("SAY", ""))
    except ActionParseError as err:
        return None, None, str(err)
    belief = None
    if "BELIEF" in fields:
        try:
            belief = parse_belief(fields["BELIEF"], obs)
        except ValueError:
            belief = None
    return action, belief, None
