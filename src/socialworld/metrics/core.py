"""Core metrics (contract §5.1, metrics contract v2) as pure functions over records.

Each function takes records only and documents its formula. Provenance travels with the
value (:class:`~socialworld.records.Signal`); nothing falls back silently — a degraded value
says so in its ``source``.

Contract v2: a scenario's sub-goals are *achievements* (``slot:<id>`` — a decision finalized,
``conflict:<a>-<b>`` — a quarrel repaired in the right order), which CR counts, and *guards*
(``no_secret_leaked``, ``commitments_honoured``, ``within_budget``, ``good_relations``), which
hold at the start and earn nothing by holding; breaking one fails the episode. Every
:class:`~socialworld.records.Metrics` names its contract; :func:`aggregate` and
:func:`require_contract` refuse to mix versions.
"""

from __future__ import annotations

from statistics import fmean
from typing import Any, Final, Iterable, Sequence

from pydantic import computed_field, field_validator, model_validator

from socialworld.core import MentalState
from socialworld.metric_registry import KEYS, metric
from socialworld.records import Document, EpisodeRecord, Metrics, Signal

CR_THRESHOLD = 0.6
D_THRESHOLD = 0.5
METRICS_CONTRACT = "metrics-v2"
ACHIEVEMENT_PREFIXES = ("slot:", "conflict:")


class ContractMismatch(ValueError):
    """Numbers made under different metrics contracts were about to be compared or aggregated."""


def is_achievement(subgoal: str) -> bool:
    """Achievement sub-goals (``slot:*``, ``conflict:*``) count in CR; every other sub-goal is a guard."""
    return subgoal.startswith(ACHIEVEMENT_PREFIXES)


def broken_guards(subgoals: dict[str, bool]) -> list[str]:
    """Guards not holding at the end (sorted)."""
    return sorted(k for k, ok in subgoals.items() if not is_achievement(k) and not ok)


def solved(subgoals: dict[str, bool]) -> bool:
    """Solved iff every decision (``slot:*``) is finalized and no guard is broken."""
    return all(ok for k, ok in subgoals.items() if k.startswith("slot:")) and not broken_guards(subgoals)


def align(stated: MentalState | None, truth: MentalState) -> float:
    """``align_t`` = share of goal-relevant hidden facts (each present NPC's preferred option per
    slot it has a say on, and each present NPC's mood bucket) that ``stated`` gets right.
    Unstated facts count as wrong; a missing statement scores 0."""
    total = sum(len(s) for s in truth.preferences.values()) + len(truth.moods)
    if total == 0:
        return 1.0
    if stated is None:
        return 0.0
    right = sum(
        1 for npc, slots in truth.preferences.items() for slot, opt in slots.items()
        if stated.preferences.get(npc, {}).get(slot) == opt
    )
    right += sum(1 for npc, b in truth.moods.items() if stated.moods.get(npc) == b)
    return right / total


def completion_rate(ep: EpisodeRecord) -> Signal:
    """CR = completed achievement sub-goals / achievement sub-goals (decisions finalized,
    conflicts repaired in order), from the sub-goal states at the end. Guards are not counted."""
    goals = [ok for k, ok in ep.final.subgoals.items() if is_achievement(k)]
    if not goals:
        raise ValueError(f"episode {ep.episode_id} has no achievement sub-goals (a scenario has at least one decision)")
    return Signal(value=sum(goals) / len(goals), source="direct", confidence=1.0, detail="final achievement sub-goal states")


def understanding(ep: EpisodeRecord, cr: Signal | None = None) -> Signal:
    """U = mean_t align_t over steps (source ``direct``). If no step has a parseable stated
    mental state: U = CR with source ``degraded``."""
    stated = [s for s in ep.steps if s.mental_state.stated is not None]
    if not stated:
        cr = cr or completion_rate(ep)
        return Signal(value=cr.value, source="degraded", confidence=0.3, detail="no parseable mental state; U := CR")
    vals = [s.signals.align.value if s.mental_state.stated is not None else 0.0 for s in ep.steps]
    return Signal(value=fmean(v or 0.0 for v in vals), source="direct", confidence=1.0, detail="mean align_t")


