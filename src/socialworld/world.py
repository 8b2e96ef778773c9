"""The social world: seeded, forkable, partially observable.

``World(spec, seed)`` samples every hidden value from the spec's distributions with the
world's own :class:`~socialworld.rng.WorldRNG`, then advances one agent action per
:meth:`World.step`. State is split in two:

* :class:`PublicState` — what could be known by someone in the room (decisions, proposals,
  who accepted, what NPCs said, cues, commitments, announcements). The visibility function
  :func:`socialworld.visibility.observe` reads only this.
* :class:`NPCHidden` — utilities, vetoes, thresholds, mood, trust, engagement, patience,
  secrets; plus who must be repaired first in each conflict.

NPC response model (all constants below are module-level and documented)::

    accept(i, option) iff not vetoed and not in an unresolved conflict and
        u_i(option) + MOOD_W*(mood_i - 0.5) + concession_i + pressure_i + DIALOGUE_W*(q - 0.5)
        >= threshold_i
    pressure_i = PRESSURE_W * agreeableness_i * sum_{j accepted} influence_j / max(1, n - 1)
    p_truth(inquire) = clip(0.25 + 0.4*openness + 0.3*engagement + 0.2*(mood - 0.5), 0.05, 0.98)

Step reward ``r_t = Phi_{t+1} - Phi_t - c_t`` with penalties ``c_t``: illegal/unparseable 0.2;
avoidable wait, redundant inquiry, wasted repair or approach, repeated offer 0.1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType
from typing import Literal

from .core import (
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
from .dialogue import assess, leaked_secrets
from .rng import WorldRNG
from .spec import EventSpec, ScenarioSpec
from .templates import ANNOUNCEMENTS, NPC_REPLIES, STYLE_OPENERS

SNAPSHOT_VERSION = "world-snapshot-v1"

# Response-model constants (see module docstring).
MOOD_W = 0.3
DIALOGUE_W = 0.15
PRESSURE_W = 0.12
DIALOGUE_MOOD_NUDGE = 0.06
PENALTY_INVALID = 0.2
PENALTY_WASTE = 0.1
APPROACH_GAIN = 0.4
REPAIR_GAIN = 0.25
REPAIR_NEEDED_BELOW = 0.45
GOOD_RELATIONS_MIN = 0.3
TRUST_VIOLATION_MOOD = 0.35
CONFLICT_DROP = (0.3, 0.15)  # (first, second)
WRONG_ORDER_DROP = 0.15
PATIENCE = 3


@dataclass(slots=True)
class NPCHidden:
    utilities: dict[str, dict[str, float]]  # copy-on-write: replaced, never mutated in place
    vetoes: dict[str, frozenset[str]]  # copy-on-write
    threshold: float
    mood: float
    trust: float
    engagement: float
    patience: int
    grievance: bool

    def clone(self) -> NPCHidden:
        return NPCHidden(
            self.utilities, self.vetoes, self.threshold, self.mood, self.trust, self.engagement, self.patience, self.grievance
        )


@dataclass(slots=True)
class SlotState:
    status: Literal["open", "finalized", "lost"] = "open"
    choice: str | None = None
    proposal: str | None = None
    responses: dict[str, bool] = field(default_factory=dict)  # npc -> accepted current proposal

    def clone(self) -> SlotState:
        return SlotState(self.status, self.choice, self.proposal, dict(self.responses))


@dataclass(slots=True)
class ConflictState:
    npcs: tuple[str, str]  # in announcement order (public)
    repaired: list[str]  # correctly ordered repairs so far (public)
    resolved: bool = False

    def clone(self) -> ConflictState:
        return ConflictState(self.npcs, list(self.repaired), self.resolved)


@dataclass(slots=True)
class PublicState:
    t: int
    turns_left: int
    budget_left: float | None
    present: dict[str, bool]
    cues: dict[str, str]  # npc -> mood bucket as last observed (a proxy)
    slots: dict[str, SlotState]
    facts: list[Fact]
    commitments: list[Commitment]
    conflicts: list[ConflictState]
    announcements: list[str]
    transcript: list[Line]
    moves: list[str]  # the agent's own actions so far, canonical form (see observe)
    invalid_tags: frozenset[str]
    concessions: dict[tuple[str, str, str], float]  # (npc, slot, option) -> bonus offered
    revealed: frozenset[tuple[str, str]]  # (npc, slot) answered truthfully
    confided: frozenset[str]
    leaks: int
    done: bool
    end_reason: str | None

    def clone(self) -> PublicState:
        return PublicState(
            self.t,
            self.turns_left,
            self.budget_left,
            dict(self.present),
            dict(self.cues),
            {k: s.clone() for k, s in self.slots.items()},
            list(self.facts),
            list(self.commitments),
            [c.clone() for c in self.conflicts],
            list(self.announcements),
            list(self.transcript),
            list(self.moves),
            self.invalid_tags,
            dict(self.concessions),
            self.revealed,
            self.confided,
            self.leaks,
            self.done,
            self.end_reason,
        )


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
        """A JSON-serialisable, human-readable snapshot of the full state."""
        p = self.pub
        return {
            "version": SNAPSHOT_VERSION,
            "scenario_id": self.spec.id,
            "spec_hash": self.spec.content_hash,
            "seed": self.seed,
            "rng": self.rng.state(),
            "schedule": [list(x) for x in self.schedule],
            "conflict_first": list(self.conflict_first),
            "hidden": {
                k: {
                    "utilities": h.utilities,
                    "vetoes": {s: sorted(v) for s, v in h.vetoes.items()},
                    "threshold": h.threshold,
                    "mood": h.mood,
                    "trust": h.trust,
                    "engagement": h.engagement,
                    "patience": h.patience,
                    "grievance": h.grievance,
                }
                for k, h in self.hid.items()
            },
            "public": {
                "t": p.t,
                "turns_left": p.turns_left,
                "budget_left": p.budget_left,
                "present": p.present,
                "cues": p.cues,
                "slots": {
                    k: {"status": s.status, "choice": s.choice, "proposal": s.proposal, "responses": s.responses}
                    for k, s in p.slots.items()
                },
                "facts": [_dc(f) for f in p.facts],
                "commitments": [_dc(c) for c in p.commitments],
                "conflicts": [{"npcs": list(c.npcs), "repaired": c.repaired, "resolved": c.resolved} for c in p.conflicts],
                "announcements": p.announcements,
                "transcript": [_dc(x) for x in p.transcript],
                "moves": list(p.moves),
                "invalid_tags": sorted(p.invalid_tags),
                "concessions": [[*k, v] for k, v in p.concessions.items()],
                "revealed": sorted(list(x) for x in p.revealed),
                "confided": sorted(p.confided),
                "leaks": p.leaks,
                "done": p.done,
                "end_reason": p.end_reason,
            },
        }

    def snapshot_json(self) -> str:
        return json.dumps(self.snapshot(), sort_keys=True)

    @classmethod
    def restore(cls, snap: dict | str, spec: ScenarioSpec) -> World:
        """Rebuild a world from :meth:`snapshot` output (a dict or its JSON)."""
        if isinstance(snap, str):
            snap = json.loads(snap)
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
        w.hid = {
            k: NPCHidden(
                utilities={s: dict(u) for s, u in h["utilities"].items()},
                vetoes={s: frozenset(v) for s, v in h["vetoes"].items()},
                threshold=h["threshold"],
                mood=h["mood"],
                trust=h["trust"],
                engagement=h["engagement"],
                patience=h["patience"],
                grievance=h["grievance"],
            )
            for k, h in snap["hidden"].items()
        }
        p = snap["public"]
        w.pub = PublicState(
            t=p["t"],
            turns_left=p["turns_left"],
            budget_left=p["budget_left"],
            present=dict(p["present"]),
            cues=dict(p["cues"]),
            slots={k: SlotState(s["status"], s["choice"], s["proposal"], dict(s["responses"])) for k, s in p["slots"].items()},
            facts=[Fact(**f) for f in p["facts"]],
            commitments=[Commitment(**c) for c in p["commitments"]],
            conflicts=[ConflictState(tuple(c["npcs"]), list(c["repaired"]), c["resolved"]) for c in p["conflicts"]],  # type: ignore[arg-type]
            announcements=list(p["announcements"]),
            transcript=[Line(**x) for x in p["transcript"]],
            moves=list(p.get("moves", ())),  # snapshots written before moves existed have none
            invalid_tags=frozenset(p["invalid_tags"]),
            concessions={(a, b, c): v for a, b, c, v in p["concessions"]},
            revealed=frozenset(tuple(x) for x in p["revealed"]),  # type: ignore[misc]
            confided=frozenset(p["confided"]),
            leaks=p["leaks"],
            done=p["done"],
            end_reason=p["end_reason"],
        )
        return w

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
            c if c.status != "pending" or c.target_slot is None else _replace(c, status="broken") for c in self.pub.commitments
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
            self.spec.events[i].tag  # type: ignore[misc]
            for turn, i in self.schedule
            if turn > self.pub.t and self.spec.events[i].kind == "weather_change"
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
        q, feats, leaked = None, {}, ()
        status: Literal["ok", "unparseable", "illegal"] = "ok"
        error = parse_error
        executed = action
        if action is None:
            status, executed = "unparseable", Action("wait")
            penalty, reasons = PENALTY_INVALID, ["unparseable"]
        else:
            error = self.check_legal(action)
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
            assert executed is not None
            score = assess(self.spec, executed, p.facts, p.confided)
            q, feats, leaked = score.q, score.features, score.leaked
            if leaked:
                p.leaks += len(leaked)
            waste = _HANDLERS[executed.kind](self, executed, q, replies)
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

    def _close(self, reason: str) -> None:
        p = self.pub
        p.done, p.end_reason = True, reason
        # promises that can no longer be kept are broken at the end
        for i, c in enumerate(p.commitments):
            if c.status == "pending" and c.target_slot is not None:
                p.commitments[i] = _replace(c, status="broken")
                self._hurt(c.npc, TRUST_VIOLATION_MOOD)

    # ------------------------------------------------------------ helpers

    def _say(self, npc: str, key: str, replies: list[Line], **kw) -> None:
        n = self.spec.npc(npc)
        text = NPC_REPLIES[key].format(open=STYLE_OPENERS[n.style], **kw)
        replies.append(Line(self.pub.t, npc, text[0].upper() + text[1:]))

    def _cue(self, npc: str) -> None:
        self.pub.cues[npc] = mood_bucket(self.hid[npc].mood)

    def _hurt(self, npc: str, amount: float) -> None:
        h = self.hid[npc]
        h.mood = max(0.0, h.mood - amount)

    def _cheer(self, npc: str, amount: float) -> None:
        h = self.hid[npc]
        h.mood = min(1.0, h.mood + amount)

    def _label(self, slot: str, option: str) -> str:
        return self.spec.slot(slot).option(option).label

    def _stated_against(self, npc: str, slot: str, option: str) -> bool:
        return any(
            f.npc == npc and f.slot == slot and f.option == option and f.kind in ("vetoes", "dislikes") for f in self.pub.facts
        )

    def _fact(self, npc: str, kind: str, slot: str | None, option: str | None, text: str = "") -> None:
        self.pub.facts.append(Fact(npc, kind, slot, option, self.pub.t, text))  # type: ignore[arg-type]

    def _accepts(self, npc: str, slot: str, option: str, q: float) -> bool:
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
        infl = sum(self.spec.npc(j).traits.influence for j in holders if j != npc and s.responses.get(j))
        return PRESSURE_W * self.spec.npc(npc).traits.agreeableness * infl / max(1, len(holders) - 1)

    def _respond(self, npc: str, slot: str, option: str, q: float, replies: list[Line]) -> bool:
        """``npc`` answers the current proposal ``option`` on ``slot``; records the response."""
        h = self.hid[npc]
        ok = self._accepts(npc, slot, option, q)
        self.pub.slots[slot].responses[npc] = ok
        label = self._label(slot, option)
        other = self.in_conflict(npc)
        if ok:
            self._say(npc, "accept", replies, option=label)
        elif other is not None:
            self._say(npc, "reject_conflict", replies, other=self.spec.npc(other).name)
        elif option in h.vetoes[slot]:
            self._say(npc, "reject_veto", replies, option=label)
            self._fact(npc, "vetoes", slot, option)
        else:
            h.patience -= 1
            if h.patience < 0:
                self._hurt(npc, 0.05)
            fav = self.preferred(npc, slot)
            if fav != option and self.rng.bernoulli(self.spec.npc(npc).traits.openness):
                self._say(npc, "reject_dislike_fav", replies, option=label, fav=self._label(slot, fav))
                self._fact(npc, "prefers", slot, fav)
            else:
                self._say(npc, "reject_dislike", replies, option=label)
            self._fact(npc, "dislikes", slot, option)
        return ok

    # ------------------------------------------------------------ events

    def _fire_events(self) -> list[str]:
        fired = []
        t = self.pub.t
        for turn, i in self.schedule:
            if turn == t:
                e = self.spec.events[i]
                text = _EVENTS[e.kind](self, e)
                self.pub.announcements.append(text)
                fired.append(text)
        return fired


@lru_cache(maxsize=64)
def subgoal_names(spec: ScenarioSpec) -> tuple[str, ...]:
    """Names of a scenario's sub-goals: ``slot:<id>``, ``conflict:<a>-<b>``, then guards."""
    conflicts = [f"conflict:{'-'.join(sorted(e.npcs))}" for e in spec.events if e.kind == "conflict"]
    return (*(f"slot:{s}" for s in spec.slot_ids), *conflicts, *spec.guards)


