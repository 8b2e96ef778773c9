import pytest

from socialworld.agents.registry import make_policy
from socialworld.metrics.lifelong import (
    forgetting,
    forward_transfer,
    next_unlocked,
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
def tables():
    expert_l0, random_l0 = _eps("expert", ["L0"]), _eps("random", ["L0"])
    expert_l1, random_l1 = _eps("expert", ["L1"]), _eps("random", ["L1"])
    # an arm that is good on L0 in cycle 1 and has forgotten it by cycle 2
    arm = r_table({1: expert_l0, 2: random_l0 + expert_l1}, resamples=2000)
    untrained = r_table({1: random_l0, 2: random_l0 + random_l1}, resamples=2000)
    return arm, untrained


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
