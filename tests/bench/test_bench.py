"""ASCENT-Bench end to end on a tiny model: the protocol, the arms, the reports, resume, a suite."""

import json
from importlib.util import find_spec

import pytest

pytestmark = [pytest.mark.skipif(not find_spec("trl"), reason="needs the train extra"), pytest.mark.slow]  # three wake-sleep-train cycles with TRL on a tiny model

from socialworld.bench.config import PRESETS, BenchConfig
from socialworld.bench.document import SameRun, SuiteDoc, VariantRow  # noqa: E402
from socialworld.bench.protocol import run_bench, run_suite  # noqa: E402
from socialworld.bench.report import suite_markdown  # noqa: E402
from socialworld.rundir import RunDir  # noqa: E402


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
    assert {t: iv["mean"] for t, iv in doc["forgetting_intervals"]["B"].items()} == pytest.approx(doc["forgetting"]["B"])
    assert doc["lost"] == [] and all(e.metrics.passed is False for c in (1, 2) for e in res.per_cycle["B"][c])  # nothing passed: nothing lost
    assert [s["tiers"] for s in doc["loop"]] == [["L0"], ["L0", "L1"], ["L0", "L1", "L2"]]
    html = (tmp_path / "b" / "report.html").read_text()
    assert "Episode viewer" in html and html.count("data:image/png;base64,") == 3
    # a finished bench resumes without re-running anything
    logs = []
    again = run_bench(cfg, log=logs.append)
    assert again.doc == res.doc and not any("wake" in m or "evaluated" in m for m in logs)


def _overridden(suite_dir, name, full):
    """The config keys (``sleep.gating``, ``train.method``, ...) where variant ``name``'s recorded
    config.yaml differs from the full recipe's, besides where it lives."""
    import yaml

    def flat(doc, prefix=""):
        return {k2: v2 for k, v in doc.items() for k2, v2 in (flat(v, f"{prefix}{k}.").items() if isinstance(v, dict)
                                                              else [(f"{prefix}{k}", v)])}

    mine, theirs = (flat(yaml.safe_load((suite_dir / n / "config.yaml").read_text())) for n in (name, full))
    return {k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k)} - {"out", "reuse_from"}


def _expected(over):
    return {f"{k}.{k2}" for k, v in over.items() if isinstance(v, dict) for k2 in v} | {k for k, v in over.items() if not isinstance(v, dict)}


def test_methods_suite_shares_the_untrained_data(tiny, tmp_path):
    from socialworld.bench.protocol import SUITES

    cfg = BenchConfig(out=str(tmp_path / "s"), model=tiny, preset="smoke", cycles=1, lm_batch_size=4, resamples=1000)
    doc = run_suite(cfg, "methods", log=lambda _: None)
    # each variant's overrides reach its loop: its recorded config differs from M4's exactly there
    for name, over in SUITES["methods"].items():
        assert _overridden(tmp_path / "s" / "methods", name, "M4-full") == _expected(over), name
    # M2 trains GRPO on the steps' exact returns and says how many of its groups had a gradient at all
    # (its groups are the policy's own turns sampled under the reply grammar: legal moves that lead apart)
    rows = {n: v for n, v in doc.variants.items() if isinstance(v, VariantRow)}
    share = rows["M2-grpo"].groups_with_reward_variance
    assert share is not None and 0 < share <= 1 and all(rows[n].groups_with_reward_variance is None for n in ("M1-sft", "M4-full"))
    assert rows["M1-sft"].vs_full is not None and rows["M4-full"].vs_full is None
    assert list(doc.variants) == ["M0-untrained", "M1-sft", "M2-grpo", "M3-dpo-trajectory-ungated", "M4-full"]
    manifest = json.loads((tmp_path / "s" / "methods" / "M1-sft" / "manifest.json").read_text())["artifacts"]
    assert manifest["cycle-1/wake/episodes.jsonl"]["producer"].startswith("copied:")  # from M4-full, which ran first
    assert "| M2-grpo |" in (tmp_path / "s" / "methods" / "report.md").read_text()
    assert "data:image/png;base64," in (tmp_path / "s" / "methods" / "report.html").read_text()
    report = (tmp_path / "s" / "methods" / "report.md").read_text()
    assert "| M2-grpo | 1 |" in report.split("R[cycle][tier]")[1]  # each variant's R table, a row per cycle
    # a table that no longer matches the variants' runs (one was run again) is made again, and its reports with it
    suite = tmp_path / "s" / "methods"
    stale = json.loads((suite / "suite.json").read_text())
    stale["variants"]["M2-grpo"]["groups_with_reward_variance"] = 0.123456
    (suite / "suite.json").write_text(json.dumps(stale))
    (suite / "report.md").write_text(suite_markdown(SuiteDoc.model_validate(stale)) + "\n")
    run = RunDir(suite)
    run.commit("suite.json", "suite")
    run.commit("report.md", "report", inputs=["suite.json"])
    assert "0.12" in (suite / "report.md").read_text() and run_suite(cfg, "methods", log=lambda _: None) == doc
    assert (suite / "suite.json").read_text() == doc.to_json() and (suite / "report.md").read_text() == report


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
    assert res.doc.config["scenarios"] == ["my_lunch-v1", "book_club"]
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


