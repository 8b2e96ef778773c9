"""Train a language model on a socialworld Gymnasium environment with TRL's GRPO: someone else's
RL loop, our world as the environment. Only the public Gymnasium API of ``socialworld.rollout.gym`` is used.

States: for each seed, ``env.reset(seed=...)`` and a few seeded random legal moves (the env's
``info["legal_actions"]``), keeping each state's chat (``info["messages"]``) and
``env.unwrapped.snapshot()``. Reward: for each sampled completion, ``env.unwrapped.restore(snapshot)``
and ``env.step(completion)``: the world's own step reward for that reply (an unparseable one
gets the world's penalty). GRPO compares the group's completions at each state.

Why not TRL's ``environment_factory``: it drives an environment through tool calls, and the
bundled model's chat template has no tool calling. One reply per state is the same world reward,
reachable from any chat model.

    python examples/grpo_gymnasium.py                      # the bundled SmolLM2, team lunch, 20 steps
    python examples/grpo_gymnasium.py --env socialworld/book_club-v1 --steps 100 --out runs/grpo-book
"""

from __future__ import annotations

import argparse
import random
from typing import Any

import gymnasium

import socialworld.rollout.gym  # noqa: F401  (registers the socialworld/<scenario> ids)


def states(env_id: str, seeds: int, depth: int, seed: int = 0) -> list[dict[str, Any]]:
    """Training prompts: the chat and the snapshot at each of ``depth`` states of ``seeds`` episodes."""
    env = gymnasium.make(env_id)
    rng = random.Random(seed)
    rows = []
    for s in range(seeds):
        _, info = env.reset(seed=seed * 100_003 + s)
        for _ in range(depth):
            rows.append({"prompt": info["messages"], "snapshot": env.unwrapped.snapshot(), "env_id": env_id})
            moves = [a for a in info["legal_actions"] if a != "end()"]
            _, _, terminated, _, info = env.step(f"ACTION: {rng.choice(moves)}")
            if terminated:
                break
    return rows


def world_reward(env_id: str):
    """GRPO reward function: the env's step reward for each completion at its row's state."""
    env = gymnasium.make(env_id)
    env.reset(seed=0)  # Gymnasium's wrappers want a reset before any step; each reward restores its own state

    def reward(prompts: list, completions: list, snapshot: list[str], **_: Any) -> list[float]:
        out = []
        for completion, snap in zip(completions, snapshot):
            env.unwrapped.restore(snap)
            text = completion[-1]["content"] if isinstance(completion, list) else completion
            out.append(float(env.step(text)[1]))
        return out

    reward.__name__ = "world_reward"
    return reward


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="bundled", help="bundled, or a local model folder")
    ap.add_argument("--env", default="socialworld/team_lunch-v1", help="a registered socialworld id")
    ap.add_argument("--seeds", type=int, default=8, help="episodes the training states come from")
    ap.add_argument("--depth", type=int, default=3, help="states per episode")
    ap.add_argument("--steps", type=int, default=20, help="GRPO optimizer steps")
    ap.add_argument("--generations", type=int, default=4, help="completions per state (GRPO's group)")
    ap.add_argument("--max-completion-length", type=int, default=48)
    ap.add_argument("--learning-rate", type=float, default=1e-4)
    ap.add_argument("--out", default="runs/grpo-gymnasium", help="folder for the LoRA adapter")
    ap.add_argument("--flat-reward-patience", type=int, default=5,
                    help="stop once every group's rewards were equal for this many steps in a row (0: never)")
    args = ap.parse_args(argv)

    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from socialworld.agents.models import auto_dtype
    from socialworld.learn.trainers.grpo import flat_reward_stop

    if args.model == "bundled":
        from socialworld.agents.models import bundled_path

        args.model = str(bundled_path())
    rows = states(args.env, args.seeds, args.depth)
    tok = AutoTokenizer.from_pretrained(args.model)
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(args.model), processing_class=tok, reward_funcs=[world_reward(args.env)],
        train_dataset=Dataset.from_list(rows),
        peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"),
        args=GRPOConfig(output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=args.generations,
                        num_generations=args.generations, max_completion_length=args.max_completion_length,
                        learning_rate=args.learning_rate, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                        # bf16 only where native: TRL's default autocast emulates it on an AVX2-only CPU (a GRPO step 209 s against 12)
                        bf16=auto_dtype() == "bfloat16",
                        seed=0))
    watchdog = flat_reward_stop(args.flat_reward_patience)  # every group's rewards equal for N steps: no gradient, stop
    trainer.add_callback(watchdog)
    trainer.train()
    if watchdog.stopped:
        print(watchdog.stopped)
    trainer.save_model(args.out)
    rewards = [h["rewards/world_reward/mean"] for h in trainer.state.log_history if "rewards/world_reward/mean" in h]
    print(f"{len(rows)} states from {args.env}; mean world reward per step: {', '.join(f'{r:+.3f}' for r in rewards)}; "
          f"adapter in {args.out}")
    flat = [h["frac_reward_zero_std"] for h in trainer.state.log_history if "frac_reward_zero_std" in h]
    print(f"share of groups with equal rewards (no gradient) per step: {', '.join(f'{f:.2f}' for f in flat)}")
    return {"states": len(rows), "rewards": rewards, "frac_reward_zero_std": flat, "stopped": watchdog.stopped, "out": args.out}


if __name__ == "__main__":
    main()
