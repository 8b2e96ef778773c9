"""Scripted reference policies: ``random`` (the floor), ``expert`` (rule-based, observation
only) and ``oracle`` (reads hidden state; the ceiling).

They speak through the same :class:`~socialworld.core.Policy` protocol an LM policy uses and,
like every policy, state a mental-state estimate at every step.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal, Sequence, cast

from socialworld.agents.beliefs import Beliefs, Done, carried, present, repair_next
from socialworld.core import (
    MOOD_BUCKETS,
    Action,
    Decision,
    HiddenView,
    MentalState,
    Observation,
    SlotView,
    mood_bucket,
)
from socialworld.records import PolicyRec
from socialworld.text.templates import AGENT_UTTERANCES, RANDOM_UTTERANCES
from socialworld.world.dialogue import assess
from socialworld.world.npc import REPAIR_NEEDED_BELOW, acceptance_score, social_pressure
from socialworld.world.rng import WorldRNG, derive_seed
from socialworld.world.visibility import legal_actions

RANDOM_VERSION = "random-v1"
EXPERT_VERSION = "expert-v5"
"""v5 wins over whoever said no to a proposal the group has mostly taken (:func:`~socialworld.agents.beliefs.carried`:
three or more of the present stakeholders, and more than half, said yes) instead of asking them what they
want and turning to their favourite (v4 lost the others' yes that way, and ran out of turns going through
every option). v4 reads a quarrel's repairs from the moves made since it first saw the quarrel (v3 remembered its
own picks, so fed another policy's states it switched sides after a step it did not take); on its own
episodes it acts as v3. v3 reads what it did from the observation's moves (whom it asked, approached,
pressed, what it offered), so fed another policy's states it labels what that policy's record supports; v2 proposes
first and asks only after a rejection (v1 asked everyone about everything first)"""
ORACLE_VERSION = "oracle-v2"
"""v2 never makes an offer that adds nothing to the concession already held"""


def _names(obs: Observation) -> dict[str, str]:
    return {n.id: n.name for n in obs.npcs}


def _option_label(obs: Observation, slot: str, option: str) -> str:
    for o in obs.slot(slot).options:
        if o.id == option:
            return o.label
    return option


def say(obs: Observation, a: Action, grounded: str | None = None) -> Action:
    """Attach the expert's polite, addressed, option-naming utterance (``agent-utterances-v1``)."""
    names = _names(obs)
    name = names.get(a.npc or "", "")
    slot = obs.slot(a.slot).label if a.slot else ""
    option = _option_label(obs, a.slot, a.option) if a.slot and a.option else ""
    if a.kind == "propose":
        who = "everyone" if a.npc == "all" else name
        if grounded and a.npc != "all":
            text = AGENT_UTTERANCES["propose_grounded"].format(who=who, ground=grounded, option=option, slot=slot)
        else:
            text = AGENT_UTTERANCES["propose"].format(who=who, option=option, slot=slot)
    elif a.kind == "negotiate":
        offer = next(o.text for o in obs.offers if o.id == a.offer)
        text = AGENT_UTTERANCES["negotiate"].format(name=name, option=option, slot=slot, offer=offer)
    else:
        text = AGENT_UTTERANCES[a.kind].format(name=name, option=option, slot=slot)
    return a.with_utterance(text)


# ------------------------------------------------------------------ random


