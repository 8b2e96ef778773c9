"""socialworld judge-audit: a judge's scores set against the world's truth, failures apart."""

import json
import re

import pytest

from socialworld.agents.registry import make_policy
from socialworld.metrics.stats import cohen_kappa, metric_value, spearman
from socialworld.records import JudgeRec, Signal
from socialworld.rollout.audit import AUDIT_HEAD, Judged, audit, audit_html, audit_markdown, audit_plots, audit_row, audit_table
from socialworld.rollout.evaluate import episode_seeds
from socialworld.rollout.runner import EpisodeJob, run_episodes
from socialworld.world.spec import resolve_scenarios


@pytest.fixture(scope="module")
def pool():
    jobs = [EpisodeJob(s, seed) for s in resolve_scenarios(None, ["L0", "L1"]) for seed in episode_seeds(0, s.id, 2)]
    return [e for p in ("random", "expert", "oracle") for e in run_episodes(make_policy(p, seed=1), jobs)]


def judged(eps, goal, fail=lambda e: None):
    out = []
    for e in eps:
        kind = fail(e)
        scores = {} if kind else {"goal": Signal(value=float(goal(e)), source="proxy", confidence=1.0, detail="llm_judge:t")}
        out.append(Judged(e, JudgeRec(episode_id=e.episode_id, judge="t", prompt_version="judge-v1", scores=scores, raw="",
                                      failure=kind), voiced=False))
    return out


def test_a_judge_that_reads_the_truth_agrees_and_one_that_reverses_it_disagrees(pool):
    cr = lambda e: metric_value(e, "CR")  # noqa: E731
    truthful = audit_row("all", judged(pool, lambda e: round(10 * cr(e))), pass_score=5, resamples=200, seed=0)
    reversed_ = audit_row("all", judged(pool, lambda e: 10 - round(10 * cr(e))), pass_score=5, resamples=200, seed=0)
    assert truthful.rho_cr["mean"] == pytest.approx(1.0) and reversed_.rho_cr["mean"] == pytest.approx(-1.0)
    assert truthful.pairs == reversed_.pairs > 0
    assert truthful.pairwise["mean"] == pytest.approx(1.0) and reversed_.pairwise["mean"] == 0.0
    assert truthful.judge_ties == 0  # CR differs, and so does round(10 CR) on these episodes
    passed = [metric_value(e, "pass") == 1.0 for e in pool]
    assert truthful.kappa["mean"] == pytest.approx(cohen_kappa(passed, [round(10 * cr(e)) >= 5 for e in pool]))
    assert truthful.rho_d["mean"] == pytest.approx(spearman([round(10 * cr(e)) for e in pool], [metric_value(e, "D") for e in pool]))


def test_pairs_are_only_episodes_of_one_scenario_and_seed_the_world_orders(pool):
    row = audit_row("all", judged(pool, lambda e: 5), pass_score=5, resamples=50, seed=0)
    by = {}
    for e in pool:
        by.setdefault((e.scenario_id, e.seed), []).append(metric_value(e, "CR"))
    ordered = sum(a != b for crs in by.values() for i, a in enumerate(crs) for b in crs[i + 1:])
    assert row.pairs == ordered == row.judge_ties and row.pairwise["mean"] == 0.0  # a constant judge orders nothing
    assert row.rho_cr is None  # a constant judge: rho undefined, never 0
    assert row.kappa["mean"] == 0.0  # ... and it agrees on pass exactly as often as chance


