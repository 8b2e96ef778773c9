"""ASCENT-Bench end to end on a tiny model: the protocol, the arms, the reports, resume, a suite."""

import json
from importlib.util import find_spec

import pytest

pytestmark = [pytest.mark.skipif(not find_spec("trl"), reason="needs the train extra"), pytest.mark.slow]  # three wake-sleep-train cycles with TRL on a tiny model

from socialworld.bench.config import PRESETS, BenchConfig
from socialworld.bench.protocol import run_bench, run_suite  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return str(tiny_dir)


def test_bench_smoke_protocol_and_resume(tiny, tmp_path):
    cfg = BenchConfig(out=str(tmp_path / "b"), model=tiny, preset="smoke", lm_batch_size=4, resamples=1000)
    res = run_bench(cfg, log=lambda _: None)
    n = len(PRESETS["smoke"].scenarios) * PRESETS["smoke"].eval_episodes
    assert res.tiers_per_cycle == {1: ["L0"], 2: ["L0", "L1"], 3: ["L0", "L1", "L2"]}
    # 1 + 2 + 3 unlocked scenarios x 1 seed: every arm on the same episodes in every cycle
    for arm in ("A", "B", "C", "oracle", "random"):
        assert [len(res.per_cycle[arm][c]) for c in (1, 2, 3)] == [1, 2, 3]
        assert {(e.scenario_id, e.seed) for e in res.per_cycle[arm][3]} == {(e.scenario_id, e.seed) for e in res.per_cycle["B"][3]}
    assert len(res.per_cycle["A"][3]) == n
    doc = json.loads((tmp_path / "b" / "bench.json").read_text())
    # within 4 turns nobody settles two decisions (metrics-v2: no pass), but the oracle's D is far above random's
    assert doc["main"]["oracle"]["D"]["mean"] > doc["main"]["random"]["D"]["mean"] + 0.2 and set(doc["paired"]) >= {"B-A", "B-C"}
    assert doc["metrics_contract"] == "metrics-v2" and set(doc["main"]["A"]) >= {"pass", "solve"}
    assert "SolveRate" in (tmp_path / "b" / "report.md").read_text()
    # the reports say what the cut means before any number
    for name in ("report.md", "report.html"):
        text = (tmp_path / "b" / name).read_text()
        assert f"stops after {PRESETS['smoke'].max_turns} turns" in text.split("Main table")[0]
    # the smoke preset caps every episode at 4 turns, and the cap is in every step's setting
    cap = PRESETS["smoke"].max_turns
    for arm in ("A", "B", "C"):
        for e in res.per_cycle[arm][3]:
            assert 0 < len(e.steps) <= cap and {s.setting.turn_budget for s in e.steps} == {cap}
    assert set(doc["forgetting"]["B"]) == {"L0", "L1"} and doc["unlock_cycles"] == {"L0": 1, "L1": 2, "L2": 3}
    assert [s["tiers"] for s in doc["loop"]] == [["L0"], ["L0", "L1"], ["L0", "L1", "L2"]]
    html = (tmp_path / "b" / "report.html").read_text()
    assert "Episode viewer" in html and html.count("data:image/png;base64,") == 3
    # a finished bench resumes without re-running anything
    logs = []
    again = run_bench(cfg, log=logs.append)
    assert again.doc == res.doc and not any("wake" in m or "evaluated" in m for m in logs)


def test_methods_suite_shares_the_untrained_data(tiny, tmp_path):
    cfg = BenchConfig(out=str(tmp_path / "s"), model=tiny, preset="smoke", cycles=1, lm_batch_size=4, resamples=1000)
    doc = run_suite(cfg, "methods", log=lambda _: None)
    assert list(doc["variants"]) == ["M0-untrained", "M1-sft", "M2-grpo", "M3-dpo-trajectory-ungated", "M4-full"]
    manifest = json.loads((tmp_path / "s" / "methods" / "M4-full" / "manifest.json").read_text())["artifacts"]
    assert manifest["cycle-1/wake/episodes.jsonl"]["producer"].startswith("copied:")
    assert "| M2-grpo |" in (tmp_path / "s" / "methods" / "suite.md").read_text()