def test_bench_reports_the_held_out_scenarios_apart(tiny, tmp_path):
    """``--holdout``: B never trains on the held-out scenario; every arm is evaluated on it at the last
    cycle, apart from the tiers' tables, and the report says so with B's paired differences."""
    cfg = BenchConfig(out=str(tmp_path / "b"), model=tiny, preset="smoke", cycles=2, lm_batch_size=4, resamples=1000,
                      scenarios=("team_lunch", "activity_debrief", "book_club"), holdout=("activity_debrief",))
    res = run_bench(cfg, log=lambda _: None)
    for arm in ("A", "B", "C", "oracle", "random"):  # the tiers' tables hold the trained scenarios alone
        assert {e.scenario_id for c in (1, 2) for e in res.per_cycle[arm][c]} == {"team_lunch-v1", "book_club-v1"}, arm
    h = res.doc.holdout
    assert h is not None and h.scenarios == ["activity_debrief-v1"] and set(h.main) == {"A", "B", "C", "oracle", "random"}
    assert set(h.paired) == {"B-A", "B-C"} and h.main["B"]["pass"].n == PRESETS["smoke"].eval_episodes
    assert res.doc.config["holdout"] == ["activity_debrief-v1"]
    text = (tmp_path / "b" / "report.md").read_text()
    assert "Scenarios never trained on" in text and "activity_debrief-v1" in text.split("Scenarios never trained on")[1]
    doc = json.loads((tmp_path / "b" / "bench.json").read_text())
    assert doc["holdout"]["scenarios"] == ["activity_debrief-v1"]


def test_pool_over_two_run_seeds_pairs_within_each_run(tiny, tmp_path):
    """``socialworld pool``: two benches of one config and two seeds, pooled: every arm's last-cycle
    episodes of both runs, B - A paired within each run (so its mean is the episodes' mean of the two
    runs' differences), the held-out scenario pooled the same way; one run twice is refused."""
    from socialworld.bench.document import BenchDoc
    from socialworld.bench.pool import ALL, PoolDoc, pool_benches, write_pool
    from socialworld.records import read_document

    folders = []
    for seed in (0, 1):
        cfg = BenchConfig(out=str(tmp_path / f"b{seed}"), model=tiny, preset="smoke", cycles=2, lm_batch_size=4, resamples=1000,
                          seed=seed, scenarios=("team_lunch", "activity_debrief", "book_club"), holdout=("activity_debrief",))
        run_bench(cfg, log=lambda _: None)
        folders.append(cfg.out)
    doc = pool_benches(folders, resamples=1000)
    benches = [read_document(tmp_path / f"b{s}" / "bench.json", BenchDoc) for s in (0, 1)]
    assert [r.seed for r in doc.runs] == [0, 1] and doc.runs[1].passed["B"][ALL] == benches[1].main["B"]["pass"].mean
    assert doc.main["B"][ALL].n == sum(b.main["B"]["pass"].n for b in benches)
    n = [b.paired["B-A"]["pass"].n for b in benches]
    assert doc.paired["B-A"][ALL].mean == pytest.approx(sum(b.paired["B-A"]["pass"].mean * k for b, k in zip(benches, n)) / sum(n))
    assert doc.holdout_scenarios == ["activity_debrief-v1"] and doc.holdout_paired["B-A"].n == 2 * PRESETS["smoke"].eval_episodes
    assert doc.mean_forgetting == {"L0": pytest.approx(sum(b.forgetting["B"]["L0"] for b in benches) / 2)}
    assert doc.forgetting["L0"].mean == pytest.approx(doc.mean_forgetting["L0"]) and [r.lost for r in doc.runs] == [b.lost for b in benches]
    write_pool(doc, tmp_path / "pool")
    assert read_document(tmp_path / "pool" / "pool.json", PoolDoc) == doc and "B-A" in (tmp_path / "pool" / "pool.md").read_text()
    with pytest.raises(ValueError, match="distinct run seeds"):
        pool_benches([folders[0], folders[0]])


