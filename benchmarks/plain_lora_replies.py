"""The activated adapter's replies as plain LoRA against PEFT's aLoRA path, in one run on this machine:
seconds per training step of the bench's recipe (``bench.RECIPE_TRAIN``), fresh rows and rows from the
store, each way, interleaved, with the losses (which must be equal: the two paths compute the same sum).

Run: ``python benchmarks/plain_lora_replies.py`` (about 6 minutes on 2 cores); ``--repeats``, ``--steps``.

An activated adapter's replies follow their invocation everywhere, so PEFT's aLoRA forward masks
nothing there, yet it selects every token and scatters the sum back (``index``, ``index_put`` and their
backward) and casts each input to float32 for autocast to cast back; the trainer runs them as plain
LoRA (:func:`socialworld.learn.listwise._all_tokens_active`). "aLoRA" here replaces that context with
a no-op, which is PEFT's own path.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from dataclasses import replace
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="interleaved runs of each path")
    ap.add_argument("--steps", type=int, default=24, help="steps from the store per run (fresh runs take 8)")
    args = ap.parse_args()

    import socialworld.learn.listwise as listwise
    from socialworld.agents.models import bundled_path, cpu_description
    from socialworld.agents.registry import make_policy
    from socialworld.bench.config import RECIPE_SLEEP, RECIPE_TRAIN
    from socialworld.learn.loop import train_seeds
    from socialworld.learn.pairs.gating import GatingReport
    from socialworld.learn.pairs.sources import Unit, reference_pairs
    from socialworld.learn.train import train_adapter
    from socialworld.learn.trainers.common import TrainingSet
    from socialworld.rollout.runner import EpisodeJob, run_episodes
    from socialworld.world.spec import load_builtin_scenarios

    specs = load_builtin_scenarios()
    refs = run_episodes(make_policy("expert"), [EpisodeJob(s, train_seeds(0, s.id, 1, 1)[0]) for s in specs.values()])
    pairs = [p for e in refs for p in reference_pairs(Unit(specs[e.scenario_id], e), RECIPE_SLEEP, GatingReport())]
    recipe = replace(RECIPE_TRAIN, max_epochs=0, balance=0)
    plain = listwise._all_tokens_active
    paths = {"plain LoRA": plain, "aLoRA": lambda model: contextlib.nullcontext()}
    got: dict[str, list[tuple[float, float, float]]] = {name: [] for name in paths}
    try:
        for _ in range(args.repeats):
            for name, ctx in paths.items():
                listwise._all_tokens_active = ctx  # type: ignore[assignment]
                with tempfile.TemporaryDirectory() as tmp:  # every row read for the first time
                    fresh = train_adapter(bundled_path(), Path(tmp) / "a", replace(recipe, steps=8), TrainingSet(tuple(pairs[:32])))
                with tempfile.TemporaryDirectory() as tmp:  # two batches' worth: each row comes back from the store
                    kept = train_adapter(bundled_path(), Path(tmp) / "a", replace(recipe, steps=args.steps), TrainingSet(tuple(pairs[:8])))
                got[name].append((fresh.train_seconds / fresh.steps, kept.train_seconds / kept.steps, kept.record.losses[-1]))
    finally:
        listwise._all_tokens_active = plain
    print(f"cpu: {cpu_description()}; {args.repeats} interleaved runs each; s/step fresh (8 steps of 4 rows) and from the store ({args.steps} steps)")
    mean = {name: (sum(r[0] for r in v) / len(v), sum(r[1] for r in v) / len(v)) for name, v in got.items()}
    for name, (f, k) in mean.items():
        print(f"{name:11s} fresh {f:.2f}  store {k:.2f}  last losses {[round(r[2], 6) for r in got[name]]}")
    (pf, pk), (af, ak) = mean["plain LoRA"], mean["aLoRA"]
    print(f"plain / aLoRA: fresh {pf / af:.2f}, store {pk / ak:.2f}")


if __name__ == "__main__":
    main()
