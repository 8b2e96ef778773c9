"""The social world: seeded, forkable, partially observable.

``World(spec, seed)`` samples every hidden value from the spec's distributions with the
world's own :class:`~socialworld.world.rng.WorldRNG`, then advances one agent action per
:meth:`World.step`. State is split in two:

* :class:`PublicState` — what could be known by someone in the room (decisions, proposals,
  who accepted, what NPCs said, cues, commitments, announcements). The visibility function
  :func:`socialworld.world.visibility.observe` reads only this.
* :class:`NPCHidden` — utilities, vetoes, thresholds, mood, trust, engagement, patience,
  secrets; plus who must be repaired first in each conflict.

The NPC response model (its constants and the acceptance formula, shared with the oracle) is
:mod:`socialworld.world.npc`; the action and event handlers are :mod:`~socialworld.world.actions`
and :mod:`~socialworld.world.events`, which change the world through its public effects.

Step reward ``r_t = Phi_{t+1} - Phi_t - c_t`` with penalties ``c_t``: illegal/unparseable 0.2;
avoidable wait, redundant inquiry, wasted repair or approach, repeated offer 0.1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import lru_cache
from types import MappingProxyType
from typing import Literal, Sequence

from socialworld.core import (
    Action,
    Commitment,
    Fact,
    HiddenNPC,
    HiddenView,
    Line,
    MentalState,
    mood_bucket,
    preferred_option,
)
from socialworld.text.templates import NPC_REPLIES, STYLE_OPENERS
from socialworld.world.actions import HANDLERS
from socialworld.world.dialogue import assess, leaked_secrets
from socialworld.world.events import EVENTS
from socialworld.world.npc import (
    GOOD_RELATIONS_MIN,
    MOOD_W,
    PATIENCE,
    PENALTY_INVALID,
    PENALTY_WASTE,
    TRUST_VIOLATION_MOOD,
    acceptance_score,
    social_pressure,
)
from socialworld.world.rng import WorldRNG
from socialworld.world.spec import ScenarioSpec
from socialworld.world.state import NPCHidden, PublicState, SlotState, from_plain, to_plain

SNAPSHOT_VERSION = "world-snapshot-v1"

# Response-model constants (see module docstring).


@dataclass(frozen=True, slots=True)
class StepResult:
    executed: Action
    parse_status: Literal["ok", "unparseable", "illegal"]
    error: str | None
    penalty: float
    penalty_reasons: tuple[str, ...]
    reward: float
    phi_before: float
    phi_after: float
    q: float | None
    q_features: dict[str, float]
    leaked: tuple[str, ...]
    replies: tuple[Line, ...]
    announcements: tuple[str, ...]
    done: bool


class World:
    """One episode of one scenario. ``World(spec, seed)`` is fully determined by its inputs."""

    __slots__ = ("spec", "seed", "rng", "pub", "hid", "conflict_first", "schedule")

    def __init__(self, spec: ScenarioSpec, seed: int):
        self.spec = spec
        self.seed = int(seed)
        self.rng = WorldRNG(self.seed)
        self.hid: dict[str, NPCHidden] = {}
        self._sample_hidden()
        self.schedule: list[tuple[int, int]] = sorted(
            (self.rng.integers(int(e.at.low), int(e.at.high)), i) for i, e in enumerate(spec.events)
        )
        self.conflict_first: list[str] = []
        budget = spec.budget
        self.pub = PublicState(
            t=0,
            turns_left=spec.turn_budget,
            budget_left=budget,
            present={n.id: n.present for n in spec.npcs},
            cues={},
            slots={s.id: SlotState() for s in spec.slots},
            facts=[],
            commitments=[],
            conflicts=[],
            announcements=[],
            transcript=[],
            moves=[],
            invalid_tags=frozenset(),
            concessions={},
            revealed=frozenset(),
            confided=frozenset(),
            leaks=0,
            done=False,
            end_reason=None,
        )

    # ------------------------------------------------------------ sampling

    def _sample_npc(self, npc_id: str) -> NPCHidden:
        n = self.spec.npc(npc_id)
        r = self.rng
        utilities: dict[str, dict[str, float]] = {}
        vetoes: dict[str, frozenset[str]] = {}
        for slot_id, prefs in n.preferences.items():
            slot = self.spec.slot(slot_id)
            us, vs = {}, set()
            for opt in slot.option_ids:
                dist = prefs.get(opt) or prefs["default"]
                us[opt] = round(r.uniform(dist.range.low, dist.range.high), 4)
                if dist.veto > 0 and r.bernoulli(dist.veto):
                    vs.add(opt)
            if len(vs) == len(us):  # everyone can live with at least one option
                vs.discard(max(us, key=us.get))  # type: ignore[arg-type]
            utilities[slot_id] = us
            vetoes[slot_id] = frozenset(vs)
        return NPCHidden(
            utilities=utilities,
            vetoes=vetoes,
            threshold=round(r.uniform(n.threshold.low, n.threshold.high), 4),
            mood=round(r.uniform(n.mood.low, n.mood.high), 4),
            trust=1.0,
            engagement=0.0,
            patience=PATIENCE,
            grievance=False,
        )

    def _sample_hidden(self) -> None:
        spec = self.spec
        for _ in range(64):  # resampling budget for require_negotiation
            self.hid = {n.id: self._sample_npc(n.id) for n in spec.npcs}
            # each slot keeps at least one option no stakeholder vetoes
            for slot in spec.slots:
                holders = spec.stakeholders(slot.id)
                if all(any(o in self.hid[h].vetoes[slot.id] for h in holders) for o in slot.option_ids):
                    keep = self.rng.choice(slot.option_ids)
                    for h in holders:
                        self.hid[h].vetoes = {**self.hid[h].vetoes, slot.id: self.hid[h].vetoes[slot.id] - {keep}}
            if not spec.require_negotiation or not self._someone_pleases_all(spec.slots[0].id):
                return

    def _someone_pleases_all(self, slot_id: str) -> bool:
        holders = [h for h in self.spec.stakeholders(slot_id) if self.spec.npc(h).present]
        for opt in self.spec.slot(slot_id).option_ids:
            if all(
                opt not in self.hid[h].vetoes[slot_id]
                and self.hid[h].utilities[slot_id][opt] + MOOD_W * (self.hid[h].mood - 0.5) >= self.hid[h].threshold
                for h in holders
            ):
                return True
        return False

    # ------------------------------------------------------------ fork / snapshot

    def fork(self, reseed: int | None = None) -> World:
        """An independent copy (RNG position included); stepping it never changes ``self``.
        With ``reseed`` the copy's future NPC randomness comes from a fresh stream of that seed
        (the hidden state stays): independent rollouts from the same state."""
        w = object.__new__(World)
        w.spec = self.spec
        w.seed = self.seed
        w.rng = self.rng.fork() if reseed is None else WorldRNG(reseed)
        w.pub = self.pub.clone()
        w.hid = {k: h.clone() for k, h in self.hid.items()}
        w.conflict_first = list(self.conflict_first)
        w.schedule = self.schedule  # immutable after construction
        return w

    def snapshot(self) -> dict:
        """A JSON-serialisable, human-readable snapshot of the full state (the state dataclasses
        through :func:`~socialworld.world.state.to_plain`)."""
        return {
            "version": SNAPSHOT_VERSION,
            "scenario_id": self.spec.id,
            "spec_hash": self.spec.content_hash,
            "seed": self.seed,
            "rng": self.rng.state(),
            "schedule": [list(x) for x in self.schedule],
            "conflict_first": list(self.conflict_first),
            "hidden": {k: to_plain(h) for k, h in self.hid.items()},
            "public": to_plain(self.pub),
        }

    def snapshot_json(self) -> str:
        return json.dumps(self.snapshot(), sort_keys=True)

    @classmethod
    def restore(cls, snapshot: dict | str, spec: ScenarioSpec) -> World:
        """Rebuild a world from :meth:`snapshot` output (a dict or its JSON)."""
        snap: dict = json.loads(snapshot) if isinstance(snapshot, str) else snapshot
        if snap.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"unsupported snapshot version {snap.get('version')!r}")
        if snap["spec_hash"] != spec.content_hash:
            raise ValueError(f"snapshot was taken on a different spec than {spec.id}")
        w = object.__new__(World)
        w.spec = spec
        w.seed = int(snap["seed"])
        w.rng = WorldRNG.from_state(snap["rng"])
        w.schedule = [tuple(x) for x in snap["schedule"]]  # type: ignore[misc]
        w.conflict_first = list(snap["conflict_first"])
        w.hid = {k: from_plain(NPCHidden, h) for k, h in snap["hidden"].items()}
        w.pub = from_plain(PublicState, snap["public"], missing={"moves": []})  # snapshots written before moves existed have none
        return w

    def set_npc(self, npc: str, **values: object) -> None:
        """Set hidden values of ``npc`` (fields of :class:`~socialworld.world.state.NPCHidden`): the
        one way code outside the world changes a person, e.g. an episode chain carrying people over."""
        h = self.hid[npc]
        for name, value in values.items():
            if name not in NPCHidden.__dataclass_fields__:
                raise ValueError(f"an NPC has no hidden value {name!r}")
            setattr(h, name, value)

    # ------------------------------------------------------------ queries

    @property
    def done(self) -> bool:
        return self.pub.done

    @property
    def t(self) -> int:
        return self.pub.t

    def holders(self, slot_id: str) -> list[str]:
        """Present stakeholders of a slot."""
        p = self.pub.present
        return [h for h in self.spec.stakeholders(slot_id) if p[h]]

    def available(self, slot_id: str, option_id: str) -> bool:
        tags = self.spec.slot(slot_id).option(option_id).tags
        return not (self.pub.invalid_tags and any(t in self.pub.invalid_tags for t in tags))

    def preferred(self, npc: str, slot: str) -> str:
        h = self.hid[npc]
        return preferred_option(h.utilities[slot], h.vetoes[slot])

    def in_conflict(self, npc: str) -> str | None:
        """The other party of an unresolved conflict ``npc`` is in, if any."""
        for c in self.pub.conflicts:
            if not c.resolved and npc in c.npcs:
                return c.npcs[1] if c.npcs[0] == npc else c.npcs[0]
        return None

    def pending_events(self) -> bool:
        return any(turn > self.pub.t for turn, _ in self.schedule)

    def progress(self) -> float:
        """Phi in [0, 1]: mean over achievement sub-goals (slots, and conflicts once announced
        or scheduled) of: finalized 1, lost 0, open = share of present stakeholders that accepted
        the current proposal; a conflict counts repaired-in-order / 2."""
        total, n = 0.0, 0
        for slot_id, s in self.pub.slots.items():
            n += 1
            if s.status == "finalized":
                total += 1.0
            elif s.status == "open" and s.proposal is not None:
                holders = self.holders(slot_id)
                if holders:
                    total += sum(1 for h in holders if s.responses.get(h)) / len(holders)
        n_conflicts = self.spec.n_conflicts
        for c in self.pub.conflicts:
            total += 1.0 if c.resolved else len(c.repaired) / 2
        return total / (n + n_conflicts)

    def subgoals(self) -> dict[str, bool]:
        """Every sub-goal and whether it is met now (guards judged as if the episode ended now)."""
        p = self.pub
        out = {f"slot:{k}": s.status == "finalized" for k, s in p.slots.items()}
        for i, e in enumerate(e for e in self.spec.events if e.kind == "conflict"):
            c = p.conflicts[i] if i < len(p.conflicts) else None
            out[f"conflict:{'-'.join(sorted(e.npcs))}"] = bool(c and c.resolved)
        for g in self.spec.guards:
            if g == "no_secret_leaked":
                out[g] = p.leaks == 0
            elif g == "commitments_honoured":
                out[g] = all(c.status != "broken" for c in self._commitments_at_end())
            elif g == "within_budget":
                out[g] = p.budget_left is not None and p.budget_left >= 0
            elif g == "good_relations":
                out[g] = all(self.hid[k].mood >= GOOD_RELATIONS_MIN for k, here in p.present.items() if here)
        return out

    def _commitments_at_end(self) -> list[Commitment]:
        return [
            c if c.status != "pending" or c.target_slot is None else replace(c, status="broken") for c in self.pub.commitments
        ]

    def truth(self) -> MentalState:
        """The true mental state the agent should estimate (present NPCs, their slots)."""
        prefs: dict[str, dict[str, str]] = {}
        for slot in self.spec.slots:
            for h in self.holders(slot.id):
                prefs.setdefault(h, {})[slot.id] = self.preferred(h, slot.id)
        moods = {k: mood_bucket(self.hid[k].mood) for k, here in self.pub.present.items() if here}
        return MentalState(prefs, moods)

    def moods(self) -> dict[str, float]:
        return {k: self.hid[k].mood for k in self.spec.npc_ids}

    def hidden_view(self) -> HiddenView:
        """Hidden state for privileged policies (the oracle) and for scoring."""
        npcs = {
            k: HiddenNPC(
                utilities=MappingProxyType(h.utilities),
                vetoes=MappingProxyType(h.vetoes),
                threshold=h.threshold,
                mood=h.mood,
                engagement=h.engagement,
                secret=(self.spec.npc(k).secret.text if self.spec.npc(k).secret else None),  # type: ignore[union-attr]
            )
            for k, h in self.hid.items()
        }
        soon = frozenset(
            tag
            for turn, i in self.schedule
            if turn > self.pub.t and self.spec.events[i].kind == "weather_change" and (tag := self.spec.events[i].tag) is not None
        )
        return HiddenView(
            npcs=MappingProxyType(npcs),
            conflict_first=MappingProxyType({c.npcs: f for c, f in zip(self.pub.conflicts, self.conflict_first)}),
            tags_to_invalidate=soon,
            spec=self.spec,
            fork=self.fork,
        )

    # ------------------------------------------------------------ legality

    def check_legal(self, a: Action) -> str | None:
        """None if ``a`` is legal now, else the reason it is not."""
        spec, p = self.spec, self.pub
        k = a.kind
        if k in ("wait", "end"):
            return None
        if k in ("approach", "inquire", "negotiate", "repair"):
            if a.npc not in p.present:
                return f"unknown npc {a.npc!r}"
            if not p.present[a.npc]:
                return f"{a.npc} is not here"
            if k in ("approach", "repair"):
                return None
        if a.slot not in p.slots:
            return f"unknown slot {a.slot!r}"
        s = p.slots[a.slot]
        if s.status != "open":
            return f"slot {a.slot} is {s.status}"
        if k == "inquire":
            return None if a.npc in spec.stakeholders(a.slot) else f"{a.npc} has no say on {a.slot}"
        if a.option not in spec.slot(a.slot).option_ids:
            return f"unknown option {a.option!r} for {a.slot}"
        if not self.available(a.slot, a.option):
            return f"option {a.option} is no longer available"
        if k == "propose":
            if a.npc == "all":
                return None
            if a.npc not in p.present or not p.present[a.npc]:
                return f"{a.npc!r} is not here"
            return None if a.npc in spec.stakeholders(a.slot) else f"{a.npc} has no say on {a.slot}"
        if k == "negotiate":
            if a.npc not in spec.stakeholders(a.slot):
                return f"{a.npc} has no say on {a.slot}"
            try:
                offer = spec.offer(a.offer or "")
            except KeyError:
                return f"unknown offer {a.offer!r}"
            if offer.kind == "promise":
                if offer.target_slot == a.slot:
                    return "a promise must concern another decision"
                if a.npc not in spec.stakeholders(offer.target_slot):  # type: ignore[arg-type]
                    return f"{a.npc} has no say on {offer.target_slot}: nothing to promise them there"
                if p.slots[offer.target_slot].status != "open":  # type: ignore[index]
                    return f"cannot promise on {offer.target_slot}: it is {p.slots[offer.target_slot].status}"  # type: ignore[index]
            if offer.kind == "pay" and (p.budget_left or 0) < offer.cost:
                return "not enough budget left for that offer"
            return None
        return None  # finalize

    # ------------------------------------------------------------ stepping

    def step(self, action: Action | None, parse_error: str | None = None) -> StepResult:
        """Advance one turn. ``action=None`` means the policy's output was unparseable."""
        if self.pub.done:
            raise RuntimeError("episode is over")
        p = self.pub
        phi_before = self.progress()
        penalty, reasons = 0.0, []
        replies: list[Line] = []
        q, feats = None, {}
        leaked: tuple[str, ...] = ()
        status: Literal["ok", "unparseable", "illegal"] = "ok"
        error = parse_error
        executed: Action
        if action is None:
            status, executed = "unparseable", Action("wait")
            penalty, reasons = PENALTY_INVALID, ["unparseable"]
        else:
            error = self.check_legal(action)
            executed = action
            if error is not None:
                status, executed = "illegal", Action("wait", utterance=action.utterance)
                penalty, reasons = PENALTY_INVALID, ["illegal"]
        p.moves.append("(unparseable)" if action is None else action.key + (" (illegal)" if status == "illegal" else ""))
        if executed.utterance:
            p.transcript.append(Line(p.t, "agent", executed.utterance))
        if status == "illegal" and executed.utterance:  # said aloud all the same: a leak is a leak
            assert action is not None
            to = action.npc if action.npc is not None and p.present.get(action.npc) else None
            leaked = leaked_secrets(self.spec, executed.utterance, to, p.confided)
            p.leaks += len(leaked)
        if status == "ok":
            score = assess(self.spec, executed, p.facts, p.confided)
            q, feats, leaked = score.q, score.features, score.leaked
            if leaked:
                p.leaks += len(leaked)
            waste = HANDLERS[executed.kind](self, executed, q, replies)
            if waste:
                penalty += PENALTY_WASTE
                reasons.append(waste)
        p.transcript.extend(replies)
        p.t += 1
        p.turns_left -= 1
        fired = self._fire_events()
        if executed.kind == "end" and status == "ok":
            self._close("end")
        elif p.turns_left <= 0:
            self._close("turn_budget")
        phi_after = self.progress()
        return StepResult(
            executed=executed,
            parse_status=status,
            error=error,
            penalty=penalty,
            penalty_reasons=tuple(reasons),
            reward=phi_after - phi_before - penalty,
            phi_before=phi_before,
            phi_after=phi_after,
            q=q,
            q_features=feats,
            leaked=leaked,
            replies=tuple(replies),
            announcements=tuple(fired),
            done=p.done,
        )

    def revoice(self, texts: Sequence[str]) -> None:
        """The last step's replies (the transcript's last ``len(texts)`` lines) in other words, as a voice
        wrote them (:mod:`socialworld.world.voice`). Only the transcript's text changes: no rule reads it."""
        lines = self.pub.transcript
        start = len(lines) - len(texts)
        if start < 0 or any(ln.speaker == "agent" for ln in lines[start:]):
            raise ValueError(f"revoice: the transcript's last {len(texts)} lines are not all replies")
        lines[start:] = [Line(ln.step, ln.speaker, t) for ln, t in zip(lines[start:], texts)]

    def _close(self, reason: str) -> None:
        p = self.pub
        p.done, p.end_reason = True, reason
        # promises that can no longer be kept are broken at the end
        for i, c in enumerate(p.commitments):
            if c.status == "pending" and c.target_slot is not None:
                p.commitments[i] = replace(c, status="broken")
                self.hurt(c.npc, TRUST_VIOLATION_MOOD)

    # ------------------------------------------------------------ helpers

    def say(self, npc: str, key: str, replies: list[Line], **kw) -> None:
        n = self.spec.npc(npc)
        text = NPC_REPLIES[key].format(open=STYLE_OPENERS[n.style], **kw)
        replies.append(Line(self.pub.t, npc, text[0].upper() + text[1:]))

    def cue(self, npc: str) -> None:
        self.pub.cues[npc] = mood_bucket(self.hid[npc].mood)

    def hurt(self, npc: str, amount: float) -> None:
        h = self.hid[npc]
        h.mood = max(0.0, h.mood - amount)

    def cheer(self, npc: str, amount: float) -> None:
        h = self.hid[npc]
        h.mood = min(1.0, h.mood + amount)

    def label(self, slot: str, option: str) -> str:
        return self.spec.slot(slot).option(option).label

    def stated_against(self, npc: str, slot: str, option: str) -> bool:
        return any(
            f.npc == npc and f.slot == slot and f.option == option and f.kind in ("vetoes", "dislikes") for f in self.pub.facts
        )

    def add_fact(self, npc: str, kind: str, slot: str | None, option: str | None, text: str = "") -> None:
        self.pub.facts.append(Fact(npc, kind, slot, option, self.pub.t, text))  # type: ignore[arg-type]

    def accepts(self, npc: str, slot: str, option: str, q: float) -> bool:
        h = self.hid[npc]
        if option in h.vetoes[slot] or self.in_conflict(npc):
            return False
        return acceptance_score(
            h.utilities[slot][option],
            h.mood,
            self.pub.concessions.get((npc, slot, option), 0.0),
            self._pressure(npc, slot, option),
            q,
        ) >= h.threshold

    def _pressure(self, npc: str, slot: str, option: str) -> float:
        s = self.pub.slots[slot]
        if s.proposal != option:
            return 0.0
        holders = self.holders(slot)
        return social_pressure(self.spec, npc, [j for j in holders if j != npc and s.responses.get(j)], len(holders))

    def respond(self, npc: str, slot: str, option: str, q: float, replies: list[Line]) -> bool:
        """``npc`` answers the current proposal ``option`` on ``slot``; records the response."""
        h = self.hid[npc]
        ok = self.accepts(npc, slot, option, q)
        self.pub.slots[slot].responses[npc] = ok
        label = self.label(slot, option)
        other = self.in_conflict(npc)
        if ok:
            self.say(npc, "accept", replies, option=label)
        elif other is not None:
            self.say(npc, "reject_conflict", replies, other=self.spec.npc(other).name)
        elif option in h.vetoes[slot]:
            self.say(npc, "reject_veto", replies, option=label)
            self.add_fact(npc, "vetoes", slot, option)
        else:
            h.patience -= 1
            if h.patience < 0:
                self.hurt(npc, 0.05)
            fav = self.preferred(npc, slot)
            if fav != option and self.rng.bernoulli(self.spec.npc(npc).traits.openness):
                self.say(npc, "reject_dislike_fav", replies, option=label, fav=self.label(slot, fav))
                self.add_fact(npc, "prefers", slot, fav)
            else:
                self.say(npc, "reject_dislike", replies, option=label)
            self.add_fact(npc, "dislikes", slot, option)
        return ok

    # ------------------------------------------------------------ events

    def _fire_events(self) -> list[str]:
        fired = []
        t = self.pub.t
        for turn, i in self.schedule:
            if turn == t:
                e = self.spec.events[i]
                text = EVENTS[e.kind](self, e)
                self.pub.announcements.append(text)
                fired.append(text)
        return fired


@lru_cache(maxsize=64)
def subgoal_names(spec: ScenarioSpec) -> tuple[str, ...]:
    """Names of a scenario's sub-goals: ``slot:<id>``, ``conflict:<a>-<b>``, then guards."""
    conflicts = [f"conflict:{'-'.join(sorted(e.npcs))}" for e in spec.events if e.kind == "conflict"]
    return (*(f"slot:{s}" for s in spec.slot_ids), *conflicts, *spec.guards)


__all__ = ["World", "StepResult", "acceptance_score"]