def test_bench_smoke_on_a_user_scenario_file(tiny, tmp_path, my_lunch):
    from socialworld.world.spec import load_spec

    cfg = BenchConfig(out=str(tmp_path / "b"), model=tiny, preset="smoke", cycles=2, lm_batch_size=4, resamples=1000,
                      scenarios=(str(my_lunch), "book_club"))
    res = run_bench(cfg, log=lambda _: None)
    # the user's L0 scenario unlocks in cycle 1, the shipped L1 one in cycle 2; every arm on the same episodes
    for arm in ("A", "B", "C", "oracle", "random"):
        assert [sorted(e.scenario_id for e in res.per_cycle[arm][c]) for c in (1, 2)] == [
            ["my_lunch-v1"], ["book_club-v1", "my_lunch-v1"]], arm
    cap = PRESETS["smoke"].max_turns
    assert all(0 < len(e.steps) <= cap for e in res.per_cycle["B"][2])
    assert (tmp_path / "b" / "loop" / "scenarios" / "my_lunch-v1.yaml").is_file()
    assert res.doc["config"]["scenarios"] == ["my_lunch-v1", "book_club"]
    # resumed by id without the file: nothing re-run, the same document
    mine = load_spec(my_lunch)
    my_lunch.unlink()
    logs = []
    again = run_bench(BenchConfig(**{**cfg.__dict__, "scenarios": ("my_lunch-v1", "book_club")}), log=logs.append)
    assert again.doc == res.doc and not any("wake" in m or "evaluated" in m for m in logs)
    # a different file under the same id is refused before any work
    from socialworld.testing import write_user_scenario

    changed = write_user_scenario(tmp_path / "changed.yaml", name="Changed")
    assert load_spec(changed).content_hash != mine.content_hash
    with pytest.raises(ValueError, match="differs from the copy the run"):
        run_bench(BenchConfig(**{**cfg.__dict__, "scenarios": (str(changed), "book_club")}), log=lambda _: None)


def test_bench_with_a_judge_reports_it_beside_the_rule_metrics(tiny, tmp_path):
    cfg = BenchConfig(out=str(tmp_path / "j"), model=tiny, preset="smoke", cycles=1, lm_batch_size=4, resamples=1000, judge=tiny)
    res = run_bench(cfg, log=lambda _: None)
    judge = res.doc["judge"]
    assert judge["judge"] == tiny and set(judge["arms"]) == {"A", "B", "C", "oracle", "random"}
    for arm, j in judge["arms"].items():
        assert j["episodes"] == len(res.per_cycle[arm][1]) and j["judged"] + j["endpoint_failures"] + j["unparseable"] == j["episodes"]
        assert j["source"] == "proxy"
    plain = run_bench(BenchConfig(**{**cfg.__dict__, "out": str(tmp_path / "p"), "judge": ""}), log=lambda _: None)
    # the static arms' rule metrics do not move (B's sleep may train on judge-ranked dialogue pairs)
    assert {a: m for a, m in plain.doc["main"].items() if a != "B"} == {a: m for a, m in res.doc["main"].items() if a != "B"}
    assert "judge" not in plain.doc
    assert "LM judge" in (tmp_path / "j" / "report.md").read_text() and "LM judge" not in (tmp_path / "p" / "report.md").read_text()
    assert (tmp_path / "j" / "loop" / "cycle-1" / "wake" / "judge.jsonl").is_file()  # B's sleep had the judge too
    logs: list[str] = []
    assert run_bench(cfg, log=logs.append).doc == res.doc and not any("judged" in m for m in logs)


def test_a_dead_proxy_endpoint_stops_the_bench_instead_of_scoring_arm_c(tiny, tmp_path, monkeypatch):
    import socket

    import socialworld.agents.lm.backends as backends
    from socialworld.agents.lm.backends import EndpointFailure

    monkeypatch.setattr(backends.time, "sleep", lambda s: None)  # the retries' backoff
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    cfg = BenchConfig(out=str(tmp_path / "d"), model=tiny, preset="smoke", cycles=1, lm_batch_size=4, resamples=1000,
                      proxy=f"openai:x@http://127.0.0.1:{port}/v1")
    with pytest.raises(EndpointFailure, match="arm C .*gave no reply on 100% of the steps.*cannot reach"):
        run_bench(cfg, log=lambda _: None)
    assert (tmp_path / "d" / "arms" / "C" / "failed-episodes.jsonl").is_file()
    assert not (tmp_path / "d" / "arms" / "C" / "episodes.jsonl").exists() and not (tmp_path / "d" / "bench.json").exists()
