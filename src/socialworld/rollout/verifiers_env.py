"""The social world as a `verifiers <https://github.com/PrimeIntellect-ai/verifiers>`_ environment
(verifiers 0.4, its ``verifiers.v1`` stack; ``pip install -e '.[verifiers]' -e envs/socialworld-verifiers``), for trainers and
evaluators that load verifiers environments (``vf-eval``, prime-rl).

verifiers resolves an environment by the name of an importable module that exports, in its
``__all__``, one ``Taskset`` subclass and optionally one ``Env`` subclass. The id is
``socialworld-verifiers``: the package ``envs/socialworld-verifiers`` (module ``socialworld_verifiers``,
what Prime's Environments Hub lists) exports the classes below.

* :class:`SocialWorldTaskset`: one task per (scenario, evaluation seed), the seeds derived from the
  run seed as ``socialworld eval`` derives them (``--env.taskset.seed``, ``--env.taskset.episodes``
  per scenario, ``--env.taskset.scenarios`` ids or short names; all shipped scenarios by default).
  A task's system prompt and first user message are a language-model policy's own
  (:func:`socialworld.agents.lm.prompts.build_messages`).
* :class:`SocialWorldEnv`: multi-turn. Each reply is played by the world's own rules
  (:class:`socialworld.rollout.textenv.TextEpisode`: unparseable or illegal text is the world's
  penalised ``wait()``) and the next observation is the next user message; the NPCs are the
  world's. At the end the rule metrics of the episode's record (contract §5) are its rewards, each
  named by its registered label (:mod:`socialworld.metric_registry`): ``PassRate`` (weight 1: the
  reward a trainer optimises), ``CR`` and ``D`` (weight 0: reported, not summed); its metrics are
  ``SolveRate`` (1 or 0), ``return`` (the sum of the world's step
  rewards), ``steps``, ``parse_failures`` and ``finished`` (0 when the agent stopped before the
  world's turn budget ended: then the episode is scored as it stands).

The model is reached as verifiers reaches any: ``vf-eval socialworld-verifiers -m <model> --client.base-url
<url>``, e.g. ``socialworld serve --model bundled``. The conversation grows (every reply and
observation stays in it), where ``socialworld eval``'s language-model policies see each state as a
fresh system and user message: a model that reads its history can act differently here.
"""

from __future__ import annotations

from functools import cache
from typing import Any

try:
    import verifiers.v1 as vf
except ModuleNotFoundError as e:  # say which extra, and why apart
    if e.name is None or e.name.split(".")[0] != "verifiers":
        raise
    raise ModuleNotFoundError("the verifiers environment needs verifiers: pip install -e '.[verifiers]' in a venv of its own "
                              "(verifiers pins mcp 2, OpenEnv needs mcp < 2)", name=e.name) from e

from socialworld.metric_registry import CR, PASS, SOLVE, D, metric
from socialworld.rollout.evaluate import episode_seeds
from socialworld.rollout.textenv import TextEpisode, outcome
from socialworld.world.spec import ScenarioSpec, load_builtin_scenarios, named

REWARDS = {PASS: 1.0, CR: 0.0, D: 0.0}
"""the rewards each episode records, by metric key, with their weights (PassRate alone is summed)"""
MAX_AGENT_TURNS = 64
"""the agent's turn cap: above every shipped scenario's turn budget, so the world ends an episode"""


class SocialWorldData(vf.TaskData):
    """One episode: which scenario and which seed (``World(scenario, seed)``)."""

    scenario: str
    seed: int


class SocialWorldTask(vf.Task[SocialWorldData]):
    """A socialworld episode (its rewards are recorded by :class:`SocialWorldEnv` as it ends)."""


class SocialWorldTasksetConfig(vf.TasksetConfig):
    """Which episodes load (``--env.taskset.*``)."""

    scenarios: list[str] = []
    """scenario ids or short names (empty: every shipped scenario)"""
    episodes: int = 3
    """episodes per scenario"""
    seed: int = 0
    """run seed: each scenario's episode seeds derive from it as ``socialworld eval --seed`` derives them"""


@cache
def _builtin() -> dict[str, ScenarioSpec]:
    return load_builtin_scenarios()


def _specs(names: list[str]) -> list[ScenarioSpec]:
    known = _builtin()
    if not names:
        return list(known.values())
    out = []
    for n in names:
        got = named(known, n)
        if not got:
            raise ValueError(f"unknown scenario {n!r}; known: {', '.join(known)}")
        out += got
    return out


class SocialWorldTaskset(vf.Taskset[SocialWorldTask, SocialWorldTasksetConfig]):
    """One task per (scenario, evaluation seed)."""

    def load(self) -> Any:
        if self.config.episodes < 1:
            raise ValueError(f"episodes must be at least 1, got {self.config.episodes}")
        if self.config.seed < 0:
            raise ValueError(f"seed must be at least 0, got {self.config.seed}")
        for spec in _specs(list(self.config.scenarios)):
            for seed in episode_seeds(self.config.seed, spec.id, self.config.episodes):
                messages = TextEpisode(spec, seed).observe()[1]["messages"]
                yield SocialWorldTask(SocialWorldData(name=f"{spec.id}/{seed}", scenario=spec.id, seed=seed,
                                                      system_prompt=messages[0]["content"], prompt=messages[1]["content"]),
                                      self.config.task)


class SocialWorldEnvConfig(vf.EnvConfig):
    """The one role, ``player`` (``--env.player.*``): a plain chat program (verifiers' ``null``
    harness, no tools) run as a local subprocess."""

    player: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"}, runtime={"type": "subprocess"}, max_turns=MAX_AGENT_TURNS)


class SocialWorldEnv(vf.Env[SocialWorldEnvConfig]):
    """The episode loop: the world plays each reply and answers with the next observation."""

    async def run(self, task: Any, agents: Any) -> None:
        data = task.data
        ep = TextEpisode(_builtin()[data.scenario], data.seed)
        total, done = 0.0, False
        async with agents.player.interaction(task) as it:
            segment = await it.turn()
            while not segment.terminated:
                reward, done, _ = ep.step(segment.last_reply or "")
                total += reward
                if done:
                    break
                segment = await it.turn(ep.observe()[0])
            # recorded before the interaction closes (verifiers sums the rewards as it does)
            out = outcome(ep.record())
            trace = it.trace
            for key, weight in REWARDS.items():
                trace.record_reward(metric(key).label, float(out[key]), weight)
            trace.record_metric(metric(SOLVE).label, float(out[SOLVE]))
            trace.record_metric("return", total)
            trace.record_metric("steps", float(len(ep.steps)))
            trace.record_metric("parse_failures", float(sum(s.action.parse_status != "ok" for s in ep.steps)))
            trace.record_metric("finished", float(done))


__all__ = ["SocialWorldData", "SocialWorldTask", "SocialWorldTasksetConfig", "SocialWorldTaskset", "SocialWorldEnvConfig",
           "SocialWorldEnv"]
