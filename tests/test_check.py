import pytest

from socialworld.check import ScenarioCheckError, check_scenario
from socialworld.testing import tiny_spec_data


@pytest.mark.parametrize("sid", [
    "team_lunch-v1", "activity_debrief-v1", "book_club-v1", "birthday_budget-v1",
    "charity_fundraising-v1", "community_market-v1", "hackathon-v1", "weather_picnic-v1",
])
def test_shipped_scenarios_pass_check(specs, sid):
    r = check_scenario(specs[sid], seeds=24)
    assert r.ok, r.problems
    assert r.observations_checked > 100


def test_tiny_scenario_passes_and_unsolvable_one_fails():
    r = check_scenario(tiny_spec_data(guards=["no_secret_leaked"]), seeds=5)
    assert r.ok, r.problems
    # metrics-v2: guards earn nothing, so doing nothing never passes, however many guards hold
    many_guards = tiny_spec_data(guards=["no_secret_leaked", "good_relations", "commitments_honoured"])
    assert not any("doing nothing passes" in p for p in check_scenario(many_guards, seeds=5).problems)
    data = tiny_spec_data(guards=["no_secret_leaked"])
    for npc in data["npcs"]:  # nobody can ever agree: every option below any reachable score
        npc["threshold"] = [0.99, 0.99]
        npc["preferences"] = {"film": {"default": [0.0, 0.05]}}
    r = check_scenario(data, seeds=5)
    assert not r.ok and any("oracle passes only" in p for p in r.problems)
    with pytest.raises(ScenarioCheckError):
        check_scenario(data, seeds=5, raise_on_fail=True)
