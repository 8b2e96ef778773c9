"""One episode as text in, text out: the runner's record and outcome, the episode as one growing chat,
the expert as reply text."""

import re

import pytest

from socialworld.agents.lm.policy import merge
from socialworld.agents.lm.prompts import parse_output
from socialworld.agents.scripted import ExpertPolicy
from socialworld.rollout.runner import EpisodeJob, run_episodes
from socialworld.rollout.textenv import TextEpisode, outcome
from socialworld.world.visibility import observe


@pytest.mark.parametrize("sid, seed", [("book_club-v1", 11), ("hackathon-v1", 2), ("weather_picnic-v1", 5)])
def test_the_experts_reply_text_plays_the_experts_episode(specs, sid, seed):
    """Playing :meth:`TextEpisode.expert_reply` at every state gives the runner's expert episode: the
    same moves, rewards and outcome; the episode's record scores as the runner's does. Each reply
    matches the state's ``reply_regex`` (the grammar a server can constrain a model to)."""
    ref = run_episodes(ExpertPolicy(), [EpisodeJob(specs[sid], seed)])[0]
    ep = TextEpisode(specs[sid], seed)
    rewards, done, info = [], False, {}
    while not done:
        reply = ep.expert_reply()
        assert reply.startswith("BELIEF:") and "\nACTION: " in reply and "\nSAY:" in reply
        grammar = ep.observe()[1]["reply_regex"]
        assert re.fullmatch(grammar, reply) and not re.fullmatch(grammar, reply.replace("ACTION: ", "ACTION: dance "))
        r, done, info = ep.step(reply)
        assert info["parse_status"] == "ok"
        rewards.append(r)
    assert rewards == [s.signals.reward.value for s in ref.steps]
    assert [s.action.executed for s in ep.record().steps] == [s.action.executed for s in ref.steps]
    got, want = info["outcome"], outcome(ref)
    assert set(got) == {"pass", "solve", "U", "A_e", "S_npc", "D", "CR", "guards_broken"}
    # the same episode; understanding differs only by what is stated: the reply's BELIEF line names
    # one person at a time (what a policy is taught; the running estimate gathers them), the expert's
    # own record states what it infers at each state
    assert {k: v for k, v in got.items() if k not in ("U", "D")} == {k: v for k, v in want.items() if k not in ("U", "D")}
    assert 0 <= got["U"] <= 1


def test_belief_lines_gather_into_the_running_estimate_as_eval_reads_them(specs):
    """A BELIEF line updates the episode's estimate (what LMPolicy does with its replies): a later line
    about another person keeps the first one's statement, so the expert's replies pass through a text
    door wherever the expert passes (on L1, one person's line alone failed D >= 0.5 in most episodes)."""
    spec = specs["book_club-v1"]
    seeds = [1, 2, 3, 4, 5, 6]
    refs = run_episodes(ExpertPolicy(), [EpisodeJob(spec, s) for s in seeds])
    for seed, ref in zip(seeds, refs):
        ep, done, info, stated = TextEpisode(spec, seed), False, {}, None
        while not done:
            reply = ep.expert_reply()
            stated = merge(stated, parse_output(reply, observe(spec, ep.world.pub))[1])
            _, done, info = ep.step(reply)
            assert ep.steps[-1].mental_state.stated == stated.to_dict()  # the running estimate, not the last line
        assert info["outcome"]["pass"] == outcome(ref)["pass"]


def test_the_episode_as_one_growing_chat(specs):
    ep = TextEpisode(specs["team_lunch-v1"], 3, chat="episode")
    _, info = ep.observe()
    assert [m["role"] for m in info["messages"]] == ["system", "user"]
    replies = ["ACTION: wait()", "gibberish that does not parse"]
    for reply in replies:
        ep.step(reply)
    text, info = ep.observe()
    msgs = info["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert [m["content"] for m in msgs if m["role"] == "assistant"] == replies and msgs[-1]["content"] == text
    state = TextEpisode(specs["team_lunch-v1"], 3)  # the default: this state's chat alone
    state.step("ACTION: wait()")
    assert [m["role"] for m in state.observe()[1]["messages"]] == ["system", "user"]


def test_a_restored_episode_has_no_outcome_and_bad_options_are_named(specs):
    spec = specs["team_lunch-v1"]
    ep = TextEpisode(spec, 1)
    ep.step("ACTION: wait()")
    back = TextEpisode.restored(ep.world.snapshot_json(), spec)
    assert back.world.t == ep.world.t and not back.recorded
    done, info = False, {}
    while not done:
        _, done, info = back.step("ACTION: end()")
    assert info["outcome"] is None
    with pytest.raises(RuntimeError, match="restored from a snapshot"):
        back.record()
    with pytest.raises(RuntimeError, match="episode is over"):
        back.step("ACTION: wait()")
    with pytest.raises(ValueError, match="chat must be state or episode"):
        TextEpisode(spec, 0, chat="growing")


def test_a_voiced_text_episode_shows_the_voices_words_and_scores_as_the_templates(specs):
    from socialworld.testing import ScriptedVoice

    spec = specs["team_lunch-v1"]
    plain, voiced = TextEpisode(spec, 3, mode="render"), TextEpisode(spec, 3, mode="render",
                                                                      voice=ScriptedVoice(lambda r: "Mm, let me think."))
    said = []
    while not plain.world.done:
        reply = plain.expert_reply()
        assert voiced.expert_reply() == reply  # the expert never reads the words
        a, b = plain.step(reply), voiced.step(reply)
        assert a[:2] == b[:2] and a[2]["subgoals"] == b[2]["subgoals"]
        said += [r["text"] for r in b[2]["replies"] if r["speaker"] != "world"]
        if not voiced.world.done and said:
            assert "Mm, let me think." in voiced.observe()[0]  # the render shows what was said
    assert said and set(said) == {"Mm, let me think."}
    assert voiced.record().metrics == plain.record().metrics and voiced.record().lineage.voice.model == "scripted"
