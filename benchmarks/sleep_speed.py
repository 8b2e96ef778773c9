"""Sleep-phase speed, one process against Ray, measured in one run.

Run: ``python benchmarks/sleep_speed.py`` (every scenario, 2 random-policy wake episodes and 3
expert reference episodes per scenario, the default preset's sleep, a local Ray with 2 CPUs),
``--workers 4``, ``--no-ray`` for the one-process numbers alone, ``--quick`` for L0 only.

* a counterfactual evaluation = one continuation rollout (fork, reseed, step the candidate,
  then the continuation policy for up to ``horizon`` steps); counted in the one-process pass
  (the Ray pass does the same work: its pairs are checked equal);
* the sleep pass = :func:`socialworld.learn.pairs.sleep.candidate_pairs` then screening and gating, as the
  loop runs it (``bench.RECIPE_SLEEP``: DAgger labels at the wake's states, the expert's own
  actions at the reference states, dialogue and counterfactual-utterance pairs);
* the projection: the measured one-process seconds per scored episode of each kind, times the
  number of such episodes in the ``paper`` preset's sleep phase (8 scenarios; per cycle its wake
  and reference episodes per scenario; 3 cycles), divided over N workers, plus the measured Ray
  overhead per task. The wake here is the random policy's (it never ends early), so its episodes
  are longer than a trained policy's: the projection leans high.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

from socialworld.agents.models import cpu_description
from socialworld.agents.registry import make_policy
from socialworld.bench.config import PRESETS, RECIPE_SLEEP
from socialworld.learn.pairs import sources
from socialworld.learn.pairs.gating import GatingReport, screen_and_gate
from socialworld.learn.pairs.sleep import _score, candidate_pairs
from socialworld.learn.pairs.sources import SOURCES, SleepInputs
from socialworld.rollout.runner import EpisodeJob, run_episodes
from socialworld.world.spec import resolve_scenarios

KINDS = ("action", "reference", "dialogue", "utterance")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=2, help="random-policy wake episodes per scenario")
    ap.add_argument("--references", type=int, default=3, help="expert reference episodes per scenario (the wake's seeds first; "
                                                                "at least one per wake episode, as in the loop)")
    ap.add_argument("--workers", type=int, default=2, help="CPUs of the local Ray")
    ap.add_argument("--no-ray", action="store_true", help="one-process numbers only")
    ap.add_argument("--quick", action="store_true", help="L0 scenarios only")
    args = ap.parse_args()

    specs = resolve_scenarios(None, ["L0"] if args.quick else None)
    by_id = {s.id: s for s in specs}
    seeds = {s.id: [500 + i for i in range(max(args.episodes, args.references))] for s in specs}
    wake = run_episodes(make_policy("random", seed=0), [EpisodeJob(s, x) for s in specs for x in seeds[s.id][: args.episodes]])
    refs = {(e.scenario_id, e.seed): e for e in run_episodes(make_policy("expert"),
                                                             [EpisodeJob(s, x) for s in specs for x in seeds[s.id]])}
    cfg = RECIPE_SLEEP
    print(f"CPU: {cpu_description()}")
    print(f"{len(wake)} wake episodes ({sum(len(e.steps) for e in wake)} steps), {len(refs)} reference episodes "
          f"({sum(len(e.steps) for e in refs.values())} steps); {cfg.provenance}, <= {cfg.max_candidates} candidates/step")

    calls = [0]
    inner = sources.rollout_returns
    inputs = SleepInputs(by_id, wake, refs)

    def counted(*a, **k):
        out = inner(*a, **k)
        calls[0] += len(out)
        return out

    # one process, per kind: seconds per scored episode
    per_kind: dict[str, list[float]] = defaultdict(list)
    sources.rollout_returns = counted
    units = [(name, u) for name in KINDS if name in cfg.sources for u in SOURCES[name].units(inputs, GatingReport())]
    for u in units:
        t0 = time.perf_counter()
        _score(cfg, u)
        per_kind[u[0]].append(time.perf_counter() - t0)
    evaluations = calls[0]
    sources.rollout_returns = inner

    report = GatingReport()
    t0 = time.perf_counter()
    pairs = candidate_pairs(inputs, cfg, report)
    kept = screen_and_gate(pairs, cfg, report)
    one = time.perf_counter() - t0
    print(f"one process: {one:.1f} s, {evaluations} counterfactual evaluations -> {evaluations / one:.0f}/s; "
          f"{len(pairs)} pairs built, {len(kept)} kept")
    for k in KINDS:
        if per_kind[k]:
            print(f"  {k:9s} {len(per_kind[k]):3d} episodes, {sum(per_kind[k]) / len(per_kind[k]):.3f} s each")

    overhead = 0.0
    if not args.no_ray:
        import ray

        t0 = time.perf_counter()
        ray.init(num_cpus=args.workers, include_dashboard=False, configure_logging=False)
        start = time.perf_counter() - t0
        ray_report = GatingReport()
        t0 = time.perf_counter()
        ray_pairs = candidate_pairs(inputs, cfg, ray_report, ray="local")
        screen_and_gate(ray_pairs, cfg, ray_report)
        on_ray = time.perf_counter() - t0
        ray.shutdown()
        same = ray_pairs == pairs and ray_report.as_dict() == report.as_dict()
        overhead = max(0.0, (on_ray * args.workers - one) / len(units))
        print(f"Ray local, {args.workers} CPUs: {on_ray:.1f} s ({evaluations / on_ray:.0f} evaluations/s), speed-up "
              f"{one / on_ray:.2f}x; start {start:.1f} s (once per process); overhead {overhead * 1000:.0f} ms per task; "
              f"pairs and gating counts {'identical' if same else 'DIFFERENT'}")

    paper = PRESETS["paper"]
    n_scen, cycles = 8, 3
    counts = {"action": paper.train_episodes * n_scen, "reference": max(paper.train_episodes, paper.reference_episodes) * n_scen,
              "dialogue": paper.train_episodes * n_scen, "utterance": paper.train_episodes * n_scen if "utterance" in cfg.sources else 0}
    cost = {k: sum(v) / len(v) for k, v in per_kind.items() if v}
    total = cycles * sum(counts[k] * cost.get(k, 0.0) for k in KINDS)
    tasks = cycles * sum(counts.values())
    print(f"projection, paper preset ({paper.train_episodes} wake and {paper.reference_episodes} reference episodes per "
          f"scenario per cycle, {n_scen} scenarios, {cycles} cycles: {tasks} scored episodes): one process {total / 60:.1f} min")
    for n in (2, 8, 32, 128):
        print(f"  {n:4d} workers: {(total + tasks * overhead) / n / 60:.2f} min")


if __name__ == "__main__":
    main()
