"""Counterfactuals (contract §7): an episode replayed exactly (every recorded reward checked), the
world forked at each state, and each candidate action scored by seeded continuations of a scripted
policy (common random numbers: rollout m of every candidate uses the same reseed)."""

from __future__ import annotations

from typing import Iterator, Sequence

from socialworld.agents.registry import make_policy
from socialworld.core import Action
from socialworld.learn.config import PairBuild
from socialworld.records import EpisodeRecord, StepRecord
from socialworld.rollout.runner import decide
from socialworld.world.engine import World
from socialworld.world.rng import derive_seed
from socialworld.world.spec import ScenarioSpec
from socialworld.world.visibility import legal_actions, observe


class ReplayMismatch(RuntimeError):
    pass


def recorded_action(step: StepRecord) -> Action | None:
    """The action the world executed at ``step`` (None for unparseable output)."""
    if step.action.parse_status == "unparseable" or step.action.structured is None:
        return None
    st = step.action.structured
    return Action(st["kind"], st.get("npc"), st.get("slot"), st.get("option"), st.get("offer"), step.dialogue.utterance)  # type: ignore[arg-type]


def replay(spec: ScenarioSpec, ep: EpisodeRecord) -> Iterator[tuple[StepRecord, World]]:
    """Yield (step record, the world just before it) for each step, re-executing the episode and
    checking each recorded reward. The yielded world is live: fork it before stepping."""
    if spec.id != ep.scenario_id:
        raise ValueError(f"episode {ep.episode_id} is not of scenario {spec.id}")
    w = World(spec, ep.seed)
    for s in ep.steps:
        yield s, w
        res = w.step(recorded_action(s), parse_error=s.action.error if s.action.parse_status == "unparseable" else None)
        if abs(res.reward - (s.signals.reward.value or 0.0)) > 1e-9:
            raise ReplayMismatch(f"{ep.episode_id} step {s.setting.step}: reward {res.reward} != recorded {s.signals.reward.value}")


def rollout_returns(w0: World, first: Action | None, cfg: PairBuild, key: Sequence[int | str],
                    parse_error: str | None = None) -> list[float]:
    """Returns of ``cfg.rollouts`` continuations: step ``first`` (None with ``parse_error``: an
    unparseable reply, which the world executes as a penalised ``wait``), then the continuation policy
    for up to ``cfg.horizon`` steps. Return = sum of step rewards (Phi gain minus costs), step t's
    weighted by ``cfg.discount ** t`` (1 unless set: then exactly the sum as before). With
    ``cfg.values == "imagined"`` continuation m runs in an imagined world
    (:func:`~socialworld.world.imagine.imagine`: the public state, preferences redrawn to agree with
    it), the same m-th world for every candidate of the state (common random numbers)."""
    from socialworld.world.imagine import imagine

    out = []
    for m in range(cfg.rollouts):
        seed = derive_seed(cfg.seed, *key, m)
        w = imagine(w0, seed) if cfg.values == "imagined" else w0.fork(reseed=seed)
        pol = make_policy(cfg.continuation, seed=derive_seed(cfg.seed, *key, m, "policy"))
        pol.reset(["cf"])
        ret = w.step(first, parse_error=parse_error).reward
        for t in range(1, cfg.horizon + 1):
            if w.done:
                break
            d = decide(pol, ["cf"], [w], [observe(w.spec, w.pub)])[0]
            ret += cfg.discount ** t * w.step(d.action, parse_error=d.parse_error).reward
        out.append(ret)
    return out


def candidates(w: World, taken: Action | None, limit: int, key: Sequence[int | str]) -> list[Action]:
    """Legal alternatives at this state (``wait``/``end`` always included), capped at ``limit`` by
    a deterministic shuffle, plus the taken action when it was legal."""
    from socialworld.world.rng import WorldRNG

    legal = legal_actions(observe(w.spec, w.pub))
    always = [a for a in legal if a.kind in ("wait", "end")]
    rest = WorldRNG(derive_seed(*key, "candidates")).shuffled([a for a in legal if a.kind not in ("wait", "end")])
    out = always + rest[: max(0, limit - len(always))]
    if taken is not None and taken.key in {a.key for a in legal} and taken.key not in {a.key for a in out}:
        out.append(taken)
    return out


def templated(w: World, a: Action) -> Action:
    """Candidates are compared with one neutral utterance style (the expert's templates)."""
    from socialworld.agents.scripted import say

    return say(observe(w.spec, w.pub), a)
