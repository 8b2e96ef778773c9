"""Sleep-phase speed: counterfactual evaluations/s and pairs/s, measured in one run.

Run: ``python benchmarks/sleep_speed.py`` (random-policy wake episodes, 2 per L0 scenario, the
default SleepConfig) or ``--tiers L0 L1 --episodes 3 --rollouts 4``.

* a counterfactual evaluation = one continuation rollout (fork, reseed, step the candidate,
  then the continuation policy for up to ``horizon`` steps);
* pairs/s = action-track pairs built (before screening) per second of the whole sleep pass.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from socialworld import sleep
from socialworld.policies import make_policy
from socialworld.runner import EpisodeJob, run_episodes
from socialworld.sleep import GatingReport, SleepConfig, action_pairs, screen_and_gate
from socialworld.spec import resolve_scenarios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiers", nargs="*", default=["L0"])
    ap.add_argument("--episodes", type=int, default=2, help="wake episodes per scenario")
    ap.add_argument("--rollouts", type=int, default=SleepConfig.rollouts)
    args = ap.parse_args()

    specs = resolve_scenarios(None, args.tiers)
    eps = run_episodes(make_policy("random", seed=0), [EpisodeJob(s, 500 + i) for s in specs for i in range(args.episodes)])
    cfg = replace(SleepConfig(), rollouts=args.rollouts)
    calls = [0]
    inner = sleep.rollout_returns

    def counted(*a, **k):
        out = inner(*a, **k)
        calls[0] += len(out)
        return out

    sleep.rollout_returns = counted
    by_id = {s.id: s for s in specs}
    report = GatingReport()
    t0 = time.perf_counter()
    pairs = [p for e in eps for p in action_pairs(by_id[e.scenario_id], e, cfg, report)]
    kept = screen_and_gate(pairs, cfg, report)
    dt = time.perf_counter() - t0
    steps = sum(len(e.steps) for e in eps)
    print(f"{len(eps)} wake episodes ({steps} decision steps), {cfg.provenance}, <= {cfg.max_candidates} candidates/step")
    print(f"counterfactual evaluations: {calls[0]} in {dt:.1f} s -> {calls[0] / dt:.0f}/s")
    print(f"pairs built: {len(pairs)} -> {len(pairs) / dt:.1f}/s; kept after screening and gating: {len(kept)}")
    print(f"gating: {report.as_dict()}")


if __name__ == "__main__":
    main()
