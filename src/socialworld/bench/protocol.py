"""ASCENT-Bench (contract §8, §5.3): the lifelong protocol over arms A, B, C and reference rows.

* **A** — the base model, untrained: the loop's cycle-0 evaluation (greedy decoding on fixed
  seeds, so one evaluation serves every cycle);
* **B** — the same model through the closed loop (:func:`socialworld.learn.loop.run_loop` with
  progressive unlocking: L0; L0+L1; all), trained before each cycle's evaluation;
* **C** — a strong proxy: ``--proxy <policy spec>`` when given (an ``openai:<model>@<url>`` endpoint, or
  a trained policy ``<model>+<run folder>``), else the ``expert`` policy;
* ``oracle`` and ``random`` — reference rows.

Every arm is evaluated on the same evaluation seeds (``eval_episodes`` per unlocked scenario);
training seeds never overlap them. Static arms (A, C, references) are deterministic on fixed
seeds, so each (scenario, seed) is run once and reused in every cycle that evaluates it.

Run folder: ``<out>/loop/`` (the B arm's resumable loop, with A as its cycle 0),
``<out>/arms/<arm>/episodes.jsonl``, ``<out>/bench.json``, ``<out>/report.md``,
``<out>/report.html``; with ``--npc-voice``, ``<out>/template/<arm>.jsonl`` (each arm's last-cycle
episodes played again with the template lines: how much of the skill survives people's language);
all through :class:`~socialworld.rundir.RunDir`.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from statistics import fmean
from typing import Any, Callable, Sequence

from socialworld.agents.lm.backends import EndpointFailure
from socialworld.agents.models import SCRIPTED, find_adapters
from socialworld.agents.registry import make_voice
from socialworld.bench.config import PRESETS, BenchConfig
from socialworld.bench.document import (
    ArmDiagnostics,
    BenchDoc,
    BenchJudge,
    Coverage,
    HeldOut,
    SameRun,
    SuiteDoc,
    Thresholds,
    VariantRow,
)
from socialworld.layout import BENCH_LOOP, cycle_files
from socialworld.learn.checks import check_model, check_unlockable, held_out
from socialworld.learn.config import LoopConfig, Progress
from socialworld.learn.documents import CycleSummary, read_train_record
from socialworld.learn.loop import regate, run_loop
from socialworld.learn.runconfig import EXECUTION_FIELDS, RunConfig, read_resumed
from socialworld.learn.scenarios import RunScenarios, run_scenarios
from socialworld.metric_registry import KEYS, PASS
from socialworld.metrics.core import CR_THRESHOLD, D_THRESHOLD, METRICS_CONTRACT, aggregate, group_by
from socialworld.metrics.diagnostics import coverage, failure_counts
from socialworld.metrics.lifelong import TIERS, RTable, forgetting, forgetting_intervals, forward_transfer, lost_episodes, r_table, unlock_cycles
from socialworld.metrics.stats import Interval, metric_interval, paired_difference
from socialworld.records import EpisodeRecord, JudgeRec, read_document, read_jsonl, write_jsonl
from socialworld.rollout.config import NPC_VOICE_TEMPLATE
from socialworld.rollout.evaluate import episode_seeds, first_endpoint_error, voice_effect
from socialworld.rollout.judge import checked_judgement, judge_agreement, judge_episodes, read_judged, summarise, write_judged
from socialworld.rollout.runner import EpisodeJob
from socialworld.rollout.scale import pmap, ray_init, rollouts
from socialworld.rundir import RunDir
from socialworld.world.spec import capped

BENCH_VERSION = "ascent-bench-v1"
REFERENCES = ("oracle", "random")


def bench_scenarios(cfg: BenchConfig, loop_dir: str | Path) -> RunScenarios:
    """The bench's scenarios, checked before any work starts; ids also name the user scenarios its
    loop (in ``loop_dir``) stored, so a bench is resumed without the user's files."""
    scenarios = run_scenarios(cfg.scenario_names(), TIERS, loop_dir)
    check_unlockable(cfg.loop_config(), scenarios)
    held_out(cfg.loop_config(), scenarios)
    return scenarios


