"""Learning speed of the bench's default recipe with the bundled model, under the default prompt and
beside the prompt it replaced, measured in one run on this machine: tokens read per decision and per
training row, seconds per decision, per training step and per row, rows per minute.

Run: ``python benchmarks/learning_speed.py`` (about 5 minutes on 2 cores); ``--steps``, ``--turns``,
``--lm-batch`` and ``--prompts`` change the sample. ``--json PATH`` also writes the numbers.

For each prompt version (default: ``policy-v6``, the prompt before, and the default
``text.templates.POLICY_PROMPT_VERSION``), on the same states:

* rows: the expert's own actions at its states on one training seed of every shipped scenario (the
  reference pairs of ``bench.RECIPE_SLEEP``), each prompt rendered in that version; tokens per row =
  the prompt after its system message (what a row's first read costs: the system message is read once
  per scenario and kept) and the reply;
* training: ``bench.RECIPE_TRAIN`` (listwise on an activated adapter) for ``--steps`` steps on those
  rows, each a fresh read (its frozen part computed: the first pass), then again for ``--steps`` steps
  on two batches' worth of rows, which come back from the store (``listwise.PromptKV``: a later pass);
  seconds per step; rows per minute of the first pass (every row new), and seconds per row;
* the words (the dialogue track: the same trainer at decision weight 0) on the same rows, s/step;
* decisions: the untrained bundled model (constrained decoding, as the bench evaluates) on one
  evaluation seed of every scenario for ``--turns`` lockstep turns, batch = every episode; seconds per
  decision and prompt tokens per decision (the whole prompt, as the decoder prefills it, and after the
  system message, whose KV it keeps per scenario); decode throughput against one raw batched forward.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from socialworld.agents.lm.backends import HFBackend
from socialworld.agents.lm.policy import LMPolicy
from socialworld.agents.lm.prompts import build_messages
from socialworld.agents.models import auto_dtype, bundled_path, load_hf
from socialworld.agents.registry import make_policy
from socialworld.bench.config import RECIPE_SLEEP, RECIPE_TRAIN
from socialworld.learn.loop import train_seeds
from socialworld.learn.pairs.gating import GatingReport
from socialworld.learn.pairs.sources import Unit, reference_pairs
from socialworld.learn.train import train_adapter
from socialworld.learn.trainers.common import TrainingSet, compute_dtype
from socialworld.rollout.evaluate import episode_seeds
from socialworld.rollout.runner import EpisodeJob, run_episodes
from socialworld.text.templates import POLICY_PROMPT_VERSION
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
    ap.add_argument("--steps", type=int, default=8, help="training steps measured, each phase")
    ap.add_argument("--turns", type=int, default=3, help="lockstep turns of decisions measured")
    ap.add_argument("--lm-batch", type=int, default=48, help="prompts per forward pass (the bench's default)")
    ap.add_argument("--prompts", default=f"policy-v6,{POLICY_PROMPT_VERSION}", help="prompt versions compared, comma-separated")
    ap.add_argument("--json", default=None, help="also write the numbers here")
    args = ap.parse_args()
    import torch

    specs = load_builtin_scenarios()
    model, tok = load_hf(bundled_path())

    def n_tokens(messages, generation: bool = True) -> int:
        return len(tok(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation),
                       add_special_tokens=False)["input_ids"])

    def after_system(messages) -> int:
        return n_tokens(messages) - n_tokens(messages[:1], generation=False)

    refs = run_episodes(make_policy("expert"), [EpisodeJob(s, train_seeds(0, s.id, 1, 1)[0]) for s in specs.values()])
    pairs = [p for e in refs for p in reference_pairs(Unit(specs[e.scenario_id], e), RECIPE_SLEEP, GatingReport())]
    jobs = [EpisodeJob(capped(s, args.turns), episode_seeds(0, s.id, 1)[0]) for s in specs.values()]
    recipe = replace(RECIPE_TRAIN, steps=args.steps, max_epochs=0)
    out: dict = {"cpu": cpu(), "torch": torch.__version__, "dtype": compute_dtype(RECIPE_TRAIN), "decode_dtype": auto_dtype(),
                 "rows": len(pairs), "recipe": {"method": recipe.method, "batch_size": recipe.batch_size, "lora_upper": recipe.lora_upper},
                 "prompts": {}}
    for version in args.prompts.split(","):
        rows = [p.model_copy(update={"prompt": build_messages(observe(specs[p.scenario_id], World.restore(p.snapshot, specs[p.scenario_id]).pub),
                                                              version)}) for p in pairs]
        row_prompt = [after_system(p.prompt) for p in rows]
        row_reply = [len(tok(p.chosen[0]["content"], add_special_tokens=False)["input_ids"]) for p in rows]
        with tempfile.TemporaryDirectory() as tmp:  # every step's rows read for the first time
            fresh = train_adapter(bundled_path(), Path(tmp) / "a", replace(recipe, balance=0), TrainingSet(tuple(rows[: args.steps * recipe.batch_size])))
        with tempfile.TemporaryDirectory() as tmp:  # two batches' worth: each row comes back from the store
            kept = train_adapter(bundled_path(), Path(tmp) / "a", replace(recipe, balance=0), TrainingSet(tuple(rows[: 2 * recipe.batch_size])))
        with tempfile.TemporaryDirectory() as tmp:
            words = train_adapter(bundled_path(), Path(tmp) / "a", replace(recipe, decision_weight=0.0, balance=0),
                                  TrainingSet(tuple(rows[: args.steps * recipe.batch_size])))
        policy = LMPolicy(HFBackend(model, tok, name="bundled", batch_size=args.lm_batch), prompt_version=version, decoding="constrained")
        t0 = time.perf_counter()
        eps = run_episodes(policy, jobs, batch_size=len(jobs))
        wall = time.perf_counter() - t0
        steps = [s for e in eps for s in e.steps]
        prompts = [s.policy.prompt.messages for s in steps if s.policy.prompt is not None]
        decision_prompt = [n_tokens([m.model_dump() for m in msgs]) for msgs in prompts]
        decision_after = [after_system([m.model_dump() for m in msgs]) for msgs in prompts]
        processed = sum(s.policy.tokens_in + s.policy.tokens_out for s in steps)
        per_step = fresh.train_seconds / fresh.steps
        out["prompts"][version] = {
            "tokens_per_row": {"after_system": sum(row_prompt) / len(rows), "reply": sum(row_reply) / len(rows)},
            "train": {"seconds_per_step_fresh": per_step, "seconds_per_step_from_store": kept.train_seconds / kept.steps,
                      "seconds_per_row_fresh": per_step / recipe.batch_size, "rows_per_minute_fresh": 60 * recipe.batch_size / per_step,
                      "words_seconds_per_step": words.train_seconds / words.steps,
                      "store_reads": kept.record.frozen_reads, "store_hits": kept.record.frozen_hits},
            "decode": {"episodes": len(eps), "decisions": len(steps), "seconds_per_decision": wall / len(steps),
                       "prompt_tokens_per_decision": sum(decision_prompt) / len(steps),
                       "after_system_tokens_per_decision": sum(decision_after) / len(steps), "achieved_tokens_per_s": processed / wall},
        }
    # raw: one batched forward over the first prompts of the default version
    texts = [tok.apply_chat_template(build_messages(observe(j.spec, World(j.spec, j.seed).pub)), tokenize=False,
                                     add_generation_prompt=True) for j in jobs]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.inference_mode():
        model(**enc)  # warm-up
        t1 = time.perf_counter()
        model(**enc)
        out["raw_forward_tokens_per_s"] = int(enc["attention_mask"].sum()) / (time.perf_counter() - t1)

    c = out["cpu"]
    print(f"cpu: {c['name']} ({c['threads']} threads, native bf16: {c['native_bf16'] or 'no'}); training in {out['dtype']}, "
          f"decoding in {out['decode_dtype']}; {out['rows']} rows of expert states, {args.steps} steps each phase, batch {recipe.batch_size}")
    head = ("prompt", "row tokens (after system / reply)", "s/step fresh", "s/row fresh", "rows/min fresh", "s/step from store",
            "s/step words", "s/decision", "decision tokens (whole / after system)")
    print(" | ".join(head))
    for v, p in out["prompts"].items():
        t, d, r = p["train"], p["decode"], p["tokens_per_row"]
        print(" | ".join([v, f"{r['after_system']:.0f} / {r['reply']:.0f}", f"{t['seconds_per_step_fresh']:.2f}",
                          f"{t['seconds_per_row_fresh']:.2f}", f"{t['rows_per_minute_fresh']:.1f}", f"{t['seconds_per_step_from_store']:.2f}",
                          f"{t['words_seconds_per_step']:.2f}", f"{d['seconds_per_decision']:.3f}",
                          f"{d['prompt_tokens_per_decision']:.0f} / {d['after_system_tokens_per_decision']:.0f}"]))
    default = out["prompts"].get(POLICY_PROMPT_VERSION)
    if default:
        print(f"decode throughput ({POLICY_PROMPT_VERSION}): achieved {default['decode']['achieved_tokens_per_s']:.0f} tok/s, "
              f"raw batched forward {out['raw_forward_tokens_per_s']:.0f} tok/s")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