class RandomPolicy:
    """Uniform over legal actions, with random (often poor) utterances and random beliefs.
    Its randomness comes from a stream derived from (policy seed, episode key)."""

    policy_id = "random"

    def __init__(self, seed: int = 0):
        self.seed = seed
        self._rngs: dict[str, WorldRNG] = {}

    def info(self) -> PolicyRec:
        return PolicyRec(policy_id=self.policy_id, version=RANDOM_VERSION)

    def reset(self, episode_keys: Sequence[str]) -> None:
        for k in episode_keys:
            self._rngs[k] = WorldRNG(derive_seed(self.seed, "random-policy", k))

    def act(self, episode_keys: Sequence[str], observations: Sequence[Observation]) -> list[Decision]:
        return [self._act(self._rngs[k], o) for k, o in zip(episode_keys, observations)]

    def _act(self, r: WorldRNG, obs: Observation) -> Decision:
        a = r.choice(legal_actions(obs))
        names = [n.name for n in obs.npcs]
        secret_hint = next((f.text.split(",")[0] for f in obs.facts if f.kind == "secret"), "things are tense")
        text = r.choice(RANDOM_UTTERANCES).format(
            name=r.choice(names),
            option=_option_label(obs, a.slot, a.option) if a.slot and a.option else "that",
            slot=obs.slot(a.slot).label if a.slot else "plan",
            secret_hint=secret_hint,
        )
        prefs = {
            n.id: {s.id: r.choice(s.options).id for s in obs.slots if n.id in s.stakeholders} for n in obs.npcs if n.present
        }
        moods = {n.id: r.choice(MOOD_BUCKETS) for n in obs.npcs if n.present}
        a = a.with_utterance(text)
        return Decision(a, MentalState(prefs, moods), raw=a.key)


# ------------------------------------------------------------------ expert


@dataclass
class _ExpertMemory:
    beliefs: Beliefs = field(default_factory=Beliefs)
    tried: set[tuple[str, str]] = field(default_factory=set)  # (slot, option) given up on
    offered: set[tuple[str, str, str, str]] = field(default_factory=set)
    asked: Counter = field(default_factory=Counter)  # (npc, slot) -> inquiries made
    approached: set[str] = field(default_factory=set)
    repaired: set[str] = field(default_factory=set)
    pressed: set[tuple[str, str, str]] = field(default_factory=set)  # (npc, slot, option) re-asked one-to-one
    quarrel_since: dict[tuple[str, str], int] = field(default_factory=dict)
    """each quarrel's sides -> the move count when it was first seen open (its repairs are the moves after)"""

    def recall(self, obs: Observation) -> _ExpertMemory:
        """What the agent did, read again from ``obs.moves`` (public: the agent's own record): whom it
        asked about what and how often, whom it approached, which offers it made, whom it re-asked
        one-to-one; a quarrel's repairs it reads from the moves made since it first saw the quarrel
        (:func:`~socialworld.agents.beliefs.repair_next`). What the expert judged (options given up,
        whom it repaired outside a quarrel) stays its own.
        So at another policy's states (a DAgger label) the expert acts on what was done there, not on
        what it would have done; on its own episodes the two are the same."""
        done = Done.of(obs.moves)
        self.asked, self.approached, self.offered, self.pressed = (
            Counter(done.asked), set(done.approached), set(done.offered), set(done.pressed))
        return self


