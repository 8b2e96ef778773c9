"""``dpo``: TRL's ``DPOTrainer`` on the preference pairs (TRL's conversational format, as
:mod:`socialworld.learn.pairs` writes them), with the chosen side's likelihood beside the preference
(RPO) unless ``sft_weight`` is 0."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from socialworld.learn.config import TrainConfig
    from socialworld.learn.trainers.common import Start, TrainingSet, TrainRecord


def fit(data: TrainingSet, cfg: TrainConfig, start: Start) -> TrainRecord:
    """One DPO run over ``data``'s pairs (each kind's rows balanced by ``cfg.balance``)."""
    from trl import DPOConfig, DPOTrainer

    from socialworld.learn.trainers.common import planned_steps, run_trl, trl_args

    loss = {"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, cfg.sft_weight]} if cfg.sft_weight else {}
    rows = data.dataset("dpo", cfg.balance)
    trainer = DPOTrainer(model=start.model, args=trl_args(cfg, start.scratch, DPOConfig, beta=cfg.beta, max_length=cfg.max_length,
                                                          max_steps=planned_steps(cfg, len(rows)), **loss),
                         train_dataset=rows, processing_class=start.tokenizer, peft_config=start.lora)
    return run_trl(trainer, cfg, start, pairs=len(data), given=len(rows))
