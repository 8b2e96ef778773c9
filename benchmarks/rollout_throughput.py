"""Rollout efficiency: achieved generation tokens/s during an evaluation vs raw batched
``generate`` tokens/s of the same model at the same batch size, measured in one run.

Run: ``python benchmarks/rollout_throughput.py`` (the full 45-episode schedule with the bundled
model and constrained decoding, as ``socialworld eval --policy bundled`` runs it), or smaller:
``--episodes 1 --scenarios team_lunch book_club``; ``--decoding free`` for free generation.
Use ``--model PATH`` for any local model folder.

* raw: ``HFBackend.generate`` on the evaluation's own first-step prompts, batch = ``--lm-batch``,
  exactly ``--max-new-tokens`` tokens per prompt (eos ignored), tokens/s = batch*new / seconds.
* achieved: total completion tokens of the policy during ``run_episodes`` / its wall time (all
  overheads included: prompt prefill, prompt building, parsing, the world, records). In
  constrained mode a completion's tokens include the grammar's forced tokens (``BELIEF:``, NPC
  ids, ``mood=``), which cost a forward pass like any other token but are not chosen.
Goal: achieved / raw >= 0.7.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from socialworld.agents.lm.backends import HFBackend
from socialworld.agents.lm.policy import LMPolicy
from socialworld.agents.lm.prompts import build_messages
from socialworld.agents.models import bundled_path, load_hf, parse_model_spec
from socialworld.metrics.core import aggregate, group_by
from socialworld.records import write_jsonl
from socialworld.rollout.runner import EpisodeJob, run_episodes
from socialworld.world.engine import World
from socialworld.world.spec import resolve_scenarios
from socialworld.world.visibility import observe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="bundled", help="bundled or a local model folder")
    ap.add_argument("--episodes", type=int, default=3, help="episodes per scenario")
    ap.add_argument("--scenarios", nargs="*", default=None,
                    help="scenario ids (default: the protocol's 45-episode schedule: L0, L0+L1, all)")
    ap.add_argument("--lm-batch", type=int, default=16, help="prompts per forward pass")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="free mode: tokens per reply; raw: tokens per prompt")
    ap.add_argument("--decoding", choices=["constrained", "free"], default="constrained")
    ap.add_argument("--out", default=None, help="also write the evaluation's episodes.jsonl here")
    args = ap.parse_args()

    ms = parse_model_spec(args.model)
    model, tok = load_hf(bundled_path() if ms.kind == "bundled" else ms.name)
    if args.scenarios:
        cycles = [resolve_scenarios(args.scenarios)]
    else:  # ASCENT-Bench's evaluation schedule: cycle 1 unlocks L0, cycle 2 L0+L1, cycle 3 all tiers
        cycles = [resolve_scenarios(None, tiers) for tiers in (["L0"], ["L0", "L1"], None)]
    jobs = [EpisodeJob(s, 1000 + i) for specs in cycles for s in specs for i in range(args.episodes)]

    # raw: the evaluation's own first-step prompts, one full batch, fixed length
    convs = [build_messages(observe(j.spec, World(j.spec, j.seed).pub)) for j in jobs]
    batch = (convs * (args.lm_batch // len(convs) + 1))[: args.lm_batch]
    enc = tok(HFBackend(model, tok, name="raw").prompts(batch), return_tensors="pt", padding=True, add_special_tokens=False)
    import torch

    with torch.inference_mode():
        model.generate(**enc, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)  # warm-up
        t0 = time.perf_counter()
        model.generate(**enc, max_new_tokens=args.max_new_tokens, min_new_tokens=args.max_new_tokens, do_sample=False,
                       pad_token_id=tok.pad_token_id)
        raw = args.lm_batch * args.max_new_tokens / (time.perf_counter() - t0)

    # achieved: the same model generating during a lockstep evaluation
    backend = HFBackend(model, tok, name=ms.display, max_new_tokens=args.max_new_tokens, batch_size=args.lm_batch)
    t0 = time.perf_counter()
    eps = run_episodes(LMPolicy(backend, decoding=args.decoding), jobs, batch_size=len(jobs))
    wall = time.perf_counter() - t0
    steps = [s for e in eps for s in e.steps]
    achieved = sum(s.policy.tokens_out for s in steps) / wall
    unparseable = sum(s.action.parse_status == "unparseable" for s in steps)
    illegal = sum(s.action.parse_status == "illegal" for s in steps)
    print(f"model {ms.display}, {args.decoding} decoding, {len(eps)} episodes, {len(steps)} decisions, "
          f"lm batch {args.lm_batch}, dtype {model.dtype}")
    print(f"prompt tokens per decision {sum(s.policy.tokens_in for s in steps) / len(steps):.0f}, "
          f"completion tokens {sum(s.policy.tokens_out for s in steps) / len(steps):.0f}; "
          f"{wall / len(steps):.2f} s per decision")
    print(f"raw batched generate: {raw:.1f} tok/s")
    print(f"achieved during eval: {achieved:.1f} tok/s over {wall:.0f} s  -> efficiency {achieved / raw:.2f} (goal >= 0.7)")
    print(f"unparseable: {unparseable}/{len(steps)}; parsed but illegal: {illegal}/{len(steps)}")
    for tier, group in sorted(group_by(eps, "tier").items()):
        m = aggregate(group)
        print(f"{tier}: n={m.n} U={m.U:.2f} A_e={m.A_e:.2f} S_npc={m.S_npc:.2f} D={m.D:.2f} CR={m.CR:.2f} "
              f"pass={m['pass']:.2f} parse_fail={m.parse_failure_rate:.2f}")
    if args.out:
        write_jsonl(Path(args.out) / "episodes.jsonl", eps)


if __name__ == "__main__":
    main()
