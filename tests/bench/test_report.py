"""Bench document and reports from scripted arms (fast), and the HTML page in real headless Chromium."""

import json
import os
import shutil

import pytest

from socialworld.agents.registry import make_policy
from socialworld.bench.config import BenchConfig
from socialworld.bench.document import BenchDoc
from socialworld.bench.protocol import bench_document, remake_reports
from socialworld.bench.report import lifelong_rows, markdown, table_note, write_reports
from socialworld.layout import cycle_files
from socialworld.learn.documents import CycleSummary
from socialworld.metric_registry import KEYS
from socialworld.metrics.core import aggregate
from socialworld.metrics.lifelong import Lost
from socialworld.records import Message, PromptRec, atomic_write_text, read_document, write_jsonl
from socialworld.rollout.evaluate import episode_seeds
from socialworld.rollout.runner import EpisodeJob, run_episodes
from socialworld.rundir import RunDir
from socialworld.world.spec import resolve_scenarios

TIERS = {1: ["L0"], 2: ["L0", "L1"]}
SCENARIOS = ["team_lunch", "book_club"]


def _eps(policy):
    jobs = [EpisodeJob(s, seed) for s in resolve_scenarios(SCENARIOS, ["L0", "L1"]) for seed in episode_seeds(3, s.id, 3)]
    return run_episodes(make_policy(policy, seed=2), jobs)


def _with_prompts(eps):
    """Arm B as a language model would be recorded: each step keeps the prompt it was given."""
    def one(ep):
        steps = [s.model_copy(update={"policy": s.policy.model_copy(update={"prompt": PromptRec(version="policy-test", messages=[
            Message(role="system", content=f"SYSTEM for {ep.scenario_id}"),
            Message(role="user", content=f"USER turn {s.setting.step + 1} <b>literal</b>")]), "tokens_in": 40 + s.setting.step})})
            for s in ep.steps]
        return ep.model_copy(update={"steps": steps})
    return [one(e) for e in eps]


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    eps = {"A": _eps("random"), "B": _with_prompts(_eps("expert")), "C": _eps("oracle")}
    per_cycle = {arm: {c: [e for e in es if e.tier in t] for c, t in TIERS.items()} for arm, es in eps.items()}
    cfg = BenchConfig(out=str(tmp_path_factory.mktemp("bench")), preset="smoke", resamples=2000)
    loop = [CycleSummary(cycle=c, tiers=t, pairs={"action": 3}, excluded={"action:below_margin": 2}, final_loss={"action": 0.6},
                         eval=aggregate(per_cycle["B"][c]), by_tier={}) for c, t in TIERS.items()]
    doc = bench_document(cfg, TIERS, per_cycle, loop)
    run = RunDir(cfg.out)
    run.produce("bench.json", "bench", lambda p: atomic_write_text(p, doc.to_json()))
    write_reports(run, doc, per_cycle)
    return cfg, doc, per_cycle


def test_document_numbers_come_from_the_records(bench):
    from socialworld.bench.report import cut_note

    _cfg, doc, per_cycle = bench
    assert "stops after 4 turns" in cut_note(doc) and cut_note(doc.model_copy(update={"preset": {**doc.preset, "max_turns": 0}})) is None
    assert set(doc.main) == {"A", "B", "C"} and all(list(ivs) == list(KEYS) for ivs in doc.main.values())
    assert doc.main["A"]["pass"].mean == 0.0  # random never passes
    b_a = doc.paired["B-A"]["pass"]
    assert b_a.mean == pytest.approx(doc.main["B"]["pass"].mean) and b_a.lo > 0
    assert doc.ratios["B/A"]["pass"] is None  # A's pass rate is 0: no ratio, not a made-up number
    # per tier: the paired PassRate difference on that tier's last-cycle episodes (B the expert, A random, C the oracle)
    last = per_cycle["B"][max(per_cycle["B"])]
    for tier in ("L0", "L1"):
        b = [e for e in last if e.tier == tier]
        d = doc.paired_by_tier["B-A"][tier]
        assert d.n == len(b) and d.mean == pytest.approx(sum(bool(e.metrics.passed) for e in b) / len(b))
        oracle = [e for e in per_cycle["C"][max(per_cycle["C"])] if e.tier == tier]
        assert doc.paired_by_tier["B-C"][tier].mean == pytest.approx(d.mean - sum(bool(e.metrics.passed) for e in oracle) / len(b))
    assert set(doc.paired_by_tier) == {"B-A", "B-C"}
    assert set(doc.R["B"]["2"]) == {"L0", "L1"} and set(doc.R["B"]["1"]) == {"L0"}
    assert set(doc.forgetting["B"]) == {"L0"}
    assert doc.forgetting_intervals["B"]["L0"].mean == doc.forgetting["B"]["L0"] and doc.lost == []  # the expert plays alike
    lost = [Lost("L0", "team_lunch-v1", 7, (1,), False)]
    note = table_note(lifelong_rows, doc.model_copy(update={"lost": lost}))
    assert note is not None and "team_lunch-v1 seed 7 (passed in cycle 1; C fails it too)" in note and table_note(lifelong_rows, doc) is None
    assert "[" in lifelong_rows(doc)[1][0][1] and "[" not in lifelong_rows(doc.model_copy(update={"forgetting_intervals": {}}))[1][0][1]
    assert doc.unlock_cycles == {"L0": 1, "L1": 2}
    assert doc.episodes_per_arm["A"] == sum(len(v) for v in per_cycle["A"].values())
    md = markdown(doc)
    for title in ("Main table", "PassRate differences by tier", "Hierarchical", "Forgetting", "Closed loop", "Diagnostics"):
        assert f"## {title}" in md
    assert "PassRate differences by tier" not in markdown(doc.model_copy(update={"paired_by_tier": {}}))  # an older document