def recorded(cfg: BenchConfig, scenarios: RunScenarios) -> BenchConfig:
    """``cfg`` as its run records it: scenarios of your own by id (none named: the preset's), held-out
    scenarios by id."""
    return replace(cfg, scenarios=scenarios.names if cfg.scenarios else (), holdout=held_out(cfg.loop_config(), scenarios))


def eval_jobs(cfg: BenchConfig, scenarios: RunScenarios | None = None) -> list[EpisodeJob]:
    """Every evaluation episode any cycle may run: the same seeds for every arm."""
    p = PRESETS[cfg.preset]
    specs = [capped(s, p.max_turns) for s in (scenarios or bench_scenarios(cfg, Path(cfg.out) / BENCH_LOOP)).specs]
    return [EpisodeJob(s, seed) for s in specs for seed in episode_seeds(cfg.seed, s.id, p.eval_episodes)]


def arm_policies(cfg: BenchConfig) -> dict[str, str]:
    """Static arms besides A: C (proxy or expert) and the reference rows."""
    return {"C": cfg.proxy or "expert", **{r: r for r in REFERENCES}}


@dataclass
class BenchResult:
    config: BenchConfig
    tiers_per_cycle: dict[int, list[str]]
    per_cycle: dict[str, dict[int, list[EpisodeRecord]]]
    """arm -> cycle -> evaluation episodes"""
    loop_summaries: list[CycleSummary]
    doc: BenchDoc
    """bench.json"""


def _subset(eps: Sequence[EpisodeRecord], tiers: Sequence[str]) -> list[EpisodeRecord]:
    return [e for e in eps if e.tier in tiers]


def run_bench(cfg: BenchConfig, log: Callable[[str], None] = print, progress: Progress | None = None) -> BenchResult:
    loop_dir = Path(cfg.out) / BENCH_LOOP
    scenarios = bench_scenarios(cfg, loop_dir)  # checked before the run folder is made
    check_model(cfg.loop_config())  # ... as is the model: a typo left config.yaml behind, which refused the fix
    if cfg.ray:
        ray_init(cfg.ray)  # a wrong address fails here, not after the first cycles
    run = RunDir(cfg.out)
    run.write_config(RunConfig(recorded(cfg, scenarios), scenarios.user).document(), read=read_resumed)
    summaries = run_loop(cfg.loop_config(), log=log, progress=progress)
    jobs = eval_jobs(cfg, scenarios)
    voice = functools.cache(lambda: make_voice(cfg.npc_voice, batch_size=cfg.lm_batch_size))  # loaded by the first arm run
    for arm, spec in arm_policies(cfg).items():
        rel = f"arms/{arm}/episodes.jsonl"

        def evaluate_arm(p: Path, spec: str = spec, arm: str = arm) -> None:
            tick = progress(f"arm {arm} ({spec})", len(jobs)) if progress else None
            lm = {} if spec in SCRIPTED else {"batch_size": cfg.lm_batch_size}
            eps = rollouts(spec, jobs, ray=cfg.ray, seed=cfg.seed, tick=tick, voice=voice(), **lm)
            failed = aggregate(eps).endpoint_failure_rate
            if failed > cfg.max_endpoint_failures:  # a dead endpoint's scores would only measure the endpoint
                kept = p.parent.parent / "failed-episodes.jsonl"  # p is inside the artifact's temporary folder
                write_jsonl(kept, eps)
                raise EndpointFailure(f"arm {arm} ({spec}): the endpoint gave no reply on {failed:.0%} of the steps (more than "
                                      f"max_endpoint_failures {cfg.max_endpoint_failures:g}; the first error: "
                                      f"{first_endpoint_error(eps)}); "
                                      f"not scored; its records are in {kept}; rerun to retry the arm")
            write_jsonl(p, eps)

        if run.produce(rel, f"eval:{spec}", evaluate_arm):
            log(f"arm {arm} ({spec}): evaluated {len(jobs)} episodes")
    tiers_per_cycle = {s.cycle: s.tiers for s in summaries}
    kept = recorded(cfg, scenarios)
    per_cycle = arm_episodes(cfg.out, tiers_per_cycle, list(arm_policies(cfg)), kept.holdout)
    held = holdout_episodes(cfg.out, max(tiers_per_cycle), list(arm_policies(cfg)), kept.holdout)
    doc = bench_document(kept, tiers_per_cycle, per_cycle, summaries, held)
    judged = _judge_arms(cfg, run, {arm: cyc[max(cyc)] for arm, cyc in per_cycle.items()}, scenarios, log)
    templated = _template_arms(cfg, run, per_cycle, scenarios, log)
    if templated:
        doc = doc.model_copy(update={"voice_effect": {arm: voice_effect(templated[arm], cyc[max(cyc)], seed=cfg.seed)
                                                      for arm, cyc in per_cycle.items()}})
    if judged:
        by_id = {r.episode_id: r for arm_recs in judged.values() for r in arm_recs}
        last_eps = [e for cyc in per_cycle.values() for e in cyc[max(cyc)]]
        doc = doc.model_copy(update={"judge": BenchJudge(judge=cfg.judge, arms={arm: summarise(recs).as_dict() for arm, recs in judged.items()},
                                                         agreement=judge_agreement(last_eps, by_id).as_dict())})
    run.derive("bench.json", "bench", doc.to_json(),  # B's episodes are the loop's
               inputs=[f"arms/{a}/episodes.jsonl" for a in arm_policies(cfg)] + [f"judge/{a}.jsonl" for a in judged]
               + [f"template/{a}.jsonl" for a in templated])
    from socialworld.bench.report import write_reports

    write_reports(run, doc, per_cycle, held)
    return BenchResult(cfg, tiers_per_cycle, per_cycle, summaries, doc)


