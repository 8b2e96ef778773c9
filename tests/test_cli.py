import json

from typer.testing import CliRunner

from socialworld.cli import app

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
    keys = {"U", "A_e", "S_npc", "D", "CR", "pass_rate"}
    assert keys <= set(doc["by_tier"]["L0"])
    for row in doc["by_scenario"].values():
        assert keys <= set(row) and row["tier"] == "L0"
    assert (tmp_path / "episodes.parquet").exists() and (tmp_path / "episodes.jsonl").exists()
    assert json.loads((tmp_path / "metrics.json").read_text()) == doc


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
    monkeypatch.setattr("socialworld.loop.run_loop", lambda cfg, **_: seen.append(cfg) or [])
    r = runner.invoke(app, ["loop", "--method", "sft", "--steps", "7", "--lora-r", "8",
                            "--target-modules", "q_proj,up_proj", "--label-gate", "disagree", "--out", "x"])
    assert r.exit_code == 0, r.output
    (cfg,) = seen
    assert (cfg.train.method, cfg.train.steps, cfg.train.lora_r, cfg.train.lora_alpha) == ("sft", 7, 8, 16)
    assert cfg.train.target_modules == ("q_proj", "up_proj") and cfg.sleep.label_gate == "disagree"


def test_loop_and_bench_take_scenario_files(monkeypatch, my_lunch):
    seen = []
    monkeypatch.setattr("socialworld.loop.run_loop", lambda cfg, **_: seen.append(cfg) or [])
    r = runner.invoke(app, ["loop", "--scenario", str(my_lunch), "--scenario", "team_lunch", "--out", "x"])
    assert r.exit_code == 0, r.output
    assert seen.pop().scenarios == (str(my_lunch), "team_lunch")
    monkeypatch.setattr("socialworld.bench.run_bench", lambda cfg, **_: seen.append(cfg) or 1 / 0)
    r = runner.invoke(app, ["bench", "--preset", "smoke", "--scenario", str(my_lunch), "--out", "x"])
    assert isinstance(r.exception, ZeroDivisionError)  # the stub ran
    assert seen.pop().scenarios == (str(my_lunch),)
    for cmd in ("loop", "bench", "tom"):
        assert "--scenario" in runner.invoke(app, [cmd, "--help"]).output


def test_unknown_or_bad_scenarios_fail_before_any_work(tmp_path, my_lunch):
    from conftest import write_user_scenario

    no_model = str(tmp_path / "no-model")  # would fail loudly, never load a real model, if work started
    cases = [
        (["loop", "--scenario", "no_such"], "unknown scenario 'no_such'"),
        (["loop", "--scenario", str(tmp_path / "missing.yaml")], f"{tmp_path / 'missing.yaml'}: cannot read the scenario file"),
        (["loop", "--scenario", str(write_user_scenario(tmp_path / "l1.yaml", base="book_club", id="my_club-v1"))],
         "no scenario of tier(s) L0 among my_club-v1 (L1)"),
        (["bench", "--preset", "smoke", "--scenario", "no_such"], "unknown scenario 'no_such'"),
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
