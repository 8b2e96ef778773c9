"""NPC voices: the check every voiced line passes or is replaced by its template line, and the world's
transcript rewritten without anything else changing."""

import pytest

from socialworld.core import Action
from socialworld.world.dialogue import named
from socialworld.world.engine import World
from socialworld.world.voice import MAX_VOICE_CHARS, VoiceReply, VoiceRequest, check_line, line_requests


@pytest.fixture
def lunch(specs):
    return specs["team_lunch-v1"]


def req(spec, template, npc=None):
    n = spec.npcs[0] if npc is None else spec.npc(npc)
    return VoiceRequest(spec.id, n.id, n.name, n.profile, "mid", template)


def options(spec):
    return [(s, o) for s in spec.slots for o in s.options]


def test_named_finds_options_people_and_secrets_as_whole_words(lunch):
    (s, o), (s2, o2) = options(lunch)[:2]
    n = lunch.npcs[1]
    found = named(lunch, f"I'd like {o.label}, and so would {n.name}.")
    assert found == {f"option:{s.id}/{o.id}", f"npc:{n.id}"}
    assert named(lunch, f"{o.label}s".replace(" ", "")) == frozenset()  # not a whole word: names nothing
    assert f"option:{s2.id}/{o2.id}" in named(lunch, o2.id.replace("_", " "))  # an option's id names it too


def test_a_line_that_names_what_its_template_does_not_is_a_leak(lunch):
    (s, o), (_, other) = options(lunch)[:2]
    template = f"I'm not keen on {o.label}."
    ok = check_line(lunch, req(lunch, template), VoiceReply(f"Honestly, {o.label} isn't my thing.", "h"))
    assert (ok.status, ok.text, ok.template, ok.prompt_hash) == ("voiced", f"Honestly, {o.label} isn't my thing.", template, "h")
    leak = check_line(lunch, req(lunch, template), VoiceReply(f"No {o.label}; {other.label} would be lovely.", "h"))
    assert leak.status == "leak" and leak.text == template and f"option:{s.id}/{other.id}" in leak.detail
    friend = next(n for n in lunch.npcs if n.id != lunch.npcs[0].id)
    who = check_line(lunch, req(lunch, template), VoiceReply(f"{friend.name} agrees: not {o.label}.", "h"))
    assert who.status == "leak" and who.detail == f"npc:{friend.id}"
    me = lunch.npcs[0]
    assert check_line(lunch, req(lunch, template), VoiceReply(f"{me.name} here: not {o.label}.", "h")).status == "voiced"


def test_a_secret_keyword_the_template_did_not_confide_is_a_leak(specs):
    spec = next(s for s in specs.values() if any(n.secret for n in s.npcs))
    n = next(n for n in spec.npcs if n.secret)
    r = VoiceRequest(spec.id, n.id, n.name, n.profile, None, "Nice of you to check in.")
    out = check_line(spec, r, VoiceReply(f"Nice of you to check in, {n.secret.keywords[0]} aside.", "h"))
    assert out.status == "leak" and out.detail == f"secret:{n.id}"
    confided = VoiceRequest(spec.id, n.id, n.name, n.profile, None, f"Between us: {n.secret.text}")
    assert check_line(spec, confided, VoiceReply(f"Just so you know: {n.secret.text}", "h")).status == "voiced"


@pytest.mark.parametrize(("reply", "status", "heard"), [
    (VoiceReply("", "h", error="HTTP 500 from x"), "failed", None),
    (VoiceReply("  \n \n", "h"), "empty", None),
    (VoiceReply('""', "h"), "empty", None),
    (VoiceReply("fine\x07 by me", "h"), "not_text", None),
    (VoiceReply("Ann: \"Works for me!\"\nAnd another line", "h"), "voiced", "Works for me!"),
])
def test_what_cannot_be_heard_is_the_template_line_counted_by_reason(lunch, reply, status, heard):
    r = VoiceRequest(lunch.id, lunch.npcs[0].id, "Ann", "", "high", "Sounds good.")
    out = check_line(lunch, r, reply)
    assert out.status == status
    assert out.text == (heard if heard is not None else "Sounds good.")
    if status == "failed":
        assert out.detail == "HTTP 500 from x"


def test_a_long_line_is_cut_at_a_sentence_end_then_checked(lunch):
    r = req(lunch, "Sounds good.")
    long = "That sounds good to me. " + "Really, I mean it, " * 30
    out = check_line(lunch, r, VoiceReply(long, "h"))
    assert out.status == "cut" and out.text == "That sounds good to me." and out.detail == f"{len(long.strip())} chars"
    words = check_line(lunch, r, VoiceReply("word " * 100, "h"))
    assert words.status == "cut" and len(words.text) <= MAX_VOICE_CHARS and words.text.endswith("word")


def test_revoice_rewrites_the_last_replies_and_nothing_else(lunch):
    w = World(lunch, 3)
    npc = lunch.npcs[0].id
    res = w.step(Action("approach", npc=npc, utterance="Hi there!"))
    assert res.replies and w.pub.transcript[-1].text == res.replies[-1].text
    asked = line_requests(w, len(res.replies))
    assert [(r.npc, r.template, r.mood) for r in asked] == [(x.speaker, x.text, w.pub.cues.get(x.speaker)) for x in res.replies]
    fin = w.step(Action("finalize", slot=lunch.slots[0].id, option=lunch.slots[0].options[0].id))
    assert "world" in [x.speaker for x in fin.replies]
    assert [r is None for r in line_requests(w, len(fin.replies))] == [x.speaker == "world" for x in fin.replies]  # nobody voices the world
    res = w.step(Action("approach", npc=npc, utterance="Hi again!"))
    w.revoice(["Hey, good to see you."] * len(res.replies))
    assert [ln.text for ln in w.pub.transcript[-len(res.replies):]] == ["Hey, good to see you."] * len(res.replies)
    assert w.pub.transcript[0].text == "Hi there!"  # the agent's line is its own
    with pytest.raises(ValueError, match="not all replies"):
        w.revoice(["x"] * (len(res.replies) + 1))
