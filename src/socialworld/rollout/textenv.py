"""The social world as text in, text out: what the Gymnasium env (:mod:`socialworld.rollout.gym`) and
the OpenEnv environment (:mod:`socialworld.rollout.openenv`) both serve, over a live
:class:`~socialworld.world.engine.World`.

* :func:`text_observation`: the observation as text (``prompt``: the user message a language-model
  policy receives; ``render``: the world's long render) and its info (the structured observation,
  the legal actions' canonical strings, the LM chat for this state).
* :func:`text_step`: one reply in the policy's format (``BELIEF: …`` / ``ACTION: <action>`` /
  ``SAY: …``; only ``ACTION`` is required), parsed strictly; unparseable or illegal text is the
  world's own case (recorded, penalised, executed as ``wait()``). Returns the world's step reward,
  whether the episode ended, and what happened.
"""

from __future__ import annotations

from typing import Any, Literal

from socialworld.agents.lm.prompts import build_messages, parse_output
from socialworld.metrics.core import align
from socialworld.world.engine import World
from socialworld.world.visibility import legal_actions, observe, render, to_plain

TextMode = Literal["prompt", "render"]


def text_observation(world: World, mode: TextMode = "prompt") -> tuple[str, dict[str, Any]]:
    """The world's current observation as text, and ``{"observation", "legal_actions", "messages"}``."""
    obs = observe(world.spec, world.pub)
    messages = build_messages(obs)
    text = messages[-1]["content"] if mode == "prompt" else render(obs)
    return text, {"observation": to_plain(obs), "legal_actions": [a.key for a in legal_actions(obs)], "messages": messages}


def text_step(world: World, reply: Any) -> tuple[float, bool, dict[str, Any]]:
    """Play ``reply`` (text in the policy's format; anything else is an unparseable reply) on
    ``world``: the step reward, whether the episode is over, and ``{"parse_status", "error",
    "executed", "penalty", "penalty_reasons", "q", "align", "replies", "subgoals"}`` (``q``: the
    dialogue score, None when nothing assessable was said; ``align``: the stated belief against the
    hidden truth, None without a parseable belief). Raises ``RuntimeError`` once the episode is over."""
    if world.done:
        raise RuntimeError("the episode is over: call reset()")
    obs = observe(world.spec, world.pub)
    parsed, belief, error = parse_output(reply, obs) if isinstance(reply, str) else (None, None, "the action is not text")
    truth = world.truth()
    res = world.step(parsed, parse_error=error)
    info = {"parse_status": res.parse_status, "error": res.error, "executed": res.executed.key, "penalty": res.penalty,
            "penalty_reasons": list(res.penalty_reasons), "q": res.q,
            "align": None if belief is None else align(belief, truth),
            "replies": [{"speaker": r.speaker, "text": r.text} for r in res.replies], "subgoals": world.subgoals()}
    return float(res.reward), bool(res.done), info