def test_bench_with_a_judge_reports_it_beside_the_rule_metrics(tiny, tmp_path):
    cfg = BenchConfig(out=str(tmp_path / "j"), model=tiny, preset="smoke", cycles=1, lm_batch_size=4, resamples=1000, judge=tiny)
    res = run_bench(cfg, log=lambda _: None)
    judge = res.doc.judge
    assert judge is not None and judge.judge == tiny and set(judge.arms) == {"A", "B", "C", "oracle", "random"}
    for arm, j in judge.arms.items():
        assert j["episodes"] == len(res.per_cycle[arm][1]) and j["judged"] + j["endpoint_failures"] + j["unparseable"] == j["episodes"]
        assert j["source"] == "proxy"
    # its agreement with the world over every two arms' episodes of one task (5 arms: 10 pairs a task)
    agreement = judge.agreement
    assert agreement["compared"] + agreement["world_ties"] == 10 * len(res.per_cycle["B"][1])
    assert "Against the world: of " in (tmp_path / "j" / "report.md").read_text()
    plain = run_bench(BenchConfig(**{**cfg.__dict__, "out": str(tmp_path / "p"), "judge": ""}), log=lambda _: None)
    # the static arms' rule metrics do not move (B's sleep may train on judge-ranked dialogue pairs)
    assert {a: m for a, m in plain.doc.main.items() if a != "B"} == {a: m for a, m in res.doc.main.items() if a != "B"}
    assert plain.doc.judge is None
    assert "LM judge" in (tmp_path / "j" / "report.md").read_text() and "LM judge" not in (tmp_path / "p" / "report.md").read_text()
    assert (tmp_path / "j" / "loop" / "cycle-1" / "wake" / "judge.jsonl").is_file()  # B's sleep had the judge too
    logs: list[str] = []
    assert run_bench(cfg, log=logs.append).doc == res.doc and not any("judged" in m for m in logs)


def test_a_voiced_bench_plays_each_arm_again_with_the_templates_and_reports_the_difference(tiny, tmp_path):
    """``--npc-voice``: every arm's last-cycle episodes are played again by the same policy with the template
    lines (``template/<arm>.jsonl``: the same scenarios and seeds, no voice in their lineage), and the report
    holds voiced − template per arm. The scripted arms never read talk and the default prompt shows none, so
    every arm makes the same moves and every difference is exactly 0 here (the tiny model's free SAY text may
    differ: another batch, other float sums); a resumed bench plays nothing again."""
    from socialworld.metric_registry import KEYS
    from socialworld.records import read_jsonl

    cfg = BenchConfig(out=str(tmp_path / "v"), model=tiny, preset="smoke", cycles=1, lm_batch_size=4, resamples=200, npc_voice=tiny)
    res = run_bench(cfg, log=lambda _: None)
    fx = res.doc.voice_effect
    assert set(fx) == {"A", "B", "C", "oracle", "random"}
    for arm, eff in fx.items():
        voiced = res.per_cycle[arm][1]
        template = read_jsonl(tmp_path / "v" / "template" / f"{arm}.jsonl")
        assert sorted((e.scenario_id, e.seed) for e in template) == sorted((e.scenario_id, e.seed) for e in voiced)
        assert all(e.lineage.voice is None for e in template) and all(e.lineage.voice is not None for e in voiced)
        assert eff.voice == ", ".join(sorted({e.lineage.voice.model for e in voiced}))
        assert all(eff.all[k].n == len(voiced) and eff.all[k].mean == eff.all[k].lo == eff.all[k].hi == 0.0 for k in KEYS), (arm, eff.all)
        by_task = {(e.scenario_id, e.seed): [s.action.executed for s in e.steps] for e in voiced}
        assert [[s.action.executed for s in e.steps] for e in template] == [by_task[e.scenario_id, e.seed] for e in template]
    assert "Voiced − template" in (tmp_path / "v" / "report.md").read_text()
    assert "Voiced − template" in (tmp_path / "v" / "report.html").read_text()
    logs: list[str] = []
    assert run_bench(cfg, log=logs.append).doc == res.doc and not any("template lines" in m for m in logs)
    plain = run_bench(BenchConfig(**{**cfg.__dict__, "out": str(tmp_path / "p"), "npc_voice": "template"}), log=lambda _: None)
    assert plain.doc.voice_effect == {} and not (tmp_path / "p" / "template").exists()
    assert "Voiced − template" not in (tmp_path / "p" / "report.md").read_text()


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


