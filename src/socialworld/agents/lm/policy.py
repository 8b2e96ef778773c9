"""A language-model policy on the same :class:`~socialworld.core.Policy` protocol as the
scripted ones: one batched backend call per lockstep step (per phase).

Decoding modes:

* ``free`` — the model writes ``BELIEF/ACTION/SAY`` lines; parsed strictly (any backend).
* ``constrained`` — parseable by construction (local models): greedy decoding restricted to
  the same reply grammar (:func:`program`, decoded by :mod:`socialworld.agents.lm.constrained`): a
  belief over known ids, one legal action, a free SAY line. The text is still run through the
  strict parser, so both modes are recorded the same way.
"""

from __future__ import annotations

from typing import Literal, Sequence

from socialworld.agents.lm.backends import Backend, Completion, ConstrainedBackend
from socialworld.agents.lm.constrained import Choice, Forced, Free, Segment
from socialworld.agents.lm.prompts import build_messages, parse_output
from socialworld.core import MOOD_BUCKETS, Decision, MentalState, Observation
from socialworld.records import PolicyRec
from socialworld.text.reply import ACTION, BELIEF, SAY, render_turn
from socialworld.text.templates import POLICY_PROMPT_VERSION
from socialworld.world.visibility import legal_actions

SAY_TOKENS = 24
"""Most tokens of a constrained reply's SAY line: room for the expert's template sentences, which the
dialogue track teaches (a proposal's address and polite close included). Cut shorter, a trained
policy's line stops before its close, its ``q_t`` falls, and with ``DIALOGUE_W`` that costs
borderline acceptances; each token more costs decoding time (design.md, constrained decoding)."""


def focus(obs: Observation) -> str | None:
    """The NPC whose mental state the reply re-estimates: whoever spoke last (new evidence),
    else present NPCs in turn by step."""
    present = [n.id for n in obs.npcs if n.present]
    if not present:
        return None
    if obs.recent and obs.recent[-1].speaker in present:
        return obs.recent[-1].speaker
    return present[obs.step % len(present)]


def program(obs: Observation, say_tokens: int, adapters: tuple[str, str] | None = None) -> list[Segment]:
    """The reply grammar of ``policy-v2``/``policy-v3`` (the same) for constrained decoding: a BELIEF about the
    :func:`focus` NPC (preferred option on every decision it has a say on, and its mood bucket),
    one ACTION from :func:`~socialworld.world.visibility.legal_actions`, and a free one-line SAY.

    One NPC per step, not all: each belief item costs a sequential forward pass, and re-stating
    every NPC every step would multiply those passes (see docs/design.md). The policy keeps
    its latest statement per item, so its stated estimate still covers every NPC it has
    re-estimated. ``adapters`` = (action adapter, dialogue adapter): the belief and action are
    decoded under the first, the utterance under the second."""
    act, talk = adapters or (None, None)
    segs: list[Segment] = [Forced(BELIEF)]
    npc = focus(obs)
    if npc is not None:
        segs.append(Forced(" " + npc))
        for s in obs.slots:
            if npc in s.stakeholders:
                segs += [Forced(f" {s.id}="), Choice(f"pref:{npc}:{s.id}", tuple(o.id for o in s.options), act)]
        segs += [Forced(" mood="), Choice(f"mood:{npc}", MOOD_BUCKETS, act)]
    segs += [Forced(f"\n{ACTION}"), Choice("action", tuple(" " + a.key for a in legal_actions(obs)), act),
             Forced(f"\n{SAY}"), Free("say", say_tokens, adapter=talk)]
    return segs