def _as_v1(doc):
    """``doc`` as a bench.json of v1 (before the metric registry): no schema_version, no
    paired_by_tier, and each cycle's aggregates flat with PassRate spelled ``pass_rate``."""
    old = json.loads(doc.to_json())
    del old["schema_version"], old["paired_by_tier"], old["judge"]
    for s in old["loop"]:
        s["schema_version"] = "cycle-summary-v1"
        for agg in (s["eval"], *s["by_tier"].values()):
            m = agg.pop("metrics")
            agg.update({k: m[k] for k in ("U", "A_e", "S_npc", "D", "CR")}, pass_rate=m["pass"], solve_rate=m["solve"])
    return old


def test_a_v1_bench_document_reads_as_v2_and_its_reports_are_made_again(bench, tmp_path):
    cfg, doc, per_cycle = bench
    old = _as_v1(doc)
    assert "pass_rate" in old["loop"][0]["eval"] and "metrics" not in old["loop"][0]["eval"]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(old))
    back = read_document(path, BenchDoc)
    assert back == doc.model_copy(update={"paired_by_tier": {}})  # every number as it was, in today's form
    assert back.loop[0].eval["pass"] == doc.loop[0].eval["pass"] and back.loop[0].schema_version == "cycle-summary-v2"
    path.write_text(json.dumps({**old, "main": {"A": {"PassRate": old["main"]["A"]["pass"]}}}))
    with pytest.raises(ValueError, match="(?s)bench.json: not a BenchDoc.*unknown metric.*PassRate"):
        read_document(path, BenchDoc)
    # a finished bench folder of v1: `socialworld report` rewrites its document and remakes the reports from it
    folder = tmp_path / "run"
    shutil.copytree(cfg.out, folder)
    run = RunDir(folder)
    atomic_write_text(folder / "bench.json", json.dumps(old, indent=1))
    run.commit("bench.json", "bench")
    run.produce("arms/C/episodes.jsonl", "eval", lambda p: write_jsonl(p, per_cycle["C"][2]))  # every tier: the last cycle's
    write_jsonl(folder / "loop" / cycle_files(0).eval, per_cycle["A"][2])
    for c in TIERS:
        write_jsonl(folder / "loop" / cycle_files(c).eval, per_cycle["B"][c])
    remake_reports(folder, log=lambda _: None)
    assert read_document(folder / "bench.json", BenchDoc) == back and json.loads((folder / "bench.json").read_text())["schema_version"] == "bench-v2"
    assert (folder / "report.md").read_text() == markdown(back) + "\n"


