"""The lockstep runner's progress counts."""

from socialworld.agents.registry import make_policy
from socialworld.rollout.runner import EpisodeJob, run_episodes, turn_budget


def test_turns_counted_add_up_to_the_budget_as_episodes_end(specs):
    jobs = [EpisodeJob(specs[s], seed) for s in ("team_lunch-v1", "hackathon-v1") for seed in (1, 2)]
    counts = []
    eps = run_episodes(make_policy("expert"), jobs, on_steps=counts.append)
    assert sum(counts) == turn_budget(jobs) == 2 * specs["team_lunch-v1"].turn_budget + 2 * specs["hackathon-v1"].turn_budget
    assert len(counts) == max(len(e.steps) for e in eps)  # one call per lockstep step
    assert counts[0] >= len(jobs)  # the first step: every episode stepped (and one that ended gave its unused turns)
    assert any(e.final.steps < e.steps[0].setting.turn_budget for e in eps)  # the expert ends early: its unused turns count


def _without_words(ep):
    """An episode record with every NPC line's words, and what shows them, taken out."""
    steps = [s.model_copy(update={"dialogue": s.dialogue.model_copy(update={"replies": [r.speaker for r in s.dialogue.replies]}),
                                  "observation": s.observation.model_copy(update={"text": "", "structured": {
                                      k: v for k, v in s.observation.structured.items() if k != "recent"}})})
             for s in ep.steps]
    return ep.model_copy(update={"steps": steps, "lineage": ep.lineage.model_copy(update={"voice": None})})


def test_a_voice_changes_the_npcs_words_and_nothing_the_rules_decide(specs):
    from socialworld.records import to_jsonl
    from socialworld.testing import ScriptedVoice

    jobs = [EpisodeJob(specs[s], seed) for s in ("team_lunch-v1", "weather_picnic-v1") for seed in (1, 2)]
    def other_option(r):
        """an option of the speaker's scenario its line does not name"""
        return next(o.label for sl in specs[r.scenario_id].slots for o in sl.options if o.label not in r.template)

    def words(r):
        if r.npc == specs[r.scenario_id].npcs[0].id:
            raise TimeoutError("no reply")  # a failed call: the template line, counted
        return f"{r.template} Also, {other_option(r)}!" if "keen" in r.template else f"Well... {r.template.lower()}"

    for policy in ("expert", "random", "oracle"):
        plain = run_episodes(make_policy(policy, seed=4), jobs)
        voice = ScriptedVoice(words)
        voiced = run_episodes(make_policy(policy, seed=4), jobs, voice=voice)
        assert [_without_words(e) for e in voiced] == [_without_words(e) for e in plain], policy
        replies = [r for e in voiced for s in e.steps for r in s.dialogue.replies if r.speaker != "world"]
        templates = [r for e in plain for s in e.steps for r in s.dialogue.replies if r.speaker != "world"]
        narrated = [r for e in voiced for s in e.steps for r in s.dialogue.replies if r.speaker == "world"]
        assert all(r.voice is None for r in narrated) and (policy == "random" or narrated)  # the world's own lines keep their words
        assert [r.voice.template for r in replies] == [r.text for r in templates]  # each line keeps the one it replaced
        statuses = {r.voice.status for r in replies}
        assert {"voiced", "failed"} <= statuses, policy
        assert all(r.text == r.voice.template for r in replies if r.voice.status not in ("voiced", "cut"))
        assert all(r.text.startswith("Well... ") for r in replies if r.voice.status == "voiced")
        assert len(voice.requests) == len(replies)
        assert {e.lineage.voice.model for e in voiced} == {"scripted"} and all(e.lineage.voice is None for e in plain)
        if any("keen" in r.text for r in templates):
            assert "leak" in statuses
        again = run_episodes(make_policy(policy, seed=4), jobs, voice=ScriptedVoice(words))
        assert to_jsonl(again) == to_jsonl(voiced)  # the same seed, the same lines
    assert '"voice"' not in to_jsonl(plain)  # records of template runs are as before


def test_voiced_lines_are_what_the_agent_observes_and_round_trip(specs, tmp_path):
    from socialworld.records import read_jsonl, write_jsonl
    from socialworld.testing import ScriptedVoice

    odd = "Ça va — « très bien » 😀, merci."
    eps = run_episodes(make_policy("expert"), [EpisodeJob(specs["team_lunch-v1"], 5)], voice=ScriptedVoice(lambda r: odd))
    steps = eps[0].steps
    heard = [r for s in steps for r in s.dialogue.replies if r.speaker != "world"]
    assert heard and all(r.text == odd and r.voice.status == "voiced" for r in heard)
    later = [ln["text"] for s in steps[1:] for ln in s.observation.structured["recent"] if ln["speaker"] not in ("agent", "world")]
    assert later and set(later) == {odd}  # the next observation carries the voiced words
    write_jsonl(tmp_path / "e.jsonl", eps)
    assert read_jsonl(tmp_path / "e.jsonl") == eps
