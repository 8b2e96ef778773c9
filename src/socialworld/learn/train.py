"""One training run (contract §8): a LoRA adapter trained by the method ``TrainConfig.method`` names
(:data:`socialworld.learn.trainers.TRAINERS`: TRL's DPO, SFT and GRPO trainers, or the listwise
objective) on a :class:`~socialworld.learn.trainers.common.TrainingSet`, saved in PEFT format with its
record (:class:`~socialworld.learn.documents.TrainRecord`) beside it. A resumed adapter is loaded
trainable (``is_trainable=True``)."""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from socialworld.learn.config import TrainConfig
from socialworld.learn.documents import TrainRecord
from socialworld.learn.trainers import TRAINERS
from socialworld.learn.trainers.common import Start, TrainingSet, assistant_header, load_trainable, lora_layers
from socialworld.records import TMP_MARK

if TYPE_CHECKING:
    from socialworld.learn.listwise import PromptKV


@dataclass(frozen=True)
class TrainResult:
    """What :func:`train_adapter` returns: the record it saved beside the adapter, and its times."""

    record: TrainRecord
    adapter: str
    seconds: float
    """trainer set-up and training"""
    train_seconds: float = 0.0
    """the training loop alone"""

    @property
    def method(self) -> str:
        return self.record.config.method

    @property
    def steps(self) -> int:
        return self.record.steps

    @property
    def losses(self) -> list[float]:
        return self.record.losses

    @property
    def stopped(self) -> str | None:
        """why training stopped before its planned steps, if it did"""
        return self.record.stopped


def train_adapter(base_path: str | Path, out_dir: str | Path, cfg: TrainConfig, data: TrainingSet,
                  resume_from: str | Path | None = None, progress: Callable[[int], Callable[[Any], None]] | None = None,
                  prompt_kv: PromptKV | None = None) -> TrainResult:
    """Train one LoRA adapter on ``data`` and save it (PEFT format) to ``out_dir``: a new adapter
    (``cfg``'s rank, modules and layers; activated from the chat template's assistant header with
    ``cfg.activated``) or the one at ``resume_from``, trained on. ``prompt_kv``: an activated
    listwise run keeps the frozen part of its rows there (a new store when not given; the loop gives
    one store to all its runs, whose rows recur). ``progress(total_steps)`` returns a function called
    after each optimizer step. Nothing is printed per step (the losses are in the record)."""
    from peft import LoraConfig
    from transformers import set_seed

    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    # the trainer's own output_dir, beside the adapter (inside a run folder's temporary name when
    # the loop trains: a killed run's scratch goes with it), never in the system temp directory
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.{TMP_MARK}", dir=out.parent))
    try:
        set_seed(cfg.seed)  # LoRA init draws from torch's RNG before the trainer seeds it: seed it here
        model, tok = load_trainable(base_path, resume_from)
        lora = None if resume_from is not None else LoraConfig(
            r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0, target_modules=list(cfg.target_modules),
            layers_to_transform=lora_layers(model.config.num_hidden_layers, cfg.lora_upper),
            alora_invocation_tokens=assistant_header(tok) if cfg.activated else None, task_type="CAUSAL_LM")
        t0 = time.perf_counter()
        start = Start(model, tok, lora, base_path, out, scratch, progress, prompt_kv)
        record = TRAINERS[cfg.method](data, cfg, start)
        return TrainResult(record, str(out), time.perf_counter() - t0, train_seconds=start.train_seconds)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
