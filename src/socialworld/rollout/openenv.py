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
* Tasks (OpenEnv's Task API): the splits are the tiers ``L0``, ``L1``, ``L2`` (easy to hard), each
  task an episode of one of the tier's scenarios from a fixed seed (:func:`tasks`), chosen with
  ``reset(split=, index=)``; graded by :data:`GRADERS` (``pass`` and ``CR`` in [0, 1], in the last
  observation's ``metadata["outcome"]``). ``envs/socialworld/`` is the folder OpenEnv's hub lists.
* MCP tools (:data:`TOOLS`) beside reset/step, on OpenEnv's ``/mcp`` (JSON-RPC ``tools/list`` and
  ``tools/call`` in a session from ``openenv/session/create``, or the ``/mcp`` WebSocket): ``start`` a task
  or scenario, ``act`` with a reply, ``observe``.
* A server made with ``scripted=True`` lets a step ask the expert or the oracle for its reply
  (``SocialAction(reply="", scripted="oracle")``): baselines through the same server as the model.

What the doors accept (every refusal a message, never a server error, never a traceback in the log):

* ``reset``: ``seed`` an integer in [0, 2**63) or none, ``scenario`` one the server offers (id or short
  name), ``episode_id`` any text; anything else is a :class:`RequestError` (HTTP 400; an error message on
  the WebSocket, the session stays).
* ``step``: a reply is any text without lone surrogates (U+D800–U+DFFF: no UTF-8 text can carry them, so
  a turn played with one could never be answered; refused before the world sees it); one that does not
  parse is the world's own penalised ``wait()``. A step before ``reset`` or after the end is a
  :class:`RequestError`. OpenEnv's stateless HTTP ``POST /step`` makes a new environment for every
  request, so it can never play this environment's episodes: it answers 400 saying to use the
  WebSocket (``/ws``, :class:`SocialWorldClient`).
* a binary WebSocket frame is read as its UTF-8 text; one that is not UTF-8 gets an error message, and
  the session stays.
"""

from __future__ import annotations

import json
import re
import secrets
import uuid
from functools import partial
from typing import Any, Literal

from openenv.core import Action, EnvClient, Environment, Observation, State, create_app
from openenv.core.client_types import StepResult
from pydantic import BaseModel, Field, field_validator

from socialworld.rollout.evaluate import episode_seeds
from socialworld.rollout.textenv import ChatMode, ScriptedName, TextEpisode, TextMode
from socialworld.world.spec import ScenarioSpec, capped, load_builtin_scenarios, named
from socialworld.world.voice import Voice

ENV_NAME = "socialworld"
_SURROGATE = re.compile("[\ud800-\udfff]")
STATELESS_STEP = ("POST /step cannot play an episode here: OpenEnv's HTTP routes make a new environment for every request, "
                  "and this environment keeps its episode in a session; play over the WebSocket (/ws; SocialWorldClient)")


TIERS: tuple[Literal["L0", "L1", "L2"], ...] = ("L0", "L1", "L2")
"""the task splits, easy to hard: one per tier"""
TASK_SEEDS = 10
"""episodes per scenario in a task split: the seeds ``eval --seed 0 --episodes 10`` plays"""
GRADERS = ("pass", "CR")
"""each task's graders, deterministic and in [0, 1]: at an episode's end, ``metadata["outcome"]`` holds
both (PassRate's 1/0 and the completion rate, contract §5) with the other rule metrics"""


class Task(BaseModel):
    """One task of a split: an episode of ``scenario`` from ``seed``, graded by :data:`GRADERS`."""

    id: str = Field(description="<split>-<index>")
    split: str
    index: int
    scenario: str = Field(description="the scenario id")
    seed: int = Field(description="the world's seed (the same seed, the same episode)")
    graders: list[str] = Field(default_factory=lambda: list(GRADERS))


def tasks(scenarios: dict[str, ScenarioSpec], split: str) -> list[Task]:
    """The tasks of tier ``split`` over ``scenarios``: its scenarios in id order, :data:`TASK_SEEDS`
    evaluation seeds each (run seed 0's, as ``eval`` draws them). ``RequestError`` for another split."""
    if split not in TIERS:
        raise RequestError(f"unknown split {split!r}; the splits are the tiers {', '.join(TIERS)}")
    specs = sorted((s for s in scenarios.values() if s.tier == split), key=lambda s: s.id)
    pairs = [(s.id, seed) for s in specs for seed in episode_seeds(0, s.id, TASK_SEEDS)]
    return [Task(id=f"{split}-{i}", split=split, index=i, scenario=sid, seed=seed) for i, (sid, seed) in enumerate(pairs)]


class RequestError(ValueError):
    """A client's request this environment refuses (bad arguments, no episode to step): the call's error
    with a message (HTTP 400; a WebSocket error message, the session kept), never a server failure."""


class SocialAction(Action):
    """One reply in the policy's format: ``BELIEF: …`` / ``ACTION: <action>`` / ``SAY: …`` (only
    ``ACTION`` is required; the legal actions are in the observation). On a server started with
    ``scripted=True`` (baselines, tests), ``scripted`` asks the expert or the oracle to write this
    turn's reply instead, and ``reply`` must be empty."""

    reply: str = Field(..., description="the reply: BELIEF/ACTION/SAY lines, ACTION required")
    scripted: ScriptedName | None = Field(None, description=(
        "expert or oracle: the server writes the reply (only where it was started to; reply must be empty)"))

    @field_validator("reply")
    @classmethod
    def _sendable(cls, reply: str) -> str:
        if (m := _SURROGATE.search(reply)) is not None:
            raise ValueError(f"the reply holds a lone surrogate (U+{ord(m.group()):04X}) at character {m.start()}, "
                             "which no UTF-8 text can carry")
        return reply


class SocialObservation(Observation):
    """What the agent sees; ``reward`` is the world's step reward (None after ``reset``) and
    ``metadata`` what the last step did (``parse_status``, ``error``, ``executed``, ``penalty``,
    ``penalty_reasons``, ``q``, ``align``, ``replies``, ``subgoals``)."""

    text: str = Field("", description="the observation as text (the user message a language-model policy receives)")
    messages: list[dict[str, str]] = Field(default_factory=list, description="the chat for this state: system and user")
    legal_actions: list[str] = Field(default_factory=list, description="the legal actions' canonical strings")
    observation: dict[str, Any] = Field(default_factory=dict, description="the structured observation (plain types)")
    reply_regex: str = Field("", description="a regular expression for a reply at this state (belief, one legal action, words): "
                             "a reply that matches it parses; send it as structured_outputs.regex to constrain a model")


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
                 observation: TextMode = "prompt", max_turns: int = 0, chat: ChatMode = "state", scripted: bool = False,
                 voice: Voice | None = None) -> None:
        super().__init__()
        self.voice = voice
        """the NPCs' voice, shared by the server's sessions (None: the templates' lines)"""
        self.scripted = scripted
        """whether a step may ask the expert or the oracle for its reply (:class:`SocialAction`)"""
        self.scenarios = scenarios if scenarios is not None else load_builtin_scenarios()
        if not self.scenarios:
            raise ValueError("an environment needs at least one scenario")
        self.default = default or next(iter(self.scenarios))
        self.mode: TextMode = observation
        self.chat: ChatMode = chat
        self.max_turns = max_turns
        self.episode: TextEpisode | None = None
        self._state = SocialState()
        self.mcp_server = _tools(self)
        """the MCP tools (:data:`TOOLS`) over this session's episode, served on ``/mcp`` by OpenEnv"""

    def reset(self, seed: int | None = None, episode_id: str | None = None, scenario: str | None = None,
              split: str | None = None, index: int | None = None, **kwargs: Any) -> SocialObservation:
        if kwargs:
            raise RequestError(f"reset takes seed, episode_id and scenario, or split and index, not {', '.join(sorted(kwargs))}")
        if split is not None or index is not None:
            if seed is not None or scenario is not None:
                raise RequestError("reset takes a task (split and index) or a scenario and seed, not both")
            task = self.get_task(split, index)  # type: ignore[arg-type]
            seed, scenario = task.seed, task.scenario
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
            raise RequestError(f"seed must be an integer in [0, 2**63), got {seed!r}")
        if episode_id is not None and (not isinstance(episode_id, str) or _SURROGATE.search(episode_id)):
            raise RequestError("episode_id must be text (UTF-8)")
        spec = self._scenario(scenario or self.default)
        seed = secrets.randbits(63) if seed is None else seed
        self.episode = TextEpisode(capped(spec, self.max_turns), seed, self.mode, self.chat, voice=self.voice)
        self._state = SocialState(episode_id=episode_id or str(uuid.uuid4()), step_count=0, scenario=spec.id, seed=seed)
        return self._observe(None, False, {})

    def step(self, action: SocialAction, timeout_s: float | None = None, **kwargs: Any) -> SocialObservation:  # type: ignore[override]
        if self.episode is None:
            raise RequestError("no episode: call reset() first")
        if self.episode.world.done:
            raise RequestError("the episode is over: call reset() to start another")
        reply = action.reply
        if action.scripted is not None:
            if not self.scripted:
                raise RequestError("this server does not write scripted replies (socialworld env serve --scripted)")
            if reply:
                raise RequestError("a step with scripted takes an empty reply")
            reply = self.episode.scripted_reply(action.scripted)
        reward, done, happened = self.episode.step(reply)
        self._state.step_count += 1
        return self._observe(reward, done, happened)

    @property
    def state(self) -> SocialState:
        return self._state

    # OpenEnv's Task API (served under /socialworld/...; a task is chosen with reset(split=, index=))

    def list_splits(self) -> list[dict[str, str]]:
        return [{"name": t, "type": "test"} for t in TIERS]

    def list_tasks(self, split: str) -> list[Task]:
        return tasks(self.scenarios, split)

    def num_tasks(self, split: str) -> int:
        return len(self.list_tasks(split))

    def get_task(self, split: str, index: int) -> Task:
        if isinstance(index, bool) or not isinstance(index, int):
            raise RequestError(f"index must be an integer, got {index!r}")
        found = self.list_tasks(split)
        if not 0 <= index < len(found):
            raise IndexError(f"split {split} has tasks 0 to {len(found) - 1}, not {index}")
        return found[index]

    def get_task_range(self, split: str, start: int | None = None, stop: int | None = None) -> list[Task]:
        return self.list_tasks(split)[start:stop]

    def _scenario(self, name: str) -> ScenarioSpec:
        found = named(self.scenarios, name) if isinstance(name, str) and not _SURROGATE.search(name) else []
        if not found:
            raise RequestError(f"unknown scenario {name!r}; this server has {', '.join(self.scenarios)}")
        return found[-1]  # as resolve_scenarios: the last of several versions

    def _observe(self, reward: float | None, done: bool, happened: dict[str, Any]) -> SocialObservation:
        assert self.episode is not None
        text, info = self.episode.observe()
        self._state.turn, self._state.done = self.episode.world.t, bool(self.episode.world.done)
        return SocialObservation(text=text, messages=info["messages"], legal_actions=info["legal_actions"],
                                 observation=info["observation"], reply_regex=info["reply_regex"], reward=reward, done=done,
                                 metadata=happened)


TOOLS = ("start", "act", "observe")
"""the MCP tools each session offers beside reset/step (the names OpenEnv reserves are not among them)"""


def _tools(env: SocialWorldEnvironment) -> Any:
    """A FastMCP server whose tools play ``env``'s episode: ``start`` a task or a scenario, ``act`` with a
    reply (the world's own parse, legality check and penalties), ``observe`` the state. Each returns the
    observation's text, legal actions, reward, whether it is over, and what the step did; a bad call is
    the tool's error (a JSON-RPC error naming it), never a server failure."""
    from fastmcp import FastMCP

    mcp = FastMCP(ENV_NAME)

    def view(obs: SocialObservation) -> dict[str, Any]:
        return {"text": obs.text, "legal_actions": obs.legal_actions, "reward": obs.reward, "done": obs.done,
                "metadata": obs.metadata}

    @mcp.tool
    def start(split: str | None = None, index: int | None = None, scenario: str | None = None,
              seed: int | None = None) -> dict[str, Any]:
        """Start an episode: a task (split L0, L1 or L2, and its index) or a scenario (id or short name)
        from a seed (drawn when none). Returns the first observation."""
        return view(env.reset(seed=seed, scenario=scenario, split=split, index=index))

    @mcp.tool
    def act(reply: str) -> dict[str, Any]:
        """Play one reply (BELIEF/ACTION/SAY lines, ACTION required; one that does not parse is a
        penalised wait()). Returns the next observation, the step's reward and whether the episode is over
        (then metadata.outcome holds its grades: pass and CR)."""
        return view(env.step(SocialAction(reply=reply)))

    @mcp.tool
    def observe() -> dict[str, Any]:
        """The current observation, without playing."""
        if env.episode is None:
            raise RequestError("no episode: call start first")
        return view(env._observe(None, bool(env.episode.world.done), {}))

    return mcp


def make_app(scenarios: dict[str, ScenarioSpec] | None = None, max_sessions: int = 16, observation: TextMode = "prompt",
             max_turns: int = 0, chat: ChatMode = "state", scripted: bool = False, voice: Voice | None = None) -> Any:
    """OpenEnv's FastAPI app serving :class:`SocialWorldEnvironment` over ``scenarios`` (default: the
    shipped ones): one environment per WebSocket session, at most ``max_sessions`` at once; ``scripted``:
    steps may ask the expert or the oracle for their reply (baselines; the oracle reads hidden state);
    ``voice``: the NPCs' voice, one for every session (:func:`socialworld.agents.registry.make_voice`)."""
    from fastapi import Request
    from fastapi.encoders import jsonable_encoder
    from fastapi.exceptions import RequestValidationError

    _AsciiJSON = _ascii_json()

    specs = scenarios if scenarios is not None else load_builtin_scenarios()
    factory = partial(SocialWorldEnvironment, specs, None, observation, max_turns, chat, scripted, voice)
    app = create_app(factory, SocialAction, SocialObservation, env_name=ENV_NAME, max_concurrent_envs=max_sessions,
                     state_cls=SocialState)
    # the stateless HTTP step can never play an episode here: a clear 400 in place of OpenEnv's handler
    app.router.routes = [r for r in app.router.routes if not (getattr(r, "path", None) == "/step" and "POST" in getattr(r, "methods", ()))]

    @app.post("/step", tags=["Environment Control"], status_code=400, response_model=None)
    async def step_stateless():  # type: ignore[no-untyped-def]
        return _AsciiJSON(status_code=400, content={"detail": STATELESS_STEP})

    @app.exception_handler(RequestError)
    async def refused(request: Request, err: RequestError):  # type: ignore[no-untyped-def]
        return _AsciiJSON(status_code=400, content={"detail": str(err)})

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError):  # type: ignore[no-untyped-def]
        # FastAPI's own answer echoes the input, and one holding a lone surrogate could not be encoded (a 500)
        return _AsciiJSON(status_code=422, content={"detail": jsonable_encoder(err.errors())})

    return _TextFrames(app)