def _judge_arms(cfg: BenchConfig, run: RunDir, last: dict[str, list[EpisodeRecord]], scenarios: RunScenarios,
                log: Callable[[str], None]) -> dict[str, list[JudgeRec]]:
    """With ``cfg.judge``: the judge's record of each arm's last-cycle episodes (``judge/<arm>.jsonl``,
    made once), by arm; else nothing."""
    if not cfg.judge:
        return {}
    specs = {s.id: capped(s, PRESETS[cfg.preset].max_turns) for s in scenarios.specs}
    out = {}
    for arm, eps in last.items():
        rel = f"judge/{arm}.jsonl"
        # the arms this folder made are its inputs; A and B come from the loop's folder, whose
        # evaluations a resumed bench never remakes
        inputs = [f"arms/{arm}/episodes.jsonl"] if run.complete(f"arms/{arm}/episodes.jsonl") else []
        def judged(p: Path, eps: list[EpisodeRecord] = eps) -> None:
            write_judged(p, checked_judgement(cfg.judge, judge_episodes(cfg.judge, eps, specs, batch_size=cfg.lm_batch_size),
                                              cfg.max_endpoint_failures))

        if run.produce(rel, f"judge:{cfg.judge}", judged, inputs=inputs):
            log(f"arm {arm}: judged {len(eps)} last-cycle episodes with {cfg.judge}")
        out[arm] = list(read_judged(run.path(rel)).values())
    return out