class ExpertPolicy:
    """A competent organiser that sees only observations (``expert-v5``).

    Per open decision, in order: propose to everyone at once the option the known wants favour
    (no known veto, within budget, a promised option first) — one turn hears every stakeholder;
    keep a proposal the group has mostly taken (:func:`~socialworld.agents.beliefs.carried`) and win
    over whoever said no; else
    ask only someone who turned a proposal down and whose wish is still unknown, *once* (one who
    answered vaguely is approached and asked a second time only when there are turns to spare);
    finalize as soon as every present stakeholder accepted; win
    over each one who rejects with a non-binding offer first, a promise only when its decision
    is still open and nobody was promised it, then one one-to-one re-proposal once everyone else
    agreed; give up on an option only then. Quarrels are settled first (the more hurt party, by
    mood cue, first), then relationships before leaving. Its stated mental state infers
    preferences from what was said and from who accepted what. What it did it reads from the
    observation's moves (:meth:`_ExpertMemory.recall`)."""

    policy_id = "expert"

    def __init__(self) -> None:
        self._mem: dict[str, _ExpertMemory] = {}

    def info(self) -> PolicyRec:
        return PolicyRec(policy_id=self.policy_id, version=EXPERT_VERSION)

    def reset(self, episode_keys: Sequence[str]) -> None:
        for k in episode_keys:
            self._mem[k] = _ExpertMemory()

    def act(self, episode_keys: Sequence[str], observations: Sequence[Observation]) -> list[Decision]:
        out = []
        for k, obs in zip(episode_keys, observations):
            m = self._mem.setdefault(k, _ExpertMemory()).recall(obs)
            b = m.beliefs.update(obs)
            a = self._choose(m, obs, b)
            out.append(Decision(a, self.stated(obs, b), raw=a.key))
        return out

    @staticmethod
    def stated(obs: Observation, b: Beliefs) -> MentalState:
        """What was said, plus an inference for the unsaid: whoever accepted a proposal is
        taken to like that option, unless they stated otherwise."""
        ms = b.mental_state(obs)
        prefs = cast(dict[str, dict[str, str]], ms.preferences)  # the dict mental_state built: filled in place
        for s in obs.slots:
            if s.proposal is None:
                continue
            for h in s.accepted_by:
                prefs.setdefault(h, {}).setdefault(s.id, s.proposal)
        return ms

    def _choose(self, m: _ExpertMemory, obs: Observation, b: Beliefs) -> Action:
        # 1. quarrels first: nobody in a quarrel agrees to anything
        for c in obs.conflicts:
            if not c.resolved:
                since = m.quarrel_since.setdefault(c.npcs, len(obs.moves))
                return say(obs, Action("repair", npc=repair_next(obs, c, since)))
        # 1b. chained episodes: make amends first with whoever we let down last time
        for npc in obs.memory.aggrieved if obs.memory is not None else ():
            if npc not in m.repaired and obs.npc(npc).present:
                m.repaired.add(npc)
                return say(obs, Action("repair", npc=npc))
        # 2. decisions, promised ones first (a promise is kept only once its decision is made)
        promised = {c.target_slot for c in obs.commitments if c.status == "pending"}
        for s in sorted(obs.slots, key=lambda s: s.id not in promised):
            if s.status != "open":
                continue
            a = self._work_on(m, obs, b, s)
            if a is not None:
                return a
        # 3. relationships before leaving
        if "good_relations" in obs.subgoals:
            for n in obs.npcs:
                if n.present and n.cue_bucket == "low" and n.id not in m.repaired:
                    m.repaired.add(n.id)
                    return say(obs, Action("repair", npc=n.id))
        pending_conflicts = sum(1 for g in obs.subgoals if g.startswith("conflict:")) > len(obs.conflicts)
        if pending_conflicts and obs.turns_left > 1:
            return say(obs, Action("wait"))
        return say(obs, Action("end"))

    def _work_on(self, m: _ExpertMemory, obs: Observation, b: Beliefs, s: SlotView) -> Action | None:
        holders = present(obs, s)
        spare = obs.turns_left - 2 * sum(1 for x in obs.slots if x.status == "open")
        held = carried(obs, b, s)
        held = None if (s.id, held) in m.tried else held
        for h in holders if held is None else ():  # a carried proposal: win the rest over, do not ask them
            if s.id in b.prefers.get(h, {}) or not _rejected_here(m, s, h):
                continue
            asked = m.asked[(h, s.id)]
            if asked == 0 or (asked == 1 and b.vague[(h, s.id)] >= 1 and spare > len(holders)):
                if asked == 1 and h not in m.approached:
                    m.approached.add(h)
                    return say(obs, Action("approach", npc=h))
                m.asked[(h, s.id)] += 1
                return say(obs, Action("inquire", npc=h, slot=s.id))
        option = held or self._candidate(m, obs, b, s)
        if option is None:
            return None
        if s.proposal != option:
            return say(obs, Action("propose", slot=s.id, option=option, npc="all"))
        if all(h in s.accepted_by for h in holders):
            return say(obs, Action("finalize", slot=s.id, option=option))
        for h in holders:
            if h in s.accepted_by:
                continue
            if h not in s.rejected_by:
                fav = b.prefers.get(h, {}).get(s.id)
                ground = _option_label(obs, s.id, fav) if fav and fav != option else None
                return say(obs, Action("propose", slot=s.id, option=option, npc=h), grounded=ground)
            offer = self._offer_for(m, obs, b, h, s.id, option)
            if offer is not None:
                m.offered.add((h, s.id, option, offer))
                return say(obs, Action("negotiate", npc=h, slot=s.id, option=option, offer=offer))
            others_agree = all(x in s.accepted_by for x in holders if x != h)
            if others_agree and (h, s.id, option) not in m.pressed:  # everyone else agreed: ask once more
                m.pressed.add((h, s.id, option))
                return say(obs, Action("propose", slot=s.id, option=option, npc=h))
        m.tried.add((s.id, option))
        return self._work_on(m, obs, b, s)

    def _candidate(self, m: _ExpertMemory, obs: Observation, b: Beliefs, s: SlotView) -> str | None:
        promised = [c.target_option for c in obs.commitments if c.status == "pending" and c.target_slot == s.id]
        holders = present(obs, s)
        best, best_score = None, None
        for o in s.options:
            if not o.available or (s.id, o.id) in m.tried:
                continue
            if b.vetoed(holders, s.id, o.id):
                continue
            if obs.budget_left is not None and o.cost > obs.budget_left - _reserve(obs, s.id):
                continue
            score = 5.0 * promised.count(o.id) + b.want_score(holders, s.id, o.id)
            key = (score, -o.cost)
            if best_score is None or key > best_score:
                best, best_score = o.id, key
        return best

    def _offer_for(self, m: _ExpertMemory, obs: Observation, b: Beliefs, npc: str, slot: str, option: str) -> str | None:
        """Non-binding offers first (largest first), then a promise on a decision that is still
        open, that nobody was promised, and that this NPC has a say on. Offers do not add up (the
        largest counts), so one no larger than what ``npc`` already holds is never made."""
        held = _concession(obs, npc, slot, option)
        for off in sorted(obs.offers, key=lambda o: (o.kind == "promise", -o.value)):
            if (npc, slot, option, off.id) in m.offered or off.value <= held:
                continue
            if off.kind == "promise":
                tgt = obs.slot(off.target_slot)  # type: ignore[arg-type]
                if off.target_slot == slot or tgt.status != "open" or npc not in tgt.stakeholders:
                    continue
                if any(c.status == "pending" and c.target_slot == off.target_slot for c in obs.commitments):
                    continue  # never promise the same decision twice
            if off.kind == "pay" and (obs.budget_left or 0) < off.cost + _reserve(obs):
                continue
            return off.id
        return None


