"""NPC voices: people's words for what the rules decided.

The world decides every NPC response by its rules and writes it from a template
(``socialworld.text.templates.NPC_REPLIES``). A *voice* rewrites such a line after the step in the
speaker's own words, given only what the line reveals to the agent: the template line itself, the
speaker's name and public profile, and their visible mood. No rule reads a line's text, so the world's
state but for the transcript's words, every signal and every metric are the same under any voice for
the same moves.

Every voiced line passes :func:`check_line` or the agent hears the template line instead, counted by
reason (:data:`VoiceStatus`): a line that names an option, a person or a secret's keyword its template
line does not name (a hidden preference, another person's private state, an invented fact: the agent
could act on it) is a ``leak``; nothing usable is ``empty``; control characters are ``not_text``; a
failed voice call is ``failed`` (the run never stops for a voice). A line longer than
:data:`MAX_VOICE_CHARS` is ``cut`` at its last sentence or word end that fits, then checked.

The voice itself is a protocol (:class:`Voice`); the language-model one is
:class:`socialworld.agents.lm.voice.LMVoice`, and ``voice=None`` everywhere means the templates.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Sequence, get_args, runtime_checkable

from socialworld.core import MoodBucket
from socialworld.records import VoiceStatus
from socialworld.world.dialogue import named
from socialworld.world.spec import ScenarioSpec

if TYPE_CHECKING:
    from socialworld.world.engine import World

VOICE_STATUSES: tuple[VoiceStatus, ...] = get_args(VoiceStatus)
KEPT: tuple[VoiceStatus, ...] = ("voiced", "cut")
"""the statuses whose words the agent hears"""
MAX_VOICE_CHARS = 240
"""the longest voiced line the agent hears (longer ones are cut)"""


@dataclass(frozen=True)
class VoiceRequest:
    """One NPC line to voice: what it reveals to the agent, and no more."""

    scenario_id: str
    npc: str
    name: str
    profile: str
    """the public profile the agent sees"""
    mood: MoodBucket | None
    """the mood bucket the agent sees after the step (None before any contact)"""
    template: str
    """the line the rules wrote"""


@dataclass(frozen=True)
class VoiceReply:
    """A voice's answer to one request: its words, or the error that left it without any."""

    text: str
    prompt_hash: str = ""
    """sha256 of the voice's canonical prompt (its cache key)"""
    error: str | None = None


@runtime_checkable
class Voice(Protocol):
    """Writes NPC lines: one reply per request, in order, never raising for one request's failure."""

    @property
    def voice_id(self) -> str:
        """the model (spec) that speaks"""
        ...

    @property
    def decoding(self) -> dict[str, object]:
        """how it decodes (recorded in each episode's lineage)"""
        ...

    def speak(self, requests: Sequence[VoiceRequest]) -> list[VoiceReply]: ...


@dataclass(frozen=True)
class VoicedLine:
    """What the agent hears for one NPC line, and why."""

    text: str
    status: VoiceStatus
    template: str
    prompt_hash: str
    detail: str = ""
    """the leak's names, the failure's error, the cut's original length"""


_END = re.compile(r"[.!?](?=\s|$)")


def _cut(text: str, limit: int) -> str:
    head = text[:limit]
    ends = [m.end() for m in _END.finditer(head)]
    if ends:
        return head[: ends[-1]]
    return head.rsplit(" ", 1)[0] if " " in head else head


def check_line(spec: ScenarioSpec, req: VoiceRequest, reply: VoiceReply) -> VoicedLine:
    """The line the agent hears for ``req``: the voice's words where they pass, else the template's
    (see the module's docstring for the reasons). The voiced text is its first non-empty line, without
    a leading ``<name>:`` and surrounding quotes."""
    keep = lambda status, detail="": VoicedLine(req.template, status, req.template, reply.prompt_hash, detail)  # noqa: E731
    if reply.error is not None:
        return keep("failed", reply.error)
    lines = [ln.strip() for ln in reply.text.splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    for prefix in (f"{req.name}:", f"{req.npc}:"):
        if text.lower().startswith(prefix.lower()):
            text = text[len(prefix):].strip()
    text = text.strip("\"'\u201c\u201d ").strip()
    if not text:
        return keep("empty")
    if any(unicodedata.category(c)[0] == "C" for c in text):
        return keep("not_text")
    status: VoiceStatus = "voiced"
    detail = ""
    if len(text) > MAX_VOICE_CHARS:
        status, detail, text = "cut", f"{len(text)} chars", _cut(text, MAX_VOICE_CHARS)
    extra = named(spec, text) - named(spec, req.template) - {f"npc:{req.npc}"}
    if extra:
        return keep("leak", " ".join(sorted(extra)))
    return VoicedLine(text, status, req.template, reply.prompt_hash, detail)


def line_requests(w: World, count: int) -> list[VoiceRequest | None]:
    """The requests for the last ``count`` lines of ``w``'s transcript (the replies of its last step), as
    the agent sees their speakers now; None for a line no person says (the world's own: a decision
    finalized), which keeps its words."""
    lines = w.pub.transcript[len(w.pub.transcript) - count:] if count else []
    people = {n.id: n for n in w.spec.npcs}
    return [None if (n := people.get(ln.speaker)) is None else
            VoiceRequest(w.spec.id, n.id, n.name, n.profile, w.pub.cues.get(n.id), ln.text)  # type: ignore[arg-type]
            for ln in lines]
