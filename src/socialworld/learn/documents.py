"""The learning side's result documents, typed and versioned: a loop cycle's ``summary.json``
(:class:`CycleSummary`) and an adapter's ``socialworld-train.json`` (:class:`TrainRecord`). Readers
(the bench, its reports, the command line) import these, never the loop's or the trainers' code."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final, Literal

from pydantic import model_validator

from socialworld.learn.config import TrainConfig
from socialworld.metrics.core import Aggregate
from socialworld.metrics.stats import Interval
from socialworld.records import Document

CYCLE_SUMMARY_SCHEMA: Final = "cycle-summary-v2"
TRAIN_RECORD = "socialworld-train.json"
"""an adapter folder's record of how it was trained (:class:`TrainRecord`)"""


class CycleSummary(Document):
    """One loop cycle's result, as ``cycle-c/summary.json`` holds it."""

    schema_version: Literal["cycle-summary-v2"] = CYCLE_SUMMARY_SCHEMA
    cycle: int
    tiers: list[str]
    """the tiers this cycle trained and evaluated"""
    pairs: dict[str, int]
    """pairs kept per track (before replay)"""
    excluded: dict[str, int]
    """candidate pairs excluded, by ``track:reason``"""
    replayed: dict[str, int] = {}
    """pairs replayed from earlier cycles, per track"""
    final_loss: dict[str, float | None]
    """each trained adapter's last logged loss (None: not trained this cycle)"""
    eval: Aggregate
    """the deployed policy's metrics on the evaluation seeds"""
    by_tier: dict[str, Aggregate]
    vs_baseline: dict[str, Interval] | None = None
    """paired bootstrap of this cycle minus the untrained policy, per registered metric (with a baseline)"""
    holdout: Aggregate | None = None
    """the last cycle of a run with held-out scenarios: the deployed policy's metrics on them"""
    holdout_vs_baseline: dict[str, Interval] | None = None
    """... and its paired bootstrap against the untrained policy there"""

    @model_validator(mode="before")
    @classmethod
    def _migrate(cls, data: Any) -> Any:
        """v1 (before the metric registry) held its aggregates flat (read by :class:`Aggregate`)."""
        if isinstance(data, dict) and data.get("schema_version") == "cycle-summary-v1":
            data = {**data, "schema_version": CYCLE_SUMMARY_SCHEMA}
        return data


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
    """``pairs`` (given before balancing), ``given`` (after it), ``trained_on`` (what the trainer kept)"""
    stopped: str | None = None
    """why training stopped before its planned steps (:func:`~socialworld.learn.trainers.grpo.flat_reward_stop`), if it did"""
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


def read_train_record(adapter: str | Path) -> TrainRecord:
    """The record :func:`~socialworld.learn.train.train_adapter` saved beside the adapter in folder ``adapter``."""
    return TrainRecord.model_validate_json((Path(adapter) / TRAIN_RECORD).read_text())
