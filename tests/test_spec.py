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


def test_run_scenarios_checks_user_files_before_a_run(tmp_path, my_lunch, specs):
    from socialworld.spec import SCENARIO_STORE, capped, resolve_scenarios, run_scenarios, spec_yaml, stored_scenarios

    run = tmp_path / "run"
    sc = run_scenarios([str(my_lunch), "book_club"], ("L0", "L1"), run)
    mine = load_spec(my_lunch)
    assert [s.id for s in sc.specs] == ["my_lunch-v1", "book_club-v1"] and sc.names == ("my_lunch-v1", "book_club")
    assert sc.user == {"my_lunch-v1": mine.content_hash}  # shipped scenarios are not stored
    assert not run.exists()
    # the canonical YAML loads back to the same content hash, for every shipped spec too
    for s in [mine, *specs.values()]:
        assert parse_spec(yaml.safe_load(spec_yaml(s))).content_hash == s.content_hash
    # tiers filter; nothing left is an error
    assert [s.id for s in run_scenarios([str(my_lunch), "book_club"], ("L0",), run).specs] == ["my_lunch-v1"]
    with pytest.raises(ScenarioError, match=r"no scenario of tier\(s\) L2 among my_lunch-v1 \(L0\)"):
        run_scenarios([str(my_lunch)], ("L2",), run)
    # a shipped id with other content, or two different files with one id, are refused
    clash = tmp_path / "clash.yaml"
    clash.write_text(my_lunch.read_text().replace("my_lunch-v1", "team_lunch-v1"))
    with pytest.raises(ScenarioError, match="clash.yaml: id team_lunch-v1 is a shipped scenario's"):
        run_scenarios([str(clash)], ("L0",), run)
    other = tmp_path / "other.yaml"
    other.write_text(my_lunch.read_text().replace("My team lunch", "Another lunch"))
    with pytest.raises(ScenarioError, match="a second, different scenario with id my_lunch-v1"):
        run_scenarios([str(my_lunch), str(other)], ("L0",), run)
    # a run's stored copy: its id resolves without the file; a changed file is refused
    (run / SCENARIO_STORE).mkdir(parents=True)
    (run / SCENARIO_STORE / "my_lunch-v1.yaml").write_text(spec_yaml(mine))
    (run / "config.yaml").write_text(yaml.safe_dump({"user_scenarios": {"my_lunch-v1": mine.content_hash}}))
    assert resolve_scenarios(["my_lunch"], run_dir=run)[0].content_hash == mine.content_hash
    assert run_scenarios(["my_lunch"], ("L0",), run).names == ("my_lunch-v1",)  # recorded as the path was
    with pytest.raises(ScenarioError, match="unknown scenario 'my_lunch'"):
        resolve_scenarios(["my_lunch"])
    with pytest.raises(ScenarioError, match="other.yaml: scenario my_lunch-v1 differs from the copy the run"):
        run_scenarios([str(other)], ("L0",), run)
    (run / SCENARIO_STORE / "my_lunch-v1.yaml").write_text(spec_yaml(load_spec(other)))
    with pytest.raises(ScenarioError, match="my_lunch-v1.yaml: changed since the run was made"):
        stored_scenarios(run)
    # a missing file is one line naming it
    with pytest.raises(ScenarioError, match=r"^nowhere.yaml: cannot read the scenario file \(No such file or directory\)$"):
        resolve_scenarios(["nowhere.yaml"])
    # a capped spec has its own content hash (a model_copy would keep the cached one)
    assert capped(mine, 4).turn_budget == 4 and capped(mine, 4).content_hash != mine.content_hash
    assert capped(mine, 4).content_hash == parse_spec({**yaml.safe_load(spec_yaml(mine)), "turn_budget": 4}).content_hash
