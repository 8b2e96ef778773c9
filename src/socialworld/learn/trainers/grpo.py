"""``grpo``: TRL's ``GRPOTrainer`` at the action track's states. Its completions are the policy's own
turns sampled under its reply grammar (:func:`policy_rollout`); its reward restores the state's world
snapshot and returns the completion's exact return there (:func:`simulator_reward`); a run whose groups
all score alike stops and says so (:func:`flat_reward_stop`)."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from statistics import fmean
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from socialworld.learn.config import PairBuild, TrainConfig
    from socialworld.learn.trainers.common import Start, TrainingSet, TrainRecord
    from socialworld.world.spec import ScenarioSpec


def fit(data: TrainingSet, cfg: TrainConfig, start: Start) -> TrainRecord:
    """One GRPO run over ``data``'s action-track states (:meth:`TrainingSet.states`), restored in ``data.specs``."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from socialworld.learn.trainers.common import run_trl, trl_args

    if not data.specs:
        raise ValueError("grpo needs the scenario specs to restore snapshots")
    states = data.states()
    rows = Dataset.from_list(states)
    trainer = GRPOTrainer(
        model=start.model, reward_funcs=[simulator_reward(data.specs, data.returns)], processing_class=start.tokenizer,
        rollout_func=policy_rollout(states, data.specs, start.tokenizer, cfg.seed),
        args=trl_args(cfg, start.scratch, GRPOConfig, beta=cfg.beta, num_generations=cfg.num_generations,
                      # TRL needs the generation batch divisible by both the batch and the group size
                      generation_batch_size=math.lcm(cfg.batch_size, cfg.num_generations),
                      max_completion_length=cfg.max_completion_length, temperature=1.0),
        train_dataset=rows, peft_config=start.lora)
    return run_trl(trainer, cfg, start, pairs=len(rows), given=len(rows), watchdog=flat_reward_stop(cfg.flat_reward_patience))


def flat_reward_stop(patience: int) -> Any:
    """A ``TrainerCallback`` that stops a GRPO run once TRL's ``frac_reward_zero_std`` (the share of
    groups whose completions all got the same reward) has been 1 for ``patience`` logged steps in a
    row: every advantage, and so the policy gradient, is 0 there, and a run that goes on only
    spends time (the failure that silently wastes social-RL runs). Its ``stopped`` says so."""
    from transformers import TrainerCallback

    class FlatRewardStop(TrainerCallback):
        def __init__(self) -> None:
            self.flat = 0
            self.stopped: str | None = None

        def on_log(self, args, state, control, logs=None, **kwargs):  # type: ignore[no-untyped-def]
            share = (logs or {}).get("frac_reward_zero_std")
            if share is None:
                return
            self.flat = self.flat + 1 if share >= 1.0 else 0
            if patience and self.flat >= patience and self.stopped is None:
                control.should_training_stop = True
                self.stopped = (f"GRPO stopped at step {state.global_step}: every group's rewards were equal for {self.flat} "
                                "steps in a row (no advantage, no gradient)")

    return FlatRewardStop()


def simulator_reward(specs: Mapping[str, ScenarioSpec], returns: PairBuild | None = None):
    """GRPO reward: for each completion, restore the row's world ``snapshot``, parse the
    completion strictly and step the world once (the world applies the penalty to unparseable or
    illegal output, which it executes as ``wait``). Without ``returns`` the reward is that step's
    reward; with it, the step's exact return as the sleep phase values a candidate
    (:func:`socialworld.learn.pairs.rollout_returns`): the mean over ``returns.rollouts``
    continuations of ``returns.continuation`` of the step's reward plus ``gamma^t`` times step t's,
    the continuations of one prompt's completions reseeded alike (common random numbers), so
    completions differ in reward exactly where their moves lead to different outcomes. A one-step
    reward is 0 for most moves at most states, and a group of equal rewards has no gradient."""
    from socialworld.agents.lm.prompts import parse_output
    from socialworld.learn.pairs.counterfactual import rollout_returns
    from socialworld.world.engine import World
    from socialworld.world.visibility import observe

    def reward(prompts: list, completions: list, snapshot: list[str], scenario_id: list[str], **_: Any) -> list[float]:
        out = []
        for comp, snap, sid in zip(completions, snapshot, scenario_id):
            text = comp[-1]["content"] if isinstance(comp, list) else str(comp)
            w = World.restore(snap, specs[sid])
            action, _belief, error = parse_output(text, observe(w.spec, w.pub))
            if returns is None:
                out.append(float(w.step(action, parse_error=error).reward))
            else:
                key = ("grpo", sid, hashlib.sha256(snap.encode()).hexdigest()[:16])
                out.append(fmean(rollout_returns(w, action, returns, key, parse_error=error)))
        return out

    reward.__name__ = "simulator_reward"
    return reward


def policy_rollout(rows: Sequence[dict[str, Any]], specs: Mapping[str, ScenarioSpec], tokenizer: Any, seed: int,
                   temperature: float = 1.0) -> Callable[[list, Any], dict[str, list]]:
    """GRPO's completions (TRL's ``rollout_func``): at each row's state, the turn the policy being
    trained writes under its own reply grammar (:func:`socialworld.agents.lm.policy.program`: a
    BELIEF, one legal ACTION, a SAY line), every choice sampled at ``temperature`` from a
    generator seeded with ``seed``. Only the tokens the model chose are trained (TRL's ``env_mask``);
    the grammar's forced text is not. Free generation is the wrong distribution here: sampled
    unconstrained, an untrained small model rarely writes an ACTION line, so every completion of a
    group gets the same unparseable penalty, and no group has an advantage. The policy decodes
    constrained, and so is sampled constrained."""
    import torch

    from socialworld.agents.lm.constrained import decode
    from socialworld.agents.lm.policy import SAY_TOKENS, program
    from socialworld.world.engine import World
    from socialworld.world.visibility import observe

    states = {json.dumps(r["prompt"], sort_keys=True): (r["snapshot"], r["scenario_id"]) for r in rows}
    generator = torch.Generator().manual_seed(seed)

    def rollout(prompts: list, trainer: Any) -> dict[str, list]:
        programs = []
        for p in prompts:
            snap, sid = states[json.dumps(p, sort_keys=True)]
            w = World.restore(snap, specs[sid])
            programs.append(program(observe(w.spec, w.pub), SAY_TOKENS))
        texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
        # unmerged: the adapter's output added as the trainer's forward adds it
        got = decode(trainer.model, tokenizer, texts, programs, batch_size=len(texts), merge=False, sample=generator,
                     temperature=temperature)
        return {"prompt_ids": [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts],
                "completion_ids": [list(d.completion_ids) for d in got], "logprobs": [list(d.logprobs) for d in got],
                "env_mask": [list(d.chosen_mask) for d in got]}

    return rollout