def application_efficiency(ep: EpisodeRecord, cr: Signal | None = None) -> Signal:
    """A_e = (Phi_T - Phi_0 - sum_t c_t) * min(1, t_ref / T), T = steps taken. Source ``direct``;
    ``degraded`` (= CR) when the episode has no step rewards."""
    T = len(ep.steps)
    if T == 0 or any(s.signals.penalty.value is None for s in ep.steps):
        cr = cr or completion_rate(ep)
        return Signal(value=cr.value, source="degraded", confidence=0.3, detail="no step rewards; A_e := CR")
    cost = sum(s.signals.penalty.value for s in ep.steps)  # type: ignore[misc]
    value = (ep.final.phi_T - ep.final.phi_0 - cost) * min(1.0, ep.final.t_ref / T)
    return Signal(value=value, source="direct", confidence=1.0, detail=f"T={T}, t_ref={ep.final.t_ref}, sum_c={cost:.2f}")


def npc_satisfaction(ep: EpisodeRecord, cr: Signal | None = None) -> Signal:
    """S_npc (Likert 1-5) = 0.7 * mean_i(1 + 4*mood_i) + 0.3 * (1 + 4*CR) over NPCs present at
    the end. Source ``fused`` (hidden moods fused with the goal outcome)."""
    cr = cr or completion_rate(ep)
    moods = [m for npc, m in ep.final.moods.items() if ep.final.present.get(npc, True)]
    value = 0.7 * fmean(1 + 4 * m for m in moods) + 0.3 * (1 + 4 * (cr.value or 0.0))
    return Signal(value=value, source="fused", confidence=0.9, detail="0.7*moods + 0.3*CR")


def diagnostic_score(u: Signal, a_e: Signal, s_npc: Signal) -> Signal:
    """D = 0.4*U + 0.4*clip(A_e, 0, 1) + 0.2*(S_npc - 1)/4; source is the weakest input's."""
    value = 0.4 * (u.value or 0.0) + 0.4 * min(1.0, max(0.0, a_e.value or 0.0)) + 0.2 * ((s_npc.value or 1.0) - 1) / 4
    order = ["direct", "fused", "proxy", "degraded", "missing"]
    source = max((u.source, a_e.source, s_npc.source), key=order.index)
    return Signal(value=value, source=source, confidence=min(u.confidence, a_e.confidence, s_npc.confidence), detail="0.4U+0.4A_e+0.2S")


def episode_metrics(ep: EpisodeRecord, cr_threshold: float = CR_THRESHOLD, d_threshold: float = D_THRESHOLD) -> Metrics:
    """All core metrics of an episode (contract v2). Pass iff CR >= cr_threshold and
    D >= d_threshold and no guard is broken; Solved iff every decision is finalized and no guard
    is broken."""
    cr = completion_rate(ep)
    u = understanding(ep, cr)
    a_e = application_efficiency(ep, cr)
    s = npc_satisfaction(ep, cr)
    d = diagnostic_score(u, a_e, s)
    broken = broken_guards(ep.final.subgoals)
    passed = (cr.value or 0) >= cr_threshold and (d.value or 0) >= d_threshold and not broken
    return Metrics(contract=METRICS_CONTRACT, U=u, A_e=a_e, S_npc=s, D=d, CR=cr, passed=passed,
                   solved=solved(ep.final.subgoals), guards_broken=broken, cr_threshold=cr_threshold, d_threshold=d_threshold)


def require_contract(episodes: Iterable[EpisodeRecord], source: str = "these records") -> None:
    """Raise :class:`ContractMismatch` unless every scored episode was scored under
    :data:`METRICS_CONTRACT` (records of another version are never compared or aggregated with ours)."""
    found = {e.metrics.contract for e in episodes if e.metrics is not None}
    other = sorted(found - {METRICS_CONTRACT})
    if other:
        raise ContractMismatch(
            f"{source} were scored under {', '.join(other)}, this version scores under {METRICS_CONTRACT}; "
            "numbers of different metrics contracts are never compared: re-run them into a new folder")