def test_failed_judgements_are_counted_apart_and_left_out(pool):
    fails = lambda e: "endpoint" if e.policy_id == "random" else "unparseable" if e.policy_id == "oracle" and e.seed % 2 else None  # noqa: E731
    items = judged(pool, lambda e: round(10 * metric_value(e, "CR")), fail=fails)
    row = audit_row("all", items, pass_score=5, resamples=50, seed=0)
    n_end = sum(e.policy_id == "random" for e in pool)
    n_bad = sum(e.policy_id == "oracle" and e.seed % 2 for e in pool)
    assert row.failures == {"endpoint": n_end, "unparseable": n_bad} and row.judged == len(pool) - n_end - n_bad
    doc = audit("t", "judge-v1", items, resamples=50)
    assert [r.group for r in doc.rows] == ["all", "L0", "L1"] and doc.pool == {"random": n_end, "expert": n_end, "oracle": n_end}
    assert json.loads(doc.to_json())["schema_version"] == "judge-audit-v1"
    assert "| L1 |" in audit_markdown(doc)


def test_the_audit_page_holds_every_row_and_both_plots(pool):
    """``audit.html``: the rows of ``audit.md`` cell for cell (a judge's name escaped), and the two figures as
    PNGs, also where a statistic is undefined (a constant judge's rho) and where judgements failed."""
    import base64
    import html

    fails = lambda e: "endpoint" if e.policy_id == "random" and e.seed % 2 else None  # noqa: E731
    for goal in (lambda e: round(10 * metric_value(e, "CR")), lambda e: 5):
        items = judged(pool, goal, fail=fails)
        doc = audit("<judge>", "judge-v1", items, resamples=50)
        images = audit_plots(doc, items)
        assert set(images) == {"scores", "agreement"}
        assert all(base64.b64decode(b64)[:8] == b"\x89PNG\r\n\x1a\n" for b64 in images.values())
        page = audit_html(doc, images)
        assert "&lt;judge&gt;" in page and "<judge>" not in page
        assert page.count("data:image/png;base64,") == 2
        assert all(f"<th>{html.escape(h)}</th>" in page for h in AUDIT_HEAD)
        for row in audit_table(doc):
            assert "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" in page
        assert [r[0] for r in audit_table(doc)] == ["all", "L0", "L1"]
    assert audit_table(doc)[0][AUDIT_HEAD.index("rho (goal, CR)")] == "-"  # the constant judge's rho: undefined, shown as such


def test_judge_audit_plays_judges_and_writes_a_pool(tmp_path, tiny_dir):
    pytest.importorskip("torch")
    from typer.testing import CliRunner

    from socialworld.cli.main import app
    from socialworld.records import read_jsonl

    runner = CliRunner()
    out = tmp_path / "a"
    args = ["judge-audit", "--judge", str(tiny_dir), "--policies", "random,expert", "--tiers", "L0", "--per-scenario", "1",
            "--resamples", "50"]
    res = runner.invoke(app, [*args, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "…" not in res.output and re.search(r"\[[+-]\d\.\d\d,[+-]\d\.\d\d\]", res.output), res.output  # whole at 80 columns
    doc = json.loads((out / "audit.json").read_text())
    n = len(resolve_scenarios(None, ["L0"])) * 2
    assert doc["rows"][0]["episodes"] == n == len(read_jsonl(out / "pool.jsonl"))
    assert len((out / "judge.jsonl").read_text().splitlines()) == n and doc["rows"][0]["judged"] == n  # a local judge always answers
    assert (out / "audit.html").read_text().count("data:image/png;base64,") == 2
    again = runner.invoke(app, [*args, "--out", str(out)])
    assert again.exit_code == 2 and "already holds an audit" in again.output
    read = runner.invoke(app, ["judge-audit", "--judge", str(tiny_dir), "--episodes", str(out / "pool.jsonl"), "--resamples", "50",
                               "--out", str(tmp_path / "b")])
    assert read.exit_code == 0, read.output
    assert json.loads((tmp_path / "b" / "audit.json").read_text())["rows"] == doc["rows"]  # the same pool, the same judge: the same audit
    for bad, says in ((["--judge", "expert"], "judge must be a language model"), ([], "--judge: give the judge"),
                      (["--judge", str(tiny_dir), "--pass-score", "11"], "--pass-score")):
        r = runner.invoke(app, ["judge-audit", *bad, "--out", str(tmp_path / "c")])
        assert r.exit_code == 2 and says in r.output, r.output
