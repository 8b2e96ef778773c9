"""A language model as the NPCs' voice: what its prompt holds, its cache, its failures, a tiny model end to end."""

import json
from dataclasses import dataclass, field

import pytest

from socialworld.agents.lm.backends import Completion
from socialworld.agents.lm.voice import LMVoice, prompt_hash, voice_messages
from socialworld.agents.registry import check_voice, make_voice
from socialworld.world.voice import VoiceRequest


@dataclass
class Counting:
    """A backend that answers each conversation with its user line upper-cased, or fails on "fail"."""

    name: str = "counting"
    decoding: dict = field(default_factory=lambda: {"strategy": "greedy"})
    local: bool = True
    calls: list = field(default_factory=list)

    def complete(self, conversations):
        self.calls.append(len(conversations))
        return [Completion("", error="HTTP 400 from x") if "fail" in c[-1]["content"] else Completion(c[-1]["content"].upper())
                for c in conversations]


def req(template, mood="low"):
    return VoiceRequest("team_lunch-v1", "raj", "Raj", "backend engineer", mood, template)


def test_the_prompt_holds_the_line_name_profile_and_visible_mood_only():
    messages = voice_messages(req("I'm not keen on Sushi Go."))
    text = json.dumps(messages)
    assert "Raj" in text and "backend engineer" in text and "upset" in text and "I'm not keen on Sushi Go." in text
    assert voice_messages(req("x", mood=None))[0]["content"].count("calm") == 1  # no contact yet: calm
    assert prompt_hash(messages) == prompt_hash(voice_messages(req("I'm not keen on Sushi Go.")))
    assert prompt_hash(messages) != prompt_hash(voice_messages(req("I'm not keen on Sushi Go.", mood="high")))


def test_lines_are_cached_by_prompt_and_failures_are_asked_again():
    backend = Counting()
    voice = LMVoice(backend)
    first = voice.speak([req("a"), req("b"), req("a"), req("fail")])
    assert [r.text for r in first] == ["A", "B", "A", ""] and first[3].error == "HTTP 400 from x"
    assert backend.calls == [3]  # one batched call; the repeated line asked once
    again = voice.speak([req("b"), req("fail")])
    assert [r.text for r in again] == ["B", ""] and backend.calls == [3, 1]  # only the failure asked again
    assert voice.voice_id == "counting" and voice.decoding == {"strategy": "greedy"}


def test_a_scripted_policy_is_no_voice():
    assert make_voice("template") is None
    with pytest.raises(ValueError, match="NPC voice must be 'template' or a language model"):
        check_voice("expert")


def test_a_dead_endpoint_leaves_the_template_lines_and_the_run_goes_on(specs):
    from socialworld.agents.registry import make_policy
    from socialworld.rollout.runner import EpisodeJob, run_episodes
    from socialworld.testing import stub_endpoint

    with stub_endpoint(lambda request, headers: (400, {}, {"error": {"message": "no such model"}})) as url:
        voice = make_voice(f"openai:nobody@{url}", timeout_s=5)
        eps = run_episodes(make_policy("expert"), [EpisodeJob(specs["team_lunch-v1"], 2)], voice=voice)
    replies = [r for s in eps[0].steps for r in s.dialogue.replies if r.voice is not None]
    assert replies and all(r.voice.status == "failed" and r.text == r.voice.template and "HTTP 400" in r.voice.detail
                           for r in replies)
    assert eps[0].metrics.passed == run_episodes(make_policy("expert"), [EpisodeJob(specs["team_lunch-v1"], 2)])[0].metrics.passed


def test_a_tiny_model_voices_an_eval_and_its_lines_are_counted(tmp_path, tiny_dir):
    pytest.importorskip("torch")
    from typer.testing import CliRunner

    from socialworld.cli.main import app

    runner = CliRunner()
    args = ["eval", "--policy", "expert", "--scenario", "team_lunch", "--episodes", "2", "--json"]
    plain = runner.invoke(app, [*args, "--out", str(tmp_path / "a")])
    voiced = runner.invoke(app, [*args, "--out", str(tmp_path / "b"), "--npc-voice", str(tiny_dir)])
    assert plain.exit_code == 0 and voiced.exit_code == 0, voiced.output
    a, b = json.loads(plain.stdout), json.loads(voiced.stdout)
    counts = b.pop("voice")
    assert a.pop("voice") is None and a["by_tier"] == b["by_tier"] and a["by_scenario"] == b["by_scenario"]
    assert counts["lines"] == sum(counts["by_status"].values()) > 0
    assert 0 <= counts["heard"] <= 1 and counts["by_status"]["failed"] == 0
    again = runner.invoke(app, [*args, "--out", str(tmp_path / "c"), "--npc-voice", str(tiny_dir)])
    assert (tmp_path / "b" / "episodes.jsonl").read_text() == (tmp_path / "c" / "episodes.jsonl").read_text()
    bad = runner.invoke(app, [*args, "--out", str(tmp_path / "d"), "--npc-voice", "expert"])
    assert bad.exit_code == 2 and "--npc-voice" in bad.output and "language model" in bad.output
    ray = runner.invoke(app, [*args, "--out", str(tmp_path / "e"), "--npc-voice", str(tiny_dir), "--ray", "local"])
    assert ray.exit_code == 2 and "--npc-voice" in ray.output and "--ray" in ray.output and again.exit_code == 0


