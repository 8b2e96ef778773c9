"""The bench's config, presets and the learning recipe. Light to import: the command line builds its
options from them."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from socialworld.agents.models import parse_model_spec
from socialworld.config import SHARE, FieldError, at_least, check_fields
from socialworld.layout import BENCH_LOOP
from socialworld.learn.config import LoopConfig, SleepConfig, TrainConfig
from socialworld.metrics.lifelong import TIERS
from socialworld.rollout.config import NPC_VOICE_HELP, RAY_HELP, check_judge, check_npc_voice, check_ray

ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


RECIPE_SLEEP = SleepConfig(sources=("action", "reference", "dialogue", "utterance", "judge"), reference_chosen="own",
                           wake_chosen="label", replay=0.5,
                           discount=0.9, rollouts=4, template_cap=24)
"""The sleep that teaches (DAgger): the expert's own actions at its states on training seeds, the
expert's label at every state of the policy's wake where it disagrees, and earlier cycles' pairs
replayed (up to half as many as this cycle's: no forgetting, without drowning the new tier). The
label is the only target (``values`` off: imagined values disagree between equal states,
design.md "labels, not values"); 4 discounted expert continuations per candidate
pick each reference state's rejected side and its quality; up to 24 pairs per template key (the
default 6 dropped the repeats of a scenario's equal first states that the expert's 12 reference
episodes a scenario make)."""


RECIPE_TRAIN = TrainConfig(method="listwise", activated=True, decision_weight=1.0, steps=400, max_epochs=3.0, batch_size=4,
                           learning_rate=1e-3, target_modules=ALL_LINEAR, lora_upper=0.5, balance=2)
"""Those labels learned listwise (``socialworld.learn.listwise``): the action as a choice among the
state's legal actions (the label's log-probability over the legal set, weight 1) plus the
likelihood of the BELIEF and SAY lines; an activated adapter (the prompt read by the base model, the
reply by the adapter: each prompt read once a step without gradient); LoRA on every linear layer
of the upper half, lr 1e-3 (what fitted the labels, docs/design.md), each action kind weighted
toward the most common one (rows repeated up to twice), 400 steps a cycle (enough passes over a
cycle's rows to fit them; fewer left the last cycles under-fitted), bf16 where native (design.md,
the learning recipe)."""


VALUES_SLEEP = replace(RECIPE_SLEEP, values="imagined")
"""The value recipe, studied and not taken (design.md "labels, not values": equal states got different
top targets, and a lookahead that followed them passed less than the expert):
the default's sleep, and at every labelled state the value of every scored candidate (up to
``max_candidates`` legal actions, the label and the taken action), each the mean of 4 discounted
expert continuations in imagined worlds (preferences redrawn to agree with the public record).
Trained with ``RECIPE_TRAIN``, whose listwise decision then fits soft targets from those values (the
label, or a candidate that beats it by ``value_margin``)."""


@dataclass(frozen=True)
class Preset:
    """The budget and recipe of a bench run."""

    eval_episodes: int
    train_episodes: int
    """wake episodes of the deployed policy per scenario per cycle (language-model time)"""
    reference_episodes: int = 0
    """expert episodes per scenario per cycle on training seeds (no language-model time)"""
    reference_varied: float = 0.0
    """share of those beyond the wake's seeds played on a new variant of the scenario each"""
    train: TrainConfig = RECIPE_TRAIN
    sleep: SleepConfig = RECIPE_SLEEP
    dialogue_steps: int = 20
    """cap on the dialogue track's steps per cycle"""
    scenarios: tuple[str, ...] = ()
    """a subset of scenario ids (empty: all eight)"""
    max_turns: int = 0
    """cap on every scenario's turn budget (0: the scenario's own)"""


PRESETS: dict[str, Preset] = {
    # one scenario per tier, one evaluation seed each, episodes cut at 4 turns, one wake episode and
    # one training step on one row per cycle: does the whole protocol run (its numbers mean little)
    "smoke": Preset(eval_episodes=1, train_episodes=1, train=replace(RECIPE_TRAIN, steps=1, batch_size=1), max_turns=4,
                    scenarios=("team_lunch-v1", "book_club-v1", "weather_picnic-v1")),
    # the protocol's 45 evaluation episodes per arm and the recipe that learns: about 45 minutes on a
    # 2-core CPU with native bf16 (measured: see the README)
    "default": Preset(eval_episodes=3, train_episodes=1, reference_episodes=12, reference_varied=0.5),
    # a suite's budget (--suite methods|ablations, each variant a whole loop): one scenario per tier, 4
    # evaluation seeds each (12 episodes at the last cycle, the default 24), the default recipe at 100
    # steps a cycle (the default 400) and 10 dialogue steps (20): about a third of a default loop's time
    "suite": Preset(eval_episodes=4, train_episodes=1, reference_episodes=12, train=replace(RECIPE_TRAIN, steps=100),
                    dialogue_steps=10, scenarios=("team_lunch-v1", "book_club-v1", "weather_picnic-v1")),
    # the full budget
    "paper": Preset(eval_episodes=3, train_episodes=8, reference_episodes=16,
                   dialogue_steps=100),
}


