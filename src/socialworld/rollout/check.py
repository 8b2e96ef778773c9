"""``check_scenario``: the conformance test every scenario must pass (shipped or user-made).

Checks: schema (the spec validated), oracle solvability over many seeds (it must pass *and*
settle every decision; a failure names the failing seeds and where the oracle stalled), that
doing nothing never passes, seeding determinism (same seed, same records, byte for byte), that
no hidden value ever appears in any observation a policy receives (random and oracle rollouts,
so many states are visited), and a crash fuzz: random legal actions on ``fuzz_seeds`` seeds, no
exception may escape :meth:`World.step`. Likely mistakes that a scenario may intend
(:func:`~socialworld.world.spec.spec_warnings`) are reported as warnings and fail nothing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Literal, Sequence

from socialworld.agents.scripted import OraclePolicy, RandomPolicy, true_mental_state
from socialworld.core import ACTION_ARGS, ACTION_KINDS, Action, Decision, HiddenView, Observation
from socialworld.records import EpisodeRecord, to_jsonl
from socialworld.rollout.runner import EpisodeJob, decide, run_episodes
from socialworld.world.engine import World
from socialworld.world.rng import WorldRNG, derive_seed
from socialworld.world.spec import ScenarioSpec, parse_spec, spec_warnings
from socialworld.world.visibility import observe, render, to_plain


@dataclass
class CheckReport:
    scenario_id: str
    problems: list[str] = field(default_factory=list)
    oracle_pass_rate: float = 0.0
    oracle_solve_rate: float = 0.0
    observations_checked: int = 0
    warnings: list[str] = field(default_factory=list)
    """likely mistakes the scenario may intend (see :func:`~socialworld.world.spec.spec_warnings`); never fail it"""
    fuzz_steps: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


class ScenarioCheckError(AssertionError):
    pass


class _KnowItAllIdler:
    """States the true mental state (U = 1) and ends at once: it must never pass."""

    policy_id = "idle-oracle"
    privileged: Literal[True] = True

    def reset(self, episode_keys: Sequence[str]) -> None:
        pass

    def act(self, episode_keys: Sequence[str], observations: Sequence[Observation], hidden: Sequence[HiddenView]) -> list[Decision]:
        return [Decision(Action("end", utterance="Bye."), true_mental_state(o, hv)) for o, hv in zip(observations, hidden)]


def hidden_tokens(world: World) -> set[str]:
    """Text forms of every hidden value of ``world`` that must never reach an observation:
    utilities, thresholds, moods (several numeric renderings each), and secrets not (yet)
    confided. Values that coincide with a public number of the scenario (0, 1, costs,
    budgets, offer values) are skipped: seeing them reveals nothing."""
    spec = world.spec
    public = {0.0, 1.0, *(o.value for o in spec.offers), *(o.cost for o in spec.offers)}
    public |= {o.cost for s in spec.slots for o in s.options}
    out: set[str] = set()

    def num(x: float) -> None:
        if x in public:
            return
        out.update({repr(x), f"{x:.4f}", f"{x:.3f}"})

    for npc, h in world.hid.items():
        for us in h.utilities.values():
            for u in us.values():
                num(u)
        num(h.threshold)
        num(h.mood)
        sec = spec.npc(npc).secret
        if sec is not None and npc not in world.pub.confided:
            out.add(sec.text)
    return out


_NUMBER = re.compile(r"(?<![\d.])\d+\.\d+")


def leaks_in(world: World) -> list[str]:
    """Hidden tokens present in the current observation (structured JSON or rendered text);
    numbers match as whole tokens only."""
    obs = observe(world.spec, world.pub)
    blob = json.dumps(to_plain(obs)) + "\n" + render(obs)
    numbers = set(_NUMBER.findall(blob))
    tokens = hidden_tokens(world)
    found = [t for t in tokens if t in numbers] + [t for t in tokens if not t[0].isdigit() and t in blob]
    return sorted(found)


def where_it_stalls(episodes: list[EpisodeRecord], show: int = 3, moves: int = 3) -> str:
    """The failing seeds (all of them, or the first 20) and, for the first ``show``, how the
    episode ended: end reason and step, unmet sub-goals, and the last ``moves`` actions."""
    seeds = [e.seed for e in episodes]
    head = ", ".join(map(str, seeds[:20])) + (f" and {len(seeds) - 20} more" if len(seeds) > 20 else "")
    detail = []
    for e in episodes[:show]:
        unmet = [k for k, v in e.final.subgoals.items() if not v] or ["none"]
        last = [s.action.executed + (f" ({s.action.parse_status})" if s.action.parse_status != "ok" else "")
                for s in e.steps[-moves:]]
        detail.append(f"seed {e.seed}: ended by {e.final.end_reason} after {e.final.steps} steps; unmet: "
                      f"{', '.join(unmet)}; last moves: {'; '.join(last) or 'none'}")
    return f"failing seeds: {head}; " + " | ".join(detail)


FUZZ_OFF_SCRIPT = 0.2
"""share of fuzz steps that play an arbitrary action built from the spec's ids (often illegal)"""


def _arbitrary_action(spec: ScenarioSpec, r: WorldRNG) -> Action:
    """Any action the grammar allows over the spec's ids, legal or not (a legal check must
    refuse it cleanly: no crash)."""
    kind = r.choice(ACTION_KINDS)
    pools = {
        "npc": (*spec.npc_ids, "all"),
        "slot": spec.slot_ids,
        "option": tuple(o.id for sl in spec.slots for o in sl.options),
        "offer": tuple(o.id for o in spec.offers) or ("none",),
    }
    args = {name: r.choice(pools[name]) for name in ACTION_ARGS[kind]}
    return Action(kind, utterance=r.choice(("", "Everyone, thanks!")), **args)  # type: ignore[arg-type]