def acceptance_score(utility: float, mood: float, concession: float, pressure: float, q: float) -> float:
    """``u + MOOD_W*(mood-0.5) + concession + pressure + DIALOGUE_W*(q-0.5)``."""
    return utility + MOOD_W * (mood - 0.5) + concession + pressure + DIALOGUE_W * (q - 0.5)


def _dc(obj) -> dict:
    return {k: getattr(obj, k) for k in obj.__slots__}


def _replace(obj, **kw):
    d = _dc(obj)
    d.update(kw)
    return type(obj)(**d)


# ---------------------------------------------------------------- action handlers
# Each handler applies one legal action and returns a waste reason (penalised) or None.


def _nudge(w: World, npc: str, q: float) -> None:
    w._cheer(npc, DIALOGUE_MOOD_NUDGE * (q - 0.5))


def _approach(w: World, a: Action, q: float, replies: list[Line]) -> str | None:
    h = w.hid[a.npc]  # type: ignore[index]
    wasted = h.engagement >= 0.8
    h.engagement = min(1.0, h.engagement + APPROACH_GAIN)
    if not wasted:
        w._cheer(a.npc, 0.03)  # type: ignore[arg-type]
    _nudge(w, a.npc, q)  # type: ignore[arg-type]
    w._say(a.npc, "approach_again" if wasted else "approach", replies)  # type: ignore[arg-type]
    w._cue(a.npc)  # type: ignore[arg-type]
    return "wasted_approach" if wasted else None


