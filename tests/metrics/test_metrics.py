import json

import pytest

from socialworld.core import MentalState
from socialworld.metric_registry import KEYS
from socialworld.metrics.core import (
    METRICS_CONTRACT,
    Aggregate,
    ContractMismatch,
    aggregate,
    align,
    broken_guards,
    episode_metrics,
    require_contract,
    solved,
)
from socialworld.metrics.stats import metric_interval, paired_difference
from socialworld.records import (
    ActionRec,
    DialogueRec,
    EpisodeRecord,
    FinalState,
    Lineage,
    MentalStateRec,
    ObservationRec,
    PolicyRec,
    Setting,
    Signal,
    StepRecord,
    StepSignals,
)

TRUTH = {"preferences": {"ann": {"film": "drama"}, "bob": {"film": "comedy"}}, "moods": {"ann": "mid", "bob": "high"}}


def sig(v, source="direct"):
    return Signal(value=v, source=source, confidence=1.0)


def step(t, align_v, penalty, stated=TRUTH):
    return StepRecord(
        setting=Setting(scenario_id="tiny-v1", tier="L0", seed=0, step=t, turn_budget=8),
        observation=ObservationRec(structured={}, text="", provenance={}),
        mental_state=MentalStateRec(stated=stated, truth=TRUTH),
        action=ActionRec(structured=None, raw="", parse_status="ok", error=None, executed="wait()"),
        dialogue=DialogueRec(utterance="", replies=[], announcements=[]),
        signals=StepSignals(align=sig(align_v), reward=sig(0.0), penalty=sig(penalty), q=sig(0.5), moods={},
                            phi=0.0, penalty_reasons=[], q_features={}, leaked=[]),
        policy=PolicyRec(policy_id="hand"),
    )


def episode(steps, subgoals, moods, phi_0=0.0, phi_T=1.0, t_ref=4):
    return EpisodeRecord(
        episode_id="e", scenario_id="tiny-v1", tier="L0", seed=0, policy_id="hand", steps=steps,
        final=FinalState(subgoals=subgoals, moods=moods, present={k: True for k in moods}, phi_0=phi_0, phi_T=phi_T,
                         steps=len(steps), t_ref=t_ref, end_reason="end", commitments=[], leaks=0),
        lineage=Lineage(framework_version="0", spec_hash="x", world_snapshot_version="v", templates={}),
    )


def test_align_counts_unstated_as_wrong():
    truth = MentalState.from_dict(TRUTH)
    assert align(truth, truth) == 1.0
    assert align(MentalState({"ann": {"film": "drama"}}, {}), truth) == pytest.approx(1 / 4)
    assert align(MentalState({"ann": {"film": "comedy"}}, {"bob": "high"}), truth) == pytest.approx(1 / 4)
    assert align(None, truth) == 0.0


def test_hand_computed_metrics():
    # 5 steps, T=5 > t_ref=4; penalties 0.2 + 0.1; align 0, .5, .5, 1, 1 -> U = 0.6
    steps = [step(0, 0.0, 0.0), step(1, 0.5, 0.2), step(2, 0.5, 0.0), step(3, 1.0, 0.1), step(4, 1.0, 0.0)]
    ep = episode(steps, {"slot:film": True, "slot:venue": False, "conflict:ann-bob": True, "good_relations": True},
                 {"ann": 0.5, "bob": 0.75}, phi_0=0.0, phi_T=1.0, t_ref=4)
    m = episode_metrics(ep)
    assert m.contract == METRICS_CONTRACT == "metrics-v2"
    assert m.CR.value == pytest.approx(2 / 3)  # achievements only: 2 of slot:film, slot:venue, conflict:ann-bob
    assert m.U.value == pytest.approx(0.6) and m.U.source == "direct"
    assert m.A_e.value == pytest.approx((1.0 - 0.0 - 0.3) * 4 / 5)  # 0.56
    s = 0.7 * ((1 + 4 * 0.5) + (1 + 4 * 0.75)) / 2 + 0.3 * (1 + 4 * 2 / 3)  # 0.7*3.5 + 0.3*3.6667 = 3.55
    assert m.S_npc.value == pytest.approx(s) and m.S_npc.source == "fused"
    d = 0.4 * 0.6 + 0.4 * 0.56 + 0.2 * (s - 1) / 4
    assert m.D.value == pytest.approx(d)
    assert m.passed is (2 / 3 >= 0.6 and d >= 0.5) is True
    assert m.solved is False and m.guards_broken == []  # slot:venue is open


