"""The social world as a Gymnasium environment, for RL stacks that speak Gymnasium (TRL, verifiers,
OpenEnv adapters, your own PPO).

``import socialworld.rollout.gym`` registers one id per shipped scenario, ``socialworld/<scenario id>``
(``gymnasium.make("socialworld/team_lunch-v1")``); ``gymnasium.register_envs(socialworld.rollout.gym)``
says so to a linter. :class:`SocialWorldEnv` also takes a scenario YAML path of your own.

* **Observation**: text. ``observation="prompt"`` (default) is the user message a language-model
  policy receives (``socialworld.agents.lm.prompts``: the compact state and the agent's own earlier
  moves; the scenario's static brief is in ``info["messages"]``, the full chat);
  ``observation="render"`` is the world's long render. Either way ``info`` holds the structured
  observation. ``chat="episode"`` makes ``info["messages"]`` the whole episode as one growing
  conversation (each reply and the next observation appended), as multi-turn trainers expect.
* **Action**: text in the policy's reply format (``BELIEF: …`` / ``ACTION: <action>`` / ``SAY: …``;
  only ``ACTION`` is required), parsed strictly (:func:`socialworld.agents.lm.prompts.parse_output`).
  Unparseable or illegal text is the world's own case: recorded, penalised, executed as ``wait()``.
* **NPC voices**: ``npc_voice="bundled"`` (any model spec; default ``template``) words the NPCs' lines
  while the rules decide every response (:mod:`socialworld.world.voice`); the words reach the
  ``render`` observation and ``info["replies"]``, the prompt observation shows the state only.
* **Reward**: the world's step reward (Phi gain minus the step's penalty, contract §5.1).
* **terminated** at ``end()`` or the turn budget (the budget is part of the task, not a time
  limit); ``truncated`` is always False.
* ``info``: ``observation`` (structured, plain types), ``legal_actions`` (their canonical
  strings), ``messages`` (the LM chat for this state), and after a step ``parse_status``,
  ``error``, ``executed``, ``penalty``, ``penalty_reasons``, ``q`` (dialogue score, None when
  nothing assessable was said), ``align`` (the stated belief against the hidden truth; None
  without a parseable belief), ``replies`` and ``subgoals``; at the end, ``outcome`` (``pass``,
  ``solved``, the rule metrics: :func:`socialworld.rollout.textenv.outcome`) from the episode's
  record (:meth:`SocialWorldEnv.record`, as the runner writes it).
* :meth:`SocialWorldEnv.expert_reply`: the expert's move at this state as a reply in the policy's
  format, for warm starts and tests.
* ``reset(seed=s)`` fully determines the episode: the world is ``World(spec, s)``. Without a
  seed, the episode seed is drawn from the env's ``np_random``.
* Lookahead: :attr:`SocialWorldEnv.world` is the live :class:`~socialworld.world.engine.World`
  (``fork()``, ``snapshot_json()``); :meth:`SocialWorldEnv.snapshot` / :meth:`restore` save and
  put back the whole env state.
"""

from __future__ import annotations

from typing import Any, Literal

import gymnasium
from gymnasium import spaces

from socialworld.agents.registry import make_voice
from socialworld.records import EpisodeRecord
from socialworld.rollout.textenv import ChatMode, TextEpisode
from socialworld.world.engine import World
from socialworld.world.spec import ScenarioSpec, capped, load_builtin_scenarios, resolve_scenarios
from socialworld.world.visibility import observe, render

ENV_NAMESPACE = "socialworld"
MAX_TEXT = 1 << 16
"""longest observation or action text the spaces declare (characters)"""
SAMPLE_CHARSET = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 (),:=_-\n")
"""characters :meth:`AnyText.sample` draws from (enough to write the reply format)"""