def _inquire(w: World, a: Action, q: float, replies: list[Line]) -> str | None:
    npc, slot = a.npc, a.slot
    assert npc is not None and slot is not None
    h, n = w.hid[npc], w.spec.npc(npc)
    slot_label = w.spec.slot(slot).label
    _nudge(w, npc, q)
    waste = None
    if (npc, slot) in w.pub.revealed:
        w._hurt(npc, 0.04 * (1 + n.traits.sensitivity))
        w._say(npc, "inquire_repeat", replies, slot=slot_label)
        waste = "redundant_inquiry"
    else:
        p_truth = min(0.98, max(0.05, 0.25 + 0.4 * n.traits.openness + 0.3 * h.engagement + 0.2 * (h.mood - 0.5)))
        if w.rng.bernoulli(p_truth):
            fav = w.preferred(npc, slot)
            vetoes = sorted(h.vetoes[slot])
            vtext = NPC_REPLIES["inquire_vetoes"].format(vetoes=", ".join(w._label(slot, v) for v in vetoes)) if vetoes else ""
            w._say(npc, "inquire_truth", replies, slot=slot_label, fav=w._label(slot, fav), vetoes=vtext)
            w._fact(npc, "prefers", slot, fav)
            for v in vetoes:
                w._fact(npc, "vetoes", slot, v)
            w.pub.revealed = w.pub.revealed | {(npc, slot)}
            if n.secret is not None and npc not in w.pub.confided and h.engagement >= 0.5:
                w._say(npc, "confide", replies, secret=n.secret.text)
                w._fact(npc, "secret", None, None, n.secret.text)
                w.pub.confided = w.pub.confided | {npc}
        else:
            w._say(npc, "inquire_vague", replies, slot=slot_label)
            w._fact(npc, "vague", slot, None)
    h.engagement = min(1.0, h.engagement + 0.1)
    w._cue(npc)
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
        if w._stated_against(npc, slot, option):
            w._hurt(npc, 0.06 * (1 + w.spec.npc(npc).traits.sensitivity))
        _nudge(w, npc, q)
        w._respond(npc, slot, option, q, replies)
        w._cue(npc)
    return None


