"""The reply format's one owner: what render_turn writes, reply_fields, split_turn and action_kind read back."""

from socialworld.text.reply import action_kind, render_turn, reply_fields, split_turn


def test_a_rendered_turn_reads_back():
    turn = render_turn("BELIEF: alice restaurant=sushi mood=mid", "propose(restaurant, sushi)", "Sushi, everyone?")
    assert turn == "BELIEF: alice restaurant=sushi mood=mid\nACTION: propose(restaurant, sushi)\nSAY: Sushi, everyone?"
    assert split_turn(turn) == ("BELIEF: alice restaurant=sushi mood=mid", " propose(restaurant, sushi)")
    assert action_kind(turn) == "propose"
    assert reply_fields(turn) == {"BELIEF": "alice restaurant=sushi mood=mid", "ACTION": "propose(restaurant, sushi)",
                                  "SAY": "Sushi, everyone?"}
    assert render_turn("BELIEF:", "wait()", "").endswith("\nSAY:") and "SAY" not in render_turn("BELIEF:", "wait()")


def test_reading_is_strict_about_lines():
    assert reply_fields("say: hi\u2028ACTION: end()") == {"SAY": "hi\u2028ACTION: end()"}  # one line: no action
    assert reply_fields("ACTION: end()\nACTION: wait()") == {"ACTION": "end()"}  # the first wins
    assert action_kind("SAY: ACTION: end(") is None and action_kind("BELIEF:\nACTION: wait()") == "wait"


def test_labels_are_ascii():
    """A label is matched case-insensitively in ASCII only: a dotless i (U+0131) or a long s (U+017F),
    which Unicode case folding maps to I and S, make no label."""
    assert reply_fields("ACT\u0131ON: wait()\n\u017fAY: hi") == {}
    assert reply_fields("action: wait()\nSay: hi") == {"ACTION": "wait()", "SAY": "hi"}
