"""The social world as tools: an environment class for TRL's ``environment_factory`` (GRPO by tool calls).

TRL's ``GRPOTrainer(environment_factory=...)`` makes one :class:`ToolEnv` per rollout, calls
``reset(**row)`` with the dataset row (``scenario`` and ``seed`` name the episode; the string it
returns is appended to the row's prompt), offers every public method as a tool the model calls
by the chat template's tool-calling format, and scores the rollout with :meth:`ToolEnv.get_reward`
(the world's own reward: no ``reward_funcs``, no ``rollout_func``).

One tool per move kind (``approach``, ``inquire``, ``propose``, ``negotiate``, ``repair``,
``wait``, ``finalize``, ``end``), each taking the move's arguments and, where the organiser
speaks, the words (``say``, scored by the dialogue track). A call plays one turn through
:class:`~socialworld.rollout.textenv.TextEpisode`, so the world's own checks apply: a move that
is not legal at this state (an unknown person or option, a decided decision) is the world's
penalised ``wait()``, told to the model in the answer; a call with an argument the tool does not
take is the tool's error (TRL counts it as a tool failure) and plays nothing. A call after the
episode ended is an error too. The answer is what people said, then the new state (the policy
prompt's user message), or at the end whether the episode passed. The texts are the templates
``TOOL_*`` (``text.templates``, version ``tools-v1``).

The reward is the episode's return so far (the sum of the world's step rewards, contract §3), so
a rollout that stops calling tools before the end is scored on what it did. :attr:`ToolEnv.outcome`
holds the rule metrics (pass, CR, ...) once the episode is over. No BELIEF lines here: a tool call
states no belief, so the understanding metrics (U, D) see none.

TRL needs a chat template that renders tool calls (a model trained for them: Qwen2.5, Qwen3,
Llama 3.1, ...). The bundled SmolLM2 writes ChatML but was never taught tool calls; its tokenizer can
take TRL's Qwen2.5 template (the same ChatML tokens), and :func:`expert_conversation` gives the
expert's episodes as tool-calling conversations for a warm start (``examples/grpo_tools.py``).
"""

from __future__ import annotations

from typing import Any

from socialworld.agents.lm.prompts import brief
from socialworld.core import ACTION_ARGS, Action
from socialworld.rollout.textenv import TextEpisode
from socialworld.text import templates
from socialworld.world.spec import ScenarioSpec, capped, load_builtin_scenarios, named
from socialworld.world.visibility import observe

_ARG_NAMES = {"npc": "person", "slot": "decision", "option": "option", "offer": "offer"}
"""an action's fields (``core.ACTION_ARGS``) by the names the tools give them (``propose``'s npc is ``to``)"""


