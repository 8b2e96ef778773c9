"""Decoding a trained policy: its two LoRA adapters merged into the weights (the decoder's default,
:class:`socialworld.agents.lm.constrained.MergedAdapters`) against PEFT's mixed-adapter forward
(each adapter's output added unmerged, rows of several adapters in one pass), measured in one run
on the same prompts, with how often the two wrote the same reply.

Run: ``python benchmarks/decode_speed.py --adapters runs/bench/loop/cycle-3`` (a main job's last
adapters), or without ``--adapters`` on two random adapters shaped as the recipe's (rank 16 on every
linear layer of the upper half; the action adapter activated by the assistant header), which time
the same but agree less meaningfully. Prompts: the reply program of ``policy-v3`` at states of
expert episodes in every shipped scenario (``--states`` per scenario, at spread-out steps), decoded
in batches of ``--lm-batch`` as the evaluation does; each path decodes them ``--repeats`` times and
the fastest pass counts.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


def random_recipe_adapters(base: Path, folder: Path) -> dict[str, Path]:
    """Two random adapters shaped as the bench recipe's, saved under ``folder``."""
    import torch
    from peft import LoraConfig, get_peft_model

    from socialworld.agents.models import load_hf
    from socialworld.bench.config import RECIPE_TRAIN as cfg
    from socialworld.learn.trainers.common import assistant_header, lora_layers

    out = {}
    for name, seed, activated in (("action", 1, True), ("dialogue", 2, False)):
        model, tok = load_hf(base, dtype="float32")
        torch.manual_seed(seed)
        lc = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, target_modules=list(cfg.target_modules), init_lora_weights=False,
                        layers_to_transform=lora_layers(model.config.num_hidden_layers, cfg.lora_upper),
                        alora_invocation_tokens=assistant_header(tok) if activated else None, task_type="CAUSAL_LM")
        peft = get_peft_model(model, lc)
        with torch.no_grad():  # small, as trained ones are: random B of the init's scale
            for n, p in peft.named_parameters():
                if "lora_B" in n:
                    p.mul_(0.01)
        peft.save_pretrained(folder / name)
        out[name] = folder / name
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--adapters", default="", help="a trained run's adapters folder (default: two random recipe-shaped ones)")
    ap.add_argument("--states", type=int, default=3, help="states per scenario")
    ap.add_argument("--lm-batch", type=int, default=12, help="prompts per forward pass (the evaluation's default)")
    ap.add_argument("--repeats", type=int, default=2, help="passes per path; the fastest counts")
    args = ap.parse_args()

    from socialworld.agents.lm.backends import HFBackend
    from socialworld.agents.lm.constrained import MergedAdapters, decode
    from socialworld.agents.lm.policy import SAY_TOKENS, program
    from socialworld.agents.lm.prompts import build_messages
    from socialworld.agents.models import bundled_path, cpu_description, find_adapters, load_with_adapters
    from socialworld.agents.registry import make_policy
    from socialworld.testing import drive
    from socialworld.world.engine import World
    from socialworld.world.spec import resolve_scenarios
    from socialworld.world.visibility import observe

    base = bundled_path()
    with tempfile.TemporaryDirectory() as tmp:
        adapters = find_adapters(args.adapters) if args.adapters else random_recipe_adapters(base, Path(tmp))
        model, tok, _ = load_with_adapters(base, {k: str(v) for k, v in adapters.items()})
    names = tuple(adapters)
    obs = []
    for spec in resolve_scenarios(None):
        for i in range(args.states):
            w = drive(World(spec, 100 + i), make_policy("expert"), steps=2 + 3 * i)
            if not w.done:
                obs.append(observe(spec, w.pub))
    convs = [build_messages(o) for o in obs]
    backend = HFBackend(model, tok, name="bench")
    prompts = backend.prompts(convs)
    systems = [tok.apply_chat_template(c[:1], tokenize=False) for c in convs]
    programs = [program(o, SAY_TOKENS, (names[0], names[-1])) for o in obs]

    def run(merge: bool) -> tuple[float, list[str]]:
        best, texts = float("inf"), []
        merged = MergedAdapters()
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            rows = decode(model, tok, prompts, programs, args.lm_batch, prefixes=systems, merged=merged, merge=merge)
            best = min(best, time.perf_counter() - t0)
            texts = [r.text for r in rows]
        return best, texts

    mixed_s, mixed = run(False)
    merged_s, merged = run(True)
    same = sum(a == b for a, b in zip(mixed, merged))
    actions = sum(a.split("\nSAY:")[0] == b.split("\nSAY:")[0] for a, b in zip(mixed, merged))
    print(f"CPU: {cpu_description()}; model {model.dtype}; adapters: {args.adapters or 'random, recipe-shaped'}")
    print(f"{len(prompts)} replies in batches of {args.lm_batch}")
    print(f"PEFT mixed-adapter forward: {mixed_s:.1f} s")
    print(f"merged adapters:            {merged_s:.1f} s   ({mixed_s / merged_s:.2f}x)")
    print(f"same reply: {same}/{len(prompts)}; same BELIEF and ACTION lines: {actions}/{len(prompts)}")


if __name__ == "__main__":
    main()
