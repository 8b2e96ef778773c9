"""Checks of a loop's (or a bench's) config against what it names, before any work and before its run
folder holds anything: its scenarios (the first tier to unlock has one; the held-out ones are the run's
and leave something to train on) and its models (they load; the modules to adapt exist)."""

from __future__ import annotations

from socialworld.agents.models import check_loads, parse_model_spec
from socialworld.agents.registry import check_voice
from socialworld.learn.config import LoopConfig
from socialworld.learn.scenarios import RunScenarios
from socialworld.world.spec import ScenarioError


def check_unlockable(cfg: LoopConfig, scenarios: RunScenarios) -> None:
    """Progressive and adaptive unlocking start with the first tier alone: refuse, before any work,
    scenarios none of which is of that tier (cycle 1 would have nothing to train or evaluate)."""
    first = cfg.tiers[0]
    if cfg.unlock != "fixed" and not any(s.tier == first for s in scenarios.specs):
        raise ScenarioError(f"{cfg.unlock} unlocking starts with {first} alone, and no scenario is {first} "
                            f"({', '.join(f'{s.id} {s.tier}' for s in scenarios.specs)}): add one, or unlock 'fixed'")


def held_out(cfg: LoopConfig, scenarios: RunScenarios) -> tuple[str, ...]:
    """The ids of the run's scenarios that ``cfg.holdout`` holds out of training (each name an id or
    short name of one of the run's scenarios), checked before any work: something is left to train on,
    and under progressive or adaptive unlocking something of the first tier (cycle 1's only tier)."""
    ids: list[str] = []
    for name in cfg.holdout:
        match = [s.id for s in scenarios.specs if name in (s.id, s.id.rsplit("-v", 1)[0])]
        if not match:
            raise ScenarioError(f"--holdout {name}: not one of the run's scenarios ({', '.join(s.id for s in scenarios.specs)})")
        ids += [m for m in match if m not in ids]
    first = [s.id for s in scenarios.specs if s.tier == cfg.tiers[0]] if cfg.unlock != "fixed" else [s.id for s in scenarios.specs]
    if ids and set(first) <= set(ids):
        raise ScenarioError(f"--holdout {', '.join(cfg.holdout)} leaves {'no ' + cfg.tiers[0] if cfg.unlock != 'fixed' else 'no'} "
                            f"scenario to train on ({', '.join(first)} held out)")
    return tuple(ids)


def check_model(cfg: LoopConfig) -> None:
    """Before any artifact: the model to train is there (its config loads: a typo in a hub id or a
    folder fails now) and has every module ``--target-modules`` names (built on the meta device);
    a judge or an NPC voice that is a model folder or hub id loads too."""
    from socialworld.learn.trainers.common import check_target_modules

    check_loads(cfg.model, "--model")
    check_target_modules(base_path(cfg), cfg.train.target_modules)
    if cfg.judge:
        check_loads(cfg.judge, "--judge")
    check_voice(cfg.npc_voice, loads=True)


def base_path(cfg: LoopConfig) -> str:
    """The folder of the model the run trains (the bundled model's, or ``cfg.model``)."""
    from socialworld.agents.models import bundled_path

    ms = parse_model_spec(cfg.model)
    return str(bundled_path()) if ms.kind == "bundled" else ms.name
