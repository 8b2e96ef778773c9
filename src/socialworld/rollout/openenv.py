"""The social world as an OpenEnv environment (`openenv <https://github.com/huggingface/OpenEnv>`_,
``pip install -e '.[openenv]'``), for trainers that consume OpenEnv servers (TRL's
``environment_factory``, SkyRL, ART, NeMo Gym).

* :class:`SocialWorldEnvironment` is OpenEnv's ``Environment``: ``reset(seed, episode_id,
  scenario)`` starts ``World(scenario, seed)`` (the same seed, the same episode; without a seed one
  is drawn and kept in :class:`SocialState`); ``step(SocialAction(reply=...))`` plays one reply in
  the policy's format (:mod:`socialworld.rollout.textenv`: unparseable or illegal text is the
  world's own penalised ``wait()``, never an error). Its :class:`SocialObservation` carries the text
  (the user message a language-model policy receives), the chat, the legal actions and the
  structured observation; ``reward`` is the world's step reward and ``metadata`` what the step did
  (at the end, ``outcome``: pass, solved and the rule metrics from the episode's record).
* :func:`make_app` is OpenEnv's own server (``create_app``): one environment per WebSocket session
  (``/ws``), up to ``max_sessions`` at once, each freed when its client goes away; the scenarios it
  offers are fixed when it starts (a client names one by id or short name, never a path on the
  server). ``socialworld env serve`` runs it.
* :class:`SocialWorldClient` is OpenEnv's ``EnvClient`` for it (``.sync()`` for plain code).

An unknown scenario, a seed that is not an integer in [0, 2**63), an unknown ``reset`` argument or a
step before ``reset`` / after the end is an error from the call, with a message; the session stays.
"""

from __future__ import annotations

import secrets
import uuid
from functools import partial
from typing import Any

from openenv.core import Action, EnvClient, Environment, Observation, State, create_app
from openenv.core.client_types import StepResult
from pydantic import Field

from socialworld.rollout.textenv import ChatMode, TextEpisode, TextMode
from socialworld.world.spec import ScenarioSpec, capped, load_builtin_scenarios, named

ENV_NAME = "socialworld"


class SocialAction(Action):
    """One reply in the policy's format: ``BELIEF: …`` / ``ACTION: <action>`` / ``SAY: …`` (only
    ``ACTION`` is required; the legal actions are in the observation)."""

    reply: str = Field(..., description="the reply: BELIEF/ACTION/SAY lines, ACTION required")


class SocialObservation(Observation):
    """What the agent sees; ``reward`` is the world's step reward (None after ``reset``) and
    ``metadata`` what the last step did (``parse_status``, ``error``, ``executed``, ``penalty``,
    ``penalty_reasons``, ``q``, ``align``, ``replies``, ``subgoals``)."""

    text: str = Field("", description="the observation as text (the user message a language-model policy receives)")
    messages: list[dict[str, str]] = Field(default_factory=list, description="the chat for this state: system and user")
    legal_actions: list[str] = Field(default_factory=list, description="the legal actions' canonical strings")
    observation: dict[str, Any] = Field(default_factory=dict, description="the structured observation (plain types)")


class SocialState(State):
    """The session's episode: which scenario, which seed (what reproduces it), which turn."""

    scenario: str | None = None
    seed: int | None = None
    turn: int = 0
    done: bool = False


class SocialWorldEnvironment(Environment[SocialAction, SocialObservation, SocialState]):
    """One session's social world (module docstring)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, scenarios: dict[str, ScenarioSpec] | None = None, default: str | None = None,
                 observation: TextMode = "prompt", max_turns: int = 0, chat: ChatMode = "state") -> None:
        super().__init__()
        self.scenarios = scenarios if scenarios is not None else load_builtin_scenarios()
        if not self.scenarios:
            raise ValueError("an environment needs at least one scenario")
        self.default = default or next(iter(self.scenarios))
        self.mode: TextMode = observation
        self.chat: ChatMode = chat
        self.max_turns = max_turns
        self.episode: TextEpisode | None = None
        self._state = SocialState()

    def reset(self, seed: int | None = None, episode_id: str | None = None, scenario: str | None = None,
              **kwargs: Any) -> SocialObservation:
        if kwargs:
            raise ValueError(f"reset takes seed, episode_id and scenario, not {', '.join(sorted(kwargs))}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
            raise ValueError(f"seed must be an integer in [0, 2**63), got {seed!r}")
        spec = self._scenario(scenario or self.default)
        seed = secrets.randbits(63) if seed is None else seed
        self.episode = TextEpisode(capped(spec, self.max_turns), seed, self.mode, self.chat)
        self._state = SocialState(episode_id=episode_id or str(uuid.uuid4()), step_count=0, scenario=spec.id, seed=seed)
        return self._observe(None, False, {})

    def step(self, action: SocialAction, timeout_s: float | None = None, **kwargs: Any) -> SocialObservation:  # type: ignore[override]
        if self.episode is None:
            raise RuntimeError("call reset() first")
        reward, done, happened = self.episode.step(action.reply)
        self._state.step_count += 1
        return self._observe(reward, done, happened)

    @property
    def state(self) -> SocialState:
        return self._state

    def _scenario(self, name: str) -> ScenarioSpec:
        found = named(self.scenarios, name)
        if not found:
            raise ValueError(f"unknown scenario {name!r}; this server has {', '.join(self.scenarios)}")
        return found[-1]  # as resolve_scenarios: the last of several versions

    def _observe(self, reward: float | None, done: bool, happened: dict[str, Any]) -> SocialObservation:
        assert self.episode is not None
        text, info = self.episode.observe()
        self._state.turn, self._state.done = self.episode.world.t, bool(self.episode.world.done)
        return SocialObservation(text=text, messages=info["messages"], legal_actions=info["legal_actions"],
                                 observation=info["observation"], reward=reward, done=done, metadata=happened)


def make_app(scenarios: dict[str, ScenarioSpec] | None = None, max_sessions: int = 16, observation: TextMode = "prompt",
             max_turns: int = 0, chat: ChatMode = "state") -> Any:
    """OpenEnv's FastAPI app serving :class:`SocialWorldEnvironment` over ``scenarios`` (default: the
    shipped ones): one environment per WebSocket session, at most ``max_sessions`` at once."""
    specs = scenarios if scenarios is not None else load_builtin_scenarios()
    factory = partial(SocialWorldEnvironment, specs, None, observation, max_turns, chat)
    return create_app(factory, SocialAction, SocialObservation, env_name=ENV_NAME, max_concurrent_envs=max_sessions,
                      state_cls=SocialState)


class SocialWorldClient(EnvClient[SocialAction, SocialObservation, SocialState]):
    """OpenEnv's client for a socialworld server: ``with SocialWorldClient(base_url=url).sync() as env:
    env.reset(seed=0, scenario="team_lunch"); env.step(SocialAction(reply="ACTION: wait()"))``."""

    def _step_payload(self, action: SocialAction) -> dict[str, Any]:
        return {"reply": action.reply}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[SocialObservation]:
        fields = {k: v for k, v in payload.get("observation", {}).items() if k in SocialObservation.model_fields}
        obs = SocialObservation(**{**fields, "reward": payload.get("reward"), "done": payload.get("done", False)})
        return StepResult(observation=obs, reward=payload.get("reward"), done=payload.get("done", False),
                          metadata=payload.get("metadata"))

    def _parse_state(self, payload: dict[str, Any]) -> SocialState:
        return SocialState(**payload)
