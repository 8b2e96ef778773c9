import pytest
import yaml

from socialworld.spec import ScenarioError, load_spec, parse_spec
from socialworld.testing import tiny_spec_data


def test_eight_scenarios_over_three_tiers(specs):
    tiers = {}
    for s in specs.values():
        tiers.setdefault(s.tier, []).append(s.id.rsplit("-v", 1)[0])
    assert sorted(tiers["L0"]) == ["activity_debrief", "team_lunch"]
    assert sorted(tiers["L1"]) == ["birthday_budget", "book_club", "charity_fundraising"]
    assert sorted(tiers["L2"]) == ["community_market", "hackathon", "weather_picnic"]


def test_specs_are_frozen(specs):
    s = next(iter(specs.values()))
    with pytest.raises(Exception):
        s.turn_budget = 3


def test_l2_scenarios_have_dynamics_and_l1_need_trade_offs(specs):
    for s in specs.values():
        if s.tier == "L2":
            assert s.events, s.id
        if s.tier == "L1":
            assert s.require_negotiation and s.offers, s.id
    kinds = {e.kind for s in specs.values() for e in s.events}
    assert kinds == {"weather_change", "budget_cut", "participant_leaves", "late_arrival", "preference_change", "conflict"}


def _write(tmp_path, data):
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_malformed_file_names_file_and_field(tmp_path):
    data = tiny_spec_data()
    data["npcs"][0]["traits"]["openness"] = 3
    p = _write(tmp_path, data)
    with pytest.raises(ScenarioError) as err:
        load_spec(p)
    assert str(p) in str(err.value) and "npcs.0.traits.openness" in str(err.value)


def test_unknown_reference_names_the_field(tmp_path):
    data = tiny_spec_data()
    data["npcs"][1]["preferences"] = {"film": {"drama": 0.5, "comedy": 0.5, "popcorn": 0.1}}
    with pytest.raises(ScenarioError, match=r"npcs\.bob\.preferences\.film: unknown option"):
        load_spec(_write(tmp_path, data))


def test_missing_field_and_bad_yaml(tmp_path):
    data = tiny_spec_data()
    del data["turn_budget"]
    with pytest.raises(ScenarioError, match="field turn_budget"):
        load_spec(_write(tmp_path, data))
    p = tmp_path / "broken.yaml"
    p.write_text("id: [unclosed")
    with pytest.raises(ScenarioError, match="broken.yaml: not valid YAML"):
        load_spec(p)


def test_behaviour_is_not_in_yaml():
    data = tiny_spec_data(events=[{"kind": "run_python", "at": [1, 2], "text": "x"}])
    with pytest.raises(ScenarioError, match="events.0.kind"):
        parse_spec(data)


def test_max_turns_caps_the_turn_budget():
    from socialworld.spec import resolve_scenarios

    full = {s.id: s.turn_budget for s in resolve_scenarios()}
    capped = resolve_scenarios(max_turns=5)
    assert {s.id for s in capped} == set(full) and all(s.turn_budget == min(5, full[s.id]) for s in capped)
    assert [s.turn_budget for s in resolve_scenarios(max_turns=0)] == list(full.values())
