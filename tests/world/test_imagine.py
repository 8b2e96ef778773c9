"""Imagined worlds: the public state kept, preferences redrawn to agree with the public record."""

from dataclasses import replace

import pytest

from socialworld.agents.registry import make_policy
from socialworld.core import Action
from socialworld.learn.config import SleepConfig
from socialworld.learn.pairs.counterfactual import rollout_returns, templated
from socialworld.testing import drive
from socialworld.world.engine import World
from socialworld.world.imagine import imagine
from socialworld.world.visibility import observe


@pytest.fixture
def lunch(specs):
    return specs["team_lunch-v1"]


def _mid_episode(spec, seed=11, steps=3) -> World:
    return drive(World(spec, seed), make_policy("expert"), steps=steps)


def test_the_agent_cannot_tell_an_imagined_world_apart(lunch):
    w = _mid_episode(lunch)
    a, b = imagine(w, 5), imagine(w, 5)
    assert observe(lunch, a.pub) == observe(lunch, w.pub)  # the same observation
    assert a.snapshot() == b.snapshot()  # the same seed, the same world
    assert {n: h.utilities for n, h in imagine(w, 6).hid.items()} != {n: h.utilities for n, h in a.hid.items()}
    assert {n: h.threshold for n, h in a.hid.items()} == {n: h.threshold for n, h in w.hid.items()}  # not a preference: kept
    for f in w.pub.facts:  # every stated preference holds in the imagined world (unless said otherwise later)
        if f.kind == "prefers" and not any(g.npc == f.npc and g.slot == f.slot and g.step > f.step for g in w.pub.facts):
            assert a.preferred(f.npc, f.slot) == f.option
        if f.kind == "vetoes":
            assert f.option in a.hid[f.npc].vetoes[f.slot]


def test_imagined_values_never_depend_on_hidden_preferences(lunch):
    """Two worlds with the same public state whose NPCs want other things: every candidate has the
    same imagined value in both (and, as a check that it could fail, other true-state values)."""
    w = _mid_episode(lunch, steps=1)
    other = w.fork()
    for npc, h in other.hid.items():
        other.set_npc(npc, utilities={s: {o: 1.0 - u for o, u in us.items()} for s, us in h.utilities.items()},
                      vetoes={s: frozenset() for s in h.vetoes})
    cfg = SleepConfig(rollouts=4, horizon=6, values="imagined", discount=0.9)
    obs = observe(lunch, w.pub)
    acts = [Action.parse(k) for k in ("propose(time, t1200, all)", "propose(time, t1300, all)", "wait()")]
    for a in acts:
        key = ("t", 1)
        assert rollout_returns(w, templated(w, a), cfg, key) == rollout_returns(other, templated(other, a), cfg, key)
    true = replace(cfg, values="true")
    assert any(rollout_returns(w, templated(w, a), true, ("t", 1)) != rollout_returns(other, templated(other, a), true, ("t", 1))
               for a in acts), obs
