import pytest

from socialworld.agents.registry import make_policy
from socialworld.metrics.lifelong import (
    Lost,
    forgetting,
    forgetting_intervals,
    forward_transfer,
    lost_episodes,
    next_unlocked,
    pooled_forgetting_intervals,
    progressive_schedule,
    r_table,
    static_schedule,
    unlock_cycles,
)
from socialworld.rollout.evaluate import episode_seeds
from socialworld.rollout.runner import EpisodeJob, run_episodes
from socialworld.world.spec import resolve_scenarios


def _eps(policy, tiers, n=4):
    jobs = [EpisodeJob(s, seed) for s in resolve_scenarios(None, tiers) for seed in episode_seeds(5, s.id, n)]
    return run_episodes(make_policy(policy, seed=1), jobs)


@pytest.fixture(scope="module")
def cycles():
    """per-cycle evaluations on the same seeds: an arm good on L0 in cycle 1 that has forgotten it by
    cycle 2, and an untrained one"""
    expert_l0, random_l0 = _eps("expert", ["L0"]), _eps("random", ["L0"])
    expert_l1, random_l1 = _eps("expert", ["L1"]), _eps("random", ["L1"])
    return {1: expert_l0, 2: random_l0 + expert_l1}, {1: random_l0, 2: random_l0 + random_l1}


@pytest.fixture(scope="module")
def tables(cycles):
    arm, untrained = cycles
    return r_table(arm, resamples=2000), r_table(untrained, resamples=2000)


def test_schedules():
    assert progressive_schedule(3) == [("L0",), ("L0", "L1"), ("L0", "L1", "L2")]
    assert progressive_schedule(4)[-1] == ("L0", "L1", "L2")
    assert static_schedule(2) == [("L0", "L1", "L2")] * 2
    assert next_unlocked(("L0",), 0.4, 0.5) == ("L0",)
    assert next_unlocked(("L0",), 0.5, 0.5) == ("L0", "L1")
    assert next_unlocked(("L0", "L1", "L2"), 1.0, 0.5) == ("L0", "L1", "L2")


def test_r_table_forgetting_and_transfer(tables):
    arm, untrained = tables
    assert set(arm[1]) == {"L0"} and set(arm[2]) == {"L0", "L1"}
    assert unlock_cycles(arm) == {"L0": 1, "L1": 2}
    assert arm[1]["L0"].mean > 0.5 and arm[2]["L0"].mean == 0.0
    assert arm[1]["L0"].lo <= arm[1]["L0"].mean <= arm[1]["L0"].hi
    f = forgetting(arm)
    assert set(f) == {"L0"} and f["L0"] == pytest.approx(arm[1]["L0"].mean)
    assert forgetting(untrained)["L0"] == 0.0
    fwt = forward_transfer(arm, untrained)
    assert fwt["L0"] == pytest.approx(arm[1]["L0"].mean) and fwt["L1"] == pytest.approx(arm[2]["L1"].mean)


def test_forgetting_interval_resamples_the_same_episodes_in_every_cycle(cycles, tables):
    """F's interval: its mean is :func:`forgetting`'s F, it holds the mean, and an arm that plays the same
    episodes alike in every cycle forgets nothing on any draw ([0, 0]); cycles of other episodes are an error."""
    arm, untrained = cycles
    iv = forgetting_intervals(arm, seed=3, resamples=2000)
    assert set(iv) == {"L0"} and iv["L0"].mean == pytest.approx(forgetting(tables[0])["L0"]) and iv["L0"].n == len(arm[1])
    assert iv["L0"].lo <= iv["L0"].mean <= iv["L0"].hi and iv["L0"].hi > 0 and iv["L0"].resamples == 2000
    assert forgetting_intervals(arm, seed=3, resamples=2000) == iv  # seeded
    flat = forgetting_intervals(untrained, resamples=500)["L0"]
    assert (flat.mean, flat.lo, flat.hi) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="cycle 1 evaluated other episodes than cycle 2"):
        forgetting_intervals({1: arm[1][1:], 2: arm[2]})


def test_lost_episodes_are_those_passed_before_and_failed_last(cycles):
    """The lost episodes: passed in an earlier cycle, failed in the last, each with whether the reference
    passes it; none where nothing was passed before."""
    arm, untrained = cycles
    passed_first = {(e.scenario_id, e.seed) for e in arm[1] if e.metrics.passed}
    failed_last = {(e.scenario_id, e.seed) for e in arm[2] if e.tier == "L0" and not e.metrics.passed}
    lost = lost_episodes(arm, reference=arm[1])
    assert passed_first & failed_last and {(x.scenario_id, x.seed) for x in lost} == passed_first & failed_last
    assert all(x.tier == "L0" and x.passed_in == (1,) and x.reference_passed is True for x in lost)
    assert {x.reference_passed for x in lost_episodes(arm, reference=untrained[1])} == {False}
    assert lost_episodes(arm)[0].reference_passed is None and lost_episodes(untrained) == []
    assert len(lost) / len(arm[1]) == pytest.approx(forgetting_intervals(arm)["L0"].mean)  # F counts them here
    assert isinstance(lost[0], Lost)


def test_pooled_forgetting_is_the_mean_over_runs(cycles):
    """Pooled over runs: the mean of each run's F, on every episode of them all; a run with its forgetting
    and one without average to half of it."""
    arm, untrained = cycles
    one = forgetting_intervals(arm)["L0"]
    two = pooled_forgetting_intervals([arm, untrained], resamples=2000)["L0"]
    assert two.mean == pytest.approx(one.mean / 2) and two.n == 2 * one.n and two.lo <= two.mean <= two.hi
    same = pooled_forgetting_intervals([arm, arm], resamples=2000)["L0"]
    assert same.mean == pytest.approx(one.mean) and same.hi - same.lo <= one.hi - one.lo + 1e-9
