import re

import pytest

from socialworld.rollout.check import ScenarioCheckError, check_scenario
from socialworld.testing import tiny_spec_data


@pytest.mark.parametrize("sid", [
    "team_lunch-v1", "activity_debrief-v1", "book_club-v1", "birthday_budget-v1",
    "charity_fundraising-v1", "community_market-v1", "hackathon-v1", "weather_picnic-v1",
])
def test_shipped_scenarios_pass_check(specs, sid):
    r = check_scenario(specs[sid], seeds=24, fuzz_seeds=8)  # the full fuzz: test_fuzz_200_seeds (slow)
    assert r.ok, r.problems
    assert r.fuzz_steps > 8 * 5 and r.warnings == []
    assert r.observations_checked > 100


def test_tiny_scenario_passes_and_unsolvable_one_fails():
    r = check_scenario(tiny_spec_data(guards=["no_secret_leaked"]), seeds=5)
    assert r.ok, r.problems
    # metrics-v2: guards earn nothing, so doing nothing scores CR 0 and never passes, however many guards hold
    from socialworld.rollout.runner import EpisodeJob, run_episodes
    from socialworld.testing import FixedPolicy
    from socialworld.world.spec import parse_spec

    many_guards = parse_spec(tiny_spec_data(guards=["no_secret_leaked", "good_relations", "commitments_honoured"]))
    idle = run_episodes(FixedPolicy([]), [EpisodeJob(many_guards, s) for s in range(5)])
    assert all(e.metrics.CR.value == 0 and not e.metrics.passed and not e.metrics.guards_broken for e in idle)
    data = tiny_spec_data(guards=["no_secret_leaked"])
    for npc in data["npcs"]:  # nobody can ever agree: every option below any reachable score
        npc["threshold"] = [0.99, 0.99]
        npc["preferences"] = {"film": {"default": [0.0, 0.05]}}
    r = check_scenario(data, seeds=5)
    assert not r.ok and any("oracle passes only" in p for p in r.problems)
    with pytest.raises(ScenarioCheckError):
        check_scenario(data, seeds=5, raise_on_fail=True)


SHIPPED = ["team_lunch-v1", "activity_debrief-v1", "book_club-v1", "birthday_budget-v1",
           "charity_fundraising-v1", "community_market-v1", "hackathon-v1", "weather_picnic-v1"]


def test_fuzz_finds_no_crash_in_the_shipped_scenarios(specs):
    from socialworld.rollout.check import fuzz

    for sid in SHIPPED:  # a few seeds here; test_fuzz_200_seeds (slow) runs the full count
        problems, steps = fuzz(specs[sid], seeds=8)
        assert problems == [] and steps > 8 * 5, (sid, problems, steps)


@pytest.mark.slow
@pytest.mark.parametrize("sid", SHIPPED)
def test_fuzz_200_seeds(specs, sid):
    from socialworld.rollout.check import fuzz

    problems, steps = fuzz(specs[sid], seeds=200)
    assert problems == [] and steps > 200 * 5, problems


def test_fuzz_reports_an_escaping_exception_with_seed_step_and_action(monkeypatch, specs):
    from socialworld.world import actions

    def boom(w, a, q, replies):
        raise ZeroDivisionError("boom")

    monkeypatch.setitem(actions.HANDLERS, "approach", boom)
    r = check_scenario(specs["team_lunch-v1"], seeds=3, fuzz_seeds=6)  # reported, not raised
    crashes = [p for p in r.problems if p.startswith("fuzz:")]
    assert crashes and not r.ok and r.problems[-1].startswith("the other checks were skipped")
    assert re.fullmatch(r"fuzz: seed 2000\d step \d+: approach\(\w+\) raised ZeroDivisionError: boom", crashes[0]), crashes


def test_fuzz_plays_arbitrary_illegal_actions_too(specs):
    """Part of the fuzz is off-script (any ids): the promise crash class would be caught."""
    from socialworld.rollout.check import _arbitrary_action
    from socialworld.world.engine import World
    from socialworld.world.rng import WorldRNG

    spec, r = specs["book_club-v1"], WorldRNG(0)
    w = World(spec, 0)
    actions = [_arbitrary_action(spec, r) for _ in range(300)]
    assert any(w.check_legal(a) is not None for a in actions) and any(w.check_legal(a) is None for a in actions)
    assert {a.kind for a in actions} == {"approach", "inquire", "propose", "negotiate", "repair", "wait", "finalize", "end"}


def test_failed_solvability_names_the_seeds_and_where_the_oracle_stalls():
    data = tiny_spec_data(guards=["no_secret_leaked"])
    for npc in data["npcs"]:
        npc["threshold"] = [0.99, 0.99]
        npc["preferences"] = {"film": {"default": [0.0, 0.05]}}
    r = check_scenario(data, seeds=4, fuzz_seeds=0)
    (solve,) = [p for p in r.problems if p.startswith("oracle solves")]
    assert "failing seeds: 10000, 10001, 10002, 10003;" in solve
    assert "seed 10000: ended by " in solve and "unmet: slot:film" in solve and "last moves: " in solve
    assert solve.count(" | ") == 2  # details of the first three failing seeds


def test_warnings_are_reported_and_fail_nothing():
    data = tiny_spec_data(guards=["no_secret_leaked"],
                          events=[{"kind": "weather_change", "at": [2, 3], "tag": "sunny", "text": "Sun!"}])
    r = check_scenario(data, seeds=4, fuzz_seeds=4)
    assert r.ok, r.problems
    assert r.warnings == ["events[0].tag: no option carries the tag 'sunny': the weather change invalidates nothing"]
    assert r.fuzz_steps > 0


@pytest.mark.parametrize("seed", [10044, 10075, 10141])
def test_oracle_never_repeats_an_offer_that_adds_nothing(specs, seed):
    """Offers do not stack: these seeds once had the oracle re-offer a smaller goodwill offer
    (answered 'repeated_offer') until the turns ran out."""
    from socialworld.agents.scripted import OraclePolicy
    from socialworld.rollout.runner import EpisodeJob, run_episodes

    (ep,) = run_episodes(OraclePolicy(), [EpisodeJob(specs["charity_fundraising-v1"], seed)])
    reasons = [x for s in ep.steps for x in s.signals.penalty_reasons]
    assert "repeated_offer" not in reasons and ep.final.end_reason == "end", (reasons, ep.final.end_reason)


def test_oracle_makes_no_repeated_offer_on_the_shipped_scenarios(specs):
    from socialworld.agents.scripted import OraclePolicy
    from socialworld.rollout.runner import EpisodeJob, run_episodes

    jobs = [EpisodeJob(specs[sid], 10_000 + i) for sid in SHIPPED for i in range(10)]
    eps = run_episodes(OraclePolicy(), jobs)
    bad = [(e.scenario_id, e.seed) for e in eps for s in e.steps if "repeated_offer" in s.signals.penalty_reasons]
    assert bad == []