def belief_target(obs: Observation) -> str:
    """The BELIEF line a trained policy is taught to write at ``obs``, in :func:`program`'s grammar:
    about the :func:`focus` NPC, what the observation supports (the expert's inference from the
    public record: what was said, and who accepted which proposal; the mood its cue shows, ``mid``
    without one). Where nothing is known of a decision, a fixed rule the prompt also shows (the
    option on the table, else the decision's first option), so every target is a function of the
    prompt: the simulator's hidden truth (a hindsight label) taught the model to guess what no
    prompt reveals, and that noise outweighed the few tokens that pick the action."""
    from socialworld.agents.beliefs import Beliefs
    from socialworld.agents.scripted import ExpertPolicy

    npc = focus(obs)
    if npc is None:
        return BELIEF
    ms = ExpertPolicy.stated(obs, Beliefs().update(obs))
    known = ms.preferences.get(npc, {})
    items = [f"{s.id}={known.get(s.id) or s.proposal or s.options[0].id}" for s in obs.slots if npc in s.stakeholders]
    return " ".join([BELIEF, npc, *items, f"mood={ms.moods.get(npc, 'mid')}"])


def target_turn(obs: Observation, action: str, words: str | None = None) -> str:
    """A whole reply in :func:`program`'s grammar, as training rows teach it: the
    :func:`belief_target` at ``obs``, the action key, and (``words`` given) the SAY line (``SAY:``
    alone for no words)."""
    return render_turn(belief_target(obs), action, words)


def merge(old: MentalState | None, new: MentalState | None) -> MentalState | None:
    """The running estimate: the latest statement per (npc, slot) preference and per npc mood."""
    if new is None or old is None:
        return new or old
    prefs = {k: dict(v) for k, v in old.preferences.items()}
    for npc, slots in new.preferences.items():
        prefs.setdefault(npc, {}).update(slots)
    return MentalState(prefs, {**old.moods, **new.moods})


class LMPolicy:
    def __init__(self, backend: Backend, prompt_version: str = POLICY_PROMPT_VERSION, base_model: str | None = None,
                 adapter_hash: str | None = None, decoding: Literal["free", "constrained"] = "free",
                 say_tokens: int = SAY_TOKENS, adapters: tuple[str, str] | None = None):
        self._grammar: ConstrainedBackend | None = None
        """the backend, where this policy decodes under the reply grammar"""
        if decoding == "constrained":
            if not isinstance(backend, ConstrainedBackend):
                raise ValueError(f"backend {backend.name} cannot decode under a grammar; use decoding='free'")
            self._grammar = backend
        self.backend = backend
        self.prompt_version = prompt_version
        self.policy_id = backend.name
        self.base_model = base_model or backend.name
        self.adapter_hash = adapter_hash
        self.decoding = decoding
        self.say_tokens = say_tokens
        self.adapters = adapters
        self._estimates: dict[str, MentalState | None] = {}

    def info(self) -> PolicyRec:
        return PolicyRec(policy_id=self.policy_id, base_model=self.base_model, adapter_hash=self.adapter_hash,
                         decoding={**self.backend.decoding, "prompt": self.prompt_version, "mode": self.decoding,
                                   **({"say_tokens": self.say_tokens} if self.decoding == "constrained" and self.backend.local
                                      else {})})

    def reset(self, episode_keys: Sequence[str]) -> None:
        for k in episode_keys:
            self._estimates.pop(k, None)

    def act(self, episode_keys: Sequence[str], observations: Sequence[Observation]) -> list[Decision]:
        convs = [build_messages(o, self.prompt_version) for o in observations]
        comps: list[Completion]
        if self._grammar is not None:
            progs = [program(o, self.say_tokens, self.adapters) for o in observations]
            comps = self._grammar.constrained(convs, progs)
        else:
            comps = self.backend.complete(convs)
        out = []
        for key, obs, conv, c in zip(episode_keys, observations, convs, comps):
            error: str | None
            if c.error is not None:
                action, belief, error = None, None, c.error
            else:
                action, belief, error = parse_output(c.text, obs)
            belief = self._estimates[key] = merge(self._estimates.get(key), belief)
            out.append(Decision(action, belief, raw=c.text, parse_error=error, tokens_in=c.tokens_in,
                                tokens_out=c.tokens_out, latency_s=c.latency_s, failure="endpoint" if c.error is not None else None,
                                prompt=(self.prompt_version, tuple((m["role"], m["content"]) for m in conv))))
        return out
