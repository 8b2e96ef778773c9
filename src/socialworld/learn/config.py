"""The configs of learning (``socialworld loop``): the sleep phase, training, the loop. Light to
import: the command line builds its options from them."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable, Literal

PairSource = Literal["action", "reference", "dialogue", "utterance", "judge"]
"""The pair sources (:data:`socialworld.learn.pairs.sources.SOURCES`), by name."""

from socialworld.agents.models import TRACKS, parse_model_spec
from socialworld.config import SHARE, FieldError, above, at_least, check_fields, within
from socialworld.learn.trainers.options import DPOOptions, GRPOOptions, ListwiseOptions
from socialworld.rollout.config import NPC_VOICE_HELP, RAY_HELP, check_judge, check_npc_voice, check_ray


@dataclass(frozen=True)
class PairBuild:
    """What builds the sleep phase's candidate pairs: the same settings, the same candidates (a
    gating variant, ``socialworld gate``, may change none of them)."""

    continuation: Literal["expert", "oracle", "random"] = field(default="expert", metadata={
        "help": "scripted policy rolled out after each counterfactual candidate"})
    rollouts: int = field(default=2, metadata={"check": at_least(1), "help": "M: continuations per candidate"})
    horizon: int = field(default=8, metadata={"check": at_least(1), "help": "steps per continuation (or until the episode ends)"})
    discount: float = field(default=1.0, metadata={"check": within(0, 1, low_open=True),
        "help": "gamma: a continuation's return is the sum of gamma^t times step t's reward (1: undiscounted; below 1 a "
                "turn lost costs value, so candidates that only delay the same outcome are told apart)"})
    max_candidates: int = field(default=12, metadata={"check": at_least(1), "help": "legal alternatives scored per step (besides the taken one)"})
    margin: float = field(default=0.05, metadata={"check": at_least(0), "help": "delta: least value gap between chosen and rejected"})
    q_margin: float = field(default=0.05, metadata={"check": at_least(0), "help": "dialogue track: least q_t gap"})
    sources: tuple[PairSource, ...] = field(default=("action", "dialogue", "utterance", "judge"), metadata={
        "help": "the pair sources, built in this order whatever the list's: action (counterfactual steps of each wake "
                "episode), reference (of each reference episode), dialogue (a wake episode's words against its reference "
                "episode's), utterance (the policy's words against the template's for the same action), judge (two "
                "episodes an LM judge ranked; only with --judge)"})
    seed: int = field(default=0, metadata={"check": at_least(0), "help": "seed of the continuation reseeds"})
    wake_chosen: Literal["best", "label", "label_by_margin"] = field(default="best", metadata={
        "help": "chosen side of the action source's pairs at the wake policy's own states: best (the best candidate by "
                "rollouts); label (what the continuation policy does at that state, fed the episode's observations in "
                "order: DAgger's expert label, kept whenever it differs from the policy's action, the quality threshold "
                "not applied); label_by_margin (the label, kept only when the rollouts favour it by margin)"})
    judge_margin: float = field(default=2.0, metadata={"check": above(0),
        "help": "with an LM judge: least gap in its goal score (0-10) between two episodes of the same scenario and seed "
                "for a judge-ranked pair at their first differing turn"})
    values: Literal["off", "true", "imagined"] = field(default="off", metadata={
        "help": "values of every scored candidate at each action pair's state, recorded on the pair (its candidates): off "
                "(only what picks chosen and rejected); true (rollouts from the true state); imagined (each rollout in a "
                "world whose NPC preferences are redrawn to agree with the public record: values an observation can support)"})
    reference_chosen: Literal["best", "own"] = field(default="best", metadata={
        "help": "chosen side of the reference source's pairs (at the states of the reference, continuation-policy, "
                "episodes, which a weak policy's own wake never visits): best (the best candidate by rollouts) or own "
                "(the reference's own action); rejected = a candidate at least margin worse"})

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.sources or len(set(self.sources)) != len(self.sources):
            raise FieldError("sources", f"must name each pair source once, and at least one; got {', '.join(self.sources) or 'none'}")

    @property
    def provenance(self) -> str:
        where = (f", gamma={self.discount:g}" if self.discount < 1 else "") + (", imagined" if self.values == "imagined" else "")
        return f"simulator_rollout({self.continuation}, M={self.rollouts}, horizon={self.horizon}{where})"


@dataclass(frozen=True)
class Gating:
    """What screens and gates the candidates, and what replay adds to them: the settings a gating
    variant (``socialworld gate``) may change. (Gating also reads two :class:`PairBuild` fields:
    ``wake_chosen``, whether labels skip the quality threshold, and ``seed``, replay's draw.)"""

    quality_threshold: float = field(default=0.5, metadata={"check": SHARE, "help": "least share of paired rollouts in which chosen beats rejected"})
    template_cap: int = field(default=6, metadata={"check": at_least(1), "help": "most pairs per template key (scenario, chosen action, rejected action)"})
    gating: Literal["strict", "off"] = field(default="strict", metadata={"help": (
        "strict provenance gating, or off (the ablation: evidence of any source; screening, the quality threshold "
        "included, still applies)")})
    replay: float = field(default=0.0, metadata={"check": at_least(0),
        "help": "replay from earlier cycles: add up to this many times this cycle's kept pairs (per track) from the "
                "pairs earlier cycles kept, drawn by a seeded RNG (0: off)"})

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class SleepConfig(Gating, PairBuild):
    """The sleep phase's settings: what builds pairs (:class:`PairBuild`) and what gates them
    (:class:`Gating`), one flat config (its fields are ``socialworld loop``'s options)."""

    def __post_init__(self) -> None:
        PairBuild.__post_init__(self)

    @property
    def build(self) -> PairBuild:
        return PairBuild(**{f.name: getattr(self, f.name) for f in fields(PairBuild)})


@dataclass(frozen=True)
class TrainOptions:
    """The options every training method reads: which method, how long, the LoRA adapter, the dtype.
    Each method's own options live beside its trainer (:mod:`socialworld.learn.trainers`)."""

    method: Literal["dpo", "sft", "grpo", "listwise"] = field(default="dpo", metadata={"help": (
        "dpo, sft or grpo (TRL's trainers), or listwise (the policy's distribution over legal actions fitted to soft "
        "targets from the simulator's values of every scored candidate, the belief and words by likelihood: "
        "socialworld.learn.listwise)")})
    steps: int = field(default=30, metadata={"check": at_least(1), "help": "optimizer steps"})
    max_epochs: float = field(default=0.0, metadata={"check": at_least(0), "help": (
        "at most this many passes over the rows (fewer steps on a small set; 0: steps alone decide)")})
    batch_size: int = field(default=4, metadata={"check": at_least(1), "help": "pairs (or GRPO prompts x generations) per step"})
    balance: int = field(default=0, metadata={"check": at_least(0), "help": (
        "sft/dpo/listwise: repeat each action kind's rows (the kind in the chosen turn's ACTION line) round(rows of the most common kind / "
        "its rows) times, at most this many (0: the rows as they are); rows without an ACTION line count once")})
    learning_rate: float = field(default=1e-4, metadata={"check": above(0), "help": "AdamW learning rate of the LoRA weights"})
    lora_r: int = field(default=16, metadata={"check": at_least(1), "help": "LoRA rank"})
    lora_alpha: int = field(default=32, metadata={"check": above(0), "help": "LoRA alpha"})
    target_modules: tuple[str, ...] = field(default=("q_proj", "k_proj", "v_proj", "o_proj"),
                                            metadata={"help": "modules that get LoRA weights"})
    beta: float = field(default=0.1, metadata={"check": at_least(0), "help": "DPO/GRPO KL strength"})
    max_length: int = field(default=768, metadata={"check": at_least(1), "help": "truncate prompt+completion to this many tokens"})
    lora_upper: float = field(default=1.0, metadata={"check": within(0, 1, low_open=True), "help": (
        "share of the transformer layers, counted from the top, that get LoRA (1: all; 0.5: the upper half, "
        "where the backward pass then stops)")})
    dtype: Literal["auto", "float32", "bfloat16"] = field(default="auto", metadata={"help": (
        "compute dtype: bfloat16 autocast over fp32 weights where the hardware has native bf16 (CUDA, avx512_bf16, AMX), "
        "else float32 (auto); emulated bf16 is slower than fp32")})
    activated: bool = field(default=False, metadata={"help": (
        "LoRA acts from the reply's assistant header on, the prompt read by the base model (PEFT's activated LoRA, "
        "alora_invocation_tokens): listwise then reads each batch's prompts once without gradient and trains on the "
        "replies alone; decoding prefills the prompts under the base model")})
    seed: int = field(default=0, metadata={"check": within(0, 2**32 - 1), "help": "trainer seed (numpy's range)"})
    gradient_checkpointing: bool = field(default=False, metadata={"help": (
        "recompute activations in the backward pass (TRL's own default is on: it saves memory and costs time; "
        "a 135M model needs no saving)")})

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class TrainConfig(ListwiseOptions, GRPOOptions, DPOOptions, TrainOptions):
    """Training's settings, one flat config as the command line and a run's ``config.yaml`` show them: the
    common options (:class:`TrainOptions`) and each method's own (DPO's, GRPO's, listwise's, from their
    trainers' modules); SFT has none of its own."""

    def __post_init__(self) -> None:
        check_fields(self)
        if self.method == "grpo" and self.num_generations < 2:
            raise FieldError("num_generations", "must be at least 2 with {method} grpo (a group of one has no advantage), "
                             f"got {self.num_generations}", related=("method",))
        if not self.target_modules:
            raise FieldError("target_modules", "must name at least one module")


@dataclass(frozen=True)
class LoopConfig:
    out: str = field(default="runs/loop", metadata={"help": "run folder (resumed if it exists with the same config)"})
    model: str = field(default="bundled", metadata={"help": "base model: bundled or a local folder"})
    cycles: int = field(default=1, metadata={"check": at_least(1), "help": "wake-sleep-train-deploy cycles"})
    tiers: tuple[str, ...] = field(default=("L0",), metadata={"help": "tiers trained and evaluated"})
    scenarios: tuple[str, ...] = field(default=(), metadata={"commas": False, "help": (
        "scenario ids or YAML paths of your own (repeatable; default: the shipped scenarios of the tiers); "
        "the run stores each file's spec and is resumed by id without it")})
    holdout: tuple[str, ...] = field(default=(), metadata={"help": (
        "scenarios of the run (ids or short names) never trained on: no wake, reference or pairs there; the "
        "untrained policy and the last cycle's are evaluated on them apart from the tiers (skill that carries "
        "to scenarios it never saw)")})
    train_episodes: int = field(default=4, metadata={"check": at_least(1), "help": "wake episodes per scenario per cycle (training seeds)"})
    reference_episodes: int = field(default=0, metadata={"check": at_least(0), "help": (
        "continuation-policy (expert) episodes per scenario per cycle on training seeds, the wake's seeds first "
        "(at least train_episodes; 0: just the wake's); with reference_pairs they give pairs at no language-model cost")})
    reference_varied: float = field(default=0.0, metadata={"check": SHARE, "help": (
        "share of the reference episodes beyond the wake's seeds played on a variant of their scenario (the same "
        "structure, people's names and the decisions' words redrawn: socialworld.world.variation), a new one each "
        "episode, so the student reads the move from the state rather than from the scenario's words")})
    eval_episodes: int = field(default=3, metadata={"check": at_least(1), "help": "evaluation episodes per scenario (fixed held-out seeds)"})
    seed: int = field(default=0, metadata={"check": at_least(0), "help": "run seed"})
    max_turns: int = field(default=0, metadata={"check": at_least(0), "help": "cap every scenario's turn budget (0: the scenario's own; smoke runs)"})
    lm_batch_size: int = field(default=12, metadata={"check": at_least(1), "help": "prompts per forward pass"})
    baseline: bool = field(default=True, metadata={"help": "evaluate the untrained policy first (cycle 0) and compare each cycle with it"})
    unlock: Literal["fixed", "progressive", "adaptive"] = field(default="fixed", metadata={"help": (
        "fixed: every cycle trains and evaluates all tiers; progressive: cycle c unlocks the first c tiers "
        "(ASCENT-Bench); adaptive: the next tier unlocks once the newest tier's pass rate reaches adaptive_threshold")})
    adaptive_threshold: float = field(default=0.5, metadata={"check": SHARE, "help": "adaptive unlocking: pass rate that unlocks the next tier"})
    tracks: tuple[Literal["action", "dialogue"], ...] = field(default=TRACKS, metadata={"help": "tracks trained (action, dialogue)"})
    merged: bool = field(default=False, metadata={"help": "one adapter trained on both tracks' pairs, used for both (ablation E1)"})
    reuse_from: str = field(default="", metadata={"help": "copy the untrained policy's artifacts (cycle-0 eval, cycle-1 wake) from this run "
                                                       "folder instead of re-running them: ablations on the same data"})
    sleep: SleepConfig = field(default_factory=SleepConfig)
    dialogue_steps: int = field(default=0, metadata={"check": at_least(0), "help": (
        "cap on the dialogue track's optimizer steps per cycle (0: the train steps): it starts from the action "
        "adapter, which already writes the words")})
    train: TrainConfig = field(default_factory=lambda: TrainConfig(method="dpo", steps=20))
    judge: str = field(default="", metadata={"help": (
        "an LM judge's model spec (off when empty): scores each cycle's wake and reference episodes (judge.jsonl); "
        "pairs ranked by its goal score join the candidates with proxy evidence, which strict gating keeps out of "
        "the action track")})
    npc_voice: str = field(default="template", metadata={"help": NPC_VOICE_HELP + " (the wake and every evaluation hear it; "
                                                                                  "the reference episodes keep the templates' lines)"})
    ray: str = field(default="", metadata={"help": RAY_HELP + " (how the run executes, not what it makes: not in config.yaml)"})

    def __post_init__(self) -> None:
        check_fields(self)
        check_npc_voice(self.npc_voice)  # the loop's reference rollouts under ray keep the templates' lines
        if not self.tracks:
            raise FieldError("tracks", f"must name at least one of {', '.join(TRACKS)}")
        check_ray(self.ray)
        ms = parse_model_spec(self.model)  # before the run folder holds a typo
        if ms.kind not in ("bundled", "hf") or ms.adapters:
            raise FieldError("model", "must be bundled or a model folder without adapters (the loop trains a local model), "
                             f"got {self.model!r}")
        check_judge(self.judge)


Progress = Callable[[str, int], Callable[[Any], None]]
"""``progress(description, total)`` -> a per-item callback (the command line draws bars with it)."""