def _template_arms(cfg: BenchConfig, run: RunDir, per_cycle: dict[str, dict[int, list[EpisodeRecord]]],
                   scenarios: RunScenarios, log: Callable[[str], None]) -> dict[str, list[EpisodeRecord]]:
    """With ``cfg.npc_voice``: each arm's last-cycle episodes played again by the same policy (A the base
    model, B it with the adapters its last evaluation deployed, the static arms their specs) on the same
    scenarios and seeds with the template lines (``template/<arm>.jsonl``, made once), by arm; else nothing."""
    if cfg.npc_voice == NPC_VOICE_TEMPLATE:
        return {}
    last = max(c for cyc in per_cycle.values() for c in cyc)
    jobs = eval_jobs(cfg, scenarios)
    specs = {"A": cfg.model, "B": cfg.model, **arm_policies(cfg)}
    adapters = {t: str(p) for t, p in find_adapters(Path(cfg.out) / BENCH_LOOP / f"cycle-{last}").items()}
    out = {}
    for arm, cyc in per_cycle.items():
        played = {(e.scenario_id, e.seed) for e in cyc[last]}
        mine = [j for j in jobs if (j.spec.id, j.seed) in played]
        rel = f"template/{arm}.jsonl"
        inputs = [f"arms/{arm}/episodes.jsonl"] if run.complete(f"arms/{arm}/episodes.jsonl") else []

        def replay(p: Path, spec: str = specs[arm], arm: str = arm, mine: list[EpisodeJob] = mine) -> None:
            lm: dict[str, Any] = {} if spec in SCRIPTED else {"batch_size": cfg.lm_batch_size, **({"adapters": adapters} if arm == "B" else {})}
            write_jsonl(p, rollouts(spec, mine, seed=cfg.seed, **lm))

        if run.produce(rel, f"eval:{specs[arm]}:template", replay, inputs=inputs):
            log(f"arm {arm}: its {len(mine)} last-cycle episodes played again with the template lines")
        out[arm] = read_jsonl(run.path(rel))
    return out


def arm_episodes(out: str | Path, tiers_per_cycle: dict[int, list[str]], proxies: Sequence[str],
                 holdout: Sequence[str] = ()) -> dict[str, dict[int, list[EpisodeRecord]]]:
    """arm -> cycle -> evaluation episodes, read from a bench folder: B's are its loop's evaluation
    of each cycle; A's (the loop's cycle 0) and each of ``proxies``' (``arms/<arm>/episodes.jsonl``)
    are one evaluation of every tier, cut to the tiers each cycle unlocked; the ``holdout`` scenarios'
    episodes are left out (:func:`holdout_episodes`)."""
    loop_dir = Path(out) / BENCH_LOOP
    static = {"A": read_jsonl(loop_dir / cycle_files(0).eval),
              **{a: [e for e in read_jsonl(Path(out) / f"arms/{a}/episodes.jsonl") if e.scenario_id not in holdout] for a in proxies}}
    per_cycle: dict[str, dict[int, list[EpisodeRecord]]] = {arm: {} for arm in ("A", "B", *proxies)}
    for c, tiers in tiers_per_cycle.items():
        per_cycle["B"][c] = read_jsonl(loop_dir / cycle_files(c).eval)
        for arm, eps in static.items():
            per_cycle[arm][c] = _subset(eps, tiers)
    return per_cycle


def holdout_episodes(out: str | Path, last: int, proxies: Sequence[str], holdout: Sequence[str]) -> dict[str, list[EpisodeRecord]]:
    """arm -> its episodes on the ``holdout`` scenarios, read from a bench folder: A's the loop's cycle 0
    made there, B's its cycle ``last``, each of ``proxies``' from its one evaluation (empty without
    held-out scenarios)."""
    if not holdout:
        return {}
    loop_dir = Path(out) / BENCH_LOOP
    return {"A": read_jsonl(loop_dir / cycle_files(0).holdout), "B": read_jsonl(loop_dir / cycle_files(last).holdout),
            **{a: [e for e in read_jsonl(Path(out) / f"arms/{a}/episodes.jsonl") if e.scenario_id in holdout] for a in proxies}}


def remake_reports(out: str | Path, log: Callable[[str], None] = print) -> BenchDoc | SuiteDoc:
    """A finished bench's or suite's reports made again from its stored document (``bench.json``
    or ``suite.json``, any version: an older one is rewritten in this version's form first, and
    the reports follow it) and, for a bench, the episodes in its folder. Nothing is run."""
    from socialworld.bench.report import write_reports, write_suite_reports

    if not Path(out).is_dir():
        raise ValueError(f"{out}: no such folder")
    run = RunDir(out)
    if run.complete("suite.json"):
        suite = read_document(run.path("suite.json"), SuiteDoc)
        if run.derive("suite.json", "suite", suite.to_json()):
            log(f"{run.path('suite.json')}: rewritten as {suite.schema_version}")
        write_suite_reports(run, suite)
        return suite
    if not run.complete("bench.json"):
        raise ValueError(f"{out}: no finished bench or suite here (its manifest lists no bench.json or suite.json)")
    doc = read_document(run.path("bench.json"), BenchDoc)
    proxies = [a for a in doc.main if a not in ("A", "B")]
    inputs = [f"arms/{a}/episodes.jsonl" for a in proxies] + [f"judge/{a}.jsonl" for a in (doc.judge.arms if doc.judge else {})] \
        + [f"template/{a}.jsonl" for a in doc.voice_effect]
    if run.derive("bench.json", "bench", doc.to_json(), inputs=inputs):
        log(f"{run.path('bench.json')}: rewritten as {doc.schema_version}")
    holdout = doc.holdout.scenarios if doc.holdout else []
    write_reports(run, doc, arm_episodes(out, {int(c): t for c, t in doc.tiers_per_cycle.items()}, proxies, holdout),
                  holdout_episodes(out, max(int(c) for c in doc.tiers_per_cycle), proxies, holdout))
    return doc