def fuzz(spec: ScenarioSpec, seeds: int = 200, first_seed: int = 20_000, policy_seed: int = 13) -> tuple[list[str], int]:
    """Crash fuzz: ``seeds`` episodes of random actions: uniformly random legal ones
    (:class:`RandomPolicy`, its random utterances included) and, on a share
    :data:`FUZZ_OFF_SCRIPT` of steps, arbitrary (mostly illegal) ones over the spec's ids.
    Returns one problem per episode in which an exception escaped (naming the seed, the step
    and the action; that episode stops there) and the number of steps taken. Deterministic:
    fixed seeds, the policy's own streams and a local :class:`WorldRNG` (never the global RNG)."""
    problems, steps = [], 0
    policy = RandomPolicy(policy_seed)
    for seed in range(first_seed, first_seed + seeds):
        key = f"fuzz-{seed}"
        policy.reset([key])
        r = WorldRNG(derive_seed(policy_seed, "fuzz", seed))
        t, what = 0, "building the world"
        try:
            w = World(spec, seed)
            while not w.done:
                t, what = w.t, "choosing an action"
                action: Action | None
                if r.bernoulli(FUZZ_OFF_SCRIPT):
                    action = _arbitrary_action(spec, r)
                else:
                    action = policy.act([key], [observe(spec, w.pub)])[0].action
                what = action.key if action is not None else "an unparseable action"
                w.step(action)
                steps += 1
        except Exception as err:  # noqa: BLE001 -- the point: report it, never raise
            problems.append(f"fuzz: seed {seed} step {t}: {what} raised {type(err).__name__}: {err}")
    return problems, steps


def check_scenario(
    spec: ScenarioSpec | dict, seeds: int = 50, min_oracle_pass: float = 0.9, min_oracle_solve: float = 0.85,
    raise_on_fail: bool = False, fuzz_seeds: int = 200,
) -> CheckReport:
    """Run the conformance checks on ``spec`` (a spec or a raw mapping) over ``seeds`` seeds,
    and the crash fuzz over ``fuzz_seeds`` other seeds (0 skips it)."""
    if isinstance(spec, dict):
        spec = parse_spec(spec)
    report = CheckReport(spec.id, warnings=spec_warnings(spec))
    if fuzz_seeds > 0:  # first: the rollouts below assume an engine that does not raise
        crashes, report.fuzz_steps = fuzz(spec, fuzz_seeds)
        if crashes:
            report.problems.extend(crashes[:5])
            if len(crashes) > 5:
                report.problems.append(f"fuzz: {len(crashes) - 5} more seed(s) raised")
            report.problems.append("the other checks were skipped: the engine raises on this scenario")
            if raise_on_fail:
                raise ScenarioCheckError(f"{spec.id}: " + "; ".join(report.problems))
            return report
    jobs = [EpisodeJob(spec, 10_000 + i) for i in range(seeds)]
    oracle_eps = run_episodes(OraclePolicy(), jobs)
    report.oracle_pass_rate = sum(e.metrics.passed for e in oracle_eps) / len(oracle_eps)  # type: ignore[union-attr]
    if report.oracle_pass_rate < min_oracle_pass:
        failed = [e for e in oracle_eps if not e.metrics.passed]  # type: ignore[union-attr]
        report.problems.append(f"oracle passes only {report.oracle_pass_rate:.0%} of {seeds} seeds (< {min_oracle_pass:.0%}); "
                               + where_it_stalls(failed))
    # solved (metrics-v2) = every decision settled and no guard broken
    solved = [e.metrics.solved for e in oracle_eps]  # type: ignore[union-attr]
    report.oracle_solve_rate = sum(solved) / len(solved)
    if report.oracle_solve_rate < min_oracle_solve:
        report.problems.append(
            f"oracle solves (settles every decision, breaks no guard) only {report.oracle_solve_rate:.0%} of seeds "
            f"(< {min_oracle_solve:.0%}); "
            + where_it_stalls([e for e, ok in zip(oracle_eps, solved) if not ok])
        )
    idle = run_episodes(_KnowItAllIdler(), jobs)  # knows everything, says goodbye at once
    idle_pass = sum(e.metrics.passed for e in idle) / len(idle)  # type: ignore[union-attr]
    if idle_pass > 0:
        report.problems.append(f"doing nothing passes {idle_pass:.0%} of seeds: too few decisions for its guards")
    # determinism: rerun a few seeds with a fresh policy, compare bytes
    again = run_episodes(OraclePolicy(), jobs[:5])
    if to_jsonl(again) != to_jsonl(oracle_eps[:5]):
        report.problems.append("same seed and policy gave different records")
    again_r = run_episodes(RandomPolicy(7), jobs[:5])
    if to_jsonl(again_r) != to_jsonl(run_episodes(RandomPolicy(7), jobs[:5])):
        report.problems.append("random policy: same seed gave different records")
    # leaks: replay random and oracle trajectories step by step and inspect every observation
    for policy in (RandomPolicy(11), OraclePolicy()):
        for job in jobs:
            w = World(spec, job.seed)
            policy.reset([job.key])
            while not w.done:
                found = leaks_in(w)
                report.observations_checked += 1
                if found:
                    report.problems.append(f"seed {job.seed} step {w.t}: hidden value(s) visible: {found[:3]}")
                    break
                w.step(decide(policy, [job.key], [w], [observe(spec, w.pub)])[0].action)
    if raise_on_fail and not report.ok:
        raise ScenarioCheckError(f"{spec.id}: " + "; ".join(report.problems))
    return report
