import pytest
import yaml

from socialworld.testing import tiny_spec_data
from socialworld.world.spec import ScenarioError, load_spec, parse_spec


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
    from socialworld.world.spec import resolve_scenarios

    full = {s.id: s.turn_budget for s in resolve_scenarios()}
    capped = resolve_scenarios(max_turns=5)
    assert {s.id for s in capped} == set(full) and all(s.turn_budget == min(5, full[s.id]) for s in capped)
    assert [s.turn_budget for s in resolve_scenarios(max_turns=0)] == list(full.values())
    # a capped spec stays valid: t_ref fits, events that could no longer fire are left out
    assert all(s.t_ref <= s.turn_budget and all(e.at.low <= s.turn_budget for e in s.events) for s in capped)
    picnic = next(s for s in resolve_scenarios(["weather_picnic"], max_turns=4))
    assert [e.kind for e in picnic.events] == ["weather_change"]  # the quarrel (turns 5-8) could never happen


# ---------------------------------------------------------------- validation: every invalid spec is refused clearly

def _shipped(name: str) -> dict:
    from socialworld.world.spec import builtin_scenario_files

    (path,) = [p for p in builtin_scenario_files() if p.stem == name]
    return yaml.safe_load(path.read_text())


def _set(path: str, value):
    """A mutation setting ``path`` (dotted; digits index lists) of the mapping to ``value``."""
    def mutate(data):
        *head, last = path.split(".")
        node = data
        for k in head:
            node = node[int(k)] if k.isdigit() else node[k]
        node[int(last) if last.isdigit() else last] = value
    return mutate


def _second_conflict(data):
    first = next(e for e in data["events"] if e["kind"] == "conflict")
    data["events"].append({**first, "npcs": first["npcs"][::-1], "at": [9, 10]})


def _leaves_twice(data):
    data["events"].append({**data["events"][1], "at": [7, 8]})


def _absent_leaves(data):  # felix arrives on turn 2-4; leaving from turn 2 may come first
    data["events"][1].update(npc="felix", at=[2, 6])


def _absent_quarrel(data):  # felix arrives on turn 2-4; a quarrel with him from turn 3 may come first
    data["events"].append({"kind": "conflict", "at": [3, 5], "npcs": ["felix", "zoe"], "text": "Felix and Zoe fall out."})


def _all_absent(data):
    for n in data["npcs"]:
        n["present"] = False


def _no_say_on_theme(data):  # zoe's preference_change is on theme; take theme away from her
    data["slots"][0]["stakeholders"] = [n["id"] for n in data["npcs"] if n["id"] != "zoe"]


