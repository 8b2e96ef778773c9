"""The training methods, one module each, registered by name (``TrainConfig.method``) behind one
protocol, as the pair sources are (:data:`socialworld.learn.pairs.sources.SOURCES`):

* ``dpo`` (:mod:`.dpo`): TRL's ``DPOTrainer`` on the preference pairs;
* ``sft`` (:mod:`.sft`): TRL's ``SFTTrainer`` on the chosen side (behaviour cloning);
* ``grpo`` (:mod:`.grpo`): TRL's ``GRPOTrainer`` at the action track's states, the simulator's return
  as its reward;
* ``listwise`` (:mod:`.listwise`): the policy's distribution over legal actions fitted to soft targets
  (:mod:`socialworld.learn.listwise`).

Each module holds its method's entry ``fit(data, cfg, start) -> TrainRecord``; each method's own options
(a dataclass that :class:`~socialworld.learn.config.TrainConfig` composes, flat, as the command line and
``config.yaml`` show them) are in :mod:`.options`, light to import. What the methods share is in
:mod:`.common`; one run is :func:`socialworld.learn.train.train_adapter`. Each method imports its
trainer (and :mod:`.common`) when it runs, so the configs import none of them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from socialworld.learn.trainers import dpo, grpo, listwise, sft

if TYPE_CHECKING:
    from socialworld.learn.config import TrainConfig
    from socialworld.learn.documents import TrainRecord
    from socialworld.learn.trainers.common import Start, TrainingSet


class Trainer(Protocol):
    """A training method: train the adapter ``start`` describes on ``data`` under ``cfg``, save it
    (:meth:`Start.save <socialworld.learn.trainers.common.Start.save>`) and return its record."""

    def __call__(self, data: TrainingSet, cfg: TrainConfig, start: Start, /) -> TrainRecord: ...


TRAINERS: dict[str, Trainer] = {"dpo": dpo.fit, "sft": sft.fit, "grpo": grpo.fit, "listwise": listwise.fit}
"""every training method by its name"""