def test_a_paired_eval_plays_the_same_seeds_with_the_templates_and_reports_the_difference(tmp_path, tiny_dir):
    """``eval --npc-voice M --paired``: the template side's records beside the voiced ones, the same
    episodes as a plain eval's; voiced − template for every metric, overall and by tier, each with its
    n; the scripted expert never reads what people say, so every difference is exactly 0. ``--paired``
    without a voice fails before any work, naming both options."""
    pytest.importorskip("torch")
    from typer.testing import CliRunner

    from socialworld.cli.main import app
    from socialworld.metric_registry import KEYS

    runner = CliRunner()
    args = ["eval", "--policy", "expert", "--scenario", "team_lunch", "--scenario", "book_club", "--episodes", "2"]
    plain = runner.invoke(app, [*args, "--json", "--out", str(tmp_path / "a")])
    paired = runner.invoke(app, [*args, "--json", "--out", str(tmp_path / "b"), "--npc-voice", str(tiny_dir), "--paired"])
    assert plain.exit_code == 0 and paired.exit_code == 0, paired.output
    assert (tmp_path / "b" / "template" / "episodes.jsonl").read_text() == (tmp_path / "a" / "episodes.jsonl").read_text()
    fx = json.loads(paired.stdout)["voice_effect"]
    assert fx["voice"] == str(tiny_dir) and set(fx["by_tier"]) == {"L0", "L1"}
    for row, n in ((fx["all"], 4), (fx["by_tier"]["L0"], 2), (fx["by_tier"]["L1"], 2)):
        assert set(row) == set(KEYS)
        assert all((d["mean"], d["lo"], d["hi"], d["n"]) == (0.0, 0.0, 0.0, n) for d in row.values()), row
    assert json.loads(plain.stdout)["voice_effect"] is None
    shown = runner.invoke(app, [*args, "--out", str(tmp_path / "c"), "--npc-voice", str(tiny_dir), "--paired"])
    assert shown.exit_code == 0 and "voiced - template, the same seeds" in shown.output, shown.output
    assert "[+0.00,+0.00]" in shown.output and "…" not in shown.output.split("voiced - template")[1]  # whole at 80 columns
    bad = runner.invoke(app, [*args, "--out", str(tmp_path / "d"), "--paired"])
    assert bad.exit_code == 2 and "--paired" in bad.output and "--npc-voice" in bad.output
    assert not (tmp_path / "d").exists()


def test_the_voice_effect_is_the_paired_difference_by_tier(specs):
    """:func:`voice_effect` against hand-computed differences: the random policy's episodes standing for
    the voiced side of the expert's (same scenarios and seeds); pass differences per tier are the
    differences of the tiers' pass counts over their episodes."""
    from socialworld.agents.registry import make_policy
    from socialworld.records import VoiceInfo
    from socialworld.rollout.evaluate import voice_effect
    from socialworld.rollout.runner import EpisodeJob, run_episodes

    jobs = [EpisodeJob(specs[s], seed) for s in ("team_lunch-v1", "book_club-v1", "hackathon-v1") for seed in (1, 2, 3)]
    expert = run_episodes(make_policy("expert"), jobs)
    voice = VoiceInfo(model="m", decoding={}, prompt_version="v")
    other = [e.model_copy(update={"lineage": e.lineage.model_copy(update={"voice": voice})})
             for e in run_episodes(make_policy("random", seed=3), jobs)]
    fx = voice_effect(expert, other, seed=0)
    for tier in ("L0", "L1", "L2"):
        a = [e.metrics.passed for e in expert if e.tier == tier]
        b = [e.metrics.passed for e in other if e.tier == tier]
        if not a:
            continue
        assert fx.by_tier[tier]["pass"].mean == pytest.approx((sum(b) - sum(a)) / len(a))
        assert fx.by_tier[tier]["pass"].n == len(a)
    assert fx.all["pass"].mean == pytest.approx((sum(e.metrics.passed for e in other) - sum(e.metrics.passed for e in expert)) / 9)
    assert fx.all["pass"].mean < 0 and fx.voice == "m"
    with pytest.raises(ValueError, match="names a voice"):
        voice_effect(expert, expert)