@dataclass(frozen=True)
class BenchConfig:
    out: str = field(default="runs/bench", metadata={"help": "run folder (resumed if it exists with the same config)"})
    model: str = field(default="bundled", metadata={"help": "base model of arms A and B: bundled or a local folder"})
    preset: Literal["smoke", "default", "suite", "paper"] = field(default="default", metadata={
        "help": "budget: smoke, default, suite (a third of default's time per loop, for --suite) or paper"})
    proxy: str = field(default="", metadata={"help": (
        "arm C: a policy spec, e.g. openai:<model>@<url>, or a trained policy as <model>+<run folder> "
        "(default: the expert policy)")})
    cycles: int = field(default=3, metadata={"check": at_least(1), "help": "protocol cycles (cycle c unlocks the first c tiers)"})
    unlock: Literal["progressive", "adaptive", "fixed"] = field(default="progressive", metadata={
        "help": "progressive (the protocol), adaptive (unlock once the newest tier's pass rate reaches adaptive_threshold), "
                "or fixed (static: every tier every cycle, E6)"})
    adaptive_threshold: float = field(default=0.5, metadata={"check": SHARE, "help": "adaptive unlocking threshold"})
    seed: int = field(default=0, metadata={"check": at_least(0), "help": "run seed (evaluation, training and bootstrap seeds derive from it)"})
    lm_batch_size: int = field(default=48, metadata={"check": at_least(1), "help": "prompts per forward pass (48: the default preset's whole lockstep batch in one)"})
    resamples: int = field(default=10_000, metadata={"check": at_least(1), "help": "bootstrap resamples per interval"})
    scenarios: tuple[str, ...] = field(default=(), metadata={"commas": False, "help": (
        "scenario ids or YAML paths of your own (repeatable), instead of the preset's; each unlocks with its tier "
        "(the preset's budget stays)")})
    holdout: tuple[str, ...] = field(default=(), metadata={"help": (
        "scenarios (ids or short names of the bench's) that B never trains on; every arm is evaluated on them "
        "at the last cycle, apart from the tiers' tables (does the skill carry to scenarios it never saw?)")})
    max_endpoint_failures: float = field(default=0.2, metadata={"check": SHARE, "help": (
        "an arm on an openai: endpoint (the proxy): when more than this share of its steps got no reply, the bench "
        "stops with the endpoint's error instead of scoring it (its records kept in arms/<arm>/failed-episodes.jsonl)")})
    judge: str = field(default="", metadata={"help": (
        "an LM judge's model spec (off when empty): scores every arm's last-cycle episodes 0-10 on goal and "
        "believability, reported beside the rule metrics (source proxy), and ranks pairs in B's sleep (kept out of "
        "the action track by strict gating)")})
    npc_voice: str = field(default="template", metadata={"help": NPC_VOICE_HELP + " (every arm's evaluation and B's wake hear it)"})
    ray: str = field(default="", metadata={"help": RAY_HELP + "; the sleep phase's scoring, the scripted arms' rollouts and a "
                                                               "suite's variants (the run folder must be on storage every node sees)"})

    def __post_init__(self) -> None:
        check_fields(self)
        check_ray(self.ray)
        check_judge(self.judge)
        check_npc_voice(self.npc_voice, self.ray)
        ms = parse_model_spec(self.model)  # before the run folder holds a typo
        if ms.kind not in ("bundled", "hf") or ms.adapters:
            raise FieldError("model", "must be bundled or a model folder without adapters (arms A and B train a local model), "
                             f"got {self.model!r}")
        if self.proxy and parse_model_spec(self.proxy).kind not in ("scripted", "openai") and self.ray:  # parsed: a typo fails now
            raise FieldError("proxy", f"{self.proxy!r} is a local model; {{ray}} spreads scripted and openai: policies only",
                             related=("ray",))

    def scenario_names(self) -> tuple[str, ...]:
        return tuple(self.scenarios) or PRESETS[self.preset].scenarios

    def loop_config(self, **over) -> LoopConfig:
        p = PRESETS[self.preset]
        base = LoopConfig(out=str(Path(self.out) / BENCH_LOOP), model=self.model, cycles=self.cycles, tiers=TIERS,
                          train_episodes=p.train_episodes, reference_episodes=p.reference_episodes,
                          reference_varied=p.reference_varied,
                          eval_episodes=p.eval_episodes, seed=self.seed,
                          lm_batch_size=self.lm_batch_size, baseline=True, unlock=self.unlock, holdout=self.holdout,
                          adaptive_threshold=self.adaptive_threshold, scenarios=self.scenario_names(), max_turns=p.max_turns,
                          sleep=p.sleep, train=p.train, dialogue_steps=p.dialogue_steps, ray=self.ray, judge=self.judge,
                          npc_voice=self.npc_voice)
        return replace(base, **over)
