"""A run folder's scenarios: resolved and checked before a run, stored, and named by id after."""

import pytest
import yaml

from socialworld.layout import SCENARIO_STORE
from socialworld.learn.scenarios import resolve_in_run, run_scenarios, stored_scenarios
from socialworld.world.spec import ScenarioError, load_spec, spec_yaml


def test_run_scenarios_checks_user_files_before_a_run(tmp_path, my_lunch):
    run = tmp_path / "run"
    sc = run_scenarios([str(my_lunch), "book_club"], ("L0", "L1"), run)
    mine = load_spec(my_lunch)
    assert [s.id for s in sc.specs] == ["my_lunch-v1", "book_club-v1"] and sc.names == ("my_lunch-v1", "book_club")
    assert sc.user == {"my_lunch-v1": mine.content_hash}  # shipped scenarios are not stored
    assert not run.exists()
    # tiers filter; nothing left is an error
    assert [s.id for s in run_scenarios([str(my_lunch), "book_club"], ("L0",), run).specs] == ["my_lunch-v1"]
    with pytest.raises(ScenarioError, match=r"no scenario of tier\(s\) L2 among my_lunch-v1 \(L0\)"):
        run_scenarios([str(my_lunch)], ("L2",), run)
    # a shipped id with other content, or two different files with one id, are refused
    clash = tmp_path / "clash.yaml"
    clash.write_text(my_lunch.read_text().replace("my_lunch-v1", "team_lunch-v1"))
    with pytest.raises(ScenarioError, match="clash.yaml: id team_lunch-v1 is a shipped scenario's"):
        run_scenarios([str(clash)], ("L0",), run)
    bare = tmp_path / "clash_no_suffix"  # a path however it is spelled: the check does not depend on the name
    bare.write_text(clash.read_text())
    with pytest.raises(ScenarioError, match="clash_no_suffix: id team_lunch-v1 is a shipped scenario's"):
        run_scenarios([str(bare)], ("L0",), run)
    other = tmp_path / "other.yaml"
    other.write_text(my_lunch.read_text().replace("My team lunch", "Another lunch"))
    with pytest.raises(ScenarioError, match="a second, different scenario with id my_lunch-v1"):
        run_scenarios([str(my_lunch), str(other)], ("L0",), run)
    # a run's stored copy: its id resolves without the file; a changed file is refused
    (run / SCENARIO_STORE).mkdir(parents=True)
    (run / SCENARIO_STORE / "my_lunch-v1.yaml").write_text(spec_yaml(mine))
    (run / "config.yaml").write_text(yaml.safe_dump({"user_scenarios": {"my_lunch-v1": mine.content_hash}}))
    assert resolve_in_run(["my_lunch"], run)[0].content_hash == mine.content_hash
    assert run_scenarios(["my_lunch"], ("L0",), run).names == ("my_lunch-v1",)  # recorded as the path was
    with pytest.raises(ScenarioError, match="other.yaml: scenario my_lunch-v1 differs from the copy the run"):
        run_scenarios([str(other)], ("L0",), run)
    (run / SCENARIO_STORE / "my_lunch-v1.yaml").write_text(spec_yaml(load_spec(other)))
    with pytest.raises(ScenarioError, match="my_lunch-v1.yaml: changed since the run was made"):
        stored_scenarios(run)
