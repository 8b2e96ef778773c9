"""The bench's result documents, typed and versioned: ``bench.json`` (:class:`BenchDoc`) and a
suite's ``suite.json`` (:class:`SuiteDoc`).

Every per-metric table in them is keyed by the metric registry
(:mod:`socialworld.metric_registry`); a key it does not know fails the read. The reports
(:mod:`socialworld.bench.report`) read these types, never raw JSON.

Versions: v1 documents (written before the registry; they named no ``schema_version``) held the
loop's per-cycle evaluations flat with PassRate spelled ``pass_rate``. They read as v2 (a missing
``schema_version`` takes the current one) through the models' migrations (:func:`socialworld.metrics.core.migrate_flat_aggregate` for each aggregate),
so an old run folder's reports can be made again (``socialworld report``). Read one with
:func:`socialworld.records.read_document`.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator

from socialworld.bench.config import BenchConfig
from socialworld.learn.documents import CycleSummary
from socialworld.metrics.lifelong import Lost
from socialworld.metrics.stats import Interval, PerMetric, only_registered
from socialworld.records import Document
from socialworld.rollout.evaluate import VoiceEffect

BENCH_SCHEMA: Final = "bench-v2"
SUITE_SCHEMA: Final = "suite-v2"


Ratios = Annotated[dict[str, float | None], AfterValidator(only_registered)]
"""registered metric key -> a ratio of means (None: the denominator's mean is 0)"""
RTable = dict[str, dict[str, Interval]]
"""cycle (as text) -> tier -> PassRate interval"""


class Thresholds(Document):
    CR: float
    D: float
    guards: str


class Coverage(Document):
    """:func:`socialworld.metrics.diagnostics.coverage`"""

    failed: int
    coverage: float
    mean_confidence: float


class ArmDiagnostics(Document):
    coverage: Coverage
    primary_failures: dict[str, int]


class BenchJudge(Document):
    """With ``--judge``: the judge's summary per arm and its agreement with the world's returns."""

    judge: str
    arms: dict[str, dict[str, Any]]
    """arm -> :meth:`socialworld.rollout.judge.JudgeSummary.as_dict`"""
    agreement: dict[str, Any]
    """:meth:`socialworld.rollout.judge.RankAgreement.as_dict`"""


class HeldOut(Document):
    """With ``--holdout``: every arm on the scenarios B never trained on (the last cycle's adapters; A,
    C and the references on the same seeds), apart from the tiers' tables."""

    scenarios: list[str]
    main: dict[str, PerMetric]
    """arm -> metric -> interval over the held-out scenarios' episodes"""
    paired: dict[str, PerMetric]
    """``B-A``, ``B-C`` -> metric -> paired-bootstrap difference there"""
    by_scenario: dict[str, dict[str, float]]
    """arm -> scenario -> PassRate"""


def typed_config(config: dict[str, Any]) -> BenchConfig:
    """A recorded bench configuration (``config`` of ``bench.json`` or ``suite.json``: its ``config.yaml``
    without the fields that only change how a run executes) as the typed config; fields an older document
    lacks take their defaults."""
    from pydantic import TypeAdapter

    return TypeAdapter(BenchConfig).validate_python(config)


class BenchDoc(Document):
    """``bench.json``: every number of the report (:func:`socialworld.bench.protocol.bench_document`)."""

    schema_version: Literal["bench-v2"] = BENCH_SCHEMA
    version: str
    """the protocol's version (``ascent-bench-v1``)"""
    metrics_contract: str
    config: dict[str, Any]
    """the bench's configuration as its ``config.yaml`` records it (typed: :attr:`run_config`)"""
    preset: dict[str, Any]
    thresholds: Thresholds
    steps_per_episode: dict[str, float]
    """arm -> mean steps per last-cycle episode"""
    tiers_per_cycle: dict[str, list[str]]
    episodes_per_arm: dict[str, int]
    main: dict[str, PerMetric]
    """arm -> metric -> last-cycle interval"""
    paired: dict[str, PerMetric]
    """``B-A``, ``B-C``, ``B-oracle``, … -> metric -> paired-bootstrap difference"""
    paired_by_tier: dict[str, dict[str, Interval]] = {}
    """``B-A``, ``B-C`` -> tier -> PassRate difference (absent from documents written before it)"""
    ratios: dict[str, Ratios]
    R: dict[str, RTable]
    forgetting: dict[str, dict[str, float]]
    forgetting_intervals: dict[str, dict[str, Interval]] = {}
    """arm -> tier -> F with its paired bootstrap interval over the tier's evaluation episodes (absent from
    documents written before it)"""
    lost: list[Lost] = []
    """B's episodes of earlier tiers that passed in an earlier cycle and fail in the last, each with whether
    arm C passes it (absent from documents written before it)"""
    forward_transfer: dict[str, dict[str, float]]
    unlock_cycles: dict[str, int]
    diagnostics: dict[str, ArmDiagnostics]
    loop: list[CycleSummary]
    judge: BenchJudge | None = None
    holdout: HeldOut | None = None
    """the scenarios held out of training (absent without ``--holdout``)"""
    voice_effect: dict[str, VoiceEffect] = {}
    """with ``--npc-voice``: arm -> voiced − template on its last-cycle episodes, the same seeds played again
    by the same policy with the template lines (absent without a voice)"""

    @property
    def run_config(self) -> BenchConfig:
        """:attr:`config`, typed"""
        return typed_config(self.config)


class SameRun(Document):
    """A suite variant that is another by construction (not run)."""

    same_as: str
    why: str


class VariantRow(Document):
    """A suite variant's (or the untrained model's) last-cycle numbers."""

    metrics: PerMetric
    R: RTable
    vs_untrained: PerMetric | None = None
    """paired against the untrained model on the same episodes (None: the untrained row)"""
    vs_full: PerMetric | None = None
    """paired against the full recipe (None: the full recipe and the untrained row)"""
    forgetting: dict[str, float] | None = None
    pairs: list[dict[str, int]] = []
    """pairs kept per track, per cycle"""
    excluded: list[dict[str, int]] = []
    groups_with_reward_variance: float | None = None
    """GRPO: the share of groups whose rewards were not all equal"""


class SuiteDoc(Document):
    """``<suite>/suite.json``: a methods or ablations suite (:func:`socialworld.bench.protocol.run_suite`)."""

    schema_version: Literal["suite-v2"] = SUITE_SCHEMA
    version: str
    metrics_contract: str
    suite: str
    config: dict[str, Any]
    """the bench's configuration as its ``config.yaml`` records it (typed: :attr:`run_config`)"""
    preset: dict[str, Any]
    full: str
    """the variant without overrides, the others' comparison"""
    variants: dict[str, VariantRow | SameRun]
    """the untrained model's row first, then each variant's"""

    @property
    def run_config(self) -> BenchConfig:
        """:attr:`config`, typed"""
        return typed_config(self.config)
