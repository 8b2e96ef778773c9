"""``listwise``: the policy's distribution over a state's legal actions fitted to a soft target over
the candidates the sleep phase scored, the belief and words by likelihood (the objective and its loop:
:mod:`socialworld.learn.listwise`). TRL has no listwise trainer: a plain AdamW loop over the same PEFT
LoRA adapter, saved and recorded as TRL's runs are."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from socialworld.learn.config import TrainConfig
    from socialworld.learn.trainers.common import Start, TrainingSet, TrainRecord


def fit(data: TrainingSet, cfg: TrainConfig, start: Start) -> TrainRecord:
    """One listwise run over ``data``'s pairs (each kind's rows balanced by ``cfg.balance``); an activated
    adapter keeps the frozen part of its rows in ``start.prompt_kv``."""
    from peft import get_peft_model

    from socialworld.learn.listwise import PromptKV, train_listwise
    from socialworld.learn.trainers.common import TrainRecord, balanced_indices, compute_dtype, planned_steps

    model = start.model if start.lora is None else get_peft_model(start.model, start.lora)  # on load_hf's device
    pairs = list(data.pairs)
    dtype = compute_dtype(cfg)
    steps = planned_steps(cfg, len(data.balanced(cfg.balance)))
    advance = start.progress(steps) if start.progress is not None else None
    store = start.prompt_kv if start.prompt_kv is not None else PromptKV()
    with start.training():
        losses, rows = train_listwise(model, start.tokenizer, pairs, cfg, dtype, lambda kinds: balanced_indices(kinds, cfg.balance),
                                      steps, on_step=(lambda: advance(None)) if advance is not None else None, prompt_kv=store)
    record = TrainRecord(config=cfg, dtype=dtype, steps=steps, losses=losses, rows=rows, frozen_reads=store.misses,
                         frozen_hits=store.hits, frozen_bytes=store.bytes)
    start.save(model, record)
    return record