def _ascii_json() -> type:
    from fastapi.responses import JSONResponse

    class AsciiJSON(JSONResponse):
        """JSON with every non-ASCII character escaped: any text a client sent can be echoed back."""

        def render(self, content: Any) -> bytes:
            return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")

    return AsciiJSON


def _unsendable(value: Any) -> bool:
    """Whether a decoded JSON value holds a lone surrogate in any string (key or value)."""
    if isinstance(value, str):
        return _SURROGATE.search(value) is not None
    if isinstance(value, dict):
        return any(_unsendable(k) or _unsendable(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_unsendable(v) for v in value)
    return False


class _TextFrames:
    """ASGI wrapper of the app's WebSocket doors: a binary frame reaches OpenEnv as its UTF-8 text (OpenEnv
    reads text frames only, and answered a binary one with the error ``'text'``); one that is not UTF-8,
    a message whose JSON holds a lone surrogate (OpenEnv's error would echo it and fail to encode,
    ending the session) or is nested too deeply for Python's parser, is answered with an error message here and never reaches the environment.
    Everything else passes."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def __getattr__(self, name: str) -> Any:  # the FastAPI app's own attributes (routes, state, ...)
        return getattr(self.app, name)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") != "websocket":
            return await self.app(scope, receive, send)

        async def refuse(message: str) -> None:
            await send({"type": "websocket.send", "text": json.dumps({"type": "error", "data": {"message": message, "code": "INVALID_JSON"}})})

        async def text_receive() -> dict:
            while True:
                msg = await receive()
                if msg.get("type") != "websocket.receive":
                    return msg
                text = msg.get("text")
                if text is None and msg.get("bytes") is not None:
                    try:
                        text = msg["bytes"].decode("utf-8")
                    except UnicodeDecodeError as err:
                        await refuse(f"a binary frame that is not UTF-8 text (byte {err.start}); send JSON messages as text")
                        continue
                try:
                    if _unsendable(json.loads(text or "null")):
                        await refuse("the message holds a lone surrogate (U+D800-U+DFFF), which no UTF-8 text can carry")
                        continue
                except RecursionError:
                    await refuse("the message's JSON is nested too deeply")
                    continue
                except ValueError:
                    pass  # OpenEnv answers malformed JSON itself
                return {"type": "websocket.receive", "text": text}

        return await self.app(scope, text_receive, send)


class SocialWorldClient(EnvClient[SocialAction, SocialObservation, SocialState]):
    """OpenEnv's client for a socialworld server: ``with SocialWorldClient(base_url=url).sync() as env:
    env.reset(seed=0, scenario="team_lunch"); env.step(SocialAction(reply="ACTION: wait()"))``."""

    def _step_payload(self, action: SocialAction) -> dict[str, Any]:
        return {"reply": action.reply} if action.scripted is None else {"reply": action.reply, "scripted": action.scripted}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[SocialObservation]:
        fields = {k: v for k, v in payload.get("observation", {}).items() if k in SocialObservation.model_fields}
        obs = SocialObservation(**{**fields, "reward": payload.get("reward"), "done": payload.get("done", False)})
        return StepResult(observation=obs, reward=payload.get("reward"), done=payload.get("done", False),
                          metadata=payload.get("metadata"))

    def _parse_state(self, payload: dict[str, Any]) -> SocialState:
        return SocialState(**payload)
