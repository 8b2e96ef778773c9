"""Training (contract §8) with TRL and PEFT — no hand-written loop.

* ``dpo`` — ``DPOTrainer`` on preference pairs (TRL's conversational format, as
  :mod:`socialworld.learn.pairs` writes them);
* ``sft`` — ``SFTTrainer`` on the chosen side only (prompt-completion: behaviour cloning);
* ``grpo`` — ``GRPOTrainer`` whose completions are the policy's own turns sampled under its reply
  grammar (:func:`policy_rollout`) and whose reward restores the step's world snapshot and returns
  the completion's exact return (:func:`simulator_reward`).

Each call trains one LoRA adapter (one per track) and saves it in PEFT format. CPU-safe
defaults: fp32 weights (bf16 autocast only where the hardware has native bf16), ``use_cpu``
when no GPU is present, no checkpoints mid-run, no reporting
integrations. A resumed adapter is loaded trainable (``is_trainable=True``).
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import TYPE_CHECKING, Any, Callable, Literal, Sequence

from socialworld.agents.lm.prompts import parse_output
from socialworld.learn.config import PairBuild, TrainConfig
from socialworld.learn.pairs.counterfactual import rollout_returns
from socialworld.learn.pairs.record import Pair
from socialworld.records import TMP_MARK, Document
from socialworld.text.reply import action_kind as turn_action_kind
from socialworld.world.engine import World
from socialworld.world.spec import ScenarioSpec
from socialworld.world.visibility import observe

if TYPE_CHECKING:
    from socialworld.learn.listwise import PromptKV

TRAIN_RECORD = "socialworld-train.json"
"""an adapter folder's record of how it was trained (:class:`TrainRecord`)"""


class TrainRecord(Document):
    """How an adapter was trained (``<adapter>/socialworld-train.json``)."""

    schema_version: Literal["train-record-v1"] = "train-record-v1"
    config: TrainConfig
    dtype: str
    """the compute dtype the training ran in"""
    steps: int
    losses: list[float]
    """the trainer's logged losses, in order"""
    rows: dict[str, int]
    """``pairs`` (given before balancing), ``given`` (after it), ``trained_on`` (what TRL kept)"""
    stopped: str | None = None
    """why training stopped before its planned steps (:func:`flat_reward_stop`), if it did"""
    reward_zero_std: list[float] = []
    """GRPO: TRL's ``frac_reward_zero_std`` at each logged step, the share of groups whose completions
    all got the same reward (no advantage there, so no gradient); empty for the other methods"""
    frozen_reads: int = 0
    """listwise on an activated adapter: rows whose frozen part (:class:`socialworld.learn.listwise.PromptKV`:
    the prompt's KV, the reply entering the adapted layers) was computed at a step, not taken from the store"""
    frozen_hits: int = 0
    """listwise on an activated adapter: rows whose frozen part came from the store"""
    frozen_bytes: int = 0
    """listwise on an activated adapter: the bytes the store kept"""


@dataclass(frozen=True)
class TrainResult:
    """What :func:`train_adapter` returns: the record it saved beside the adapter, and its times."""

    record: TrainRecord
    adapter: str
    seconds: float
    """trainer set-up and training"""
    train_seconds: float = 0.0
    """the training loop alone (``trainer.train()``)"""

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


def read_train_record(adapter: str | Path) -> TrainRecord:
    """The record :func:`train_adapter` saved beside the adapter in folder ``adapter``."""
    return TrainRecord.model_validate_json((Path(adapter) / TRAIN_RECORD).read_text())


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


