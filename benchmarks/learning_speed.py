"""Learning speed of the bench's default recipe and the trainers before it, with the bundled model, measured in one run on
this machine: seconds per training step and per decision, prompt tokens per decision and per
training row, and the achieved decode throughput against the model's raw batched forward
throughput on the same prompts.

Run: ``python benchmarks/learning_speed.py`` (about 4 minutes on 2 cores); ``--steps``,
``--turns`` and ``--lm-batch`` change the sample. ``--json PATH`` also writes the numbers.

* training (cloning): :func:`socialworld.learn.train.train_adapter` with TRL's SFT on a plain
  adapter (``bench.RECIPE_TRAIN``'s LoRA, batch and dtype; the default until 2026-11-28) on expert
  reference pairs (``bench.RECIPE_SLEEP``'s ``own`` labels) at training seeds of every shipped
  scenario; seconds per step = ``trainer.train()`` wall / steps (the first step's warm-up
  included, trainer set-up not).
* decisions: the deployed policy (constrained decoding, as the bench evaluates) on one
  evaluation seed of every scenario for ``--turns`` lockstep turns, batch = every episode;
  seconds per decision = wall / decisions. Achieved throughput = (prompt + completion tokens)
  / wall: decoding is bound by prefilling the prompts.
* values (the ``values`` preset's sleep, ``bench.VALUES_SLEEP``): the value of every scored
  candidate at the same reference states, each the mean of its rollouts in imagined worlds;
  counterfactual evaluations per second = continuations rolled out / wall.
* listwise (``bench.RECIPE_TRAIN``'s objective on a plain adapter): seconds per training step of the listwise
  objective on those pairs, and rows per minute of it and of cloning (rows = steps x batch).
* activated: the default recipe (``bench.RECIPE_TRAIN``: the same objective on an activated
  adapter, the prompts read by the base model without gradient, the replies trained) on the
  reference pairs (their legal sets, one-hot targets), seconds per step and rows per minute; and
  again on two batches' worth of those rows, so each comes back every other step and its frozen
  part (the prompt's KV in the adapted layers, the reply entering them) is read from the store
  (``listwise.PromptKV``), as in a main job's later passes; the store's bytes for those rows.
* words (the dialogue track of the default recipe): the same trainer with the decision's weight 0
  (the belief and SAY lines by likelihood) on an activated adapter, seconds per step, against TRL's
  SFT on an activated adapter (the dialogue track's trainer until 2026-11-28).
* raw: one batched forward pass (no generation) over the same episodes' first prompts,
  tokens/s = non-padding tokens / seconds; ratio = achieved / raw.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from socialworld.agents.lm.prompts import build_messages
from socialworld.agents.models import auto_dtype, bundled_path, load_hf
from socialworld.agents.registry import make_lm_policy, make_policy
from socialworld.bench.config import RECIPE_SLEEP, RECIPE_TRAIN, VALUES_SLEEP
from socialworld.learn.loop import train_seeds
from socialworld.learn.pairs.gating import GatingReport
from socialworld.learn.pairs.sources import Unit, reference_pairs
from socialworld.learn.train import compute_dtype, train_adapter
from socialworld.rollout.evaluate import episode_seeds
from socialworld.rollout.runner import EpisodeJob, run_episodes
from socialworld.world.engine import World
from socialworld.world.spec import capped, load_builtin_scenarios
from socialworld.world.visibility import observe


def cpu() -> dict:
    flags = set()
    name = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and name in ("", "x86_64"):
                name = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    import torch

    return {"name": name, "threads": torch.get_num_threads(),
            "native_bf16": sorted(flags & {"avx512_bf16", "amx_bf16"}), "avx2": "avx2" in flags}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8, help="training steps measured")
    ap.add_argument("--turns", type=int, default=3, help="lockstep turns of decisions measured")
    ap.add_argument("--lm-batch", type=int, default=48, help="prompts per forward pass (the bench's default)")
    ap.add_argument("--json", default=None, help="also write the numbers here")
    args = ap.parse_args()
    import torch

    specs = load_builtin_scenarios()
    model, tok = load_hf(bundled_path())

    def tokens(messages) -> int:
        return len(tok(tok.apply_chat_template(messages, tokenize=False), add_special_tokens=False)["input_ids"])

    # training rows: the expert's own actions at its states on one training seed per scenario
    refs = run_episodes(make_policy("expert"), [EpisodeJob(s, train_seeds(0, s.id, 1, 1)[0]) for s in specs.values()])
    pairs = [p for e in refs for p in reference_pairs(Unit(specs[e.scenario_id], e), RECIPE_SLEEP, GatingReport())]
    row_tokens = [tokens(p.prompt + p.chosen) for p in pairs]
    completion_tokens = [len(tok(p.chosen[0]["content"], add_special_tokens=False)["input_ids"]) for p in pairs]
    recipe = replace(RECIPE_TRAIN, steps=args.steps, max_epochs=0)
    cloning = replace(recipe, method="sft", activated=False)
    with tempfile.TemporaryDirectory() as tmp:
        res = train_adapter(bundled_path(), Path(tmp) / "adapter", cloning, pairs=pairs)

    # the value recipe: every candidate's value at the same states, then the listwise objective on them
    t0 = time.perf_counter()
    valued = [p for e in refs for p in reference_pairs(Unit(specs[e.scenario_id], e), VALUES_SLEEP, GatingReport())]
    values_wall = time.perf_counter() - t0
    continuations = sum(len(p.candidates or ()) for p in valued) * VALUES_SLEEP.rollouts
    with tempfile.TemporaryDirectory() as tmp:
        lw = train_adapter(bundled_path(), Path(tmp) / "adapter", replace(recipe, activated=False), pairs=valued)

    with tempfile.TemporaryDirectory() as tmp:
        act = train_adapter(bundled_path(), Path(tmp) / "adapter", recipe, pairs=pairs)
    with tempfile.TemporaryDirectory() as tmp:
        again = train_adapter(bundled_path(), Path(tmp) / "adapter", replace(recipe, balance=0),
                              pairs=pairs[: 2 * RECIPE_TRAIN.batch_size])
        kept = again.record

    with tempfile.TemporaryDirectory() as tmp:
        words = train_adapter(bundled_path(), Path(tmp) / "adapter", replace(recipe, decision_weight=0.0), pairs=pairs)
    with tempfile.TemporaryDirectory() as tmp:
        words_sft = train_adapter(bundled_path(), Path(tmp) / "adapter", replace(recipe, method="sft"), pairs=pairs)

    # decisions: every scenario's first evaluation seed, in one lockstep batch
    jobs = [EpisodeJob(capped(s, args.turns), episode_seeds(0, s.id, 1)[0]) for s in specs.values()]
    policy = make_lm_policy("bundled", batch_size=args.lm_batch)
    t0 = time.perf_counter()
    eps = run_episodes(policy, jobs, batch_size=len(jobs))
    wall = time.perf_counter() - t0
    steps = [s for e in eps for s in e.steps]
    prompt = sum(s.policy.tokens_in for s in steps)
    processed = prompt + sum(s.policy.tokens_out for s in steps)

    # raw: one batched forward over the same first prompts
    texts = [tok.apply_chat_template(build_messages(observe(j.spec, World(j.spec, j.seed).pub)), tokenize=False,
                                     add_generation_prompt=True) for j in jobs]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.inference_mode():
        model(**enc)  # warm-up
        t1 = time.perf_counter()
        model(**enc)
        raw = int(enc["attention_mask"].sum()) / (time.perf_counter() - t1)

    out = {
        "cpu": cpu(), "torch": torch.__version__,
        "train": {"recipe": {"method": cloning.method, "batch_size": RECIPE_TRAIN.batch_size,
                             "lora_upper": RECIPE_TRAIN.lora_upper, "target_modules": list(RECIPE_TRAIN.target_modules)},
                  "dtype": compute_dtype(RECIPE_TRAIN), "rows": len(pairs), "steps": res.steps,
                  "seconds_per_step": res.train_seconds / res.steps,
                  "tokens_per_row": sum(row_tokens) / len(row_tokens),
                  "completion_tokens_per_row": sum(completion_tokens) / len(completion_tokens)},
        "values": {"rollouts": VALUES_SLEEP.rollouts, "horizon": VALUES_SLEEP.horizon, "states": len(valued),
                   "candidates_per_state": continuations / VALUES_SLEEP.rollouts / max(1, len(valued)),
                   "continuations_per_s": continuations / values_wall, "seconds_per_state": values_wall / max(1, len(valued))},
        "listwise": {"steps": lw.steps, "seconds_per_step": lw.train_seconds / lw.steps,
                     "rows_per_minute": 60 * lw.steps * RECIPE_TRAIN.batch_size / lw.train_seconds,
                     "sft_rows_per_minute": 60 * res.steps * RECIPE_TRAIN.batch_size / res.train_seconds},
        "activated": {"steps": act.steps, "seconds_per_step": act.train_seconds / act.steps,
                      "rows_per_minute": 60 * act.steps * RECIPE_TRAIN.batch_size / act.train_seconds,
                      "seconds_per_step_rows_again": again.train_seconds / again.steps,
                      "kept_rows": 2 * RECIPE_TRAIN.batch_size, "kept_bytes": kept.frozen_bytes,
                      "kept_reads": kept.frozen_reads, "kept_hits": kept.frozen_hits},
        "words": {"steps": words.steps, "seconds_per_step": words.train_seconds / words.steps,
                  "sft_seconds_per_step": words_sft.train_seconds / words_sft.steps},
        "decode": {"dtype": auto_dtype(), "episodes": len(eps), "decisions": len(steps), "lm_batch": args.lm_batch,
                   "seconds_per_decision": wall / len(steps), "prompt_tokens_per_decision": prompt / len(steps),
                   "achieved_tokens_per_s": processed / wall, "raw_forward_tokens_per_s": raw,
                   "achieved_over_raw": processed / wall / raw},
    }
    t, d = out["train"], out["decode"]
    print(f"cpu: {out['cpu']['name']} ({out['cpu']['threads']} threads, native bf16: {out['cpu']['native_bf16'] or 'no'})")
    print(f"cloning, TRL SFT on a plain adapter ({t['dtype']}, batch {RECIPE_TRAIN.batch_size}, LoRA on the upper {RECIPE_TRAIN.lora_upper:.0%} of layers): "
          f"{t['seconds_per_step']:.2f} s/step over {t['steps']} steps; {t['tokens_per_row']:.0f} tokens per row "
          f"({t['completion_tokens_per_row']:.0f} of them completion)")
    v, lw_ = out["values"], out["listwise"]
    print(f"values (M={v['rollouts']} imagined continuations of {v['horizon']} steps): {v['continuations_per_s']:.0f} "
          f"counterfactual evaluations/s, {v['candidates_per_state']:.1f} candidates and {v['seconds_per_state']:.2f} s per state")
    print(f"listwise: {lw_['seconds_per_step']:.2f} s/step; rows per minute {lw_['rows_per_minute']:.1f} (sft {lw_['sft_rows_per_minute']:.1f})")
    a = out["activated"]
    print(f"activated listwise (the default recipe): {a['seconds_per_step']:.2f} s/step; rows per minute {a['rows_per_minute']:.1f}; "
          f"{a['seconds_per_step_rows_again']:.2f} s/step where rows come back (their frozen part kept: "
          f"{a['kept_bytes'] / 2**20:.0f} MiB for {a['kept_rows']} rows and their system messages; "
          f"{a['kept_hits']} of {a['kept_hits'] + a['kept_reads']} rows from the store)")
    w = out["words"]
    print(f"the words (the dialogue track: the same trainer at decision weight 0, activated): {w['seconds_per_step']:.2f} s/step; "
          f"TRL's SFT on the activated adapter {w['sft_seconds_per_step']:.2f} s/step")
    print(f"decoding ({d['dtype']}, batch {d['lm_batch']}): {d['seconds_per_decision']:.3f} s/decision over {d['decisions']} "
          f"decisions; {d['prompt_tokens_per_decision']:.0f} prompt tokens per decision")
    print(f"throughput: achieved {d['achieved_tokens_per_s']:.0f} tok/s, raw batched forward {d['raw_forward_tokens_per_s']:.0f} tok/s "
          f"-> {d['achieved_over_raw']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
