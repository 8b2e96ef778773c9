"""Sleep phase (contract §7): wake episodes -> counterfactual preference pairs -> screening ->
strict gating, with a report that counts every exclusion by reason.

* **Counterfactuals** — each decision step of a wake episode is replayed exactly (the replay
  checks every recorded reward), the world is forked, and each candidate action is scored by
  ``rollouts`` continuations of the ``continuation`` policy (common random numbers: rollout m of
  every candidate uses the same reseed). Provenance: ``simulator_rollout(<policy>, M, horizon)``.
* **Action track** (step level) — prompt = the policy's prompt at that step; chosen = the best
  candidate as a whole turn (:func:`~socialworld.agents.lm.policy.target_turn`): its belief is
  :func:`~socialworld.agents.lm.policy.belief_target` (what the observation supports about the focus
  NPC, never the hidden truth) and its SAY line the expert's template words for that action (the
  words the candidate was scored with), so the action adapter learns the words with the decision;
  rejected = the turn the policy wrote. Kept when the value margin is >= ``margin``.
  With ``wake_chosen="continuation"`` chosen is instead the continuation policy's action at
  that state (DAgger's expert label: the policy is fed the episode's observations in order);
  only the label and the taken action are rolled out. ``label_gate="margin"`` keeps a label only
  when its rollout value beats the policy's by ``margin``; ``"disagree"`` keeps every label that
  differs from what the policy did (plain DAgger: behaviour cloning needs every disagreement; the
  values are still recorded, the quality threshold is not applied to them). A label equal to the taken action is ``label_agrees``.
* **Reference states** (action track, ``reference_pairs`` = ``best`` or ``own``) — the same
  scoring at each state of the reference episode (the continuation policy on the same seed):
  chosen = the best candidate (``best``) or the reference's own action (``own``: DAgger's
  expert label, with simulator-scored negatives), rejected = a candidate at least ``margin``
  worse than chosen, drawn by a seeded RNG; both as whole turns with the template's words. The
  wake of a weak policy stays in opening states; these pairs cover the rest of the task.
* **Dialogue track** (trajectory level) — two trajectories of the same scenario and seed (the
  policy's and the continuation policy's); at aligned steps where both took the same action,
  chosen = the utterance of the higher-outcome trajectory, rejected = the other's, when its
  ``q_t`` is higher too.
* **Counterfactual utterances** (dialogue track, ``utterance_pairs``) — a weak policy rarely
  takes the continuation policy's action at the same step, so aligned steps are rare. At each
  step where the policy's action ran as written, the world is forked twice: the same action
  with the policy's words and with the expert's template words, each rolled out like an action
  candidate. chosen = the words with the higher ``q_t``, kept when the gap is >= ``q_margin``
  and their trajectory's return is not lower. Both sides are trajectories of the same scenario
  and seed aligned at that step by construction.
* Dialogue pairs complete the whole turn: prompt = the policy's prompt; chosen and rejected =
  ``BELIEF/ACTION`` (the same head on both sides) + ``SAY:`` + the words, which is how the
  policy decodes them (one assistant turn). The shared head cancels in the DPO margin (the NLL
  term of ``sft_weight`` still trains it).
* **Screening** — exact dedup, a cap per template key, an optional capability filter (a callable
  that says the current policy already prefers chosen), quality threshold.
* **Replay** (``replay`` > 0) — after gating, pairs that earlier cycles kept are added back, up to
  ``replay`` × this cycle's kept pairs per track, drawn by a seeded RNG; a pair equal to one kept
  now is not replayed (counted ``replay_duplicate``). They passed the same screening and gating
  when they were built. Each cycle's adapter then also sees what earlier cycles taught.
* **Gating** — action track: the source episode's U, A_e, S_npc and D must be numbers with source
  ``direct`` or ``fused`` (``degraded``, ``proxy``, ``missing`` excluded); dialogue track:
  relaxed (its episode's D must be a number). ``gating="off"`` skips it (E2, no source constraints:
  the screening, quality threshold included, still applies, so it admits exactly the pairs strict
  gating excluded for their evidence). A judge's ranking is ``proxy`` evidence; the report counts how
  often the judge ordered the two episodes it ranked as their returns do (``judge_agreement``).

Pairs are TRL conversational preference rows (``prompt``/``chosen``/``rejected`` as message
lists) plus our metadata columns, written to Parquet.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from statistics import fmean
from typing import Any, Callable, Final, Iterator, Literal, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, model_validator

from socialworld.agents.lm.policy import target_turn
from socialworld.agents.lm.prompts import build_messages
from socialworld.agents.registry import make_policy
from socialworld.core import Action
from socialworld.learn.config import PairBuild, SleepConfig
from socialworld.records import Document, EpisodeRecord, JudgeRec, StepRecord, read_document
from socialworld.rollout.judge import RankAgreement, episode_return, rank_agreement
from socialworld.rollout.runner import decide
from socialworld.world.engine import World
from socialworld.world.rng import derive_seed
from socialworld.world.spec import ScenarioSpec
from socialworld.world.visibility import legal_actions, observe

PAIR_SCHEMA: Final = "pair-v4"
"""pair-v4: an action pair may carry the value of every candidate scored at its state (``candidates``)
and the keys of every legal action there (``legal``), what a listwise objective trains on. pair-v3: a
pair names what chose its chosen side (``chosen_by``); pair-v2's told a continuation policy's label
only by a suffix of its provenance. pair-v2: an action-track turn ends in a SAY line (the words of
its action); pair-v1's ended at the ACTION line. Files of all four read back (an
older pair's ``chosen_by`` is None: not recorded; before pair-v4 ``candidates`` and ``legal`` are None); a run
folder never mixes them (``rundir.PAIRS_KEY``)."""
GOOD_SOURCES = ("direct", "fused")
EVIDENCE_KEYS = ("U", "A_e", "S_npc", "D", "ranking")
"""the source of each of the episode's metrics, and of what ranks chosen over rejected (``ranking``:
``direct`` for the simulator's rollouts, ``proxy`` for an LM judge's scores)"""
ChosenBy = Literal["rollouts", "label", "reference", "return", "q_t", "judge"]
"""What chose a pair's chosen side: ``rollouts`` (the best candidate by the simulator's rollouts),
``label`` (the continuation policy's action at a wake state: DAgger's expert label), ``reference``
(a reference episode's own action), ``return`` (the higher-return episode of two, trajectory level),
``q_t`` (the words the world assesses higher), ``judge`` (an LM judge's higher goal score)."""
PairSource = Literal["action", "reference", "dialogue", "utterance", "judge"]
"""The ways pairs are built, one function each (:data:`PAIR_SOURCES`)."""


class Candidate(BaseModel):
    """One candidate action scored at a pair's state: its key and its value (the mean return of the
    continuations after it; the pair's ``provenance`` says how they were rolled out)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    value: float


class Pair(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal["pair-v1", "pair-v2", "pair-v3", "pair-v4"] = PAIR_SCHEMA
    id: str
    track: Literal["action", "dialogue"]
    scenario_id: str
    tier: str
    seed: int
    step: int
    episode_id: str
    prompt: list[dict[str, str]]
    chosen: list[dict[str, str]]
    rejected: list[dict[str, str]]
    chosen_value: float
    rejected_value: float
    quality: float
    """action: share of paired rollouts where chosen beats rejected; dialogue: q_chosen - q_rejected"""
    provenance: str
    evidence: dict[str, str]
    """source of each of the episode's metrics (U, A_e, S_npc, D) and of the ranking (see ``EVIDENCE_KEYS``)"""
    template_key: str
    snapshot: str | None = None
    """action track: the world just before the step (``World.snapshot_json``), for GRPO rewards"""
    chosen_by: ChosenBy | None = None
    """what chose the chosen side (:data:`ChosenBy`); None only in pair-v1/v2 files, which did not record it"""
    candidates: list[Candidate] | None = None
    """action track with ``PairBuild.values``: every candidate scored at the state with its value (chosen's
    and rejected's actions among them), in the order scored; None where values were not recorded"""
    legal: list[str] | None = None
    """action track: the keys of every legal action at the state (the set constrained decoding chooses from: a
    listwise objective's decision); None in files written before it was recorded on every action pair"""

    @model_validator(mode="after")
    def _chosen_by_recorded(self) -> Pair:
        if (self.chosen_by is None) != (self.schema_version in ("pair-v1", "pair-v2")):
            raise ValueError(f"a {self.schema_version} pair {'records' if self.chosen_by else 'lacks'} chosen_by")
        return self


@dataclass
class GatingReport:
    candidates: int = 0
    kept: dict[str, int] = field(default_factory=dict)
    excluded: Counter = field(default_factory=Counter)
    """(track, reason) -> count"""
    replayed: dict[str, int] = field(default_factory=dict)
    """track -> pairs added from earlier cycles (not in ``kept``)"""
    replaced: int = 0
    """lone surrogates in the written pairs' text replaced by U+FFFD (Parquet strings are UTF-8)"""
    judge_agreement: RankAgreement = field(default_factory=RankAgreement)
    """with an LM judge: how often its goal scores ordered each wake episode and its reference
    episode as their returns do (in ``gating.json`` only where a judge ranked any)"""

    def exclude(self, track: str, reason: str) -> None:
        self.excluded[f"{track}:{reason}"] += 1

    def document(self) -> Gating:
        """``gating.json``."""
        return Gating.model_validate(self.as_dict())

    def as_dict(self) -> dict:
        return {"candidates": self.candidates, "kept": dict(self.kept), "excluded": dict(sorted(self.excluded.items())),
                "replayed": dict(self.replayed), "replaced_surrogates": self.replaced,
                **({"judge_agreement": self.judge_agreement.as_dict()} if self.judge_agreement != RankAgreement() else {})}


GATING_SCHEMA: Final = "gating-v1"


class Gating(Document):
    """A cycle's ``gating.json``: a :class:`GatingReport` as written (:meth:`GatingReport.document`)
    and read back. Files written before the field named no ``schema_version``; they read as v1."""

    schema_version: Literal["gating-v1"] = GATING_SCHEMA
    candidates: int
    kept: dict[str, int]
    """pairs kept per track (before replay)"""
    excluded: dict[str, int]
    """candidate pairs excluded, by ``track:reason``"""
    replayed: dict[str, int] = {}
    """pairs replayed from earlier cycles, per track"""
    replaced_surrogates: int = 0
    """(written since 2026-11-24; 0 before)"""
    judge_agreement: dict[str, float | int | None] | None = None
    """with an LM judge that ranked any episode (:meth:`RankAgreement.as_dict`)"""


def read_gating(path: str | Path) -> Gating:
    """A ``gating.json``; a malformed one raises naming the file."""
    return read_document(path, Gating)


# ------------------------------------------------------------------ replay and counterfactual values


class ReplayMismatch(RuntimeError):
    pass


def recorded_action(step: StepRecord) -> Action | None:
    """The action the world executed at ``step`` (None for unparseable output)."""
    if step.action.parse_status == "unparseable" or step.action.structured is None:
        return None
    st = step.action.structured
    return Action(st["kind"], st.get("npc"), st.get("slot"), st.get("option"), st.get("offer"), step.dialogue.utterance)  # type: ignore[arg-type]


def replay(spec: ScenarioSpec, ep: EpisodeRecord) -> Iterator[tuple[StepRecord, World]]:
    """Yield (step record, the world just before it) for each step, re-executing the episode and
    checking each recorded reward. The yielded world is live: fork it before stepping."""
    if spec.id != ep.scenario_id:
        raise ValueError(f"episode {ep.episode_id} is not of scenario {spec.id}")
    w = World(spec, ep.seed)
    for s in ep.steps:
        yield s, w
        res = w.step(recorded_action(s), parse_error=s.action.error if s.action.parse_status == "unparseable" else None)
        if abs(res.reward - (s.signals.reward.value or 0.0)) > 1e-9:
            raise ReplayMismatch(f"{ep.episode_id} step {s.setting.step}: reward {res.reward} != recorded {s.signals.reward.value}")


def rollout_returns(w0: World, first: Action | None, cfg: PairBuild, key: Sequence[int | str],
                    parse_error: str | None = None) -> list[float]:
    """Returns of ``cfg.rollouts`` continuations: step ``first`` (None with ``parse_error``: an
    unparseable reply, which the world executes as a penalised ``wait``), then the continuation policy
    for up to ``cfg.horizon`` steps. Return = sum of step rewards (Phi gain minus costs), step t's
    weighted by ``cfg.discount ** t`` (1 unless set: then exactly the sum as before). With
    ``cfg.values == "imagined"`` continuation m runs in an imagined world
    (:func:`~socialworld.world.imagine.imagine`: the public state, preferences redrawn to agree with
    it), the same m-th world for every candidate of the state (common random numbers)."""
    from socialworld.world.imagine import imagine

    out = []
    for m in range(cfg.rollouts):
        seed = derive_seed(cfg.seed, *key, m)
        w = imagine(w0, seed) if cfg.values == "imagined" else w0.fork(reseed=seed)
        pol = make_policy(cfg.continuation, seed=derive_seed(cfg.seed, *key, m, "policy"))
        pol.reset(["cf"])
        ret = w.step(first, parse_error=parse_error).reward
        for t in range(1, cfg.horizon + 1):
            if w.done:
                break
            d = decide(pol, ["cf"], [w], [observe(w.spec, w.pub)])[0]
            ret += cfg.discount ** t * w.step(d.action, parse_error=d.parse_error).reward
        out.append(ret)
    return out


def candidates(w: World, taken: Action | None, limit: int, key: Sequence[int | str]) -> list[Action]:
    """Legal alternatives at this state (``wait``/``end`` always included), capped at ``limit`` by
    a deterministic shuffle, plus the taken action when it was legal."""
    from socialworld.world.rng import WorldRNG

    legal = legal_actions(observe(w.spec, w.pub))
    always = [a for a in legal if a.kind in ("wait", "end")]
    rest = WorldRNG(derive_seed(*key, "candidates")).shuffled([a for a in legal if a.kind not in ("wait", "end")])
    out = always + rest[: max(0, limit - len(always))]
    if taken is not None and taken.key in {a.key for a in legal} and taken.key not in {a.key for a in out}:
        out.append(taken)
    return out


# ------------------------------------------------------------------ pairs


def _assistant(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def _pair_id(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _evidence(ep: EpisodeRecord, ranking: str = "direct") -> dict[str, str]:
    m = ep.metrics
    metrics = EVIDENCE_KEYS[:-1]
    if m is None:
        return {**{k: "missing" for k in metrics}, "ranking": ranking}
    return {**{k: (getattr(m, k).source if getattr(m, k).value is not None else "missing") for k in metrics}, "ranking": ranking}


def action_pairs(spec: ScenarioSpec, ep: EpisodeRecord, cfg: PairBuild, report: GatingReport) -> list[Pair]:
    """Step-level counterfactual pairs of one wake episode (before screening and gating)."""
    pairs = []
    labeller = make_policy(cfg.continuation, seed=derive_seed(cfg.seed, "label", ep.episode_id)) \
        if cfg.wake_chosen == "continuation" else None
    if labeller is not None:
        labeller.reset(["label"])
    for s, w in replay(spec, ep):
        t = s.setting.step
        key = (ep.scenario_id, ep.seed, t)
        taken = recorded_action(s)
        ran = taken if s.action.parse_status == "ok" else None  # what the step executed as written
        obs = observe(spec, w.pub)
        report.candidates += 1
        label = None
        if labeller is not None:  # fed every state in order, so its memory follows the episode
            d = decide(labeller, ["label"], [w], [obs])[0]
            label = d.action.without_utterance() if d.action is not None else None
            if label is None or label.key not in {a.key for a in legal_actions(obs)}:
                report.exclude("action", "label_illegal")
                continue
        if label is not None and ran is not None and label.key == ran.key:
            report.exclude("action", "label_agrees")
            continue
        if label is None:
            cands = candidates(w, ran, cfg.max_candidates, key)
        elif cfg.values != "off":  # every candidate scored, the label and the taken action among them
            cands = candidates(w, ran, cfg.max_candidates, key)
            cands += [label] if label.key not in {a.key for a in cands} else []
        else:  # only the label and the taken action need values (rollouts are per action: the same numbers)
            cands = [label] + ([ran] if ran is not None else [])
        values = {a.key: rollout_returns(w, _say(w, a), cfg, key) for a in cands}
        # the taken step as executed (unparseable/illegal -> wait with the penalty) is the rejected side
        rej_returns = rollout_returns(w, _say(w, Action("wait")), cfg, key) if ran is None \
            else values.get(ran.key) or rollout_returns(w, ran, cfg, key)
        if s.action.parse_status != "ok":
            rej_returns = [r - (s.signals.penalty.value or 0.0) for r in rej_returns]
        best = label if label is not None else max(cands, key=lambda a: (fmean(values[a.key]), a.key))
        margin = fmean(values[best.key]) - fmean(rej_returns)
        gated = label is None or cfg.label_gate == "margin"
        if (ran is not None and best.key == ran.key) or (gated and margin < cfg.margin):
            report.exclude("action", "below_margin")
            continue
        chosen = target_turn(obs, best.key, _say(w, best).utterance)
        rejected = s.action.raw.strip() or "(empty)"
        quality = fmean(float(c > r) for c, r in zip(values[best.key], rej_returns))
        pairs.append(Pair(
            id=_pair_id("action", ep.episode_id, t, chosen, rejected), track="action", scenario_id=ep.scenario_id,
            tier=ep.tier, seed=ep.seed, step=t, episode_id=ep.episode_id, prompt=build_messages(obs),
            chosen=_assistant(chosen), rejected=_assistant(rejected), chosen_value=fmean(values[best.key]),
            rejected_value=fmean(rej_returns), quality=quality, evidence=_evidence(ep),
            provenance=cfg.provenance, chosen_by="rollouts" if label is None else "label",
            template_key=f"{ep.scenario_id}:{best.key}>{taken.key if taken else 'unparseable'}",
            snapshot=w.snapshot_json(), **_scored(cfg, obs, cands, values),
        ))
    return pairs


def reference_pairs(spec: ScenarioSpec, ref: EpisodeRecord, cfg: PairBuild, report: GatingReport) -> list[Pair]:
    """Step-level pairs at the states of a reference episode: chosen = the best candidate
    (``cfg.reference_pairs == "best"``) or the reference's own action (``"own"``; a step where it
    was not legal is excluded as ``reference_illegal``), rejected = a candidate whose value is at
    least ``cfg.margin`` below chosen's, drawn by a seeded RNG. The reference's own action is
    always among the candidates."""
    from socialworld.world.rng import WorldRNG

    pairs = []
    for s, w in replay(spec, ref):
        t = s.setting.step
        key = (ref.scenario_id, ref.seed, t, "reference")
        own = recorded_action(s)
        cands = candidates(w, own, cfg.max_candidates, key)
        values = {a.key: rollout_returns(w, _say(w, a), cfg, key) for a in cands}
        best = max(cands, key=lambda a: (fmean(values[a.key]), a.key))
        report.candidates += 1
        if cfg.reference_pairs == "own":
            if own is None or own.key not in values:
                report.exclude("action", "reference_illegal")
                continue
            best = next(a for a in cands if a.key == own.key)
        worse = sorted(a.key for a in cands if fmean(values[a.key]) <= fmean(values[best.key]) - cfg.margin)
        if not worse:
            report.exclude("action", "below_margin")
            continue
        rej = WorldRNG(derive_seed(*key, "rejected")).choice(worse)
        obs = observe(spec, w.pub)
        chosen = target_turn(obs, best.key, _say(w, best).utterance)
        rejected = target_turn(obs, rej, _say(w, next(a for a in cands if a.key == rej)).utterance)
        pairs.append(Pair(
            id=_pair_id("reference", ref.episode_id, t, chosen, rejected), track="action", scenario_id=ref.scenario_id,
            tier=ref.tier, seed=ref.seed, step=t, episode_id=ref.episode_id, prompt=build_messages(obs),
            chosen=_assistant(chosen), rejected=_assistant(rejected), chosen_value=fmean(values[best.key]),
            rejected_value=fmean(values[rej]), quality=fmean(float(c > r) for c, r in zip(values[best.key], values[rej])),
            provenance=cfg.provenance, chosen_by="reference" if cfg.reference_pairs == "own" else "rollouts",
            evidence=_evidence(ref), template_key=f"{ref.scenario_id}:{best.key}>{rej}",
            snapshot=w.snapshot_json(), **_scored(cfg, obs, cands, values),
        ))
    return pairs


def _scored(cfg: PairBuild, obs: Any, cands: Sequence[Action], values: dict[str, list[float]]) -> dict[str, Any]:
    """A pair's ``legal`` field, and its ``candidates`` where ``cfg.values`` records them."""
    legal = {"legal": [a.key for a in legal_actions(obs)]}
    if cfg.values == "off":
        return legal
    return {"candidates": [Candidate(key=a.key, value=fmean(values[a.key])) for a in cands], **legal}


def _say(w: World, a: Action) -> Action:
    """Candidates are compared with one neutral utterance style (the expert's templates)."""
    from socialworld.agents.scripted import say

    return say(observe(w.spec, w.pub), a)


def _dialogue_pair(spec: ScenarioSpec, ep: EpisodeRecord, w: World, s: StepRecord, said: tuple[str, str],
                   values: tuple[float, float], qs: tuple[float, float], provenance: str, id_parts: tuple, key: str,
                   chosen_by: ChosenBy) -> Pair:
    """A dialogue-track pair at step ``s`` (state ``w``): ``said`` = (chosen, rejected) words."""
    obs = observe(spec, w.pub)
    turn = partial(target_turn, obs, s.action.executed)
    return Pair(
        id=_pair_id("dialogue", *id_parts, s.setting.step), track="dialogue", scenario_id=ep.scenario_id,
        tier=ep.tier, seed=ep.seed, step=s.setting.step, episode_id=ep.episode_id, prompt=build_messages(obs),
        chosen=_assistant(turn(said[0])), rejected=_assistant(turn(said[1])),
        chosen_value=values[0], rejected_value=values[1], quality=qs[0] - qs[1], provenance=provenance,
        evidence=_evidence(ep), template_key=key, chosen_by=chosen_by,
    )


def dialogue_pairs(spec: ScenarioSpec, a: EpisodeRecord, b: EpisodeRecord, cfg: PairBuild, report: GatingReport) -> list[Pair]:
    """Trajectory-level utterance pairs from two episodes of the same scenario and seed."""
    if (a.scenario_id, a.seed) != (b.scenario_id, b.seed):
        raise ValueError("dialogue pairs need two episodes of the same scenario and seed")
    hi, lo = (a, b) if (episode_return(a), a.episode_id) >= (episode_return(b), b.episode_id) else (b, a)
    pairs = []
    for (sh, wh), sl in zip(replay(spec, hi), lo.steps):
        report.candidates += 1
        qh, ql = sh.signals.q.value, sl.signals.q.value
        if sh.action.executed != sl.action.executed or qh is None or ql is None:
            report.exclude("dialogue", "not_aligned")
            continue
        if qh - ql < cfg.q_margin or sh.dialogue.utterance == sl.dialogue.utterance:
            report.exclude("dialogue", "below_margin")
            continue
        pairs.append(_dialogue_pair(
            spec, hi, wh, sh, (sh.dialogue.utterance, sl.dialogue.utterance), (episode_return(hi), episode_return(lo)),
            (qh, ql), f"trajectory_pair(q_t {qh:.2f} vs {ql:.2f})", (hi.episode_id, lo.episode_id),
            f"{hi.scenario_id}:say:{sh.action.executed.split('(')[0]}", "return"))
    return pairs


def judge_pairs(spec: ScenarioSpec, a: EpisodeRecord, b: EpisodeRecord, ja: JudgeRec, jb: JudgeRec, cfg: PairBuild,
                report: GatingReport) -> list[Pair]:
    """Pairs ranked by an LM judge (contract §3.5): two episodes of the same scenario and seed whose
    ``goal`` scores differ by at least ``cfg.judge_margin``, compared at their first differing turn
    (the same prompt on both sides: the same seed and the same turns before it). The higher-judged
    episode's turn is chosen: an action-track pair where the actions differ, else a dialogue-track
    pair where the words do. Evidence ``ranking: proxy``: an inferred judgement ranks them, so
    strict gating keeps them out of the action track; the dialogue track's relaxed gating admits them."""
    if (a.scenario_id, a.seed) != (b.scenario_id, b.seed):
        raise ValueError("judge pairs need two episodes of the same scenario and seed")
    ga, gb = ja.scores["goal"].value, jb.scores["goal"].value
    if ga is None or gb is None:
        raise ValueError(f"judge pairs need both episodes' goal scores ({a.episode_id}: {ga}, {b.episode_id}: {gb})")
    hi, lo, gh, gl = (a, b, ga, gb) if (ga, a.episode_id) >= (gb, b.episode_id) else (b, a, gb, ga)
    report.candidates += 1
    report.judge_agreement += rank_agreement([(ga, gb, episode_return(a), episode_return(b))])
    if gh - gl < cfg.judge_margin:
        report.exclude("judge", "below_margin")
        return []
    for (sh, wh), sl in zip(replay(spec, hi), lo.steps):
        same_action, same_words = sh.action.executed == sl.action.executed, sh.dialogue.utterance == sl.dialogue.utterance
        if same_action and same_words:
            continue
        if sh.observation != sl.observation:
            report.exclude("judge", "not_aligned")
            return []
        obs = observe(spec, wh.pub)
        provenance = f"{ja.scores['goal'].detail}(goal {gh:g} vs {gl:g})"
        key = f"{hi.scenario_id}:judge:{'action' if not same_action else 'say'}"
        if same_action:
            pair = _dialogue_pair(spec, hi, wh, sh, (sh.dialogue.utterance, sl.dialogue.utterance), (gh, gl),
                                  (gh / 10, gl / 10), provenance, ("judge", hi.episode_id, lo.episode_id), key, "judge")
            return [pair.model_copy(update={"evidence": _evidence(hi, ranking="proxy")})]
        chosen = target_turn(obs, sh.action.executed, sh.dialogue.utterance)
        rejected = target_turn(obs, sl.action.executed, sl.dialogue.utterance)
        return [Pair(
            id=_pair_id("judge", hi.episode_id, lo.episode_id, sh.setting.step), track="action", scenario_id=hi.scenario_id,
            tier=hi.tier, seed=hi.seed, step=sh.setting.step, episode_id=hi.episode_id, prompt=build_messages(obs),
            chosen=_assistant(chosen), rejected=_assistant(rejected), chosen_value=gh, rejected_value=gl,
            quality=(gh - gl) / 10, provenance=provenance, evidence=_evidence(hi, ranking="proxy"), template_key=key,
            snapshot=wh.snapshot_json(), chosen_by="judge",
        )]
    report.exclude("judge", "no_difference")
    return []


def utterance_pairs(spec: ScenarioSpec, ep: EpisodeRecord, cfg: PairBuild, report: GatingReport) -> list[Pair]:
    """Counterfactual dialogue pairs of one wake episode: at each step whose action ran as the
    policy wrote it, the policy's words vs the expert template's words for that same action.
    Each side is forked from the step's state and rolled out (``cfg.rollouts`` continuations of
    ``cfg.horizon`` steps, common random numbers); its ``q_t`` is the world's assessment of the
    words. chosen = the higher-``q_t`` words; kept when ``q_chosen - q_rejected >= q_margin``
    and ``mean return(chosen) >= mean return(rejected)``. Excluded, by reason: ``not_executed``
    (unparseable or illegal: no words ran), ``same_words``, ``below_margin``,
    ``outcome_disagrees``."""
    pairs = []
    for s, w in replay(spec, ep):
        report.candidates += 1
        if s.action.parse_status != "ok":
            report.exclude("dialogue", "not_executed")
            continue
        taken = recorded_action(s)
        assert taken is not None
        alt = _say(w, taken)
        if alt.utterance == taken.utterance:
            report.exclude("dialogue", "same_words")
            continue
        key = (ep.scenario_id, ep.seed, s.setting.step, "utterance")
        q_taken, q_alt = w.fork().step(taken).q, w.fork().step(alt).q
        if q_taken is None or q_alt is None:
            raise RuntimeError(f"{ep.episode_id} step {s.setting.step}: an executed action has no q_t")
        sides = [(taken, q_taken), (alt, q_alt)]
        (hi, qh), (lo, ql) = sorted(sides, key=lambda x: (x[1], x[0].utterance), reverse=True)
        if qh - ql < cfg.q_margin:
            report.exclude("dialogue", "below_margin")
            continue
        vh, vl = fmean(rollout_returns(w, hi, cfg, key)), fmean(rollout_returns(w, lo, cfg, key))
        if vh < vl:
            report.exclude("dialogue", "outcome_disagrees")
            continue
        pairs.append(_dialogue_pair(
            spec, ep, w, s, (hi.utterance, lo.utterance), (vh, vl), (qh, ql),
            f"counterfactual_utterance(q_t {qh:.2f} vs {ql:.2f}); {cfg.provenance}", (ep.episode_id, "utterance"),
            f"{ep.scenario_id}:say:{s.action.executed}:{'template' if hi is alt else 'policy'}", "q_t"))
    return pairs


PAIR_SOURCES: dict[PairSource, Callable[..., list[Pair]]] = {
    "action": action_pairs, "reference": reference_pairs, "dialogue": dialogue_pairs, "utterance": utterance_pairs,
    "judge": judge_pairs}
"""Each way of building pairs (:data:`PairSource`), by name: ``action`` (counterfactual steps of a
wake episode), ``reference`` (steps of a reference episode), ``dialogue`` (a wake episode against
its reference episode, trajectory level), ``utterance`` (the policy's words against the template's),
``judge`` (two episodes ranked by an LM judge)."""


def _score(cfg: PairBuild, unit: tuple) -> tuple[list[Pair], GatingReport]:
    """One episode's pairs of one kind, with its own gating counts: a pure function of its inputs
    (a Ray task under ``ray``)."""
    kind, spec, *eps = unit
    report = GatingReport()
    return PAIR_SOURCES[kind](spec, *eps, cfg, report), report


def candidate_pairs(specs: dict[str, ScenarioSpec], wake: Sequence[EpisodeRecord], reference: dict[tuple[str, int], EpisodeRecord],
                    cfg: PairBuild, report: GatingReport, progress: Callable[[str, int], Callable[[Any], None]] | None = None,
                    ray: str = "", judged: dict[str, JudgeRec] | None = None) -> list[Pair]:
    """All pairs of a wake (before screening and gating): action pairs of every episode, then
    (``cfg.reference_pairs``) action pairs at the states of every reference episode (the wake's
    seeds and any further training seeds), then dialogue pairs
    against the reference episode of the same scenario and seed, then (``cfg.utterance_pairs``)
    counterfactual utterance pairs of every wake episode, then (``judged``: an LM judge's record
    per episode id) judge-ranked pairs of each wake episode and its reference episode (a failed
    judgement is counted, ``judge:failed``, and pairs nothing). ``progress(what, total)``, when given,
    returns a callback ticked once per episode scored (the CLI's bars). Each (kind, episode) is
    scored apart (:func:`_score`), as a Ray task with ``ray`` (:func:`socialworld.rollout.scale.pmap`);
    the pairs and counts are the same either way."""

    from socialworld.rollout.scale import pmap

    refs = [reference[k] for k in sorted(reference)] if cfg.reference_pairs != "off" else []
    units: list[tuple] = [("action", specs[e.scenario_id], e) for e in wake]
    units += [("reference", specs[r.scenario_id], r) for r in refs]
    units += [("dialogue", specs[e.scenario_id], e, reference[(e.scenario_id, e.seed)]) for e in wake]
    if cfg.utterance_pairs:
        units += [("utterance", specs[e.scenario_id], e) for e in wake]
    for e in wake if judged else ():
        r = reference[(e.scenario_id, e.seed)]
        ja, jb = judged.get(e.episode_id), judged.get(r.episode_id)  # type: ignore[union-attr]
        if ja is None or jb is None or ja.failure or jb.failure:
            report.exclude("judge", "failed")
        else:
            units.append(("judge", specs[e.scenario_id], e, r, ja, jb))
    tick = progress("sleep: scoring counterfactuals (episodes)", len(units)) if progress else None
    pairs: list[Pair] = []
    for made, part in pmap(partial(_score, cfg), units, ray=ray, tick=tick):
        pairs += made
        report.candidates += part.candidates
        report.excluded.update(part.excluded)
        report.judge_agreement += part.judge_agreement
    return pairs


# ------------------------------------------------------------------ screening and gating


def screen_and_gate(pairs: Sequence[Pair], cfg: SleepConfig, report: GatingReport,
                    already_right: Callable[[Pair], bool] | None = None) -> list[Pair]:
    """Dedup, template cap, capability filter, quality threshold, then provenance gating."""
    kept: list[Pair] = []
    seen: set[tuple] = set()
    per_template: Counter = Counter()
    for p in pairs:
        sig = _signature(p)
        if sig in seen:
            report.exclude(p.track, "duplicate")
            continue
        seen.add(sig)
        if per_template[p.template_key] >= cfg.template_cap:
            report.exclude(p.track, "template_cap")
            continue
        if already_right is not None and already_right(p):
            report.exclude(p.track, "capability")
            continue
        if p.track == "action" and p.quality < cfg.quality_threshold and not (cfg.label_gate == "disagree" and p.chosen_by == "label"):
            report.exclude(p.track, "low_quality")
            continue
        if cfg.gating == "strict":
            if p.track == "action":
                bad = [k for k, src in p.evidence.items() if src not in GOOD_SOURCES]
                if bad:
                    src = p.evidence[bad[0]]
                    report.exclude(p.track, f"{src}_evidence")
                    continue
            elif p.evidence.get("D") == "missing":
                report.exclude(p.track, "missing_evidence")
                continue
        per_template[p.template_key] += 1
        kept.append(p)
    for track in ("action", "dialogue"):
        report.kept[track] = sum(p.track == track for p in kept)
    return kept


def _signature(p: Pair) -> tuple:
    return (p.track, json.dumps(p.prompt), p.chosen[0]["content"], p.rejected[0]["content"])


def add_replay(kept: Sequence[Pair], earlier: Sequence[Pair], cfg: SleepConfig, report: GatingReport,
               key: Sequence[int | str]) -> list[Pair]:
    """``kept`` plus pairs replayed from ``earlier`` (pairs earlier cycles kept, which may repeat
    one another): per track, ``n = floor(cfg.replay * kept_t)`` distinct earlier pairs equal to no
    pair in ``kept``, drawn without replacement by an RNG seeded from ``(cfg.seed, "replay", *key)``
    (all of them when fewer). Counted in ``report.replayed``; an earlier pair equal to a kept one
    is counted as ``replay_duplicate``."""
    out = list(kept)
    now = {_signature(p) for p in kept}
    for track in ("action", "dialogue"):
        pool: list[Pair] = []
        seen: set[tuple] = set()
        for p in earlier:
            sig = _signature(p)
            if p.track != track or sig in seen:
                continue
            seen.add(sig)
            if sig in now:
                report.exclude(track, "replay_duplicate")
            else:
                pool.append(p)
        n = min(len(pool), int(cfg.replay * sum(p.track == track for p in kept)))
        rng = np.random.default_rng(derive_seed(cfg.seed, "replay", track, *key))
        picked = sorted(rng.choice(len(pool), size=n, replace=False).tolist()) if n else []
        out += [pool[i] for i in picked]
        report.replayed[track] = n
    return out


@dataclass
class SleepResult:
    """One sleep phase's pairs and counts."""

    candidates: list[Pair]
    """every pair built, before screening and gating"""
    built: GatingReport
    """the counts of building alone (what each source excluded), before screening and gating"""
    kept: list[Pair]
    """the pairs screened and gated, then those replayed from earlier cycles"""
    report: GatingReport
    """every count: building, screening, gating, replay"""


def run_sleep(specs: dict[str, ScenarioSpec], wake: Sequence[EpisodeRecord], reference: dict[tuple[str, int], EpisodeRecord],
              cfg: SleepConfig, *, judged: dict[str, JudgeRec] | None = None, earlier: Sequence[Pair] = (),
              replay_key: Sequence[int | str] = (), progress: Callable[[str, int], Callable[[Any], None]] | None = None,
              ray: str = "") -> SleepResult:
    """The sleep phase, the one entry point (the loop and ``socialworld gate``): candidate pairs from
    every source (:func:`candidate_pairs`), screened and gated (:func:`screen_and_gate`), plus up to
    ``cfg.replay`` times as many pairs from ``earlier`` cycles (:func:`add_replay`, keyed by ``replay_key``)."""
    report = GatingReport()
    candidates = candidate_pairs(specs, wake, reference, cfg, report, progress, ray=ray, judged=judged)
    built = GatingReport(candidates=report.candidates, excluded=report.excluded.copy())
    kept = screen_and_gate(candidates, cfg, report)
    if cfg.replay > 0 and earlier:
        kept = add_replay(kept, earlier, cfg, report, key=replay_key)
    return SleepResult(candidates, built, kept, report)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _replace_surrogates(obj: Any) -> tuple[Any, int]:
    """``obj`` with every lone surrogate in its strings replaced by U+FFFD, and how many were."""
    if isinstance(obj, str):
        return _SURROGATE.subn("\ufffd", obj)
    if isinstance(obj, dict):
        fixed = {k: _replace_surrogates(v) for k, v in obj.items()}
        return {k: v for k, (v, _) in fixed.items()}, sum(n for _, n in fixed.values())
    if isinstance(obj, list):
        items = [_replace_surrogates(v) for v in obj]
        return [v for v, _ in items], sum(n for _, n in items)
    return obj, 0


def write_pairs(path: str | Path, pairs: Sequence[Pair]) -> int:
    """Parquet with TRL's conversational preference columns (prompt/chosen/rejected as lists of
    {role, content}) plus the metadata columns. Parquet strings are UTF-8, so a lone surrogate a
    model wrote (kept exactly in the episode records) is replaced by U+FFFD here; returns how many
    were (the sleep phase counts them in ``gating.json``)."""
    rows, replaced = _replace_surrogates([p.model_dump() for p in pairs])
    msg = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    schema = pa.schema([
        ("schema_version", pa.string()), ("id", pa.string()), ("track", pa.string()), ("scenario_id", pa.string()),
        ("tier", pa.string()), ("seed", pa.int64()), ("step", pa.int64()), ("episode_id", pa.string()),
        ("prompt", msg), ("chosen", msg), ("rejected", msg), ("chosen_value", pa.float64()),
        ("rejected_value", pa.float64()), ("quality", pa.float64()), ("provenance", pa.string()),
        ("evidence", pa.struct([(k, pa.string()) for k in EVIDENCE_KEYS])), ("template_key", pa.string()), ("snapshot", pa.string()),
        ("chosen_by", pa.string()),
        ("candidates", pa.list_(pa.struct([("key", pa.string()), ("value", pa.float64())]))), ("legal", pa.list_(pa.string())),
    ])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), str(path))
    return replaced


def read_pairs(path: str | Path) -> list[Pair]:
    """Pairs from :func:`write_pairs`' Parquet. Files written before the ``ranking`` evidence
    existed (or their pairs, replayed into a newer file, where it reads back null) hold pairs the
    simulator ranked: ``ranking`` is ``direct`` there."""
    rows = pq.read_table(str(path)).to_pylist()
    for r in rows:
        if r["evidence"].get("ranking") is None:
            r["evidence"] = {**r["evidence"], "ranking": "direct"}
    return [Pair(**r) for r in rows]

