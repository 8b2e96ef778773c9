"""Each training method's own options, beside the common ones (:class:`~socialworld.learn.config.TrainOptions`);
:class:`~socialworld.learn.config.TrainConfig` composes them flat, as the command line and a run's
``config.yaml`` show them. Here, apart from the trainers' code, so the configs stay light to import."""

from __future__ import annotations

from dataclasses import dataclass, field

from socialworld.config import above, at_least, check_fields


@dataclass(frozen=True)
class DPOOptions:
    """DPO's own option (its KL strength ``beta`` it shares with GRPO, in the common options)."""

    sft_weight: float = field(default=1.0, metadata={"check": at_least(0), "help": (
        "DPO: add this weight times the NLL of the chosen completion (TRL loss_type ['sigmoid', 'sft'], as in RPO); "
        "0 = plain DPO, which pushed the bundled model's mass onto an action no pair chose")})

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class GRPOOptions:
    """GRPO's own options (its KL strength ``beta`` it shares with DPO, in the common options)."""

    num_generations: int = field(default=4, metadata={"check": at_least(1), "help": "GRPO: completions per prompt"})
    max_completion_length: int = field(default=48, metadata={"check": at_least(1), "help": "GRPO: tokens per sampled completion"})
    flat_reward_patience: int = field(default=5, metadata={"check": at_least(0), "help": (
        "GRPO: stop, saying so, once every group's rewards were equal (no advantage, no gradient) for this many "
        "steps in a row; 0: never")})

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class ListwiseOptions:
    """The listwise objective's own options."""

    value_temperature: float = field(default=0.05, metadata={"check": above(0), "help": (
        "listwise: temperature of the soft target over the candidates (in units of value)")})
    value_margin: float = field(default=0.05, metadata={"check": at_least(0), "help": (
        "listwise: a candidate joins the target beside chosen only when its value beats chosen's by this much")})
    decision_weight: float = field(default=0.2, metadata={"check": at_least(0), "help": (
        "listwise: weight W of the decision's term against the per-token likelihood of the belief and words "
        "(the action track's; a loop's dialogue track trains at 0: the words alone)")})

    def __post_init__(self) -> None:
        check_fields(self)
