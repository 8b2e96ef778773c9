"""What every trainer shares: the typed training set (:class:`TrainingSet`), what a run starts from
(:class:`Start`), TRL's arguments and run (:func:`trl_args`, :func:`run_trl`), and the LoRA and
row-balancing helpers. CPU-safe: fp32 weights (bf16 autocast only where the hardware has native
bf16), ``use_cpu`` when no GPU is present, no checkpoints mid-run, no reporting integrations."""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal, Sequence

from socialworld.learn.config import PairBuild, TrainConfig
from socialworld.learn.documents import TRAIN_RECORD, TrainRecord
from socialworld.learn.pairs.record import Pair, read_pairs
from socialworld.text.reply import action_kind as turn_action_kind
from socialworld.world.spec import ScenarioSpec

if TYPE_CHECKING:
    from socialworld.learn.listwise import PromptKV


@dataclass(frozen=True)
class TrainingSet:
    """What one training run learns from, built once from the sleep phase's pairs: the pairs (listwise
    reads their candidates), TRL's conversational rows of them (:meth:`dataset`), and GRPO's states
    (:meth:`states`) with the scenarios their world snapshots restore in."""

    pairs: tuple[Pair, ...]
    specs: Mapping[str, ScenarioSpec] = field(default_factory=dict)
    """GRPO: the scenarios its states' snapshots restore in"""
    returns: PairBuild | None = None
    """GRPO: a completion earns its step's return under these continuations (None: the step's reward alone)"""

    @classmethod
    def read(cls, *files: str | Path, specs: Mapping[str, ScenarioSpec] | None = None,
             returns: PairBuild | None = None) -> TrainingSet:
        """The pairs of ``files`` (pairs Parquet files, :func:`~socialworld.learn.pairs.record.read_pairs`), in order."""
        return cls(tuple(p for f in files for p in read_pairs(f)), dict(specs or {}), returns)

    def __len__(self) -> int:
        return len(self.pairs)

    def rows(self, method: Literal["dpo", "sft"]) -> list[dict[str, Any]]:
        """TRL's conversational rows: prompt, chosen and rejected (dpo) or prompt and completion (sft: the chosen side)."""
        if method == "dpo":
            return [{"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected} for p in self.pairs]
        return [{"prompt": p.prompt, "completion": p.chosen} for p in self.pairs]

    def dataset(self, method: Literal["dpo", "sft"], balance: int = 0) -> Any:
        """:meth:`rows` as a ``datasets.Dataset``, each kind's rows repeated as :meth:`balanced` says."""
        from datasets import Dataset

        rows = self.rows(method)
        return Dataset.from_list([rows[i] for i in self.balanced(balance)])

    def balanced(self, cap: int) -> list[int]:
        """The pairs' indices with each action kind's repeated by :func:`balanced_indices` (``cap`` 0: each once)."""
        return balanced_indices([action_kind(p.chosen) for p in self.pairs], cap)

    def states(self) -> list[dict[str, Any]]:
        """GRPO's prompts: each action-track pair's prompt with the world snapshot there and its scenario."""
        return [{"prompt": p.prompt, "snapshot": p.snapshot, "scenario_id": p.scenario_id}
                for p in self.pairs if p.track == "action" and p.snapshot is not None]


@dataclass
class Start:
    """What a trainer starts from and where it leaves its adapter: the model loaded in fp32 (a resumed
    adapter already on it, trainable), its tokenizer, the LoRA to add (None when resumed), the base's
    path (named portably in the saved config), the adapter's folder and the trainer's scratch folder;
    ``progress(total_steps)`` returns a per-step callback; an activated listwise run keeps the frozen
    part of its rows in ``prompt_kv``. :meth:`training` times the training loop alone."""

    model: Any
    tokenizer: Any
    lora: Any
    """a ``peft.LoraConfig``, or None: the model already carries the adapter to train"""
    base_path: str | Path
    out: Path
    scratch: Path
    progress: Callable[[int], Callable[[Any], None]] | None = None
    prompt_kv: PromptKV | None = None
    train_seconds: float = 0.0
    """the training loop's wall seconds (set by :meth:`training`)"""

    @contextmanager
    def training(self) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.train_seconds += time.perf_counter() - t

    def save(self, model: Any, record: TrainRecord) -> None:
        """The adapter alone (config and weights: no ``training_args.bin``, whose pickled paths differ per run),
        its config in canonical form, and ``record`` beside it. No embedding layers are trained; PEFT's "auto"
        would look the base up on the Hugging Face hub to compare vocabularies: no hub access, ever."""
        model.save_pretrained(str(self.out), save_embedding_layers=False)
        canonical_adapter_config(self.out, self.base_path)
        (self.out / TRAIN_RECORD).write_text(record.to_json())


def trl_args(cfg: TrainConfig, out: Path, config_cls: Any, **extra: Any) -> Any:
    """A TRL config (``config_cls``: ``DPOConfig``, ``SFTConfig``, ``GRPOConfig``) of ``cfg``'s common options."""
    import torch

    bf16 = compute_dtype(cfg) == "bfloat16"
    return config_cls(
        output_dir=str(out), max_steps=extra.pop("max_steps", cfg.steps), per_device_train_batch_size=cfg.batch_size,
        learning_rate=cfg.learning_rate, logging_steps=1, save_strategy="no", report_to=[], seed=cfg.seed,
        data_seed=cfg.seed, use_cpu=not torch.cuda.is_available(), bf16=bf16, fp16=False,
        dataloader_num_workers=0, disable_tqdm=True, gradient_checkpointing=cfg.gradient_checkpointing, **extra,
    )


def run_trl(trainer: Any, cfg: TrainConfig, start: Start, pairs: int, given: int, watchdog: Any = None) -> TrainRecord:
    """Train a TRL trainer built on ``start`` to its planned steps (the ``watchdog`` callback may stop it and say
    why), save its adapter and record. ``pairs``: rows before balancing; ``given``: after it; TRL drops rows
    whose prompt fills ``max_length`` (``trained_on``), and a run with none left fails before training."""
    from transformers import PrinterCallback, TrainerCallback

    rows = {"pairs": pairs, "given": given, "trained_on": len(trainer.train_dataset)}
    if not rows["trained_on"]:
        raise ValueError(f"all {given} training rows have prompts of max_length={cfg.max_length} tokens or more, "
                         "so TRL drops every one: raise max_length")
    trainer.remove_callback(PrinterCallback)  # a loss dict per step on stdout: the losses are saved in the record
    if start.progress is not None:
        advance = start.progress(trainer.args.max_steps)

        class _Steps(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                advance(None)

        trainer.add_callback(_Steps())
    if watchdog is not None:
        trainer.add_callback(watchdog)
    with start.training():
        trainer.train()
    history = trainer.state.log_history
    record = TrainRecord(config=cfg, dtype=compute_dtype(cfg), steps=trainer.state.global_step,
                         losses=[float(h["loss"]) for h in history if "loss" in h], rows=rows,
                         stopped=watchdog.stopped if watchdog is not None else None,
                         reward_zero_std=[float(h["frac_reward_zero_std"]) for h in history if "frac_reward_zero_std" in h])
    start.save(trainer.model, record)
    return record


def action_kind(messages: Sequence[dict[str, str]]) -> str | None:
    """The action kind a completion's ACTION line names (``propose`` in ``ACTION: propose(...)``), or None."""
    return turn_action_kind(messages[-1]["content"]) if messages else None


def balanced_indices(kinds: Sequence[str | None], cap: int) -> list[int]:
    """Row indices with each kind's rows repeated ``r_k = clamp(round(n_max / n_k), 1, cap)`` times,
    where ``n_k`` is the rows of kind ``k`` and ``n_max`` those of the most common kind (rows of
    kind None once). Unweighted, a student clones the majority kind (a proposal, about half of the
    action rows) at states where its teacher negotiates, asks or finalizes; with every other kind
    nearer the majority's weight it takes those moves."""
    counts = Counter(k for k in kinds if k is not None)
    if cap <= 0 or not counts:
        return list(range(len(kinds)))
    most = max(counts.values())
    times = {k: max(1, min(cap, round(most / n))) for k, n in counts.items()}
    return [i for i, k in enumerate(kinds) for _ in range(times[k] if k is not None else 1)]


def compute_dtype(cfg: TrainConfig) -> str:
    """The dtype training computes in (``cfg.dtype``; ``auto`` follows the hardware, see
    :func:`socialworld.agents.models.auto_dtype`)."""
    from socialworld.agents.models import auto_dtype

    return auto_dtype() if cfg.dtype == "auto" else cfg.dtype


def lora_layers(n_layers: int, upper: float) -> list[int] | None:
    """Indices of the layers that get LoRA: the top ``ceil(upper * n_layers)`` (None: every layer)."""
    if upper >= 1:
        return None
    k = max(1, math.ceil(upper * n_layers))
    return list(range(n_layers - k, n_layers))


def planned_steps(cfg: TrainConfig, rows: int) -> int:
    """Optimizer steps for ``rows`` training rows: ``cfg.steps``, capped at ``cfg.max_epochs``
    passes over the rows (at least one step)."""
    if cfg.max_epochs <= 0:
        return cfg.steps
    return max(1, min(cfg.steps, math.ceil(cfg.max_epochs * rows / cfg.batch_size)))


def check_target_modules(base_path: str | Path, modules: Sequence[str]) -> None:
    """Raise ``ValueError`` naming each of ``modules`` (PEFT's ``target_modules``: a module's name or
    the last parts of it) that no module of the model at ``base_path`` has, before any work (the
    model is built on the meta device: no weights are read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(base_path)))
    named = list(model.named_modules())
    missing = [m for m in modules if not any(n == m or n.endswith("." + m) for n, _ in named)]
    if missing:
        leaves = sorted({n.rsplit(".", 1)[-1] for n, mod in named if not list(mod.children())})
        raise ValueError(f"--target-modules: {', '.join(missing)} is no module of {base_path} "
                         f"(its layers' modules: {', '.join(x for x in leaves if not x.isdigit())})")


def assistant_header(tok: Any) -> list[int]:
    """The tokens the chat template puts before every assistant reply (SmolLM2's
    ``<|im_start|>assistant\n``): an activated adapter's invocation, so it acts on the reply alone."""
    turn = [{"role": "user", "content": "x"}]
    with_header = tok.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
    without = tok.apply_chat_template(turn, tokenize=False)
    if not with_header.startswith(without) or with_header == without:
        raise ValueError("the chat template adds no assistant header of its own: an activated adapter has no invocation")
    return tok(with_header[len(without):], add_special_tokens=False)["input_ids"]


def load_trainable(base_path: str | Path, adapter: str | Path | None = None) -> tuple[Any, Any]:
    """Base model (fp32) and tokenizer; with ``adapter``, that PEFT adapter loaded *trainable*."""
    from socialworld.agents.models import load_hf

    model, tok = load_hf(base_path, dtype="float32")
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter), is_trainable=True)
    return model, tok


def canonical_adapter_config(folder: str | Path, base_path: str | Path | None = None) -> None:
    """Rewrite every saved PEFT ``adapter_config.json`` in ``folder`` in a canonical form: keys
    sorted, ``target_modules`` (a set inside PEFT, saved in an order that follows Python's hash
    seed) sorted, so the same training gives the same adapter bytes and hash in every process; and
    the base named portably (``bundled``, not this machine's cache path: see
    :func:`socialworld.agents.models.portable_base`). That includes the adapters PEFT saves in
    subfolders beside the trained one (TRL's DPO trainer keeps its reference as adapter ``ref``):
    left as saved, a run resumed in a new process would write other bytes and so other adapter
    hashes into its episode records."""
    from socialworld.agents.models import portable_base

    for path in sorted(Path(folder).rglob("adapter_config.json")):
        doc = json.loads(path.read_text())
        if base_path is not None:
            doc["base_model_name_or_path"] = portable_base(base_path)
        if isinstance(doc.get("target_modules"), list):
            doc["target_modules"] = sorted(doc["target_modules"])
        path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
