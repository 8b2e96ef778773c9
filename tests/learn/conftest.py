"""The training tests share the counterfactual action pairs of one random team-lunch episode."""

import pytest

from socialworld.agents.registry import make_policy
from socialworld.learn.config import SleepConfig
from socialworld.learn.pairs.gating import GatingReport
from socialworld.learn.pairs.sources import Unit, action_pairs
from socialworld.rollout.runner import EpisodeJob, run_episodes


@pytest.fixture(scope="session")
def pairs(specs):
    lunch = specs["team_lunch-v1"]
    ep = run_episodes(make_policy("random", seed=3), [EpisodeJob(lunch, 12)])[0]  # a seed with 4+ pairs
    ps = action_pairs(Unit(lunch, ep), SleepConfig(rollouts=1, horizon=4, max_candidates=6), GatingReport())
    assert len(ps) >= 4
    return ps