# ------------------------------------------------------------------ oracle


def true_mental_state(obs: Observation, hv: HiddenView) -> MentalState:
    """What a perfect observer would state: every present NPC's preferred option per decision
    it has a say on, and its mood bucket."""
    return MentalState(
        {n.id: {s.id: hv.preferred(n.id, s.id) for s in obs.slots if n.id in s.stakeholders} for n in obs.npcs if n.present},
        {n.id: mood_bucket(hv.npcs[n.id].mood) for n in obs.npcs if n.present},
    )


class OraclePolicy:
    """Reads the hidden state (a :class:`~socialworld.core.PrivilegedPolicy`): picks, for each
    decision, the option that needs the fewest concessions, buys exactly the needed agreement,
    avoids options a scheduled event will invalidate, repairs quarrels in the right order."""

    policy_id = "oracle"
    privileged: Literal[True] = True

    def info(self) -> PolicyRec:
        return PolicyRec(policy_id=self.policy_id, version=ORACLE_VERSION)

    def reset(self, episode_keys: Sequence[str]) -> None:
        pass

    def act(
        self, episode_keys: Sequence[str], observations: Sequence[Observation], hidden: Sequence[HiddenView]
    ) -> list[Decision]:
        out = []
        for obs, hv in zip(observations, hidden):
            a = self._choose(obs, hv)
            out.append(Decision(a, true_mental_state(obs, hv), raw=a.key))
        return out

    def _q(self, obs: Observation, hv: HiddenView, a: Action) -> float:
        confided = [f.npc for f in obs.facts if f.kind == "secret"]
        return assess(hv.spec, a, obs.facts, confided).q  # type: ignore[arg-type]

    def _choose(self, obs: Observation, hv: HiddenView) -> Action:
        for c in obs.conflicts:
            if not c.resolved:
                first = hv.conflict_first[c.npcs]
                other = c.npcs[1] if first == c.npcs[0] else c.npcs[0]
                return say(obs, Action("repair", npc=other if c.repaired else first))
        for s in obs.slots:
            if s.status != "open":
                continue
            a = self._work_on(obs, hv, s)
            if a is not None:
                return a
        if "good_relations" in obs.subgoals:
            for n in obs.npcs:
                if n.present and hv.npcs[n.id].mood < REPAIR_NEEDED_BELOW:
                    return say(obs, Action("repair", npc=n.id))
        pending_conflicts = sum(1 for g in obs.subgoals if g.startswith("conflict:")) > len(obs.conflicts)
        if (pending_conflicts or hv.tags_to_invalidate) and obs.turns_left > 1:
            return say(obs, Action("wait"))
        return say(obs, Action("end"))

    def _deficit(self, obs: Observation, hv: HiddenView, npc: str, slot: str, option: str, q: float) -> float:
        """Shortfall of ``npc``'s acceptance score, once everyone else has accepted (the social
        pressure a one-to-one re-proposal gets)."""
        h = hv.npcs[npc]
        conc = _concession(obs, npc, slot, option)
        spec = hv.spec
        holders = obs.slot(slot).stakeholders
        pressure = social_pressure(spec, npc, [j for j in holders if j != npc], len(holders))  # type: ignore[arg-type]
        return h.threshold - acceptance_score(h.utilities[slot][option], h.mood, conc, pressure, q)

    def _plan(self, obs: Observation, hv: HiddenView, s: SlotView) -> tuple[str, list[tuple[str, str]]] | None:
        """Best option for ``s`` and the (npc, offer) concessions it needs."""
        promised = {c.target_option for c in obs.commitments if c.status == "pending" and c.target_slot == s.id}
        best = None
        for o in s.options:
            if not o.available or set(o.tags) & hv.tags_to_invalidate:
                continue
            if promised and o.id not in promised:
                continue
            if any(o.id in hv.npcs[h].vetoes.get(s.id, ()) for h in s.stakeholders):
                continue
            budget = obs.budget_left
            if budget is not None and o.cost > budget - _reserve(obs, s.id):
                continue
            q = self._q(obs, hv, say(obs, Action("propose", slot=s.id, option=o.id, npc="all")))
            needs, spend, ok = [], 0.0, True
            promising: set[str] = set()
            for h in s.stakeholders:
                d = self._deficit(obs, hv, h, s.id, o.id, q)
                if d <= 0:
                    continue
                offer = self._smallest_offer(
                    obs, hv, h, s.id, o.id, d, budget - o.cost - spend if budget is not None else None, promising
                )
                if offer is None:
                    ok = False
                    break
                needs.append((h, offer.id))
                spend += offer.cost if offer.kind == "pay" else 0.0
                if offer.kind == "promise":
                    promising.add(offer.target_slot)  # type: ignore[arg-type]
            if not ok:
                continue
            util = sum(hv.npcs[h].utilities[s.id][o.id] for h in s.stakeholders)
            key = (len(needs), -util)
            if best is None or key < best[0]:
                best = (key, o.id, needs)
        return None if best is None else (best[1], best[2])

    def _smallest_offer(
        self, obs: Observation, hv: HiddenView, npc: str, slot: str, option: str, deficit: float,
        budget: float | None, promising: set[str],
    ):
        """The cheapest offer that closes ``deficit`` (computed with the concession ``npc`` already
        has on ``option``). Offers do not stack: a new one *replaces* that concession, so it must be
        worth the concession plus the deficit; an offer worth no more than the concession adds
        nothing (the world answers ``repeated_offer``) and is never chosen."""
        pending = {c.target_slot for c in obs.commitments if c.status == "pending"} | promising
        had = _concession(obs, npc, slot, option)
        for off in sorted(obs.offers, key=lambda o: o.value):
            if off.value < had + deficit:  # deficit > 0: an offer no larger than ``had`` never qualifies
                continue
            if off.kind == "pay" and (budget is None or budget < off.cost + _reserve(obs, slot)):
                continue
            if off.kind == "promise":
                tgt = off.target_slot
                if tgt == slot or obs.slot(tgt).status != "open" or tgt in pending:  # type: ignore[arg-type]
                    continue
                if npc not in obs.slot(tgt).stakeholders:  # type: ignore[arg-type]
                    continue  # no say there: nothing to promise them (illegal)
                if not self._honourable(obs, hv, hv.preferred(npc, tgt), tgt):  # type: ignore[arg-type]
                    continue
            return off
        return None

    def _honourable(self, obs: Observation, hv: HiddenView, option: str, slot_id: str) -> bool:
        """Can ``option`` win ``slot_id`` with non-exclusive offers only (so a promise of it can be kept)?"""
        s = obs.slot(slot_id)
        o = next(x for x in s.options if x.id == option)
        if not o.available or set(o.tags) & hv.tags_to_invalidate:
            return False
        best_free = max((x.value for x in obs.offers if x.kind == "goodwill"), default=0.0)
        q = self._q(obs, hv, say(obs, Action("propose", slot=slot_id, option=option, npc="all")))
        for h in s.stakeholders:
            if option in hv.npcs[h].vetoes.get(slot_id, ()):
                return False
            if self._deficit(obs, hv, h, slot_id, option, q) > best_free:
                return False
        return True

    def _work_on(self, obs: Observation, hv: HiddenView, s: SlotView) -> Action | None:
        plan = self._plan(obs, hv, s)
        if plan is None:  # nothing is fully winnable: go for the option most people like
            options = [
                o for o in s.options
                if o.available and not any(o.id in hv.npcs[h].vetoes.get(s.id, ()) for h in s.stakeholders)
            ]
            if not options:
                return None
            best = max(options, key=lambda o: sum(hv.npcs[h].utilities[s.id][o.id] for h in s.stakeholders))
            if s.proposal == best.id and all(h in s.accepted_by for h in s.stakeholders):
                return say(obs, Action("finalize", slot=s.id, option=best.id))
            if s.proposal == best.id and all(h in s.accepted_by or h in s.rejected_by for h in s.stakeholders):
                return None  # asked everyone; not winnable
            plan = (best.id, [])
        option, needs = plan
        done = {(c.npc, c.offer) for c in obs.commitments if c.slot == s.id and c.option == option}
        for h, offer in needs:
            if (h, offer) not in done:
                return say(obs, Action("negotiate", npc=h, slot=s.id, option=option, offer=offer))
        if s.proposal != option:
            return say(obs, Action("propose", slot=s.id, option=option, npc="all"))
        if all(h in s.accepted_by for h in s.stakeholders):
            return say(obs, Action("finalize", slot=s.id, option=option))
        for h in s.stakeholders:
            if h not in s.accepted_by:
                return say(obs, Action("propose", slot=s.id, option=option, npc=h))
        return None


def _rejected_here(m: _ExpertMemory, s: SlotView, h: str) -> bool:
    """``h`` turned down the current proposal on ``s``, or an option on ``s`` was given up on."""
    return h in s.rejected_by or any(slot == s.id for (slot, _o) in m.tried)


def _reserve(obs: Observation, slot_id: str | None = None) -> float:
    """Budget to keep for the open decisions other than ``slot_id`` (their cheapest available option)."""
    return sum(
        min((o.cost for o in s.options if o.available), default=0.0)
        for s in obs.slots
        if s.status == "open" and s.id != slot_id
    )


def _offer(obs: Observation, offer_id: str):
    return next(o for o in obs.offers if o.id == offer_id)


def _concession(obs: Observation, npc: str, slot: str, option: str) -> float:
    """The concession ``npc`` holds on (``slot``, ``option``): the largest offer made on it (the
    world keeps one per triple; every offer that took effect left a commitment)."""
    return max((_offer(obs, c.offer).value for c in obs.commitments if (c.npc, c.slot, c.option) == (npc, slot, option)),
               default=0.0)
