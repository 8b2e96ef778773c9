"""The lockstep runner's progress counts."""

from socialworld.agents.registry import make_policy
from socialworld.rollout.runner import EpisodeJob, run_episodes, turn_budget


def test_turns_counted_add_up_to_the_budget_as_episodes_end(specs):
    jobs = [EpisodeJob(specs[s], seed) for s in ("team_lunch-v1", "hackathon-v1") for seed in (1, 2)]
    counts = []
    eps = run_episodes(make_policy("expert"), jobs, on_steps=counts.append)
    assert sum(counts) == turn_budget(jobs) == 2 * specs["team_lunch-v1"].turn_budget + 2 * specs["hackathon-v1"].turn_budget
    assert len(counts) == max(len(e.steps) for e in eps)  # one call per lockstep step
    assert counts[0] >= len(jobs)  # the first step: every episode stepped (and one that ended gave its unused turns)
    assert any(e.final.steps < e.steps[0].setting.turn_budget for e in eps)  # the expert ends early: its unused turns count