INVALID = [  # (id, shipped file, mutation, text the error must contain)
    ("nan-range", "team_lunch", _set("npcs.0.threshold", [float("nan"), 0.6]), "field npcs.0.threshold.low: Input should be a finite number"),
    ("inf-range", "team_lunch", _set("npcs.1.mood", [0.4, float("inf")]), "field npcs.1.mood.high: Input should be a finite number"),
    ("nan-utility", "team_lunch", _set("npcs.0.preferences.restaurant.default", [float("nan"), 0.5]),
     "field npcs.0.preferences.restaurant.default.range.low: Input should be a finite number"),
    ("inf-budget", "birthday_budget", _set("budget", float("inf")), "field budget: Input should be a finite number"),
    ("nan-offer-value", "book_club", _set("offers.0.value", float("nan")), "field offers.0.value: Input should be a finite number"),
    ("option-id-dash", "team_lunch", _set("slots.0.options.0.id", "dim-sum"), "field slots.0.options.0.id: String should match pattern '^[a-z0-9_]+$'"),
    ("npc-id-upper", "team_lunch", _set("npcs.0.id", "Maya"), "field npcs.0.id: String should match pattern"),
    ("slot-id-space", "team_lunch", _set("slots.0.id", "main course"), "field slots.0.id: String should match pattern"),
    ("offer-id-dash", "book_club", _set("offers.0.id", "pick-date"), "field offers.0.id: String should match pattern"),
    ("npc-id-all", "team_lunch", _set("npcs.0.id", "all"), "field npcs.0.id: 'all' is reserved"),
    ("empty-keyword", "birthday_budget", _set("npcs.1.secret.keywords", ["", "x"]), "field npcs.1.secret.keywords: keyword '' has no ASCII letter or digit"),
    ("blank-keyword", "birthday_budget", _set("npcs.1.secret.keywords", ["  "]), "field npcs.1.secret.keywords: keyword '  ' has no ASCII letter"),
    ("self-conflict", "weather_picnic", _set("events.1.npcs", ["marco", "marco"]), "field events[1].npcs: a conflict of 'marco' with themselves"),
    ("same-pair-twice", "weather_picnic", _second_conflict, "field events[2].npcs: a second conflict between marco and sofia"),
    ("t_ref-over-budget", "team_lunch", _set("t_ref", 17), "field t_ref: 17 reference steps do not fit in the turn budget of 7"),
    ("event-after-budget", "weather_picnic", _set("events.0.at", [22, 24]), "field events[0].at: the window starts at turn 22, after the turn budget of 16"),
    ("event-at-turn-0", "weather_picnic", _set("events.0.at", [0, 3]), "field events[0].at: turns are whole numbers from 1"),
    ("event-fractional-turn", "weather_picnic", _set("events.0.at", [2.5, 4]), "field events[0].at: turns are whole numbers from 1"),
    ("late-arrival-present", "hackathon", _set("npcs.3.present", True), "field events[0].npc: late_arrival of 'felix', who is present from the start"),
    ("pref-change-no-say", "hackathon", _no_say_on_theme, "field events[2].npc: preference_change of 'zoe', who has no say on slot 'theme'"),
    ("no-stakeholders", "team_lunch", _set("slots.0.stakeholders", []), "field slots.0.stakeholders: a decision needs at least one stakeholder"),
    ("stakeholder-twice", "hackathon", _set("slots.0.stakeholders", ["zoe", "zoe"]), "field slots.0.stakeholders: a stakeholder is listed twice: ['zoe']"),
    ("negative-cost", "birthday_budget", _set("slots.0.options.0.cost", -5), "field slots.0.options.0.cost: Input should be greater than or equal to 0"),
    ("negative-offer-cost", "birthday_budget", _set("offers.0.cost", -30), "field offers.0.cost: Input should be greater than or equal to 0"),
    ("capacity-zero", "team_lunch", _set("slots.0.options.0.capacity", 0), "field slots.0.options.0.capacity: Input should be greater than or equal to 1"),
    ("nobody-present", "team_lunch", _all_absent, "field npcs: nobody is present at the start"),
    ("leaves-twice", "hackathon", _leaves_twice, "field events[3].npc: 'olga' leaves twice"),
]


@pytest.mark.parametrize("name,mutate,expected", [x[1:] for x in INVALID], ids=[x[0] for x in INVALID])
def test_invalid_spec_names_file_and_field(tmp_path, name, mutate, expected):
    data = _shipped(name)
    parse_spec(data)  # the shipped mapping is valid: the mutation alone breaks it
    mutate(data)
    p = _write(tmp_path, data)
    with pytest.raises(ScenarioError) as err:
        load_spec(p)
    msg = str(err.value)
    assert msg.startswith(f"{p}: invalid scenario spec\n") and expected in msg, msg
    assert "too_short" not in msg and "should have at least" not in msg  # no echo of the failed item


def test_an_id_that_breaks_the_action_grammar_is_what_the_pattern_stops():
    from socialworld.core import Action, ActionParseError

    with pytest.raises(ActionParseError):  # why ids are ^[a-z0-9_]+$
        Action.parse("propose(lunch, dim-sum, all)")


FILE_ERRORS = [  # (id, how to make the path, text of the one-line error)
    ("missing", lambda d: d / "nope.yaml", "no such file"),
    ("directory", lambda d: (d / "folder.yaml").mkdir() or d / "folder.yaml", "is a directory, not a scenario file"),
    ("not-utf8", lambda d: (d / "b.yaml").write_bytes(b"id: caf\xe9\n") and d / "b.yaml", "not UTF-8 text"),
    ("empty", lambda d: (d / "e.yaml").write_text("  \n") and d / "e.yaml", "the file is empty"),
    ("deep", lambda d: (d / "n.yaml").write_text("[" * 20000 + "]" * 20000) and d / "n.yaml", "line 1: nested more than 64 deep"),
    ("duplicate-key", lambda d: (d / "k.yaml").write_text("id: a-v1\nname: x\nid: b-v1\n") and d / "k.yaml",
     "not valid YAML: found duplicate key 'id' (first at line 1) (line 3, column 1)"),
    ("too-large", lambda d: (d / "big.yaml").write_text("# " + "x" * 1_000_000) and d / "big.yaml",
     "more than 1000000 bytes; a scenario file may be at most 1 MB"),
]


@pytest.mark.parametrize("make,expected", [x[1:] for x in FILE_ERRORS], ids=[x[0] for x in FILE_ERRORS])
def test_unreadable_file_is_a_one_line_error_naming_it(tmp_path, make, expected):
    p = make(tmp_path)
    with pytest.raises(ScenarioError) as err:
        load_spec(p)
    msg = str(err.value)
    assert msg.startswith(f"{p}: ") and expected in msg and "\n" not in msg, msg


