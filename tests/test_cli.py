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