def _negotiate(w: World, a: Action, q: float, replies: list[Line]) -> str | None:
    npc, slot, option = a.npc, a.slot, a.option
    assert npc is not None and slot is not None and option is not None
    offer = w.spec.offer(a.offer)  # type: ignore[arg-type]
    p = w.pub
    _nudge(w, npc, q)
    key = (npc, slot, option)
    if p.concessions.get(key, 0.0) >= offer.value:
        w._say(npc, "negotiate_noted", replies)
        w._cue(npc)
        return "repeated_offer"
    p.concessions[key] = offer.value
    target_option = None
    if offer.kind == "promise":
        target_option = w.preferred(npc, offer.target_slot)  # type: ignore[arg-type]
        w._fact(npc, "prefers", offer.target_slot, target_option)
    if offer.kind == "pay":
        p.budget_left = (p.budget_left or 0.0) - offer.cost
    p.commitments.append(
        Commitment(npc, offer.id, slot, option, offer.target_slot, target_option,
                   "pending" if offer.kind == "promise" else "kept", p.t)
    )
    if p.slots[slot].proposal == option:
        ok = w._accepts(npc, slot, option, q)
        p.slots[slot].responses[npc] = ok
    else:
        ok = w._accepts(npc, slot, option, q)
    label = w._label(slot, option)
    w._say(npc, "negotiate_accept" if ok else "negotiate_reject", replies, option=label)
    if offer.kind == "promise" and ok:
        replies[-1] = Line(replies[-1].step, npc, replies[-1].text + NPC_REPLIES["promise_terms"].format(
            target=w._label(offer.target_slot, target_option), target_slot=w.spec.slot(offer.target_slot).label))  # type: ignore[arg-type]
    w._cue(npc)
    return None