def test_html_report_renders_in_headless_chromium(bench):
    cfg, doc, per_cycle = bench
    browser_path = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser_path is None or pytest.importorskip("playwright") is None:
        if os.environ.get("SOCIALWORLD_REQUIRE_BROWSER"):
            pytest.fail("SOCIALWORLD_REQUIRE_BROWSER is set but chromium/playwright is missing")
        pytest.skip("no chromium on this machine (CI installs Debian's chromium)")
    from playwright.sync_api import sync_playwright

    page_path = os.path.join(cfg.out, "report.html")
    n_eps = sum(len(v) for cyc in per_cycle.values() for v in cyc.values())
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_path, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"])
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto("file://" + os.path.abspath(page_path))
        assert errors == []
        assert page.locator("table.main tbody tr").count() >= 3
        assert page.locator("table.r tbody tr").count() == 3 * 2
        assert page.locator("img").count() == 3
        assert all(page.locator("img").nth(i).evaluate("i => i.naturalWidth > 0") for i in range(3))
        assert page.locator("#episode option").count() == n_eps
        first_obs = page.locator("#obs").inner_text()
        assert "Turn 1/" in first_obs or first_obs.strip()
        assert page.locator("#sig tr").count() > 4  # header + align, reward, penalty, q, moods
        page.click("#next")
        assert page.locator("#stepno").inner_text().startswith("turn 1/")
        # one turn counter: the observation's own "Turn t/budget"
        assert page.locator("#stepno").inner_text().split()[1].lower() in page.locator("#obs").inner_text().lower()
        assert page.locator("#obs").inner_text() != first_obs
        page.select_option("#episode", str(n_eps - 1))
        assert page.locator("#meta").inner_text().startswith("C · cycle 2")
        assert "scripted policy" in page.locator("#prompt").inner_text()
        # the page fits 1200 px: nothing wider than the viewport, figures drawn for the page
        assert page.evaluate("document.documentElement.scrollWidth") <= 1200
        assert all(page.locator("img").nth(i).evaluate("i => i.naturalWidth <= 1200") for i in range(3))
        # filters: arm B's failed episodes
        page.select_option("#f-arm", "B")
        page.select_option("#f-outcome", "fail")
        b_fail = [e for eps in per_cycle["B"].values() for e in eps if not e.metrics.passed]
        assert page.locator("#episode option").count() == len(b_fail)
        assert page.locator("#count").inner_text() == f"{len(b_fail)} of {n_eps} episodes"
        # the prompt B's model received, literally (the shared system message resolved)
        page.select_option("#f-outcome", "")
        page.select_option("#episode", index=0)
        prompt = page.locator("#prompt").inner_text()
        assert "SYSTEM for" in prompt and "USER turn 1 <b>literal</b>" in prompt and "policy-test · 40 tokens" in prompt
        # a table row links to its episodes: R's first row is arm A, cycle 1
        page.locator("table.r tbody tr").first.locator("a").click()
        page.wait_for_function("document.getElementById('f-arm').value === 'A'")
        assert page.locator("#f-cycle").input_value() == "1" and page.locator("#f-outcome").input_value() == ""
        assert page.locator("#episode option").count() == len(per_cycle["A"][1])
        # A, B and C on the same (cycle, scenario, seed), step by step
        first = per_cycle["A"][1][0]
        same = [arm for arm in per_cycle for e in per_cycle[arm][1] if (e.scenario_id, e.seed) == (first.scenario_id, first.seed)]
        heads = page.locator("table.compare th").all_inner_texts()
        assert [h.split(" ·")[0] for h in heads[1:]] == same == ["A", "B", "C"]
        longest = max(len(e.steps) for arm in per_cycle for e in per_cycle[arm][1] if (e.scenario_id, e.seed) == (first.scenario_id, first.seed))
        assert page.locator("table.compare tr[data-step]").count() == longest
        # the seed as the records hold it (63-bit: a JavaScript number would round it)
        assert first.seed > 2**53 and f"seed {first.seed}:" in " ".join(page.locator("p.small").all_inner_texts())
        assert first.steps[0].action.executed in page.locator("table.compare tr[data-step]").first.inner_text()
        page.locator("table.compare tr[data-step]").nth(2).click()
        assert page.locator("#stepno").inner_text().startswith("turn 2/")
        page.locator("table.compare th a").nth(1).click()  # B's column header opens B's episode
        assert page.locator("#meta").inner_text().startswith(f"B · cycle 1 · {first.scenario_id}")
        assert errors == []
        shot = page.screenshot(full_page=True)
        browser.close()
    assert len(shot) > 20_000 and errors == []


def test_the_viewer_shows_a_voiced_line_with_its_template(specs):
    """A voiced reply carries the line the rules wrote and its voice status into the viewer's projection; a
    template run's replies carry neither."""
    from socialworld.bench.report import viewer_episode
    from socialworld.testing import ScriptedVoice

    jobs = [EpisodeJob(specs["team_lunch-v1"], 3)]
    voiced = run_episodes(make_policy("expert"), jobs, voice=ScriptedVoice(lambda r: "Well... " + r.template))[0]
    plain = run_episodes(make_policy("expert"), jobs)[0]
    shown = [r for s in viewer_episode("B", 1, voiced, lambda _: 0)["steps"] for r in s["replies"]]
    people = [r for r in shown if r["speaker"] != "world"]
    assert people and all(r["text"] == "Well... " + r["template"] and r["voice"] == "voiced" for r in people)
    assert all("template" not in r for s in viewer_episode("B", 1, plain, lambda _: 0)["steps"] for r in s["replies"])
