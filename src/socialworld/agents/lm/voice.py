"""A language model as the NPCs' voice (:mod:`socialworld.world.voice`): each template line rewritten
in the speaker's words from what it reveals, one batched call per lockstep step across episodes.

Decoding is greedy (both backends), so the same prompt gives the same line; lines are cached by the
prompt's hash, so a line heard once is never decoded again in the run. A backend's failure for one
request becomes that request's :class:`~socialworld.world.voice.VoiceReply` error (the world then uses the
template line and counts it): a voice never stops a run."""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

from socialworld.agents.lm.backends import Backend
from socialworld.text.templates import NPC_VOICE_MOODS, NPC_VOICE_SYSTEM, NPC_VOICE_USER, NPC_VOICE_VERSION
from socialworld.world.voice import VoiceReply, VoiceRequest

VOICE_MAX_NEW_TOKENS = 48
"""tokens a voiced line may take (a longer one is cut by the check)"""


def voice_messages(req: VoiceRequest) -> list[dict[str, str]]:
    """The voice's chat messages for one line (``NPC_VOICE_*``): name, profile and visible mood, and the
    template line; nothing hidden."""
    mood = NPC_VOICE_MOODS.get(req.mood or "mid", NPC_VOICE_MOODS["mid"])
    return [{"role": "system", "content": NPC_VOICE_SYSTEM.format(name=req.name, profile=req.profile, mood=mood)},
            {"role": "user", "content": NPC_VOICE_USER.format(template=req.template)}]


def prompt_hash(messages: list[dict[str, str]]) -> str:
    """sha256 over the prompt version and the messages' canonical JSON"""
    return hashlib.sha256(json.dumps([NPC_VOICE_VERSION, messages], sort_keys=True, ensure_ascii=False).encode()).hexdigest()


@dataclass
class LMVoice:
    """NPC lines written by ``backend`` (any model spec: :func:`socialworld.agents.registry.make_voice`)."""

    backend: Backend
    cache: dict[str, str] = field(default_factory=dict)
    """voiced text by prompt hash (failures are not cached: the next step asks again)"""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    """one call at a time (an environment server's sessions share one voice)"""

    @property
    def voice_id(self) -> str:
        return self.backend.name

    @property
    def decoding(self) -> dict[str, Any]:
        return dict(self.backend.decoding)

    def speak(self, requests: Sequence[VoiceRequest]) -> list[VoiceReply]:
        with self.lock:
            return self._speak(requests)

    def _speak(self, requests: Sequence[VoiceRequest]) -> list[VoiceReply]:
        prompts = [voice_messages(r) for r in requests]
        hashes = [prompt_hash(m) for m in prompts]
        todo = {h: m for h, m in zip(hashes, prompts) if h not in self.cache}
        errors: dict[str, str] = {}
        if todo:
            done = self.backend.complete(list(todo.values()))
            for h, c in zip(todo, done):
                if c.error is not None:
                    errors[h] = c.error
                else:
                    self.cache[h] = c.text
        return [VoiceReply("", h, errors[h]) if h in errors else VoiceReply(self.cache[h], h) for h in hashes]
