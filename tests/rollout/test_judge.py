"""The optional LM judge: public transcript in, 0-10 scores out as proxy signals, failures counted apart, never 0."""

import json
import re
import threading

import pytest

from socialworld.agents.registry import make_policy
from socialworld.rollout.judge import judge_messages, parse_scores, summarise
from socialworld.rollout.runner import EpisodeJob, run_episodes


def test_scores_parse_strictly():
    assert parse_scores("GOAL: 7\nBELIEVABILITY: 3") == {"goal": 7, "believability": 3}
    assert parse_scores("Sure.\n GOAL:10 \nBELIEVABILITY : 0\nthanks") == {"goal": 10, "believability": 0}
    for bad in ("GOAL: 7", "GOAL: 11\nBELIEVABILITY: 3", "GOAL: seven\nBELIEVABILITY: 3", "", "GOAL: -1\nBELIEVABILITY: 2"):
        assert parse_scores(bad) is None, bad


def test_the_judge_reads_the_public_transcript_only(specs):
    spec = specs["team_lunch-v1"]
    ep = run_episodes(make_policy("expert"), [EpisodeJob(spec, 4)])[0]
    text = "\n".join(m["content"] for m in judge_messages(spec, ep))
    assert spec.goal in text
    for s in ep.steps:
        assert s.action.executed in text and " ".join(s.dialogue.utterance.split()) in text
        assert all(" ".join(r.text.split()) in text for r in s.dialogue.replies)
    assert not re.search(r"\d\.\d", text)  # no mood value, no utility, no threshold: what a reader of the chat sees


def _episodes(specs, n=3):
    return run_episodes(make_policy("random", seed=1), [EpisodeJob(specs["team_lunch-v1"], s) for s in range(n)])


def test_a_local_judge_always_answers_in_the_grammar(specs, tiny_dir):
    pytest.importorskip("torch")
    from socialworld.rollout.judge import judge_episodes

    eps = _episodes(specs)
    recs = judge_episodes(str(tiny_dir), eps, specs)
    assert [r.episode_id for r in recs] == [e.episode_id for e in eps]
    for r in recs:
        assert r.failure is None and set(r.scores) == {"goal", "believability"}
        assert all(s.source == "proxy" and s.detail == f"llm_judge:{tiny_dir}" and 0 <= s.value <= 10 for s in r.scores.values())
        assert parse_scores(r.raw) == {k: int(s.value) for k, s in r.scores.items()}


def test_judge_failures_are_counted_apart_and_never_scored(specs):
    from socialworld.rollout.judge import judge_episodes
    from socialworld.testing import stub_endpoint

    replies = iter([(200, "GOAL: 8\nBELIEVABILITY: 6"), (200, "I think it went well."), (400, "bad model")])
    lock = threading.Lock()

    def reply(req, headers):
        with lock:
            code, text = next(replies)
        return code, {}, {"choices": [{"message": {"content": text}}]} if code == 200 else {"error": {"message": text}}

    with stub_endpoint(reply) as url:
        recs = judge_episodes(f"openai:j@{url}", _episodes(specs), specs, batch_size=1)
    assert [r.failure for r in recs] == [None, "unparseable", "endpoint"]
    assert recs[1].scores == {} and recs[1].raw == "I think it went well." and "bad model" in recs[2].error
    s = summarise(recs)
    assert (s.episodes, s.judged, s.unparseable, s.endpoint_failures) == (3, 1, 1, 1)
    assert s.means == {"goal": 8.0, "believability": 6.0}  # the failures are not zeros in the mean


def test_eval_with_a_judge_keeps_the_rule_metrics_as_they_are(tmp_path, tiny_dir):
    from typer.testing import CliRunner

    from socialworld.cli.main import app
    from socialworld.records import JudgeRec, record_from_json

    runner = CliRunner()
    args = ["eval", "--policy", "expert", "--scenario", "team_lunch", "--episodes", "2", "--json"]
    plain = runner.invoke(app, [*args, "--out", str(tmp_path / "a")])
    judged = runner.invoke(app, [*args, "--out", str(tmp_path / "b"), "--judge", str(tiny_dir)])
    assert plain.exit_code == 0 and judged.exit_code == 0, judged.output
    a, b = json.loads(plain.stdout), json.loads(judged.stdout)
    assert b.pop("judge")["all"]["judged"] == 2 and a.pop("judge") is None
    assert a["by_tier"] == b["by_tier"] and a["by_scenario"] == b["by_scenario"]
    recs = [record_from_json(JudgeRec, ln) for ln in (tmp_path / "b" / "judge.jsonl").read_text().splitlines()]
    assert len(recs) == 2 and not (tmp_path / "a" / "judge.jsonl").exists()
    bad = runner.invoke(app, [*args, "--out", str(tmp_path / "c"), "--judge", "expert"])
    assert bad.exit_code == 2 and "judge must be a language model" in bad.output


