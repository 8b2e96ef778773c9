"""The agent's reply format, and its one owner: up to three labelled lines,

::

    BELIEF: <npc> <slot>=<option> ... mood=<low|mid|high>
    ACTION: <kind>(<arguments>)
    SAY: <words>

:func:`render_turn` writes a turn (the training targets, the constrained decoder's fixed text uses
the same labels), :func:`reply_fields` reads a reply's lines (the strict parser builds on it),
:func:`split_turn` and :func:`action_kind` read a written turn back."""

from __future__ import annotations

import re

BELIEF, ACTION, SAY = "BELIEF:", "ACTION:", "SAY:"
"""the three lines' labels, in the order a turn writes them"""

_LINE = re.compile(r"^\s*(BELIEF|ACTION|SAY)\s*:(.*)$", re.I | re.A)
"""a labelled line; labels are ASCII, matched case-insensitively in ASCII only (``ACTıON`` with a dotless i is no
label); the value is stripped in Python: linear time"""
BELIEF_ITEM = re.compile(r"^([a-z0-9_]+)\s*=\s*([a-z0-9_]+)$")
"""one ``key=value`` item of a BELIEF line"""
_ACTION_KIND = re.compile(r"^ACTION:\s*(\w+)\(", re.MULTILINE)


def reply_fields(text: str) -> dict[str, str]:
    """The value of each labelled line of ``text`` (label upper-cased, value stripped; the first
    line of a label wins). Lines break at ``\\n`` (and ``\\r\\n``) only."""
    fields: dict[str, str] = {}
    for line in text.split("\n"):
        m = _LINE.match(line)
        if m and m.group(1).upper() not in fields:
            fields[m.group(1).upper()] = m.group(2).strip()
    return fields


def render_turn(belief: str, action: str, words: str | None = None) -> str:
    """A whole turn: the BELIEF line ``belief`` (with its label), the ACTION line, and (``words``
    given) the SAY line (``SAY:`` alone for no words)."""
    head = f"{belief}\n{ACTION} {action}"
    return head if words is None else f"{head}\n{SAY}" + (f" {words}" if words else "")


def split_turn(turn: str) -> tuple[str, str]:
    """A turn written by :func:`render_turn` as (its BELIEF line, its action text as written after
    ``ACTION:``, without the SAY line)."""
    head, rest = turn.split(f"\n{ACTION}", 1)
    return head, rest.split(f"\n{SAY}", 1)[0]


def action_kind(turn: str) -> str | None:
    """The action kind a turn's ACTION line names (``propose`` in ``ACTION: propose(...)``), or None."""
    m = _ACTION_KIND.search(turn)
    return m.group(1) if m else None