class AnyText(spaces.Text):
    """A ``Text`` space of any Unicode string up to ``max_length`` characters: model text (a SAY
    line the world repeats in the observation, a scenario written in any language) is never
    outside the space. ``sample`` draws from :data:`SAMPLE_CHARSET`."""

    def __init__(self, max_length: int = MAX_TEXT, min_length: int = 0, seed: Any = None):
        super().__init__(max_length, min_length=min_length, charset=SAMPLE_CHARSET, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"AnyText({self.min_length}, {self.max_length})"


class SocialWorldEnv(gymnasium.Env):
    """One scenario of the social world behind the Gymnasium API (module docstring)."""

    metadata = {"render_modes": ["ansi"], "render_fps": 1}
    """``ansi``: ``render()`` returns the world's full text render; one frame per step"""

    def __init__(self, scenario: str | ScenarioSpec = "team_lunch-v1", observation: Literal["prompt", "render"] = "prompt",
                 max_turns: int = 0, render_mode: str | None = None, chat: ChatMode = "state", npc_voice: str = "template"):
        if observation not in ("prompt", "render"):
            raise ValueError(f"observation must be prompt or render, got {observation!r}")
        if chat not in ("state", "episode"):
            raise ValueError(f"chat must be state or episode, got {chat!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}")
        spec = scenario if isinstance(scenario, ScenarioSpec) else resolve_scenarios([scenario])[0]
        self.scenario = capped(spec, max_turns)
        """the scenario spec (``spec`` is Gymnasium's: the registered id and its kwargs)"""
        self.observation = observation
        self.chat: ChatMode = chat
        self.render_mode = render_mode
        self.observation_space = AnyText()
        self.action_space = AnyText()
        self.episode: TextEpisode | None = None
        """the current episode (None before the first reset)"""
        self.voice = make_voice(npc_voice)
        """the NPCs' voice (``npc_voice``: template, or a model spec; :mod:`socialworld.world.voice`)"""

    @property
    def world(self) -> World | None:
        """the live world of the current episode (None before the first reset)"""
        return None if self.episode is None else self.episode.world

    # ------------------------------------------------------------------ the API

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        episode_seed = seed if seed is not None else int(self.np_random.integers(0, 2**63 - 1))
        self.episode = TextEpisode(self.scenario, episode_seed, self.observation, self.chat, voice=self.voice)
        return self._observe()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        reward, done, happened = self._live().step(action)
        text, info = self._observe()
        return text, reward, done, False, {**info, **happened}

    def expert_reply(self) -> str:
        """The expert's move at this state as a reply in the policy's format (:meth:`TextEpisode.expert_reply`)."""
        return self._live().expert_reply()

    def record(self) -> EpisodeRecord:
        """The episode's scored five-dimensional record so far (:meth:`TextEpisode.record`)."""
        return self._live().record()

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        w = self._live().world
        return render(observe(w.spec, w.pub))

    # ------------------------------------------------------------------ lookahead

    def snapshot(self) -> str:
        """The whole episode state as JSON (:meth:`World.snapshot_json`)."""
        return self._live().world.snapshot_json()

    def restore(self, snapshot: str) -> tuple[str, dict[str, Any]]:
        """Put back a state from :meth:`snapshot`; returns its observation and info, as ``reset`` does
        (the restored episode has no record and its end no ``outcome``: the steps before the
        snapshot are not in it)."""
        self.episode = TextEpisode.restored(snapshot, self.scenario, self.observation, self.chat, voice=self.voice)
        return self._observe()

    # ------------------------------------------------------------------ internals

    def _live(self) -> TextEpisode:
        if self.episode is None:
            raise RuntimeError("call reset() first")
        return self.episode

    def _observe(self) -> tuple[str, dict[str, Any]]:
        return self._live().observe()


def env_id(scenario_id: str) -> str:
    """The Gymnasium id of a shipped scenario: ``socialworld/<scenario id>``."""
    return f"{ENV_NAMESPACE}/{scenario_id}"


def register_envs() -> list[str]:
    """Register every shipped scenario (idempotent); returns their ids."""
    ids = []
    for sid in load_builtin_scenarios():
        name = env_id(sid)
        if name not in gymnasium.registry:
            gymnasium.register(id=name, entry_point=f"{__name__}:SocialWorldEnv", kwargs={"scenario": sid})
        ids.append(name)
    return ids


ENV_IDS = register_envs()
"""the registered ids (registering is what importing this module is for)"""