def test_a_judgement_whose_endpoint_mostly_failed_is_not_kept():
    from socialworld.agents.lm.backends import EndpointFailure
    from socialworld.records import JudgeRec
    from socialworld.rollout.judge import checked_judgement

    rec = lambda f: JudgeRec(episode_id="e", judge="j", prompt_version="judge-v1", scores={}, raw="",  # noqa: E731
                             failure=f, error="cannot reach x" if f else None)
    assert checked_judgement("j", [rec(None), rec("endpoint")], 0.5) == [rec(None), rec("endpoint")]
    with pytest.raises(EndpointFailure, match="no reply on 2 of 3 episodes.*cannot reach x"):
        checked_judgement("j", [rec(None), rec("endpoint"), rec("endpoint")], 0.5)


def test_rank_agreement_counts_the_world_orders_a_judge_matched():
    from socialworld.rollout.judge import RankAgreement, rank_agreement

    got = rank_agreement([(9, 2, 1.0, 0.0), (2, 9, 1.0, 0.0), (5, 5, 1.0, 0.0), (9, 2, 0.5, 0.5), (1, 3, -1.0, 2.0)])
    assert got == RankAgreement(agree=2, disagree=1, judge_ties=1, world_ties=1)
    assert got.compared == 4 and got.agreement == 0.5  # a judge tie is no ranking: it counts against
    assert RankAgreement().agreement is None and RankAgreement(world_ties=3).agreement is None


def test_judge_agreement_pairs_the_episodes_of_one_task_and_leaves_failures_out(specs):
    from socialworld.records import JudgeRec, Signal
    from socialworld.rollout.judge import episode_return, judge_agreement

    lunch = specs["team_lunch-v1"]
    jobs = [EpisodeJob(lunch, 3), EpisodeJob(lunch, 4)]
    eps = {p: run_episodes(make_policy(p), jobs) for p in ("expert", "random", "oracle")}
    flat = [e for p in eps for e in eps[p]]

    def judged(goal_of):
        sig = lambda v: Signal(value=v, source="proxy", confidence=1.0)  # noqa: E731
        return {e.episode_id: JudgeRec(episode_id=e.episode_id, judge="j", prompt_version="judge-v1", raw="",
                                       scores={"goal": sig(goal_of(e)), "believability": sig(5.0)}) for e in flat}

    honest = judge_agreement(flat, judged(episode_return))  # a judge that scores the return itself
    assert honest.disagree == honest.judge_ties == 0 and honest.agree + honest.world_ties == 6  # 3 pairs a seed
    assert honest.agreement == 1.0
    flat_judge = judge_agreement(flat, judged(lambda e: 10.0))  # the bundled model's habit: 10 for everything
    assert flat_judge.agree == 0 and flat_judge.judge_ties == honest.agree and flat_judge.agreement == 0.0
    recs = judged(episode_return)
    recs[eps["random"][0].episode_id] = recs[eps["random"][0].episode_id].model_copy(update={"failure": "endpoint", "scores": {}})
    assert judge_agreement(flat, recs).agree + judge_agreement(flat, recs).world_ties == 4  # its two pairs are left out


def test_the_judge_agreement_example_ranks_every_two_policies_on_each_task(tmp_path):
    """examples/judge_agreement.py against a stub endpoint judge: every two policies' episodes of a
    task are ranked, the counts add up, and the summary file holds them."""
    import importlib.util
    from pathlib import Path

    from socialworld.testing import stub_endpoint

    path = Path(__file__).resolve().parents[2] / "examples" / "judge_agreement.py"
    spec = importlib.util.spec_from_file_location("judge_agreement", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)

    def reply(req, headers):  # more finalized decisions and accepted proposals, a higher goal score
        text = req["messages"][-1]["content"]
        goal = min(10, text.count("finalize(") * 3 + text.count("works for me"))
        return 200, {}, {"choices": [{"message": {"content": f"GOAL: {goal}\nBELIEVABILITY: 5"}}]}

    with stub_endpoint(reply) as url:
        got = example.main(["--judge", f"openai:j@{url}", "--scenarios", "team_lunch-v1", "--seeds", "2", "--out", str(tmp_path)])
    a = got["agreement"]
    assert got["episodes"] == 6 and a["compared"] + a["world_ties"] == 6  # 3 policies, 3 pairs a seed, 2 seeds
    assert a["agree"] + a["disagree"] + a["judge_ties"] == a["compared"] and a["agree"] > 0
    assert json.loads((tmp_path / "agreement.json").read_text())["agreement"] == a
    with pytest.raises(SystemExit):
        example.main(["--policies", "expert", "--out", str(tmp_path)])