def bench_document(cfg: BenchConfig, tiers_per_cycle: dict[int, list[str]], per_cycle: dict[str, dict[int, list[EpisodeRecord]]],
                   loop_summaries: Sequence[CycleSummary] = (), holdout: dict[str, list[EpisodeRecord]] | None = None) -> BenchDoc:
    """Every number of the report, computed from records: per-arm metrics with intervals at the
    last cycle (the main table), paired B-A and B-C differences (every metric, and PassRate per
    tier), R tables, forgetting, forward transfer and unlock cycles, the loop's per-cycle
    training summary, and with ``holdout`` (arm -> episodes on the scenarios B never trained on) the
    same main and paired numbers there."""
    kw = {"seed": cfg.seed, "resamples": cfg.resamples}
    held = None
    if holdout:
        held = HeldOut(scenarios=sorted({e.scenario_id for e in holdout["B"]}),
                       main={arm: {k: metric_interval(eps, k, **kw) for k in KEYS} for arm, eps in holdout.items()},
                       paired={f"B-{o}": {k: paired_difference(holdout[o], holdout["B"], k, **kw) for k in KEYS}
                               for o in ("A", "C") if o in holdout},
                       by_scenario={arm: {sid: aggregate(v)[PASS] for sid, v in sorted(group_by(eps, "scenario_id").items())}
                                    for arm, eps in holdout.items()})
    last = max(tiers_per_cycle)
    main = {arm: {k: metric_interval(cyc[last], k, **kw) for k in KEYS} for arm, cyc in per_cycle.items()}
    paired = {f"B-{o}": {k: paired_difference(per_cycle[o][last], per_cycle["B"][last], k, **kw) for k in KEYS}
              for o in per_cycle if o != "B"}
    ratios = {f"B/{o}": {k: _ratio(main["B"][k].mean, main[o][k].mean) for k in KEYS} for o in ("A", "C")}
    tiers = {arm: group_by(per_cycle[arm][last], "tier") for arm in ("A", "B", "C")}
    by_tier = {f"B-{o}": {t: paired_difference(tiers[o][t], eps, PASS, **kw) for t, eps in sorted(tiers["B"].items())}
               for o in ("A", "C")}
    r = {arm: r_table(cyc, **kw) for arm, cyc in per_cycle.items()}
    return BenchDoc(
        version=BENCH_VERSION,
        metrics_contract=METRICS_CONTRACT,
        config={k: v for k, v in _plain(asdict(cfg)).items() if k not in EXECUTION_FIELDS},
        preset=_plain(asdict(PRESETS[cfg.preset])),
        thresholds=Thresholds(CR=CR_THRESHOLD, D=D_THRESHOLD, guards="any broken guard fails"),
        steps_per_episode={arm: fmean(len(e.steps) for e in cyc[last]) for arm, cyc in per_cycle.items()},
        tiers_per_cycle={str(c): t for c, t in tiers_per_cycle.items()},
        episodes_per_arm={arm: sum(len(v) for v in cyc.values()) for arm, cyc in per_cycle.items()},
        main=main,
        paired=paired,
        paired_by_tier=by_tier,
        ratios=ratios,
        R={arm: _r_doc(tab) for arm, tab in r.items()},
        forgetting={arm: forgetting(tab) for arm, tab in r.items()},
        forgetting_intervals={arm: forgetting_intervals(cyc, **kw) for arm, cyc in per_cycle.items()},
        lost=lost_episodes(per_cycle["B"], per_cycle["C"][last] if "C" in per_cycle else ()),
        forward_transfer={arm: forward_transfer(tab, r["A"]) for arm, tab in r.items() if arm != "A"},
        unlock_cycles=unlock_cycles(r["B"]),
        diagnostics={arm: ArmDiagnostics(coverage=Coverage.model_validate(coverage(cyc[last])), primary_failures=failure_counts(cyc[last]))
                     for arm, cyc in per_cycle.items()},
        loop=list(loop_summaries),
        holdout=held,
    )


