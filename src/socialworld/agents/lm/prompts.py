"""Prompt building for language-model policies (templates live in ``socialworld.text.templates``)
and the strict parser of their output."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from socialworld.agents.beliefs import Beliefs
from socialworld.core import MOOD_BUCKETS, Action, ActionParseError, MentalState, Observation, SlotView
from socialworld.text.reply import BELIEF_ITEM, reply_fields
from socialworld.text.templates import (
    POLICY_ALL_AGREE,
    POLICY_FAVOURED,
    POLICY_LAST_MOVES,
    POLICY_NO_MOVES,
    POLICY_PROMPT_VERSION,
    POLICY_PROMPTS,
    PolicyStateView,
)
from socialworld.world.visibility import memory_text


def brief(obs: Observation) -> str:
    """The scenario's static part (the same at every step of every episode of a scenario):
    goal, cast, decisions with all their options, offers. It goes into the system message so a
    backend can cache its KV state once per scenario."""
    lines = [obs.goal, "People: " + ", ".join(n.id for n in obs.npcs)]
    lines += [f"{s.id}: options {'|'.join(o.id for o in s.options)}" for s in obs.slots]
    if obs.offers:
        lines.append("Offers: " + ", ".join(o.id for o in obs.offers))
    return "\n".join(lines)


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
    here = [h for h in slot.stakeholders if obs.npc(h).present]
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


def build_messages(obs: Observation, version: str = POLICY_PROMPT_VERSION) -> list[dict[str, str]]:
    prompt = POLICY_PROMPTS[version]
    view = prompt.view
    return [
        {"role": "system", "content": prompt.system.format(brief=brief(obs))},
        {"role": "user", "content": prompt.user.format(obs=compact(obs, view), moves=moves_text(obs.moves, view.tally))},
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
