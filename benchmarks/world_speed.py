"""World speed on one core: expert env steps/s, fork and snapshot/restore latency.

Run: ``python benchmarks/world_speed.py`` (add ``--quick`` for a short run).

* env steps/s: ``observe`` + ``expert.act`` + ``world.step`` over whole episodes of every
  scenario (no record building), and the same with full five-dimensional records
  (``run_episodes``) for comparison.
* fork: ``world.fork()`` latency on mid-episode worlds of every scenario.
* snapshot: ``snapshot_json()`` and ``World.restore`` latency.
Goals: >= 5,000 expert steps/s and fork < 200 µs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from socialworld.agents.scripted import ExpertPolicy
from socialworld.rollout.runner import EpisodeJob, run_episodes
from socialworld.world.engine import World
from socialworld.world.spec import load_builtin_scenarios
from socialworld.world.visibility import observe


def env_steps_per_s(specs, episodes: int) -> tuple[float, int]:
    pol = ExpertPolicy()
    steps = 0
    t0 = time.perf_counter()
    for spec in specs:
        for i in range(episodes):
            w = World(spec, i)
            key = f"{spec.id}/{i}"
            pol.reset([key])
            while not w.done:
                d = pol.act([key], [observe(spec, w.pub)])[0]
                w.step(d.action)
                steps += 1
    return steps / (time.perf_counter() - t0), steps


def recorded_steps_per_s(specs, episodes: int) -> float:
    jobs = [EpisodeJob(s, i) for s in specs for i in range(episodes)]
    t0 = time.perf_counter()
    eps = run_episodes(ExpertPolicy(), jobs)
    return sum(len(e.steps) for e in eps) / (time.perf_counter() - t0)


def mid_episode_worlds(specs, n_steps: int = 6) -> list[World]:
    """Each scenario's world after up to ``n_steps`` expert steps, never a finished one (the expert
    settles short scenarios in fewer steps than that)."""
    out = []
    pol = ExpertPolicy()
    for spec in specs:
        w = World(spec, 3)
        pol.reset(["k"])
        for _ in range(n_steps):
            nxt = w.fork()
            nxt.step(pol.act(["k"], [observe(spec, w.pub)])[0].action)
            if nxt.done:
                break
            w = nxt
        out.append(w)
    return out


def latency_us(fn, worlds, reps: int) -> tuple[float, float]:
    """Median and p95 over per-world means, in microseconds."""
    per = []
    for w in worlds:
        t0 = time.perf_counter()
        for _ in range(reps):
            fn(w)
        per.append((time.perf_counter() - t0) / reps * 1e6)
    per.sort()
    return statistics.median(per), per[min(len(per) - 1, int(0.95 * len(per)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer episodes and repetitions")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    specs = list(load_builtin_scenarios().values())
    episodes, reps = (5, 200) if args.quick else (40, 2000)
    env_steps_per_s(specs, 2)  # warm caches
    sps, n = env_steps_per_s(specs, episodes)
    rec = recorded_steps_per_s(specs, max(2, episodes // 4))
    worlds = mid_episode_worlds(specs)
    fork_med, fork_p95 = latency_us(lambda w: w.fork(), worlds, reps)
    snap_med, _ = latency_us(lambda w: w.snapshot_json(), worlds, reps // 10)
    blobs = {id(w): w.snapshot_json() for w in worlds}
    rest_med, _ = latency_us(lambda w: World.restore(blobs[id(w)], w.spec), worlds, reps // 10)
    print(f"expert env steps/s (observe+act+step, one core): {sps:,.0f}  over {n} steps  [goal >= 5,000: {sps / 5000:.2f}x]")
    print(f"expert steps/s with full records (run_episodes):  {rec:,.0f}  [{rec / sps:.2f} of env steps/s]")
    print(f"fork latency: median {fork_med:.1f} us, p95 {fork_p95:.1f} us  [goal < 200 us: {200 / fork_med:.1f}x headroom]")
    print(f"snapshot_json: median {snap_med:.1f} us; restore: median {rest_med:.1f} us")


if __name__ == "__main__":
    main()