class ToolEnv:
    """One episode of the social world played by tool calls (module docstring). ``scenarios``: the
    scenarios ``reset`` may name (default: the shipped ones); ``max_turns`` > 0 caps each episode's
    turn budget. TRL calls the class with no arguments: bind these with ``functools.partial``."""

    def __init__(self, scenarios: dict[str, ScenarioSpec] | None = None, max_turns: int = 0) -> None:
        self._scenarios = scenarios if scenarios is not None else load_builtin_scenarios()
        if not self._scenarios:
            raise ValueError("a tool environment needs at least one scenario")
        self._max_turns = max_turns
        self._episode: TextEpisode | None = None
        self.outcome: dict[str, Any] | None = None
        """the episode's rule metrics once it is over (``rollout.textenv.outcome``), else None"""

    def reset(self, scenario: str | None = None, seed: int | None = None, **row: Any) -> str:
        """Start the episode of ``scenario`` (id or short name) from ``seed`` (the dataset row's columns;
        the row's other columns, ``prompt`` among them, are not the world's). Returns the task: the
        scenario's brief and the first state."""
        if scenario is None or seed is None:
            raise ValueError(f"a row names its episode with scenario and seed; this one has {', '.join(sorted(row)) or 'neither'}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        found = named(self._scenarios, scenario)
        if not found:
            raise ValueError(f"unknown scenario {scenario!r}; this environment has {', '.join(self._scenarios)}")
        self._episode = TextEpisode(capped(found[-1], self._max_turns), seed)
        self.outcome = None
        obs = observe(self._episode.world.spec, self._episode.world.pub)
        return templates.TOOL_TASK.format(brief=brief(obs, templates.POLICY_PROMPTS[templates.POLICY_PROMPT_VERSION].view),
                                          state=self._state())

    def get_reward(self) -> float:
        """The episode's return so far: the sum of the world's step rewards (TRL's reserved reward method)."""
        return 0.0 if self._episode is None else sum(float(s.signals.reward.value or 0.0) for s in self._episode.steps)

    # ------------------------------------------------------------------ the tools (one per move kind)

    def approach(self, person: str, say: str = "") -> str:
        """Approach a person to open a conversation and warm them up.

        Args:
            person: the person's id, as the state lists them
            say: your words to them
        """
        return self._play("approach", say, npc=person)

    def inquire(self, person: str, decision: str, say: str = "") -> str:
        """Ask a person what they want for one decision.

        Args:
            person: the person's id
            decision: the decision's id, as the state lists them
            say: your words
        """
        return self._play("inquire", say, npc=person, slot=decision)

    def propose(self, decision: str, option: str, to: str = "all", say: str = "") -> str:
        """Propose an option for a decision, to everyone or to one person.

        Args:
            decision: the decision's id
            option: the option's id
            to: "all", or one person's id
            say: your words
        """
        return self._play("propose", say, slot=decision, option=option, npc=to)

    def negotiate(self, person: str, decision: str, option: str, offer: str, say: str = "") -> str:
        """Offer a person something so they accept an option they refused.

        Args:
            person: the person's id
            decision: the decision's id
            option: the option's id
            offer: the offer's id, as the task lists them
            say: your words
        """
        return self._play("negotiate", say, npc=person, slot=decision, option=option, offer=offer)

    def repair(self, person: str, say: str = "") -> str:
        """Repair your relationship with an upset person.

        Args:
            person: the person's id
            say: your words
        """
        return self._play("repair", say, npc=person)

    def finalize(self, decision: str, option: str, say: str = "") -> str:
        """Settle a decision on an option everyone accepts.

        Args:
            decision: the decision's id
            option: the option's id
            say: your words
        """
        return self._play("finalize", say, slot=decision, option=option)

    def wait(self) -> str:
        """Do nothing this turn."""
        return self._play("wait", "")

    def end(self) -> str:
        """End the meeting now."""
        return self._play("end", "")

    # ------------------------------------------------------------------ internals

    def _state(self) -> str:
        assert self._episode is not None
        return self._episode.observe()[0]

    def _play(self, kind: str, say: str, **args: str) -> str:
        if self._episode is None:
            raise RuntimeError("no episode: the environment was not reset")
        if self._episode.world.done:
            raise RuntimeError("the meeting is over: no more moves")
        if not isinstance(say, str) or any(not isinstance(v, str) for v in args.values()):
            raise TypeError("every argument of a move is text")
        move = f"{kind}({', '.join(args[a] for a in ACTION_ARGS[kind])})"
        reply = f"ACTION: {move}" + (f"\nSAY: {' '.join(say.split())}" if say.strip() else "")
        _, done, info = self._episode.step(reply)
        said = "".join(f"{r['speaker']}: {r['text']}\n" for r in info["replies"])
        if info["parse_status"] != "ok":
            said = templates.TOOL_REFUSED.format(error=info["error"]) + said
        if done:
            self.outcome = info.get("outcome")
            slots = [met for goal, met in info["subgoals"].items() if goal.startswith("slot:")]
            result = "passed" if self.outcome and self.outcome["pass"] == 1.0 else "not passed"
            return said + templates.TOOL_OVER.format(result=result, done=sum(slots), total=len(slots))
        return templates.TOOL_RESULT.format(said=said, state=self._state())


def tool_call(action: Action) -> dict[str, Any]:
    """``action`` as the tool call that plays it (an OpenAI-style ``tool_calls`` entry): the tool named by
    its kind, its fields by the tools' argument names, the words as ``say``."""
    arguments = {("to" if kind_field == "npc" and action.kind == "propose" else _ARG_NAMES[kind_field]): getattr(action, kind_field)
                 for kind_field in ACTION_ARGS[action.kind]}
    if action.kind not in ("wait", "end") and action.utterance:
        arguments["say"] = action.utterance
    return {"type": "function", "function": {"name": action.kind, "arguments": arguments}}


def expert_conversation(spec: ScenarioSpec, seed: int, max_turns: int = 0) -> list[dict[str, Any]]:
    """The expert's episode of ``spec`` from ``seed`` as a tool-calling conversation: the task as the
    user message (what :meth:`ToolEnv.reset` returns), then each move as an assistant tool call and the
    tool's answer; for a warm start by supervised fine-tuning (TRL's SFT on ``messages`` and ``tools``)."""
    from socialworld.agents.scripted import ExpertPolicy

    env = ToolEnv({spec.id: spec}, max_turns)
    messages: list[dict[str, Any]] = [{"role": "user", "content": env.reset(spec.id, seed)}]
    expert = ExpertPolicy()
    expert.reset(["episode"])
    assert env._episode is not None
    while not env._episode.world.done:
        w = env._episode.world
        action = expert.act(["episode"], [observe(w.spec, w.pub)])[0].action
        assert action is not None  # the expert always acts
        call = tool_call(action)
        answer = getattr(env, action.kind)(**call["function"]["arguments"])
        messages += [{"role": "assistant", "content": "", "tool_calls": [call]},
                     {"role": "tool", "name": action.kind, "content": answer}]
    return messages


def compact_tool_chat(tokenizer: Any) -> Any:
    """Give ``tokenizer`` (a ChatML one: the bundled SmolLM2's, the tiny test model's) the compact tool
    template (``templates.TOOL_CHAT_TEMPLATE``: tools named with their arguments, not their schemas) and
    the response parser TRL's GRPO reads the calls with (Qwen's format, ``trl.chat_template_utils.qwen3_template``);
    returns it. TRL takes both as they are: the template renders a whole tool-calling conversation and
    keeps every prefix, so ``GRPOTrainer`` neither rejects nor replaces it."""
    from trl.chat_template_utils import qwen3_template

    tokenizer.chat_template = templates.TOOL_CHAT_TEMPLATE
    tokenizer.response_template = qwen3_template
    return tokenizer


TOOLS = ("approach", "inquire", "propose", "negotiate", "repair", "finalize", "wait", "end")
"""the tools a :class:`ToolEnv` offers (its public methods besides ``reset`` and ``get_reward``)"""
