"""``sft``: behaviour cloning, TRL's ``SFTTrainer`` on the chosen side only (prompt-completion), with a
loss that projects only the completion positions through the LM head (:func:`completion_sft_trainer`).
It has no options beyond the common ones."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from socialworld.learn.config import TrainConfig
    from socialworld.learn.trainers.common import Start, TrainingSet, TrainRecord


def fit(data: TrainingSet, cfg: TrainConfig, start: Start) -> TrainRecord:
    """One SFT run over the chosen completions of ``data``'s pairs (each kind's rows balanced by ``cfg.balance``)."""
    from trl import SFTConfig

    from socialworld.learn.trainers.common import planned_steps, run_trl, trl_args

    rows = data.dataset("sft", cfg.balance)
    # batches of rows of about one length (transformers' LengthGroupedSampler: random chunks of 50
    # batches, each sorted by length): rows differ in length, so random batches carry padding that
    # sorted ones nearly lack
    trainer = completion_sft_trainer()(model=start.model, args=trl_args(cfg, start.scratch, SFTConfig, max_length=cfg.max_length,
                                                                       max_steps=planned_steps(cfg, len(rows)),
                                                                       train_sampling_strategy="group_by_length"),
                                       train_dataset=rows, processing_class=start.tokenizer, peft_config=start.lora)
    return run_trl(trainer, cfg, start, pairs=len(data), given=len(rows))


def completion_sft_trainer() -> Any:
    """TRL's ``SFTTrainer`` whose loss projects only the completion positions through the LM head.

    TRL computes the loss with a fused LM head that scores every position of the row (prompt and
    padding included) except on Triton devices, plus the entropy of each; on a CPU its chunked
    forward and backward are a large share of every training step. A completion is a small part of
    a row, so projecting just those positions saves most of that; the loss is the same mean token
    NLL over the completion. The forward is the PEFT model's own (``logits_to_keep``: the
    positions some row's completion needs), so an activated adapter (aLoRA) finds its invocation in
    each row as PEFT does: calling the inner model directly would leave it switched off."""
    import torch
    import torch.nn.functional as F
    from trl import SFTTrainer

    class CompletionSFTTrainer(SFTTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            labels = inputs["labels"][:, 1:]
            mask = labels != -100  # position i predicts token i + 1
            keep = mask.any(0).nonzero().squeeze(-1)
            with self.accelerator.autocast():
                out = model(input_ids=inputs["input_ids"], attention_mask=inputs.get("attention_mask"), use_cache=False,
                            logits_to_keep=keep)
                logits = out.logits[mask[:, keep]].float()
            target = labels[:, keep][mask[:, keep]]
            n = torch.as_tensor(mask.sum() if num_items_in_batch is None else num_items_in_batch).clamp(min=1)
            loss = F.cross_entropy(logits, target, reduction="sum") / n
            hits = (logits.detach().argmax(-1) == target).float()
            self._metrics["train" if model.training else "eval"]["mean_token_accuracy"].append(
                float(hits.mean()) if hits.numel() else 0.0)
            return (loss, None) if return_outputs else loss

    return CompletionSFTTrainer