def _soothe(w: World, npc: str, q: float, replies: list[Line]) -> None:
    w.hid[npc].grievance = False
    w._cheer(npc, REPAIR_GAIN)
    _nudge(w, npc, q)
    w._say(npc, "repair_ok", replies)
    w._cue(npc)


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
            w._hurt(first, WRONG_ORDER_DROP)
            w._say(first, "repair_wrong_order", replies, other=w.spec.npc(second).name)
            w._cue(first)
            w._cheer(npc, REPAIR_GAIN / 2)
            w._cue(npc)
            return None
        else:
            break  # already repaired, waiting for the other party: wasted
        _soothe(w, npc, q, replies)
        return None
    else:
        if h.grievance or h.mood < REPAIR_NEEDED_BELOW:
            _soothe(w, npc, q, replies)
            return None
    w._say(npc, "repair_wasted", replies)
    w._cue(npc)
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
    label = w._label(slot, option)
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
                w._hurt(h, 0.1)
                w._say(h, "finalize_refuse", replies, option=label)
                w._cue(h)
        _settle_commitments(w, slot, replies)
    return None


def _settle_commitments(w: World, slot: str, replies: list[Line]) -> None:
    p = w.pub
    s = p.slots[slot]
    for i, c in enumerate(p.commitments):
        if c.status != "pending" or c.target_slot != slot:
            continue
        if s.status == "finalized" and s.choice == c.target_option:
            p.commitments[i] = _replace(c, status="kept")
        else:
            p.commitments[i] = _replace(c, status="broken")
            w._hurt(c.npc, TRUST_VIOLATION_MOOD)
            w.hid[c.npc].trust = max(0.0, w.hid[c.npc].trust - 0.5)
            w._say(c.npc, "broken_promise", replies, target=w._label(slot, c.target_option),  # type: ignore[arg-type]
                   target_slot=w.spec.slot(slot).label)
            w._cue(c.npc)


def _end(w: World, a: Action, q: float, replies: list[Line]) -> str | None:
    return None


_HANDLERS = {
    "approach": _approach,
    "inquire": _inquire,
    "propose": _propose,
    "negotiate": _negotiate,
    "repair": _repair,
    "wait": _wait,
    "finalize": _finalize,
    "end": _end,
}

# ---------------------------------------------------------------- events (L2 dynamics)


def _ev_weather(w: World, e: EventSpec) -> str:
    p = w.pub
    p.invalid_tags = p.invalid_tags | {e.tag}  # type: ignore[operator]
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
            p.commitments[i] = _replace(c, status="void")
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
    w._fact(npc, "unsettled", slot, None)
    return e.text or ANNOUNCEMENTS["preference_change"].format(name=w.spec.npc(npc).name, slot=w.spec.slot(slot).label)


def _ev_conflict(w: World, e: EventSpec) -> str:
    a, b = e.npcs
    order = tuple(w.rng.shuffled((a, b)))
    first = w.rng.choice((a, b))
    w.pub.conflicts.append(ConflictState(order, []))  # type: ignore[arg-type]
    w.conflict_first.append(first)
    second = b if first == a else a
    w._hurt(first, CONFLICT_DROP[0])
    w._hurt(second, CONFLICT_DROP[1])
    for npc in (a, b):
        w.hid[npc].grievance = True
        for s in w.pub.slots.values():
            if s.status == "open":
                s.responses.pop(npc, None)
    return e.text


_EVENTS = {
    "weather_change": _ev_weather,
    "budget_cut": _ev_budget_cut,
    "participant_leaves": _ev_leaves,
    "late_arrival": _ev_arrives,
    "preference_change": _ev_pref_change,
    "conflict": _ev_conflict,
}

__all__ = ["World", "StepResult", "acceptance_score"]