def test_duplicate_key_in_a_shipped_file_is_refused(tmp_path):
    from socialworld.world.spec import builtin_scenario_files

    text = next(p for p in builtin_scenario_files() if p.stem == "team_lunch").read_text()
    p = tmp_path / "twice.yaml"
    assert "\nturn_budget: " in text
    p.write_text(text.replace("\nturn_budget: ", "\nturn_budget: 30\nturn_budget: ", 1))
    with pytest.raises(ScenarioError, match=r"twice.yaml: not valid YAML: found duplicate key 'turn_budget'"):
        load_spec(p)


def test_yaml_merge_keys_may_override():
    from socialworld.world.spec import _UniqueKeyLoader

    assert yaml.load("b: &x {c: 1}\nd:\n  <<: *x\n  c: 2\n", Loader=_UniqueKeyLoader) == {"b": {"c": 1}, "d": {"c": 2}}


def test_a_folder_path_without_yaml_suffix_is_loaded_as_a_path(tmp_path):
    from socialworld.world.spec import resolve_scenarios

    with pytest.raises(ScenarioError, match="is a directory"):
        resolve_scenarios([str(tmp_path)])


# ---------------------------------------------------------------- warnings: likely mistakes a scenario may intend

WARNINGS = [  # (id, shipped file, mutation, text of the warning)
    ("absent-never-arrives", "team_lunch", _set("npcs.1.present", False), "npcs.{npc1}.present: '{npc1}' is absent (present: false) and no late_arrival"),
    ("weather-tag-unused", "weather_picnic", _set("events.0.tag", "snowy"), "events[0].tag: no option carries the tag 'snowy'"),
    ("window-past-budget", "weather_picnic", _set("events.0.at", [3, 25]), "events[0].at: the window ends at turn 25"),
    ("window-at-budget", "weather_picnic", _set("events.0.at", [3, 16]), "events[0].at: the window ends at turn 16"),
    ("leaves-while-absent", "hackathon", _absent_leaves, "events[1].npc: participant_leaves involves 'felix', who is absent at the start and may not have arrived by turn 2"),
    ("quarrel-while-absent", "hackathon", _absent_quarrel, "events[3].npcs: conflict involves 'felix', who is absent at the start and may not have arrived by turn 3"),
]


@pytest.mark.parametrize("name,mutate,expected", [x[1:] for x in WARNINGS], ids=[x[0] for x in WARNINGS])
def test_spec_warnings(name, mutate, expected):
    from socialworld.world.spec import spec_warnings

    data = _shipped(name)
    assert spec_warnings(parse_spec(data)) == []
    mutate(data)
    warnings = spec_warnings(parse_spec(data))  # a warning, not an error: the spec loads
    assert len(warnings) == 1 and expected.format(npc1=data["npcs"][1]["id"]) in warnings[0], warnings


def test_shipped_scenarios_have_no_warnings(specs):
    from socialworld.world.spec import spec_warnings

    assert {sid: spec_warnings(s) for sid, s in specs.items()} == {sid: [] for sid in specs}


def test_canonical_yaml_missing_files_and_capped_specs(my_lunch, specs):
    from socialworld.world.spec import capped, resolve_scenarios, spec_yaml

    mine = load_spec(my_lunch)
    # the canonical YAML loads back to the same content hash, for every shipped spec too
    for s in [mine, *specs.values()]:
        assert parse_spec(yaml.safe_load(spec_yaml(s))).content_hash == s.content_hash
    with pytest.raises(ScenarioError, match="unknown scenario 'my_lunch'"):  # a user scenario is named by its path
        resolve_scenarios(["my_lunch"])
    with pytest.raises(ScenarioError) as e:  # ids joined by commas: the error says how to give several
        resolve_scenarios(["team_lunch,book_club_var7-v1"])
    assert str(e.value).endswith("; several scenarios are several --scenario options (a path may hold a comma, so one is not split)")
    with pytest.raises(ScenarioError) as e:
        resolve_scenarios(["team_lunch,nowhere"])
    assert "several --scenario" not in str(e.value)
    # a missing file is one line naming it
    with pytest.raises(ScenarioError, match=r"^nowhere.yaml: no such file$"):
        resolve_scenarios(["nowhere.yaml"])
    # a capped spec has its own content hash (a model_copy would keep the cached one)
    assert capped(mine, 4).turn_budget == 4 and capped(mine, 4).content_hash != mine.content_hash
    assert capped(mine, 4).content_hash == parse_spec({**yaml.safe_load(spec_yaml(mine)), "turn_budget": 4, "t_ref": 4}).content_hash
