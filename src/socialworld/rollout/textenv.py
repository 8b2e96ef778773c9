"""The social world as text in, text out: one episode as the Gymnasium env
(:mod:`socialworld.rollout.gym`) and the OpenEnv environment (:mod:`socialworld.rollout.openenv`) both
serve it, recorded in five dimensions as the runner records any policy's.

* :meth:`TextEpisode.observe`: the observation as text (``prompt``: the user message a
  language-model policy receives; ``render``: the world's long render) and its info (the
  structured observation, the legal actions' canonical strings, the chat: this state's system and
  user messages, or with ``chat="episode"`` the whole episode as one growing conversation, each
  reply and the next observation appended).
* :meth:`TextEpisode.step`: one reply in the policy's format (``BELIEF: …`` / ``ACTION: <action>`` /
  ``SAY: …``; only ``ACTION`` is required), parsed strictly; unparseable or illegal text is the
  world's own case (recorded, penalised, executed as ``wait()``). A BELIEF line updates the
  episode's running estimate (the latest statement per person and decision, and per mood), as
  ``eval`` reads a language-model policy's replies, so a reply scores the same through every door. Returns the world's step reward,
  whether the episode ended, and what happened; at the end, ``outcome``: whether it passed and
  was solved, and the rule metrics (contract §5), from the episode's own record.
* :meth:`TextEpisode.expert_reply`: the expert's move at this state as a reply in the policy's
  format (the BELIEF line a trained policy is taught, the action, the words), for warm starts and
  tests; :meth:`TextEpisode.scripted_reply` the oracle's too (baselines).
"""

from __future__ import annotations

from typing import Any, Literal

from socialworld.agents.lm.constrained import program_regex
from socialworld.agents.lm.policy import SAY_TOKENS, merge, program
from socialworld.agents.lm.prompts import build_messages, parse_output
from socialworld.core import Decision, MentalState
from socialworld.metric_registry import KEYS
from socialworld.metrics.core import metric_of
from socialworld.records import EpisodeRecord, PolicyRec, StepRecord
from socialworld.rollout.runner import EpisodeJob, episode_record, step_record, voice_info, voice_step
from socialworld.world.engine import World
from socialworld.world.spec import ScenarioSpec
from socialworld.world.visibility import legal_actions, observe, render, to_plain
from socialworld.world.voice import Voice

TextMode = Literal["prompt", "render"]
ChatMode = Literal["state", "episode"]
ScriptedName = Literal["expert", "oracle"]
SCRIPTED_REPLIES: tuple[ScriptedName, ...] = ("expert", "oracle")
"""the scripted policies a text episode can ask for a reply (:meth:`TextEpisode.scripted_reply`)"""
TEXT_POLICY = "text"
"""the policy id of a text episode's record (whoever wrote the replies)"""