def test_guards_earn_nothing_and_a_broken_guard_fails():
    """v2: guards do not count in CR (v1 passed one settled decision of three plus untouched
    guards); breaking one fails the episode however good the rest is."""
    steps = [step(0, 1.0, 0.0)]
    kept = episode(steps, {"slot:a": True, "slot:b": False, "slot:c": False, "no_secret_leaked": True, "within_budget": True},
                   {"ann": 1.0}, t_ref=1)
    m = episode_metrics(kept)
    assert m.CR.value == pytest.approx(1 / 3) and not m.passed and not m.solved
    broken = episode(steps, {"slot:a": True, "no_secret_leaked": False, "within_budget": True}, {"ann": 1.0}, t_ref=1)
    m = episode_metrics(broken)
    assert m.CR.value == 1.0 and m.D.value >= 0.5
    assert not m.passed and not m.solved and m.guards_broken == ["no_secret_leaked"]
    clean = episode(steps, {"slot:a": True, "no_secret_leaked": True}, {"ann": 1.0}, t_ref=1)
    m = episode_metrics(clean)
    assert m.passed and m.solved and m.guards_broken == []


def test_solved_needs_every_decision_not_conflicts_alone():
    assert solved({"slot:a": True, "slot:b": True, "conflict:x-y": False, "good_relations": True})
    assert not solved({"slot:a": True, "slot:b": False, "conflict:x-y": True})
    assert not solved({"slot:a": True, "commitments_honoured": False})
    assert broken_guards({"slot:a": False, "within_budget": False, "good_relations": True}) == ["within_budget"]


def test_u_degrades_to_cr_without_a_stated_mental_state():
    steps = [step(0, 0.0, 0.0, stated=None), step(1, 0.0, 0.0, stated=None)]
    ep = episode(steps, {"slot:film": True, "slot:venue": False}, {"ann": 0.5})
    m = episode_metrics(ep)
    assert m.U.source == "degraded" and m.U.value == pytest.approx(0.5)
    assert m.D.source == "degraded"


def test_a_e_clipped_in_d_and_pass_thresholds():
    steps = [step(0, 1.0, 0.2)] * 1
    ep = episode(steps, {"slot:film": False}, {"ann": 0.0}, phi_0=0.0, phi_T=0.0)
    m = episode_metrics(ep)
    assert m.A_e.value == pytest.approx(-0.2)
    assert m.D.value == pytest.approx(0.4 * 1.0 + 0.0 + 0.2 * (0.7 * 1 + 0.3 * 1 - 1) / 4)
    assert not m.passed
    assert episode_metrics(ep, cr_threshold=0.0, d_threshold=0.0).passed


def test_aggregate_pass_rate():
    good = episode([step(0, 1.0, 0.0)], {"slot:film": True}, {"ann": 1.0}, t_ref=1)
    bad = episode([step(0, 0.0, 0.2)], {"slot:film": False}, {"ann": 0.0}, phi_T=0.0)
    half = episode([step(0, 1.0, 0.0), step(1, 1.0, 0.0)], {"slot:film": True, "slot:venue": True, "within_budget": False},
                   {"ann": 1.0}, t_ref=2)
    a = aggregate([good, bad, good, half])
    assert a["pass"] == 0.5 and a["solve"] == 0.5 and a.n == 4
    assert a.steps_per_episode == 5 / 4 and a.metrics_contract == METRICS_CONTRACT
    with pytest.raises(ValueError):
        aggregate([])


def test_an_aggregate_reads_back_and_one_written_before_the_registry_migrates():
    a = aggregate([episode([step(0, 1.0, 0.0)], {"slot:film": True}, {"ann": 1.0}, t_ref=1)])
    assert Aggregate.model_validate_json(a.to_json()) == a and list(a.metrics) == list(KEYS)
    flat = {**{k: a[k] for k in ("U", "A_e", "S_npc", "D", "CR")}, "pass_rate": a["pass"], "solve_rate": a["solve"],
            "n": 1, "steps": 1, "steps_per_episode": 1.0, "parse_failure_rate": 0.0, "endpoint_failure_rate": 0.0,
            "metrics_contract": METRICS_CONTRACT}  # metrics.json and summary.json before the registry
    assert Aggregate.model_validate(flat) == a
    with pytest.raises(ValueError, match="exactly the registered metrics"):  # a metric missing is not read as 0
        Aggregate.model_validate({**json.loads(a.to_json()), "metrics": {"pass": 1.0}})


def _scored(ep, contract):
    return ep.model_copy(update={"metrics": episode_metrics(ep).model_copy(update={"contract": contract})})


def test_versions_are_never_mixed():
    ep = episode([step(0, 1.0, 0.0)], {"slot:film": True}, {"ann": 1.0}, t_ref=1)
    old = _scored(ep, "metrics-v1")
    new = _scored(ep.model_copy(update={"seed": 1}), METRICS_CONTRACT)
    with pytest.raises(ContractMismatch, match="metrics-v1"):
        aggregate([new, old])
    with pytest.raises(ContractMismatch):
        metric_interval([old], "pass")
    with pytest.raises(ContractMismatch):
        paired_difference([old], [_scored(ep, METRICS_CONTRACT)], "pass")
    require_contract([new])  # ours: fine
    # a record written before the field existed reads as v1
    legacy = json.loads(new.model_dump_json())
    del legacy["metrics"]["contract"]
    assert EpisodeRecord.model_validate(legacy).metrics.contract == "metrics-v1"