def _rows(pairs: Sequence[Pair], method: str) -> list[dict[str, Any]]:
    if method == "dpo":
        return [{"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected} for p in pairs]
    if method == "sft":
        return [{"prompt": p.prompt, "completion": p.chosen} for p in pairs]
    raise ValueError(method)


def action_kind(messages: Sequence[dict[str, str]]) -> str | None:
    """The action kind a completion's ACTION line names (``propose`` in ``ACTION: propose(...)``), or None."""
    return turn_action_kind(messages[-1]["content"]) if messages else None


def balanced_indices(kinds: Sequence[str | None], cap: int) -> list[int]:
    """Row indices with each kind's rows repeated ``r_k = clamp(round(n_max / n_k), 1, cap)`` times,
    where ``n_k`` is the rows of kind ``k`` and ``n_max`` those of the most common kind (rows of
    kind None once). The bundled model cloned the majority kind (``propose``, about 45% of the
    action rows) at states where the expert negotiates, asks or finalizes; with every other kind
    nearer the majority's weight it takes those moves (docs/experiments/2026-11-24-balanced-kinds.md)."""
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


def planned_steps(cfg: TrainConfig, rows: int) -> int:
    """Optimizer steps for ``rows`` training rows: ``cfg.steps``, capped at ``cfg.max_epochs``
    passes over the rows (at least one step)."""
    if cfg.max_epochs <= 0:
        return cfg.steps
    return max(1, min(cfg.steps, math.ceil(cfg.max_epochs * rows / cfg.batch_size)))


def _args(cfg: TrainConfig, out: Path, config_cls: Any, **extra: Any) -> Any:
    import torch

    bf16 = compute_dtype(cfg) == "bfloat16"
    return config_cls(
        output_dir=str(out), max_steps=extra.pop("max_steps", cfg.steps), per_device_train_batch_size=cfg.batch_size,
        learning_rate=cfg.learning_rate, logging_steps=1, save_strategy="no", report_to=[], seed=cfg.seed,
        data_seed=cfg.seed, use_cpu=not torch.cuda.is_available(), bf16=bf16, fp16=False,
        dataloader_num_workers=0, disable_tqdm=True, gradient_checkpointing=cfg.gradient_checkpointing, **extra,
    )


def _completion_sft_trainer() -> Any:
    """TRL's ``SFTTrainer`` whose loss projects only the completion positions through the LM head.

    TRL 1.16 computes the loss with a fused LM head that scores every position of the row
    (prompt and padding included) except on Triton devices, plus the entropy of each; on a
    2-core CPU its chunked forward and backward took half of every training step (profiled:
    11.3 of 21.1 s over 3 steps of the bundled model). A completion is about a tenth of a row,
    so projecting just those positions makes a step about twice as fast; the loss is the same
    mean token NLL over the completion. The forward is the PEFT model's own (``logits_to_keep``:
    the positions some row's completion needs), so an activated adapter (aLoRA) finds its
    invocation in each row as PEFT does: calling the inner model directly left it switched off."""
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


def _dataset(pairs: Sequence[Pair] | str | Path, method: str, balance: int = 0) -> Any:
    """Pairs as a ``datasets.Dataset``: a pairs Parquet file is loaded as it is (TRL's
    conversational columns, metadata columns dropped), or built from :class:`Pair` objects; with
    ``balance`` > 0 its rows repeated by :func:`balanced_indices`."""
    from datasets import Dataset

    if isinstance(pairs, (str, Path)):
        ds = Dataset.from_parquet(str(pairs))
        if method == "sft":
            ds = ds.select_columns(["prompt", "chosen"]).rename_column("chosen", "completion")
        else:
            ds = ds.select_columns(["prompt", "chosen", "rejected"])
    else:
        ds = Dataset.from_list(_rows(pairs, method))
    if balance > 0:
        ds = ds.select(balanced_indices([action_kind(m) for m in ds["completion" if method == "sft" else "chosen"]], balance))
    return ds


def _count(pairs: Sequence[Pair] | str | Path) -> int:
    if isinstance(pairs, (str, Path)):
        import pyarrow.parquet as pq

        return pq.ParquetFile(str(pairs)).metadata.num_rows
    return len(pairs)


def train_adapter(base_path: str | Path, out_dir: str | Path, cfg: TrainConfig, pairs: Sequence[Pair] | str | Path = (),
                  grpo_rows: Sequence[dict[str, Any]] = (), specs: dict[str, ScenarioSpec] | None = None,
                  resume_from: str | Path | None = None, progress: Callable[[int], Callable[[Any], None]] | None = None,
                  returns: PairBuild | None = None, prompt_kv: PromptKV | None = None) -> TrainResult:
    """Train one LoRA adapter and save it (PEFT format) to ``out_dir``. ``pairs``: Pair objects
    or a pairs Parquet file (dpo, sft, listwise); ``grpo_rows``: prompts with world snapshots (grpo), each
    completion rewarded by :func:`simulator_reward` (with ``returns``: the step's return under the
    sleep phase's continuations, else its reward alone). ``prompt_kv``: listwise on an activated
    adapter keeps the frozen part of its rows there (a new store when not given; the loop gives one
    store to all its runs, whose rows recur).
    ``progress(total_steps)`` returns a function called after each optimizer step. Nothing is
    printed per step (the losses are in the adapter's ``socialworld-train.json``)."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    # the Trainer's own output_dir, beside the adapter (inside a run folder's temporary name when
    # the loop trains: a killed run's scratch goes with it), never in the system temp directory
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.{TMP_MARK}", dir=out.parent))
    try:
        return _train(base_path, out, scratch, cfg, pairs, grpo_rows, specs, resume_from, progress, returns, prompt_kv)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _train(base_path: str | Path, out: Path, scratch: Path, cfg: TrainConfig, pairs: Sequence[Pair] | str | Path,
           grpo_rows: Sequence[dict[str, Any]], specs: dict[str, ScenarioSpec] | None, resume_from: str | Path | None,
           progress: Callable[[int], Callable[[Any], None]] | None, returns: PairBuild | None = None,
           prompt_kv: PromptKV | None = None) -> TrainResult:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import set_seed

    set_seed(cfg.seed)  # LoRA init draws from torch's RNG before the Trainer seeds it: seed it here
    model, tok = load_trainable(base_path, resume_from)
    peft_config = None if resume_from is not None else LoraConfig(
        r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0, target_modules=list(cfg.target_modules),
        layers_to_transform=lora_layers(model.config.num_hidden_layers, cfg.lora_upper),
        alora_invocation_tokens=assistant_header(tok) if cfg.activated else None,
        task_type="CAUSAL_LM")
    t0 = time.perf_counter()
    trainer: Any  # a TRL trainer: DPO's, SFT's or GRPO's
    if cfg.method == "dpo":
        from trl import DPOConfig, DPOTrainer

        dpo_loss = {"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, cfg.sft_weight]} if cfg.sft_weight else {}
        pairs_in, data = _count(pairs), _dataset(pairs, "dpo", cfg.balance)
        trainer = DPOTrainer(model=model, args=_args(cfg, scratch, DPOConfig, beta=cfg.beta, max_length=cfg.max_length,
                                                     max_steps=planned_steps(cfg, len(data)), **dpo_loss),
                             train_dataset=data, processing_class=tok,
                             peft_config=peft_config)
    elif cfg.method == "sft":
        from trl import SFTConfig

        pairs_in, data = _count(pairs), _dataset(pairs, "sft", cfg.balance)
        # batches of rows of about one length (transformers' LengthGroupedSampler: random chunks of 50
        # batches, each sorted by length): a row runs 285-686 tokens, and random batches of 4 were 17%
        # padding on the main job's last-cycle rows, against 1% sorted
        trainer = _completion_sft_trainer()(model=model, args=_args(cfg, scratch, SFTConfig, max_length=cfg.max_length,
                                                     max_steps=planned_steps(cfg, len(data)),
                                                     train_sampling_strategy="group_by_length"),
                             train_dataset=data, processing_class=tok,
                             peft_config=peft_config)
    elif cfg.method == "listwise":
        return _train_listwise(model, tok, out, cfg, pairs, peft_config, base_path, progress, t0, prompt_kv)
    elif cfg.method == "grpo":
        from trl import GRPOConfig, GRPOTrainer

        if specs is None:
            raise ValueError("grpo needs the scenario specs to restore snapshots")
        data = Dataset.from_list(list(grpo_rows))
        pairs_in = len(data)
        trainer = GRPOTrainer(
            model=model, reward_funcs=[simulator_reward(specs, returns)], processing_class=tok,
            rollout_func=policy_rollout(grpo_rows, specs, tok, cfg.seed),
            args=_args(cfg, scratch, GRPOConfig, beta=cfg.beta, num_generations=cfg.num_generations,
                       # TRL needs the generation batch divisible by both the batch and the group size
                       generation_batch_size=math.lcm(cfg.batch_size, cfg.num_generations),
                       max_completion_length=cfg.max_completion_length, temperature=1.0),
            train_dataset=data, peft_config=peft_config)
    else:
        raise ValueError(f"unknown training method {cfg.method!r}")
    # pairs: rows before balancing; given: after it; TRL drops prompts of max_length tokens or more
    rows = {"pairs": pairs_in, "given": len(data), "trained_on": len(trainer.train_dataset)}
    if not rows["trained_on"]:
        raise ValueError(f"all {rows['given']} training rows have prompts of max_length={cfg.max_length} tokens or more, "
                         "so TRL drops every one: raise max_length")
    from transformers import PrinterCallback, TrainerCallback

    trainer.remove_callback(PrinterCallback)  # a loss dict per step on stdout: the losses are saved below
    if progress is not None:
        advance = progress(trainer.args.max_steps)

        class _Steps(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                advance(None)

        trainer.add_callback(_Steps())
    watchdog = flat_reward_stop(cfg.flat_reward_patience) if cfg.method == "grpo" else None
    if watchdog is not None:
        trainer.add_callback(watchdog)
    t1 = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - t1
    stopped = watchdog.stopped if watchdog is not None else None
    losses = [float(h["loss"]) for h in trainer.state.log_history if "loss" in h]
    # the adapter alone (config + weights): no training_args.bin, whose pickled paths differ per run.
    # No embedding layers are trained; "auto" would look the base (named "bundled" once a resumed
    # adapter says so) up on the Hugging Face hub to compare vocabularies: no hub access, ever.
    trainer.model.save_pretrained(str(out), save_embedding_layers=False)
    canonical_adapter_config(out, base_path)
    t2 = time.perf_counter()
    record = TrainRecord(config=cfg, dtype=compute_dtype(cfg), steps=trainer.state.global_step, losses=losses, rows=rows,
                         stopped=stopped, reward_zero_std=[float(h["frac_reward_zero_std"]) for h in trainer.state.log_history
                                                           if "frac_reward_zero_std" in h])
    (out / TRAIN_RECORD).write_text(record.to_json())
    return TrainResult(record, str(out), t2 - t0, train_seconds=train_seconds)


def _train_listwise(model: Any, tok: Any, out: Path, cfg: TrainConfig, pairs: Sequence[Pair] | str | Path, peft_config: Any,
                    base_path: str | Path, progress: Callable[[int], Callable[[Any], None]] | None, t0: float,
                    prompt_kv: PromptKV | None = None) -> TrainResult:
    """``method="listwise"`` (:mod:`socialworld.learn.listwise`): the same LoRA adapter, saving and
    record as TRL's trainers, trained by a plain AdamW loop."""
    from peft import get_peft_model

    from socialworld.learn.listwise import PromptKV, train_listwise
    from socialworld.learn.pairs.record import read_pairs

    if peft_config is not None:
        model = get_peft_model(model, peft_config)  # on load_hf's device (the GPU where there is one)
    data = read_pairs(pairs) if isinstance(pairs, (str, Path)) else list(pairs)
    dtype = compute_dtype(cfg)
    steps = planned_steps(cfg, len(balanced_indices([action_kind(p.chosen) for p in data], cfg.balance)))
    advance = progress(steps) if progress is not None else None
    t1 = time.perf_counter()
    store = prompt_kv if prompt_kv is not None else PromptKV()
    losses, rows = train_listwise(model, tok, data, cfg, dtype, lambda kinds: balanced_indices(kinds, cfg.balance), steps,
                                  on_step=(lambda: advance(None)) if advance is not None else None, prompt_kv=store)
    train_seconds = time.perf_counter() - t1
    model.save_pretrained(str(out), save_embedding_layers=False)
    canonical_adapter_config(out, base_path)
    record = TrainRecord(config=cfg, dtype=dtype, steps=steps, losses=losses, rows=rows, frozen_reads=store.misses,
                         frozen_hits=store.hits, frozen_bytes=store.bytes)
    (out / TRAIN_RECORD).write_text(record.to_json())
    return TrainResult(record, str(out), time.perf_counter() - t0, train_seconds=train_seconds)


def canonical_adapter_config(folder: str | Path, base_path: str | Path | None = None) -> None:
    """Rewrite every saved PEFT ``adapter_config.json`` in ``folder`` in a canonical form: keys
    sorted, ``target_modules`` (a set inside PEFT, saved in an order that follows Python's hash
    seed) sorted, so the same training gives the same adapter bytes and hash in every process; and
    the base named portably (``bundled``, not this machine's cache path: see
    :func:`socialworld.agents.models.portable_base`). That includes the adapters PEFT saves in
    subfolders beside the trained one (TRL's DPO trainer keeps its reference as adapter ``ref``):
    left as saved, a run resumed in a new process wrote other bytes and so other adapter hashes
    into its episode records."""
    from socialworld.agents.models import portable_base

    for path in sorted(Path(folder).rglob("adapter_config.json")):
        doc = json.loads(path.read_text())
        if base_path is not None:
            doc["base_model_name_or_path"] = portable_base(base_path)
        if isinstance(doc.get("target_modules"), list):
            doc["target_modules"] = sorted(doc["target_modules"])
        path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def simulator_reward(specs: dict[str, ScenarioSpec], returns: PairBuild | None = None):
    """GRPO reward: for each completion, restore the row's world ``snapshot``, parse the
    completion strictly and step the world once (the world applies the penalty to unparseable or
    illegal output, which it executes as ``wait``). Without ``returns`` the reward is that step's
    reward; with it, the step's exact return as the sleep phase values a candidate
    (:func:`socialworld.learn.pairs.rollout_returns`): the mean over ``returns.rollouts``
    continuations of ``returns.continuation`` of the step's reward plus ``gamma^t`` times step t's,
    the continuations of one prompt's completions reseeded alike (common random numbers), so
    completions differ in reward exactly where their moves lead to different outcomes. A one-step
    reward is 0 for most moves at most states, and a group of equal rewards has no gradient."""
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


def policy_rollout(rows: Sequence[dict[str, Any]], specs: dict[str, ScenarioSpec], tokenizer: Any, seed: int,
                   temperature: float = 1.0) -> Callable[[list, Any], dict[str, list]]:
    """GRPO's completions (TRL's ``rollout_func``): at each row's state, the turn the policy being
    trained writes under its own reply grammar (:func:`socialworld.agents.lm.policy.program`: a
    BELIEF, one legal ACTION, a SAY line), every choice sampled at ``temperature`` from a
    generator seeded with ``seed``. Only the tokens the model chose are trained (TRL's ``env_mask``);
    the grammar's forced text is not. Free generation is the wrong distribution here: sampled
    unconstrained, the untrained bundled model never wrote an ACTION line, so every completion of a
    group got the same unparseable penalty, and no group had an advantage (methods suite,
    2026-11-28). The policy decodes constrained, and so is sampled constrained."""
    import torch

    from socialworld.agents.lm.constrained import decode
    from socialworld.agents.lm.policy import SAY_TOKENS, program

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


def grpo_rows(pairs: Sequence[Pair]) -> list[dict[str, Any]]:
    """GRPO prompts from the action track's states: the prompt plus the world snapshot there."""
    return [{"prompt": p.prompt, "snapshot": p.snapshot, "scenario_id": p.scenario_id}
            for p in pairs if p.track == "action" and p.snapshot is not None]