class TextEpisode:
    """One episode of ``spec`` from ``seed`` (``World(spec, seed)``), played by replies as text."""

    def __init__(self, spec: ScenarioSpec, seed: int, mode: TextMode = "prompt", chat: ChatMode = "state",
                 world: World | None = None, voice: Voice | None = None) -> None:
        if mode not in ("prompt", "render"):
            raise ValueError(f"observation must be prompt or render, got {mode!r}")
        if chat not in ("state", "episode"):
            raise ValueError(f"chat must be state or episode, got {chat!r}")
        self.job = EpisodeJob(spec, seed)
        self.world = world if world is not None else self.job.world()[0]
        """the live world (``fork()`` and ``snapshot_json()`` for lookahead)"""
        self.mode, self.chat = mode, chat
        self.voice = voice
        """the NPCs' voice (:mod:`socialworld.world.voice`; None: the templates' lines)"""
        self.steps: list[StepRecord] = []
        self.recorded = world is None
        """False for an episode restored mid-way: its record would lack the steps before the snapshot"""
        self._phi0 = self.world.progress()
        self._chat = build_messages(observe(self.world.spec, self.world.pub)) if chat == "episode" else []
        """the episode as one conversation (``chat="episode"`` only)"""
        self._belief: MentalState | None = None
        """the running estimate the replies' BELIEF lines state (:func:`~socialworld.agents.lm.policy.merge`)"""
        self._scripted: dict[str, Any] = {}
        """the scripted policies asked for replies (:meth:`scripted_reply`), each remembering this episode"""

    @classmethod
    def restored(cls, snapshot: str, spec: ScenarioSpec, mode: TextMode = "prompt", chat: ChatMode = "state",
                 voice: Voice | None = None) -> TextEpisode:
        """An episode put back from ``World.snapshot_json()`` (no record, no outcome: see :attr:`recorded`)."""
        w = World.restore(snapshot, spec)
        return cls(spec, w.seed, mode, chat, world=w, voice=voice)

    def observe(self) -> tuple[str, dict[str, Any]]:
        """The observation as text, and ``{"observation", "legal_actions", "messages", "reply_regex"}``
        (``reply_regex``: the reply grammar at this state, :func:`~socialworld.agents.lm.policy.program`,
        as the regular expression a server's structured outputs take: a reply that matches it parses)."""
        obs = observe(self.world.spec, self.world.pub)
        messages = build_messages(obs)
        text = messages[-1]["content"] if self.mode == "prompt" else render(obs)
        return text, {"observation": to_plain(obs), "legal_actions": [a.key for a in legal_actions(obs)],
                      "messages": [dict(m) for m in self._chat] if self.chat == "episode" else messages,
                      "reply_regex": program_regex(program(obs, SAY_TOKENS))}

    def step(self, reply: Any) -> tuple[float, bool, dict[str, Any]]:
        """Play ``reply`` (text in the policy's format; anything else is an unparseable reply): the
        step reward, whether the episode is over, and ``{"parse_status", "error", "executed",
        "penalty", "penalty_reasons", "q", "align", "replies", "subgoals"}`` (``q``: the dialogue
        score, None when nothing assessable was said; ``align``: the stated belief against the
        hidden truth, None without a parseable belief), with ``outcome`` at the end (None for an
        episode restored mid-way). Raises ``RuntimeError`` once the episode is over."""
        w = self.world
        if w.done:
            raise RuntimeError("the episode is over: call reset()")
        obs = observe(w.spec, w.pub)
        text = reply if isinstance(reply, str) else ""
        parsed, belief, error = parse_output(reply, obs) if isinstance(reply, str) else (None, None, "the action is not text")
        belief = self._belief = merge(self._belief, belief)  # as LMPolicy reads its replies: the running estimate
        self.steps.append(step_record(w, obs, Decision(parsed, belief, raw=text, parse_error=error), PolicyRec(policy_id=TEXT_POLICY)))
        if self.voice is not None:
            voice_step(self.voice, [w], [self.steps])
        rec = self.steps[-1]
        info: dict[str, Any] = {
            "parse_status": rec.action.parse_status, "error": rec.action.error, "executed": rec.action.executed,
            "penalty": rec.signals.penalty.value, "penalty_reasons": list(rec.signals.penalty_reasons), "q": rec.signals.q.value,
            "align": None if belief is None else rec.signals.align.value,
            "replies": [{"speaker": r.speaker, "text": r.text} for r in rec.dialogue.replies], "subgoals": w.subgoals()}
        if self.chat == "episode":
            self._chat += [{"role": "assistant", "content": text},
                           {"role": "user", "content": build_messages(observe(w.spec, w.pub))[-1]["content"]}]
        if w.done:
            info["outcome"] = outcome(self.record()) if self.recorded else None
        reward = rec.signals.reward.value
        assert reward is not None  # the world always gives one (source "direct")
        return float(reward), bool(w.done), info

    def record(self) -> EpisodeRecord:
        """The episode's scored record so far (as the runner writes it; policy id ``text``)."""
        if not self.recorded:
            raise RuntimeError("an episode restored from a snapshot has no record of the steps before it")
        return episode_record(self.job, self.world, self.steps, self._phi0, TEXT_POLICY, None, voice=voice_info(self.voice))

    def expert_reply(self) -> str:
        """The expert's move at this state as a reply in the policy's format: the BELIEF line a
        trained policy is taught (:func:`~socialworld.agents.lm.policy.belief_target`), its action
        and its words. The expert remembers the episode's earlier states it was asked about.
        Played at every state it makes the expert's own moves, rewards, completion and passes; its
        BELIEF line names one person at a time (the running estimate gathers them), so understanding
        (U, and D with it) is a little lower than the expert's own records, which state everything it
        infers."""
        return self.scripted_reply("expert")

    def scripted_reply(self, policy: ScriptedName) -> str:
        """``expert`` (:meth:`expert_reply`) or ``oracle`` (it reads the hidden state, so only a
        baseline or a test should ask it) at this state, as a reply in the policy's format."""
        from socialworld.agents.lm.policy import target_turn
        from socialworld.agents.scripted import ExpertPolicy, OraclePolicy

        if policy not in SCRIPTED_REPLIES:
            raise ValueError(f"scripted replies come from {' or '.join(SCRIPTED_REPLIES)}, not {policy!r}")
        if policy not in self._scripted:
            self._scripted[policy] = ExpertPolicy() if policy == "expert" else OraclePolicy()
            self._scripted[policy].reset(["episode"])
        obs = observe(self.world.spec, self.world.pub)
        scripted = self._scripted[policy]
        hidden = [[self.world.hidden_view()]] if policy == "oracle" else []
        action = scripted.act(["episode"], [obs], *hidden)[0].action
        return target_turn(obs, action.key, action.utterance)


def outcome(ep: EpisodeRecord) -> dict[str, Any]:
    """An episode's result: every registered metric by its key (``pass`` and ``solve`` 1.0 / 0.0,
    ``U``, ``A_e``, ``S_npc``, ``D``, ``CR``; contract §5), and the guards broken."""
    m = ep.metrics
    if m is None:
        raise ValueError(f"episode {ep.episode_id} is not scored")
    return {**{k: metric_of(m, k) for k in KEYS}, "guards_broken": list(m.guards_broken)}
