"""The pair sources: each way of building candidate pairs, one function of one signature, registered by name."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from statistics import fmean
from typing import Any, Callable, Final, Sequence

from socialworld.agents.lm.policy import target_turn
from socialworld.agents.lm.prompts import build_messages
from socialworld.agents.registry import make_policy
from socialworld.core import Action
from socialworld.learn.config import PairBuild, PairSource
from socialworld.learn.pairs.counterfactual import candidates, recorded_action, replay, rollout_returns, templated
from socialworld.learn.pairs.gating import GatingReport
from socialworld.learn.pairs.record import Candidate, ChosenBy, Pair, assistant, evidence, pair_id
from socialworld.records import EpisodeRecord, JudgeRec, StepRecord
from socialworld.rollout.judge import episode_return, rank_agreement
from socialworld.rollout.runner import decide
from socialworld.world.engine import World
from socialworld.world.rng import derive_seed
from socialworld.world.spec import ScenarioSpec
from socialworld.world.visibility import legal_actions, observe


@dataclass(frozen=True)
class SleepInputs:
    """What a sleep phase builds pairs from."""

    specs: dict[str, ScenarioSpec]
    wake: Sequence[EpisodeRecord]
    reference: dict[tuple[str, int], EpisodeRecord]
    """the continuation policy's episode per (scenario, seed): the wake's seeds and any further training seeds"""
    judged: dict[str, JudgeRec] | None = None
    """an LM judge's record per episode id (with the loop's ``--judge``)"""


@dataclass(frozen=True)
class Unit:
    """One piece of a source's work: the episode it builds pairs at, in its scenario, and what the
    source compares it with (a Ray task's input: a pure function of it)."""

    spec: ScenarioSpec
    episode: EpisodeRecord
    other: EpisodeRecord | None = None
    """dialogue and judge: the reference episode of the same scenario and seed"""
    judgements: tuple[JudgeRec, JudgeRec] | None = None
    """judge: the judge's record of ``episode`` and of ``other``"""

    def against(self) -> EpisodeRecord:
        if self.other is None:
            raise ValueError(f"{self.episode.episode_id}: this source compares two episodes and was given one")
        return self.other


def prompt_of(step: StepRecord, obs: Any) -> list[dict[str, str]]:
    """The prompt a pair at ``step`` trains on: the messages the step's language model received,
    as its record holds them. A scripted policy's step (a reference episode's) recorded none: the
    language-model policy's prompt for that observation (:func:`~socialworld.agents.lm.prompts.build_messages`)."""
    if step.policy.prompt is not None:
        return [m.model_dump() for m in step.policy.prompt.messages]
    return build_messages(obs)


def action_pairs(unit: Unit, cfg: PairBuild, report: GatingReport) -> list[Pair]:
    """Step-level counterfactual pairs of one wake episode (before screening and gating): at each
    state, chosen = the best candidate by rollouts (``cfg.wake_chosen == "best"``) or the
    continuation policy's label there, fed the episode's observations in order (``label``: kept
    whenever it differs from the taken action; ``label_by_margin``: kept when the rollouts favour it
    by ``cfg.margin``); rejected = the turn the policy wrote."""
    spec, ep = unit.spec, unit.episode
    pairs = []
    labeller = make_policy(cfg.continuation, seed=derive_seed(cfg.seed, "label", ep.episode_id)) \
        if cfg.wake_chosen != "best" else None
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
        values = {a.key: rollout_returns(w, templated(w, a), cfg, key) for a in cands}
        # the taken step as executed (unparseable/illegal -> wait with the penalty) is the rejected side
        rej_returns = rollout_returns(w, templated(w, Action("wait")), cfg, key) if ran is None \
            else values.get(ran.key) or rollout_returns(w, ran, cfg, key)
        if s.action.parse_status != "ok":
            rej_returns = [r - (s.signals.penalty.value or 0.0) for r in rej_returns]
        best = label if label is not None else max(cands, key=lambda a: (fmean(values[a.key]), a.key))
        margin = fmean(values[best.key]) - fmean(rej_returns)
        gated = label is None or cfg.wake_chosen == "label_by_margin"
        if (ran is not None and best.key == ran.key) or (gated and margin < cfg.margin):
            report.exclude("action", "below_margin")
            continue
        chosen = target_turn(obs, best.key, templated(w, best).utterance)
        rejected = s.action.raw.strip() or "(empty)"
        quality = fmean(float(c > r) for c, r in zip(values[best.key], rej_returns))
        pairs.append(Pair(
            id=pair_id("action", ep.episode_id, t, chosen, rejected), track="action", scenario_id=ep.scenario_id,
            tier=ep.tier, seed=ep.seed, step=t, episode_id=ep.episode_id, prompt=prompt_of(s, obs),
            chosen=assistant(chosen), rejected=assistant(rejected), chosen_value=fmean(values[best.key]),
            rejected_value=fmean(rej_returns), quality=quality, evidence=evidence(ep),
            provenance=cfg.provenance, chosen_by="rollouts" if label is None else "label",
            template_key=f"{ep.scenario_id}:{best.key}>{taken.key if taken else 'unparseable'}",
            snapshot=w.snapshot_json(), **_scored(cfg, obs, cands, values),
        ))
    return pairs


def reference_pairs(unit: Unit, cfg: PairBuild, report: GatingReport) -> list[Pair]:
    """Step-level pairs at the states of a reference episode: chosen = the best candidate
    (``cfg.reference_chosen == "best"``) or the reference's own action (``"own"``; a step where it
    was not legal is excluded as ``reference_illegal``), rejected = a candidate whose value is at
    least ``cfg.margin`` below chosen's, drawn by a seeded RNG. The reference's own action is
    always among the candidates."""
    from socialworld.world.rng import WorldRNG

    spec, ref = unit.spec, unit.episode
    pairs = []
    for s, w in replay(spec, ref):
        t = s.setting.step
        key = (ref.scenario_id, ref.seed, t, "reference")
        own = recorded_action(s)
        cands = candidates(w, own, cfg.max_candidates, key)
        values = {a.key: rollout_returns(w, templated(w, a), cfg, key) for a in cands}
        best = max(cands, key=lambda a: (fmean(values[a.key]), a.key))
        report.candidates += 1
        if cfg.reference_chosen == "own":
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
        chosen = target_turn(obs, best.key, templated(w, best).utterance)
        rejected = target_turn(obs, rej, templated(w, next(a for a in cands if a.key == rej)).utterance)
        pairs.append(Pair(
            id=pair_id("reference", ref.episode_id, t, chosen, rejected), track="action", scenario_id=ref.scenario_id,
            tier=ref.tier, seed=ref.seed, step=t, episode_id=ref.episode_id, prompt=prompt_of(s, obs),
            chosen=assistant(chosen), rejected=assistant(rejected), chosen_value=fmean(values[best.key]),
            rejected_value=fmean(values[rej]), quality=fmean(float(c > r) for c, r in zip(values[best.key], values[rej])),
            provenance=cfg.provenance, chosen_by="reference" if cfg.reference_chosen == "own" else "rollouts",
            evidence=evidence(ref), template_key=f"{ref.scenario_id}:{best.key}>{rej}",
            snapshot=w.snapshot_json(), **_scored(cfg, obs, cands, values),
        ))
    return pairs


def _scored(cfg: PairBuild, obs: Any, cands: Sequence[Action], values: dict[str, list[float]]) -> dict[str, Any]:
    """A pair's ``legal`` field, and its ``candidates`` where ``cfg.values`` records them."""
    legal = {"legal": [a.key for a in legal_actions(obs)]}
    if cfg.values == "off":
        return legal
    return {"candidates": [Candidate(key=a.key, value=fmean(values[a.key])) for a in cands], **legal}


def _dialogue_pair(spec: ScenarioSpec, ep: EpisodeRecord, w: World, s: StepRecord, said: tuple[str, str],
                   values: tuple[float, float], qs: tuple[float, float], provenance: str, id_parts: tuple, key: str,
                   chosen_by: ChosenBy) -> Pair:
    """A dialogue-track pair at step ``s`` (state ``w``): ``said`` = (chosen, rejected) words."""
    obs = observe(spec, w.pub)
    turn = partial(target_turn, obs, s.action.executed)
    return Pair(
        id=pair_id("dialogue", *id_parts, s.setting.step), track="dialogue", scenario_id=ep.scenario_id,
        tier=ep.tier, seed=ep.seed, step=s.setting.step, episode_id=ep.episode_id, prompt=prompt_of(s, obs),
        chosen=assistant(turn(said[0])), rejected=assistant(turn(said[1])),
        chosen_value=values[0], rejected_value=values[1], quality=qs[0] - qs[1], provenance=provenance,
        evidence=evidence(ep), template_key=key, chosen_by=chosen_by,
    )


def dialogue_pairs(unit: Unit, cfg: PairBuild, report: GatingReport) -> list[Pair]:
    """Trajectory-level utterance pairs from two episodes of the same scenario and seed (a wake
    episode and its reference episode)."""
    spec, a, b = unit.spec, unit.episode, unit.against()
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


def judge_pairs(unit: Unit, cfg: PairBuild, report: GatingReport) -> list[Pair]:
    """Pairs ranked by an LM judge (contract §3.5): two episodes of the same scenario and seed whose
    ``goal`` scores differ by at least ``cfg.judge_margin``, compared at their first differing turn
    (the same prompt on both sides: the same seed and the same turns before it). The higher-judged
    episode's turn is chosen: an action-track pair where the actions differ, else a dialogue-track
    pair where the words do. Evidence ``ranking: proxy``: an inferred judgement ranks them, so
    strict gating keeps them out of the action track; the dialogue track's relaxed gating admits them."""
    spec, a, b = unit.spec, unit.episode, unit.against()
    if unit.judgements is None:
        raise ValueError("judge pairs need the judge's record of both episodes")
    ja, jb = unit.judgements
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
            return [pair.model_copy(update={"evidence": evidence(hi, ranking="proxy")})]
        chosen = target_turn(obs, sh.action.executed, sh.dialogue.utterance)
        rejected = target_turn(obs, sl.action.executed, sl.dialogue.utterance)
        return [Pair(
            id=pair_id("judge", hi.episode_id, lo.episode_id, sh.setting.step), track="action", scenario_id=hi.scenario_id,
            tier=hi.tier, seed=hi.seed, step=sh.setting.step, episode_id=hi.episode_id, prompt=prompt_of(sh, obs),
            chosen=assistant(chosen), rejected=assistant(rejected), chosen_value=gh, rejected_value=gl,
            quality=(gh - gl) / 10, provenance=provenance, evidence=evidence(hi, ranking="proxy"), template_key=key,
            snapshot=wh.snapshot_json(), chosen_by="judge",
        )]
    report.exclude("judge", "no_difference")
    return []


def utterance_pairs(unit: Unit, cfg: PairBuild, report: GatingReport) -> list[Pair]:
    """Counterfactual dialogue pairs of one wake episode: at each step whose action ran as the
    policy wrote it, the policy's words vs the expert template's words for that same action.
    Each side is forked from the step's state and rolled out (``cfg.rollouts`` continuations of
    ``cfg.horizon`` steps, common random numbers); its ``q_t`` is the world's assessment of the
    words. chosen = the higher-``q_t`` words; kept when ``q_chosen - q_rejected >= q_margin``
    and ``mean return(chosen) >= mean return(rejected)``. Excluded, by reason: ``not_executed``
    (unparseable or illegal: no words ran), ``same_words``, ``below_margin``,
    ``outcome_disagrees``."""
    spec, ep = unit.spec, unit.episode
    pairs = []
    for s, w in replay(spec, ep):
        report.candidates += 1
        if s.action.parse_status != "ok":
            report.exclude("dialogue", "not_executed")
            continue
        taken = recorded_action(s)
        assert taken is not None
        alt = templated(w, taken)
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


def _wake(inputs: SleepInputs, report: GatingReport) -> list[Unit]:
    return [Unit(inputs.specs[e.scenario_id], e) for e in inputs.wake]


def _references(inputs: SleepInputs, report: GatingReport) -> list[Unit]:
    return [Unit(inputs.specs[r.scenario_id], r) for _, r in sorted(inputs.reference.items())]


def _wake_and_reference(inputs: SleepInputs, report: GatingReport) -> list[Unit]:
    return [Unit(inputs.specs[e.scenario_id], e, inputs.reference[(e.scenario_id, e.seed)]) for e in inputs.wake]


def _judged(inputs: SleepInputs, report: GatingReport) -> list[Unit]:
    """Each wake episode with its reference episode, both judged; a failed judgement is counted
    (``judge:failed``) and pairs nothing. None without a judge's records."""
    units: list[Unit] = []
    judged = inputs.judged
    if not judged:
        return units
    for e in inputs.wake:
        r = inputs.reference[(e.scenario_id, e.seed)]
        ja, jb = judged.get(e.episode_id), judged.get(r.episode_id)
        if ja is None or jb is None or ja.failure or jb.failure:
            report.exclude("judge", "failed")
        else:
            units.append(Unit(inputs.specs[e.scenario_id], e, r, (ja, jb)))
    return units


@dataclass(frozen=True)
class Source:
    """A way of building pairs: which pieces of work a wake gives it, and the function that
    builds one piece's pairs (one signature for every source)."""

    name: PairSource
    units: Callable[[SleepInputs, GatingReport], list[Unit]]
    build: Callable[[Unit, PairBuild, GatingReport], list[Pair]]
    doc: str


SOURCES: Final[dict[str, Source]] = {s.name: s for s in (
    Source("action", _wake, action_pairs, "counterfactual steps of each wake episode (action track)"),
    Source("reference", _references, reference_pairs, "counterfactual steps of each reference episode (action track)"),
    Source("dialogue", _wake_and_reference, dialogue_pairs,
           "each wake episode against its reference episode: the higher-return one's words (dialogue track)"),
    Source("utterance", _wake, utterance_pairs, "the policy's words against the template's for the same action (dialogue track)"),
    Source("judge", _judged, judge_pairs, "two episodes ranked by an LM judge (with the loop's --judge; proxy evidence)"),
)}
"""Every pair source by name, in the order a sleep phase builds them (the recipe's
``PairBuild.sources`` chooses among them; the order is this one whatever the list's)."""
