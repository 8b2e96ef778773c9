"""socialworld: lifelong social intelligence for language agents.

The names a user needs, importable from here::

    from socialworld import World, Action, load_builtin_scenarios, observe, render

Each name is imported on first use (PEP 562), so ``import socialworld`` stays cheap and loads no
model library; a name whose extra is not installed (``SocialWorldEnv`` needs ``socialworld[gym]``)
fails with that extra's import error when it is used, not before.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0.dev0"

_EXPORTS: dict[str, str] = {
    # the world
    "World": "socialworld.world.engine",
    "StepResult": "socialworld.world.engine",
    "Action": "socialworld.core",
    "Observation": "socialworld.core",
    "observe": "socialworld.world.visibility",
    "render": "socialworld.world.visibility",
    "legal_actions": "socialworld.world.visibility",
    # scenarios
    "ScenarioSpec": "socialworld.world.spec",
    "ScenarioError": "socialworld.world.spec",
    "load_spec": "socialworld.world.spec",
    "load_builtin_scenarios": "socialworld.world.spec",
    "resolve_scenarios": "socialworld.world.spec",
    "check_scenario": "socialworld.rollout.check",
    # policies
    "Policy": "socialworld.core",
    "PrivilegedPolicy": "socialworld.core",
    "Decision": "socialworld.core",
    "make_policy": "socialworld.agents.registry",
    # episodes and their records
    "EpisodeJob": "socialworld.rollout.runner",
    "run_episodes": "socialworld.rollout.runner",
    "episode_seeds": "socialworld.rollout.evaluate",
    "EpisodeRecord": "socialworld.records",
    "read_jsonl": "socialworld.records",
    "write_jsonl": "socialworld.records",
    # evaluate, the loop, the bench
    "EvalConfig": "socialworld.rollout.config",
    "EvalResult": "socialworld.rollout.evaluate",
    "evaluate": "socialworld.rollout.evaluate",
    "LoopConfig": "socialworld.learn.config",
    "run_loop": "socialworld.learn.loop",
    "BenchConfig": "socialworld.bench.config",
    "BenchResult": "socialworld.bench.protocol",
    "run_bench": "socialworld.bench.protocol",
    # the environments
    "SocialWorldEnv": "socialworld.rollout.gym",
    "TextEpisode": "socialworld.rollout.textenv",
    "ToolEnv": "socialworld.rollout.toolenv",
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:  # what type checkers and editors see (``X as X``: re-exported); at run time each name loads on first use
    from socialworld.agents.registry import make_policy as make_policy
    from socialworld.bench.config import BenchConfig as BenchConfig
    from socialworld.bench.protocol import BenchResult as BenchResult
    from socialworld.bench.protocol import run_bench as run_bench
    from socialworld.core import Action as Action
    from socialworld.core import Decision as Decision
    from socialworld.core import Observation as Observation
    from socialworld.core import Policy as Policy
    from socialworld.core import PrivilegedPolicy as PrivilegedPolicy
    from socialworld.learn.config import LoopConfig as LoopConfig
    from socialworld.learn.loop import run_loop as run_loop
    from socialworld.records import EpisodeRecord as EpisodeRecord
    from socialworld.records import read_jsonl as read_jsonl
    from socialworld.records import write_jsonl as write_jsonl
    from socialworld.rollout.check import check_scenario as check_scenario
    from socialworld.rollout.config import EvalConfig as EvalConfig
    from socialworld.rollout.evaluate import EvalResult as EvalResult
    from socialworld.rollout.evaluate import episode_seeds as episode_seeds
    from socialworld.rollout.evaluate import evaluate as evaluate
    from socialworld.rollout.gym import SocialWorldEnv as SocialWorldEnv
    from socialworld.rollout.runner import EpisodeJob as EpisodeJob
    from socialworld.rollout.runner import run_episodes as run_episodes
    from socialworld.rollout.textenv import TextEpisode as TextEpisode
    from socialworld.rollout.toolenv import ToolEnv as ToolEnv
    from socialworld.world.engine import StepResult as StepResult
    from socialworld.world.engine import World as World
    from socialworld.world.spec import ScenarioError as ScenarioError
    from socialworld.world.spec import ScenarioSpec as ScenarioSpec
    from socialworld.world.spec import load_builtin_scenarios as load_builtin_scenarios
    from socialworld.world.spec import load_spec as load_spec
    from socialworld.world.spec import resolve_scenarios as resolve_scenarios
    from socialworld.world.visibility import legal_actions as legal_actions
    from socialworld.world.visibility import observe as observe
    from socialworld.world.visibility import render as render


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'socialworld' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # the next lookup finds it without this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
