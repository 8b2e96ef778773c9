"""A language-model policy on the same :class:`~socialworld.core.Policy` protocol as the
scripted ones: one batched backend call per lockstep step (per phase).

Decoding modes:

* ``free`` — the model writes ``BELIEF/ACTION/SAY`` lines; parsed strictly (any backend).
* ``scored`` — parseable by construction (local models): the model's log-probabilities rank a
  pruned list of legal actions (:func:`candidate_actions`) after ``ACTION:``; then it writes the
  ``SAY`` line for the chosen action. No belief line is generated in this mode, so the step
  states no mental state and U is recorded as ``degraded``.
"""

from __future__ import annotations

import time
from typing import Literal, Sequence

from ..core import Action, Decision, Observation
from ..records import PolicyRec
from ..templates import POLICY_PROMPT_VERSION
from ..visibility import legal_actions
from .backends import Backend
from .prompts import build_messages, parse_output


def candidate_actions(obs: Observation, limit: int = 24) -> list[Action]:
    """A pruned, ordered list of legal actions worth scoring: per present NPC approach, repair
    and inquiries on open decisions; per open decision proposals to all and finalizing the
    current proposal; negotiations with whoever rejected it; wait; end."""
    legal = set(legal_actions(obs))
    out: list[Action] = []
    for s in obs.slots:
        if s.status != "open":
            continue
        out += [Action("inquire", npc=h, slot=s.id) for h in s.stakeholders]
        out += [Action("propose", slot=s.id, option=o.id, npc="all") for o in s.options]
        if s.proposal:
            out.append(Action("finalize", slot=s.id, option=s.proposal))
            out += [Action("negotiate", npc=h, slot=s.id, option=s.proposal, offer=off.id)
                    for h in s.rejected_by for off in obs.offers]
    for n in obs.npcs:
        out += [Action("approach", npc=n.id), Action("repair", npc=n.id)]
    out = [a for a in out if a in legal] + [Action("wait"), Action("end")]
    return out[:limit] if len(out) <= limit else out[: limit - 2] + [Action("wait"), Action("end")]


class LMPolicy:
    def __init__(self, backend: Backend, prompt_version: str = POLICY_PROMPT_VERSION, base_model: str | None = None,
                 adapter_hash: str | None = None, decoding: Literal["free", "scored"] = "free",
                 say_tokens: int = 20):
        if decoding == "scored" and not hasattr(backend, "score"):
            raise ValueError(f"backend {backend.name} cannot score candidates; use decoding='free'")
        self.backend = backend
        self.prompt_version = prompt_version
        self.policy_id = backend.name
        self.base_model = base_model or backend.name
        self.adapter_hash = adapter_hash
        self.decoding = decoding
        self.say_tokens = say_tokens

    def info(self) -> PolicyRec:
        return PolicyRec(policy_id=self.policy_id, base_model=self.base_model, adapter_hash=self.adapter_hash,
                         decoding={**self.backend.decoding, "prompt": self.prompt_version, "mode": self.decoding})

    def reset(self, episode_keys: Sequence[str]) -> None:
        pass

    def act(self, episode_keys: Sequence[str], observations: Sequence[Observation]) -> list[Decision]:
        if self.decoding == "scored":
            return self._act_scored(observations)
        comps = self.backend.complete([build_messages(o, self.prompt_version) for o in observations])
        out = []
        for obs, c in zip(observations, comps):
            if c.error is not None:
                action, belief, error = None, None, c.error
            else:
                action, belief, error = parse_output(c.text, obs)
            out.append(Decision(action, belief, raw=c.text, parse_error=error, tokens_in=c.tokens_in,
                                tokens_out=c.tokens_out, latency_s=c.latency_s))
        return out

    def _act_scored(self, observations: Sequence[Observation]) -> list[Decision]:
        t0 = time.perf_counter()
        backend = self.backend
        convs = [build_messages(o, self.prompt_version) for o in observations]
        heads = backend.prompts(convs, prefix="ACTION:")  # type: ignore[attr-defined]
        cands = [candidate_actions(o) for o in observations]
        scores = backend.score(heads, [[" " + a.key for a in cs] for cs in cands])  # type: ignore[attr-defined]
        chosen = [cs[max(range(len(cs)), key=sc.__getitem__)] for cs, sc in zip(cands, scores)]
        says = backend.generate([h + " " + a.key + "\nSAY:" for h, a in zip(heads, chosen)], self.say_tokens,  # type: ignore[attr-defined]
                                stop_at_newline=True)
        per_decision = (time.perf_counter() - t0) / max(1, len(observations))  # scoring + SAY, shared by the batch
        out = []
        for a, say in zip(chosen, says):
            text = say.text.strip()
            out.append(Decision(a.with_utterance(text), None, raw=f"ACTION: {a.key}\nSAY: {text}",
                                tokens_in=say.tokens_in, tokens_out=say.tokens_out, latency_s=per_decision))
        return out