class Aggregate(Document):
    """A set of episodes' scores: the mean of every registered metric
    (:data:`~socialworld.metric_registry.METRICS`, read with ``agg["D"]``), and the failure rates of
    their steps. Documents (``metrics.json``, a cycle's ``summary.json``, ``bench.json``) hold it as
    it is; one written before the registry (its metrics flat beside the counts, PassRate spelled
    ``pass_rate``) is read through :func:`migrate_flat_aggregate`."""

    metrics: dict[str, float]
    """registered metric key -> mean over the episodes (``pass``, ``solve``: the share of episodes)"""
    n: int
    steps: int
    parse_failure_rate: float
    endpoint_failure_rate: float
    metrics_contract: str = METRICS_CONTRACT

    @field_validator("metrics")
    @classmethod
    def _registered(cls, v: dict[str, float]) -> dict[str, float]:
        if set(v) != set(KEYS):
            raise ValueError(f"metrics must name exactly the registered metrics {', '.join(KEYS)}; got {', '.join(sorted(v))}")
        return {k: v[k] for k in KEYS}

    @model_validator(mode="before")
    @classmethod
    def _read(cls, data: Any) -> Any:
        data = migrate_flat_aggregate(data)
        if isinstance(data, dict):  # derived, written for the reader's convenience
            data = {k: v for k, v in data.items() if k != "steps_per_episode"}
        return data

    def __getitem__(self, key: str) -> float:
        return self.metrics[metric(key).key]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def steps_per_episode(self) -> float:
        return self.steps / self.n


FLAT_KEYS: Final = {"U": "U", "A_e": "A_e", "S_npc": "S_npc", "D": "D", "CR": "CR", "pass_rate": "pass", "solve_rate": "solve"}
"""an aggregate's metrics as documents spelled them before the registry (all flat, ``pass_rate``)"""


def migrate_flat_aggregate(data: Any) -> Any:
    """An aggregate written before the registry (``{"U": .., "pass_rate": .., "solve_rate": .., "n": ..}``)
    in today's form (``{"metrics": {"U": .., "pass": .., "solve": ..}, "n": ..}``); anything else as it is.
    A record of old ``metrics-v1`` had no ``solve_rate``:
    it stays missing and the record is refused, as its contract would be."""
    if not isinstance(data, dict) or "metrics" in data or "pass_rate" not in data:
        return data
    rest = {k: v for k, v in data.items() if k not in FLAT_KEYS}
    return {**rest, "metrics": {new: data[old] for old, new in FLAT_KEYS.items() if old in data}}


def metric_of(m: Metrics, key: str) -> float | None:
    """One scored episode's value of the registered metric ``key``: its signal's value (None when
    it has none), or 1.0 / 0.0 for an outcome (``pass``, ``solve``)."""
    value = getattr(m, metric(key).field)
    return float(value) if isinstance(value, bool) else value.value


def aggregate(episodes: Sequence[EpisodeRecord]) -> Aggregate:
    """Means of each registered metric (a missing signal value counts 0); PassRate = share of
    passed episodes; SolveRate = share of solved episodes (every decision finalized, no guard
    broken); parse-failure rate = share of steps whose reply was unparseable or illegal (both
    executed as ``wait`` with the penalty); endpoint-failure rate = share of steps that got no
    reply at all (``failure == "endpoint"``), counted apart: a dead endpoint is not a bad reply.
    Episodes scored under another metrics contract are refused (:func:`require_contract`)."""
    if not episodes:
        raise ValueError("cannot aggregate zero episodes")
    require_contract(episodes)
    ms = [e.metrics or episode_metrics(e) for e in episodes]
    means = {k: fmean(metric_of(m, k) or 0.0 for m in ms) for k in KEYS}
    steps = [s for e in episodes for s in e.steps]
    endpoint = sum(s.action.failure == "endpoint" for s in steps)
    failed = sum(s.action.parse_status != "ok" and s.action.failure is None for s in steps)
    rate = lambda n: n / len(steps) if steps else 0.0  # noqa: E731
    return Aggregate(metrics=means, n=len(ms), steps=len(steps), parse_failure_rate=rate(failed), endpoint_failure_rate=rate(endpoint))


def group_by(episodes: Iterable[EpisodeRecord], key: str) -> dict[str, list[EpisodeRecord]]:
    out: dict[str, list[EpisodeRecord]] = {}
    for e in episodes:
        out.setdefault(getattr(e, key), []).append(e)
    return out