def test_ablations_suite_lets_proxy_pairs_in_only_in_e2_and_does_not_run_a_variant_that_cannot_differ(tiny, tmp_path):
    from socialworld.bench.protocol import SUITES, variant_config
    from socialworld.learn.loop import run_loop
    from socialworld.learn.pairs.record import read_pairs
    from socialworld.records import read_jsonl
    from socialworld.testing import stub_endpoint

    def reply(req, headers):  # a judge that prefers the expert's words (the tiny model's are noise)
        text = json.dumps(req["messages"])
        goal = 9 if "Would that work for you" in text or "Thanks for sharing" in text else 1
        return 200, {}, {"choices": [{"message": {"content": f"GOAL: {goal}\nBELIEVABILITY: 5"}}]}

    logs: list[str] = []
    with stub_endpoint(reply) as url:
        cfg = BenchConfig(out=str(tmp_path / "a"), model=tiny, preset="smoke", cycles=1, lm_batch_size=4, resamples=1000,
                          judge=f"openai:j@{url}")
        doc = run_suite(cfg, "ablations", log=logs.append)
        rows, runs = doc.variants, tmp_path / "a" / "ablations"
        # strict gating (E0) kept the judge's action pairs out; E2 admits exactly those
        gating = json.loads((runs / "E0-full" / "cycle-1" / "sleep" / "gating.json").read_text())
        n = gating["excluded"]["action:proxy_evidence"]
        assert n > 0 and gating["judge_agreement"]["compared"] > 0
        e0, e2 = ({p.id: p for p in read_pairs(runs / v / "cycle-1" / "sleep" / "pairs-action.parquet")}
                  for v in ("E0-full", "E2-no-provenance"))
        extra = e2.keys() - e0.keys()
        assert e0.keys() <= e2.keys() and len(extra) == n and {e2[i].evidence["ranking"] for i in extra} == {"proxy"}
        # E5 at E0's own threshold cannot differ: the suite says so instead of reporting a tie, and does not run it
        same = {name for name, v in rows.items() if isinstance(v, SameRun)}
        assert "E5-threshold-0.5" in same and same <= {"E5-threshold-0.3", "E5-threshold-0.5", "E5-threshold-0.7"}
        assert getattr(rows["E5-threshold-0.5"], "same_as") == "E0-full" and not (runs / "E5-threshold-0.5").exists()
        assert any("E5-threshold-0.5 is E0-full by construction" in m for m in logs)
        assert "E5-threshold-0.5 is E0-full by construction" in (runs / "report.md").read_text()
        # ... and run anyway, it is E0 step for step
        lc = variant_config(cfg, "ablations", "E5-threshold-0.5", reuse_from=str(runs / "E0-full"))
        run_loop(lc, log=lambda _: None)
    moves = lambda run: [[(s.action.executed, s.dialogue.utterance) for s in e.steps]  # noqa: E731
                         for e in read_jsonl(run / "cycle-1" / "eval" / "episodes.jsonl")]
    assert moves(runs / "E5-threshold-0.5") == moves(runs / "E0-full")
    for name, over in SUITES["ablations"].items():
        if name not in same:
            assert _overridden(runs, name, "E0-full") == _expected(over), name