def _plain(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` as its JSON reads back (tuples as lists), so a document equals its file."""
    return json.loads(json.dumps(d))


def _r_doc(tab: RTable) -> dict[str, dict[str, Interval]]:
    """An R table as documents key it (cycles as text)."""
    return {str(c): dict(row) for c, row in tab.items()}


def phase_seconds(out: str | Path) -> list[tuple[str, float]]:
    """Wall seconds of each artifact a bench made (its loop's first, in the order they were
    made; resumed runs list what this and earlier invocations made), from the ``timings.json``
    side files of :class:`~socialworld.rundir.RunDir`."""
    return [(f"{BENCH_LOOP}/{k}", v) for k, v in RunDir(Path(out) / BENCH_LOOP).timings().items()] + list(RunDir(out).timings().items())


def _ratio(b: float, a: float) -> float | None:
    """B/X as a ratio of means; undefined (None) when X's mean is 0."""
    return None if a == 0 else b / a


# ------------------------------------------------------------------ suites

SUITES: dict[str, dict[str, dict]] = {
    # M0 (untrained) is every variant's cycle 0; each entry overrides the full loop's settings
    "methods": {
        # behaviour cloning of the expert's trajectories alone: no DAgger labels, no replay, one track
        # M1 and M3 keep the step budget of the cloning recipe they were written for (an SFT or DPO step
        # on a plain adapter reads the whole prompt with gradient: about three times an activated step)
        "M1-sft": {"tracks": ("action",), "train": {"method": "sft", "activated": False, "steps": 130},
                   "sleep": {"wake_chosen": "best", "replay": 0.0}},
        "M2-grpo": {"train": {"method": "grpo", "steps": 20, "learning_rate": 1e-4, "activated": False}, "tracks": ("action",),
                    "sleep": {"gating": "off", "replay": 0.0}},
        "M3-dpo-trajectory-ungated": {"train": {"method": "dpo", "learning_rate": 1e-4, "activated": False, "steps": 130},
                                      "tracks": ("dialogue",),
                                      "sleep": {"gating": "off", "replay": 0.0}},
        "M4-full": {},
    },
    "ablations": {
        "E0-full": {},
        "E1-merged-tracks": {"merged": True},
        "E2-no-provenance": {"sleep": {"gating": "off"}},
        "E3-action-only": {"tracks": ("action",)},
        "E4-dialogue-only": {"tracks": ("dialogue",)},
        "E5-threshold-0.3": {"sleep": {"quality_threshold": 0.3}},
        "E5-threshold-0.5": {"sleep": {"quality_threshold": 0.5}},
        "E5-threshold-0.7": {"sleep": {"quality_threshold": 0.7}},
        "E6-static": {"unlock": "fixed"},
    },
}


def variant_config(cfg: BenchConfig, suite: str, name: str, reuse_from: str = "") -> LoopConfig:
    """The loop of one suite variant: the bench's loop with the variant's overrides, in
    ``<out>/<suite>/<name>``, reusing the first variant's untrained artifacts (same data)."""
    over = dict(SUITES[suite][name])
    base = cfg.loop_config(out=str(Path(cfg.out) / suite / name), reuse_from=reuse_from)
    if "train" in over:
        over["train"] = replace(base.train, **over["train"])
    if "sleep" in over:
        over["sleep"] = replace(base.sleep, **over["sleep"])
    return replace(base, **over)


ABLATIONS_JUDGE = "bundled"
"""the ablations suite's LM judge when ``--judge`` names none: its rankings are the ``proxy``
evidence strict gating keeps out of the action track and E2 lets in"""

GATING_ONLY = ("quality_threshold", "template_cap", "gating")
"""the settings a variant may change for :func:`same_by_construction` to check it without training
(replay also draws on earlier cycles' pairs, which re-gating does not redo)"""


def same_by_construction(first: LoopConfig, variants: dict[str, LoopConfig], cycles: int, name: str = "the full recipe") -> dict[str, str]:
    """The variants whose run would be ``first``'s (already run) bit for bit: each differs from it
    only in :data:`GATING_ONLY` settings, and re-gating ``first``'s candidate pairs under its settings
    (:func:`socialworld.learn.loop.regate`) keeps exactly the pairs ``first`` kept in every one of
    ``cycles`` cycles, so it trains on the same pairs from the same adapters, deploys the same policy
    and meets the same states. Returns why, per such variant (``name``: ``first``'s, in the reasons);
    the others are not named."""
    def gating_only(lc: LoopConfig) -> bool:
        same_gating = replace(lc.sleep, **{k: getattr(first.sleep, k) for k in GATING_ONLY})
        return replace(lc, out=first.out, reuse_from=first.reuse_from, sleep=same_gating) == first

    left = {v: lc for v, lc in variants.items() if gating_only(lc)}
    for c in range(1, cycles + 1):
        if not left:
            break
        got = regate(first.out, c, {v: lc.sleep for v, lc in left.items()})
        left = {v: lc for v, lc in left.items() if got[v]["same_as_run"]}
    return {v: (f"under its gating settings {name}'s candidate pairs keep exactly the pairs {name} kept, in each of "
                f"{cycles} cycles: the same training, so the same run") for v in left}


def _reward_variance(lc: LoopConfig, cycles: Sequence[int]) -> float | None:
    """GRPO variants: the share of the action track's groups whose rewards were not all equal (1 -
    TRL's ``frac_reward_zero_std``, over every logged step of every cycle); None for other methods."""
    zero = []
    for c in cycles:
        adapter = Path(lc.out) / cycle_files(c).adapter("action")
        if c and adapter.is_dir():
            zero += read_train_record(adapter).reward_zero_std
    return 1 - fmean(zero) if zero else None


def _same_tasks(eps: Sequence[EpisodeRecord], like: Sequence[EpisodeRecord]) -> list[EpisodeRecord]:
    """The episodes of ``eps`` whose (scenario, seed) an episode of ``like`` has."""
    tasks = {(e.scenario_id, e.seed) for e in like}
    return [e for e in eps if (e.scenario_id, e.seed) in tasks]


def _training_task() -> dict:
    """Ray resources of a task that trains: a GPU where this machine has one (a Ray task that asks
    for none sees no GPU), else one CPU."""
    import torch

    return {"num_gpus": 1} if torch.cuda.is_available() else {}


def _variant_loop(lc: LoopConfig) -> list[CycleSummary]:
    """One suite variant's loop (a Ray task under ``BenchConfig.ray``; its lines go to the worker's log)."""
    return run_loop(lc, log=print)


def full_variant(suite: str) -> str:
    """The suite's variant without overrides (M4-full, E0-full): the recipe the others are compared with."""
    return next(name for name, over in SUITES[suite].items() if not over)


def run_suite(cfg: BenchConfig, suite: str, log: Callable[[str], None] = print, progress: Progress | None = None) -> SuiteDoc:
    """Every variant of ``suite`` under the same protocol and budget; returns (and writes to
    ``<out>/<suite>/suite.json``, ``report.md`` and ``report.html``) per-variant last-cycle metrics with intervals,
    paired differences against the untrained model (M0, the loops' shared cycle 0) and against the
    full recipe, R tables and forgetting. The full recipe runs first (its untrained artifacts are
    copied by the others); a variant that would repeat its run bit for bit
    (:func:`same_by_construction`) is not run, and its row says so instead of reporting a tie."""
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; known: {', '.join(SUITES)}")
    if suite == "ablations" and not cfg.judge:  # without a judge every pair is the simulator's: E2 could not differ
        cfg = replace(cfg, judge=ABLATIONS_JUDGE)
    kw = {"seed": cfg.seed, "resamples": cfg.resamples}
    full = full_variant(suite)
    scenarios = bench_scenarios(cfg, Path(cfg.out) / suite / full)  # the first variant's loop
    if cfg.ray:
        ray_init(cfg.ray)
    run = RunDir(Path(cfg.out) / suite)
    cfg_doc = RunConfig(recorded(cfg, scenarios), scenarios.user).document()
    first = variant_config(cfg, suite, full, reuse_from="")
    check_model(first)  # before the run folder: a judge or model that does not load fails now
    run.write_config(cfg_doc, read=read_resumed)
    log(f"{suite}: {full}")
    runs = {full: run_loop(first, log=log, progress=progress)}  # the untrained artifacts the others reuse
    configs = {name: variant_config(cfg, suite, name, reuse_from=first.out) for name in SUITES[suite] if name != full}
    same = same_by_construction(first, configs, cfg.cycles, full)
    for name, why in same.items():
        log(f"{suite}: {name} is {full} by construction ({why}): not run")
    todo = {name: lc for name, lc in configs.items() if name not in same}
    if cfg.ray and todo:  # independent runs over the shared untrained artifacts: one Ray task each
        log(f"{suite}: {', '.join(todo)} as Ray tasks")
        runs.update(zip(todo, pmap(_variant_loop, list(todo.values()), ray=cfg.ray, options=_training_task())))
    else:
        for name, lc in todo.items():
            log(f"{suite}: {name}")
            runs[name] = run_loop(lc, log=log, progress=progress)
    configs[full] = first
    tiers = {s.cycle: s.tiers for s in runs[full]}
    last = max(tiers)
    untrained = read_jsonl(Path(first.out) / cycle_files(0).eval)
    per_variant = {name: {c: read_jsonl(Path(configs[name].out) / cycle_files(c).eval) for c in tiers} for name in runs}
    base_last = _same_tasks(untrained, per_variant[full][last])
    rows: dict[str, VariantRow | SameRun] = {"M0-untrained" if suite == "methods" else "untrained": VariantRow(
        metrics={k: metric_interval(base_last, k, **kw) for k in KEYS},
        R=_r_doc(r_table({c: _subset(untrained, t) for c, t in tiers.items()}, **kw)))}
    for name in SUITES[suite]:
        if name in same:
            rows[name] = SameRun(same_as=full, why=same[name])
            continue
        per_cycle, summaries = per_variant[name], runs[name]
        r = r_table(per_cycle, **kw)
        # on the episodes both evaluated (E6 evaluates every tier from cycle 1; with one cycle, the others one tier)
        full_last = _same_tasks(per_variant[full][last], per_cycle[last])
        rows[name] = VariantRow(
            metrics={k: metric_interval(per_cycle[last], k, **kw) for k in KEYS},
            vs_untrained={k: paired_difference(_same_tasks(untrained, per_cycle[last]), per_cycle[last], k, **kw) for k in KEYS},
            vs_full=({k: paired_difference(full_last, _same_tasks(per_cycle[last], full_last), k, **kw) for k in KEYS}
                     if name != full else None),
            R=_r_doc(r),
            forgetting=forgetting(r),
            pairs=[s.pairs for s in summaries], excluded=[s.excluded for s in summaries],
            groups_with_reward_variance=_reward_variance(configs[name], list(tiers)),
        )
    doc = SuiteDoc(version=BENCH_VERSION, metrics_contract=METRICS_CONTRACT, suite=suite, config=cfg_doc,
                   preset=_plain(asdict(PRESETS[cfg.preset])), full=full, variants=rows)
    from socialworld.bench.report import write_suite_reports

    # a variant run again since (its folder removed) changes the table, and the reports (its inputs) follow it
    run.derive("suite.json", "suite", doc.to_json())
    write_suite_reports(run, doc)
    return doc
