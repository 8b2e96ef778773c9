"""How often an LM judge ranks two episodes of one task as the world does: check a judge before its
rankings enter training (the ablations suite's E2 admits them).

Runs the scripted policies (by default the oracle, the expert and the random policy) on the same
evaluation seeds of every scenario, has the judge score each episode (``socialworld.rollout.judge``),
and compares, for every two episodes of the same scenario and seed, the judge's goal scores with
the episodes' returns (:func:`socialworld.rollout.judge.judge_agreement`; 0.5 is a coin's). Writes
the judgements and a summary to ``--out``.

    python examples/judge_agreement.py --judge bundled
    python examples/judge_agreement.py --judge openai:<model>@<url> --seeds 5
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from socialworld.agents.registry import make_policy
from socialworld.records import atomic_write_text, write_jsonl
from socialworld.rollout.evaluate import episode_seeds
from socialworld.rollout.judge import judge_agreement, judge_episodes, summarise, write_judged
from socialworld.rollout.runner import EpisodeJob, run_episodes
from socialworld.world.spec import builtin_scenario_files, resolve_scenarios


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--judge", default="bundled", help="the judge's model spec (bundled, a model folder, openai:<model>@<url>)")
    ap.add_argument("--policies", default="oracle,expert,random", help="scripted policies whose episodes are ranked, comma-separated")
    ap.add_argument("--scenarios", default="", help="scenario ids, comma-separated (default: all eight)")
    ap.add_argument("--seeds", type=int, default=3, help="evaluation seeds per scenario (the bench's, run seed --seed)")
    ap.add_argument("--seed", type=int, default=0, help="run seed the evaluation seeds derive from")
    ap.add_argument("--batch-size", type=int, default=12, help="a local judge's prompts per forward pass")
    ap.add_argument("--out", default="runs/judge-agreement", help="folder for judgements.jsonl, episodes.jsonl and agreement.json")
    args = ap.parse_args(argv)
    policies = [p for p in args.policies.split(",") if p]
    if len(policies) < 2:
        ap.error("--policies needs two or more policies to rank")
    if args.seeds < 1:
        ap.error("--seeds must be at least 1")
    ids = [s for s in args.scenarios.split(",") if s] or sorted(p.stem for p in builtin_scenario_files())
    specs = {s.id: s for s in resolve_scenarios(ids)}
    jobs = [EpisodeJob(s, seed) for s in specs.values() for seed in episode_seeds(args.seed, s.id, args.seeds)]
    episodes = [e for p in policies for e in run_episodes(make_policy(p), jobs)]
    t0 = time.perf_counter()
    recs = judge_episodes(args.judge, episodes, specs, batch_size=args.batch_size)
    seconds = time.perf_counter() - t0
    agreement = judge_agreement(episodes, {r.episode_id: r for r in recs})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "episodes.jsonl", episodes)
    write_judged(out / "judgements.jsonl", recs)
    summary = {"judge": args.judge, "policies": policies, "scenarios": sorted(specs), "seeds": args.seeds,
               "episodes": len(episodes), "judge_seconds": round(seconds, 1), "agreement": agreement.as_dict(),
               "means": {p: summarise([r for r, e in zip(recs, episodes) if e.policy_id == p]).as_dict()["means"] for p in policies}}
    atomic_write_text(out / "agreement.json", json.dumps(summary, indent=1, sort_keys=True) + "\n")
    a = summary["agreement"]
    rate = "-" if a["agreement"] is None else f"{a['agreement']:.2f}"
    print(f"{args.judge}: of {a['compared']} pairs of episodes of one task whose returns differ, it ranked {a['agree']} as the "
          f"returns do, {a['disagree']} the other way and scored {a['judge_ties']} alike: agreement {rate} (a coin's 0.5); "
          f"{a['world_ties']} pairs with equal returns; {len(episodes)} episodes judged in {seconds:.0f} s")
    return summary


if __name__ == "__main__":
    main()
