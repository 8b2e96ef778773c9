from socialworld.agents.registry import make_policy
from socialworld.core import Action
from socialworld.metrics.diagnostics import CATEGORIES, coverage, failure_counts
from socialworld.rollout.runner import EpisodeJob, run_episodes
from socialworld.testing import FixedPolicy
from socialworld.world.engine import World


def test_wrong_conflict_order_is_detected_and_attributed(specs):
    spec = specs["community_market-v1"]
    # wait for the quarrel, then repair the wrong party first
    w = World(spec, 0)
    for _ in range(4):
        w.step(Action("wait"))
    first = w.conflict_first[0]
    second = "rosa" if first == "karim" else "karim"
    script = ["wait() | Let's wait, everyone."] * 4 + [
        f"repair({second}) | Sorry, thank you.", f"repair({first}) | Sorry, thank you.",
        f"repair({second}) | Sorry, thank you.", "end() | Thanks all.",
    ]
    ep = run_episodes(FixedPolicy(script), [EpisodeJob(spec, 0)])[0]
    names = {c.name for c in ep.diagnostics.checks if not c.ok}
    assert "avoidable_wait" in names
    assert not ep.metrics.passed and ep.diagnostics.primary_failure in CATEGORIES
    orders = [c for c in ep.diagnostics.checks if c.name == "conflict_order"]
    assert orders and any(not c.ok for c in orders)
    assert "conflict_handling_order" in ep.diagnostics.attribution


def test_coverage_and_counts(specs):
    eps = run_episodes(make_policy("random", seed=1), [EpisodeJob(s, 3) for s in specs.values()])
    cov = coverage(eps)
    assert cov["failed"] == len(eps) and cov["coverage"] == 1.0 and 0 < cov["mean_confidence"] <= 1
    assert sum(failure_counts(eps).values()) == len(eps)
    ok = run_episodes(make_policy("oracle"), [EpisodeJob(specs["team_lunch-v1"], 3)])[0]
    assert ok.metrics.passed and ok.diagnostics.attribution == {}
