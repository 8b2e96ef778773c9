"""ASCENT-Bench (DESIGN §8, §5.3): the lifelong protocol over arms A, B, C and reference rows.

* **A** — the base model, untrained: the loop's cycle-0 evaluation (greedy decoding on fixed
  seeds, so one evaluation serves every cycle);
* **B** — the same model through the closed loop (:func:`socialworld.loop.run_loop` with
  progressive unlocking: L0; L0+L1; all), trained before each cycle's evaluation;
* **C** — a strong proxy: ``--proxy <policy spec>`` when given (an ``openai:<model>@<url>`` endpoint, or
  a trained policy ``<model>+<run folder>``), else the ``expert`` policy;
* ``oracle`` and ``random`` — reference rows.

Every arm is evaluated on the same evaluation seeds (``eval_episodes`` per unlocked scenario);
training seeds never overlap them. Static arms (A, C, references) are deterministic on fixed
seeds, so each (scenario, seed) is run once and reused in every cycle that evaluates it.

Run folder: ``<out>/loop/`` (the B arm's resumable loop, with A as its cycle 0),
``<out>/arms/<arm>/episodes.jsonl``, ``<out>/bench.json``, ``<out>/report.md``,
``<out>/report.html``; all through :class:`~socialworld.rundir.RunDir`.
"""

from __future__ import annotations

import json
from statistics import fmean
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Literal, Sequence

from .judge import check_judge, checked_judgement, judge_episodes, read_judged, summarise, write_judged
from .diagnostics import coverage, failure_counts
from .evaluate import EndpointFailure, episode_seeds, first_endpoint_error
from .metrics import CR_THRESHOLD, D_THRESHOLD, METRICS_CONTRACT, aggregate
from .lifelong import TIERS, forgetting, forward_transfer, r_table, unlock_cycles
from .config import at_least, one_of
from .scale import RAY_HELP, check_ray, pmap, ray_init, rollouts
from .lm.models import parse_model_spec
from .loop import EXECUTION_FIELDS, LoopConfig, Progress, check_unlockable, config_doc, run_loop
from .policies import SCRIPTED
from .records import EpisodeRecord, JudgeRec, atomic_write_text, read_jsonl, write_jsonl
from .rundir import RunDir
from .runner import EpisodeJob
from .sleep import SleepConfig
from .spec import RunScenarios, capped, run_scenarios
from .stats import PASS, SOLVE, metric_interval, paired_difference
from .train import TrainConfig

BENCH_VERSION = "ascent-bench-v1"
MAIN_METRICS = ("U", "A_e", "S_npc", "D", "CR", PASS, SOLVE)
REFERENCES = ("oracle", "random")


ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

RECIPE_SLEEP = SleepConfig(reference_pairs="own", wake_chosen="continuation", label_gate="disagree", replay=0.5)
"""The sleep that teaches (DAgger): the expert's own actions at its states on training seeds, the
expert's label at every state of the policy's wake where it disagrees, and earlier cycles' pairs
replayed (up to half as many as this cycle's: no forgetting, without drowning the new tier)."""

RECIPE_TRAIN = TrainConfig(method="sft", steps=130, max_epochs=3.0, batch_size=4, learning_rate=1e-3,
                           target_modules=ALL_LINEAR, lora_upper=0.5, balance=4)
"""Behaviour cloning of those labels with TRL's SFTTrainer: LoRA on every linear layer of the upper
half, lr 1e-3 (what fitted the labels, docs/design.md), each action kind weighted toward the most common one (rows repeated up to 4
times: the cloned policy otherwise proposes where the expert negotiates or finalizes), bf16 where native."""


@dataclass(frozen=True)
class Preset:
    """The budget and recipe of a bench run."""

    eval_episodes: int
    train_episodes: int
    """wake episodes of the deployed policy per scenario per cycle (language-model time)"""
    reference_episodes: int = 0
    """expert episodes per scenario per cycle on training seeds (no language-model time)"""
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
    # the protocol's 45 evaluation episodes per arm, the recipe that learns, within 40 minutes on a
    # 2-core CPU (measured: see the README)
    "default": Preset(eval_episodes=3, train_episodes=1, reference_episodes=3),
    # the full budget
    "paper": Preset(eval_episodes=3, train_episodes=8, reference_episodes=16, train=replace(RECIPE_TRAIN, steps=400),
                   dialogue_steps=100),
}


@dataclass(frozen=True)
class BenchConfig:
    out: str = field(default="runs/bench", metadata={"help": "run folder (resumed if it exists with the same config)"})
    model: str = field(default="bundled", metadata={"help": "base model of arms A and B: bundled or a local folder"})
    preset: Literal["smoke", "default", "paper"] = field(default="default", metadata={"help": "budget: smoke, default or paper"})
    proxy: str = field(default="", metadata={"help": (
        "arm C: a policy spec, e.g. openai:<model>@<url>, or a trained policy as <model>+<run folder> "
        "(default: the expert policy)")})
    cycles: int = field(default=3, metadata={"help": "protocol cycles (cycle c unlocks the first c tiers)"})
    unlock: Literal["progressive", "adaptive", "fixed"] = field(default="progressive", metadata={
        "help": "progressive (the protocol), adaptive (unlock once the newest tier's pass rate reaches adaptive_threshold), "
                "or fixed (static: every tier every cycle, E6)"})
    adaptive_threshold: float = field(default=0.5, metadata={"help": "adaptive unlocking threshold"})
    seed: int = field(default=0, metadata={"help": "run seed (evaluation, training and bootstrap seeds derive from it)"})
    lm_batch_size: int = field(default=48, metadata={"help": "prompts per forward pass (48: the default preset's whole lockstep batch; 12 and 48 measured within noise of each other on a 2-core CPU)"})
    resamples: int = field(default=10_000, metadata={"help": "bootstrap resamples per interval"})
    scenarios: tuple[str, ...] = field(default=(), metadata={"help": (
        "scenario ids or YAML paths of your own (repeatable), instead of the preset's; each unlocks with its tier "
        "(the preset's budget stays)")})
    max_endpoint_failures: float = field(default=0.2, metadata={"help": (
        "an arm on an openai: endpoint (the proxy): when more than this share of its steps got no reply, the bench "
        "stops with the endpoint's error instead of scoring it (its records kept in arms/<arm>/failed-episodes.jsonl)")})
    judge: str = field(default="", metadata={"help": (
        "an LM judge's model spec (off when empty): scores every arm's last-cycle episodes 0-10 on goal and "
        "believability, reported beside the rule metrics (source proxy), and ranks pairs in B's sleep (kept out of "
        "the action track by strict gating)")})
    ray: str = field(default="", metadata={"help": RAY_HELP + "; the sleep phase's scoring, the scripted arms' rollouts and a "
                                                               "suite's variants (the run folder must be on storage every node sees)"})

    def __post_init__(self) -> None:
        check_ray(self.ray)
        one_of(self, "preset", tuple(PRESETS))
        if not 0 <= self.max_endpoint_failures <= 1:
            raise ValueError(f"max_endpoint_failures must be in [0, 1], got {self.max_endpoint_failures!r}")
        check_judge(self.judge)
        one_of(self, "unlock", ("progressive", "adaptive", "fixed"))
        at_least(self, 1, "cycles", "lm_batch_size", "resamples")
        ms = parse_model_spec(self.model)  # before the run folder holds a typo
        if ms.kind not in ("bundled", "hf") or ms.adapters:
            raise ValueError(f"arms A and B train a local model: model must be bundled or a model folder (without adapters), "
                             f"got {self.model!r}")
        if self.proxy and parse_model_spec(self.proxy).kind not in ("scripted", "openai") and self.ray:  # parsed: a typo fails now
            raise ValueError(f"--ray spreads scripted and openai: policies; the proxy {self.proxy!r} is a local model")

    def scenario_names(self) -> tuple[str, ...]:
        return tuple(self.scenarios) or PRESETS[self.preset].scenarios

    def loop_config(self, **over) -> LoopConfig:
        p = PRESETS[self.preset]
        base = LoopConfig(out=str(Path(self.out) / "loop"), model=self.model, cycles=self.cycles, tiers=TIERS,
                          train_episodes=p.train_episodes, reference_episodes=p.reference_episodes,
                          eval_episodes=p.eval_episodes, seed=self.seed,
                          lm_batch_size=self.lm_batch_size, baseline=True, unlock=self.unlock,
                          adaptive_threshold=self.adaptive_threshold, scenarios=self.scenario_names(), max_turns=p.max_turns,
                          sleep=p.sleep, train=p.train, dialogue_steps=p.dialogue_steps, ray=self.ray, judge=self.judge)
        return replace(base, **over)


def bench_scenarios(cfg: BenchConfig, loop_dir: str | Path) -> RunScenarios:
    """The bench's scenarios, checked before any work starts; ids also name the user scenarios its
    loop (in ``loop_dir``) stored, so a bench is resumed without the user's files."""
    scenarios = run_scenarios(cfg.scenario_names(), TIERS, loop_dir)
    check_unlockable(cfg.loop_config(), scenarios)
    return scenarios


def recorded(cfg: BenchConfig, scenarios: RunScenarios) -> BenchConfig:
    """``cfg`` as its run records it: scenarios of your own by id (none named: the preset's)."""
    return replace(cfg, scenarios=scenarios.names if cfg.scenarios else ())


ADDED_FIELDS = {"scenarios": [], "user_scenarios": {}, "judge": ""}
"""Config fields added after bench runs were written (see ``socialworld.loop.ADDED_FIELDS``)."""


def eval_jobs(cfg: BenchConfig, scenarios: RunScenarios | None = None) -> list[EpisodeJob]:
    """Every evaluation episode any cycle may run: the same seeds for every arm."""
    p = PRESETS[cfg.preset]
    specs = [capped(s, p.max_turns) for s in (scenarios or bench_scenarios(cfg, Path(cfg.out) / "loop")).specs]
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
    loop_summaries: list[dict]
    doc: dict
    """bench.json"""


def _subset(eps: Sequence[EpisodeRecord], tiers: Sequence[str]) -> list[EpisodeRecord]:
    return [e for e in eps if e.tier in tiers]


def run_bench(cfg: BenchConfig, log: Callable[[str], None] = print, progress: Progress | None = None) -> BenchResult:
    loop_dir = Path(cfg.out) / "loop"
    scenarios = bench_scenarios(cfg, loop_dir)  # checked before the run folder is made
    if cfg.ray:
        ray_init(cfg.ray)  # a wrong address fails here, not after the first cycles
    run = RunDir(cfg.out)
    run.write_config(config_doc(recorded(cfg, scenarios), scenarios.user), defaults=ADDED_FIELDS)
    summaries = run_loop(cfg.loop_config(), log=log, progress=progress)
    jobs = eval_jobs(cfg, scenarios)
    static: dict[str, list[EpisodeRecord]] = {"A": read_jsonl(loop_dir / "cycle-0/eval/episodes.jsonl")}
    for arm, spec in arm_policies(cfg).items():
        rel = f"arms/{arm}/episodes.jsonl"

        def evaluate_arm(p: Path, spec: str = spec, arm: str = arm) -> None:
            tick = progress(f"arm {arm} ({spec})", len(jobs)) if progress else None
            lm = {} if spec in SCRIPTED else {"batch_size": cfg.lm_batch_size}
            eps = rollouts(spec, jobs, ray=cfg.ray, seed=cfg.seed, tick=tick, **lm)
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
        static[arm] = read_jsonl(run.path(rel))
    tiers_per_cycle = {s["cycle"]: s["tiers"] for s in summaries}
    per_cycle: dict[str, dict[int, list[EpisodeRecord]]] = {arm: {} for arm in ("A", "B", *arm_policies(cfg))}
    for c, tiers in tiers_per_cycle.items():
        per_cycle["B"][c] = read_jsonl(loop_dir / f"cycle-{c}/eval/episodes.jsonl")
        for arm, eps in static.items():
            per_cycle[arm][c] = _subset(eps, tiers)
    doc = bench_document(recorded(cfg, scenarios), tiers_per_cycle, per_cycle, summaries)
    judged = _judge_arms(cfg, run, {arm: cyc[max(cyc)] for arm, cyc in per_cycle.items()}, scenarios, log)
    if judged:
        doc["judge"] = {"judge": cfg.judge, "arms": {arm: summarise(recs).as_dict() for arm, recs in judged.items()}}
    run.produce("bench.json", "bench", lambda p: atomic_write_text(p, json.dumps(doc, indent=1, sort_keys=True) + "\n"),
                inputs=[f"arms/{a}/episodes.jsonl" for a in arm_policies(cfg)] + [f"judge/{a}.jsonl" for a in judged])
    from .report import write_reports

    write_reports(run, doc, per_cycle)
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
        if run.produce(rel, f"judge:{cfg.judge}", lambda p, eps=eps: write_judged(p, checked_judgement(cfg.judge, judge_episodes(
                cfg.judge, eps, specs, batch_size=cfg.lm_batch_size), cfg.max_endpoint_failures)), inputs=inputs):
            log(f"arm {arm}: judged {len(eps)} last-cycle episodes with {cfg.judge}")
        out[arm] = list(read_judged(run.path(rel)).values())
    return out


def bench_document(cfg: BenchConfig, tiers_per_cycle: dict[int, list[str]], per_cycle: dict[str, dict[int, list[EpisodeRecord]]],
                   loop_summaries: Sequence[dict] = ()) -> dict:
    """Every number of the report, computed from records: per-arm metrics with intervals at the
    last cycle (the main table), paired B-A and B-C differences, R tables, forgetting, forward
    transfer and unlock cycles, and the loop's per-cycle training summary."""
    kw = {"seed": cfg.seed, "resamples": cfg.resamples}
    last = max(tiers_per_cycle)
    main = {arm: {k: metric_interval(cyc[last], k, **kw).as_dict() for k in MAIN_METRICS} for arm, cyc in per_cycle.items()}
    paired = {f"B-{o}": {k: paired_difference(per_cycle[o][last], per_cycle["B"][last], k, **kw).as_dict() for k in MAIN_METRICS}
              for o in per_cycle if o != "B"}
    ratios = {f"B/{o}": {k: _ratio(main["B"][k]["mean"], main[o][k]["mean"]) for k in MAIN_METRICS} for o in ("A", "C")}
    r = {arm: r_table(cyc, **kw) for arm, cyc in per_cycle.items()}
    return {
        "version": BENCH_VERSION,
        "metrics_contract": METRICS_CONTRACT,
        "config": {k: v for k, v in json.loads(json.dumps(asdict(cfg))).items() if k not in EXECUTION_FIELDS},
        "preset": asdict(PRESETS[cfg.preset]),
        "thresholds": {"CR": CR_THRESHOLD, "D": D_THRESHOLD, "guards": "any broken guard fails"},
        "steps_per_episode": {arm: fmean(len(e.steps) for e in cyc[last]) for arm, cyc in per_cycle.items()},
        "tiers_per_cycle": {str(c): t for c, t in tiers_per_cycle.items()},
        "episodes_per_arm": {arm: sum(len(v) for v in cyc.values()) for arm, cyc in per_cycle.items()},
        "main": main,
        "paired": paired,
        "ratios": ratios,
        "R": {arm: {str(c): {t: iv.as_dict() for t, iv in row.items()} for c, row in tab.items()} for arm, tab in r.items()},
        "forgetting": {arm: forgetting(tab) for arm, tab in r.items()},
        "forward_transfer": {arm: forward_transfer(tab, r["A"]) for arm, tab in r.items() if arm != "A"},
        "unlock_cycles": unlock_cycles(r["B"]),
        "diagnostics": {arm: {"coverage": coverage(cyc[last]), "primary_failures": failure_counts(cyc[last])}
                        for arm, cyc in per_cycle.items()},
        "loop": list(loop_summaries),
    }


def phase_seconds(out: str | Path) -> list[tuple[str, float]]:
    """Wall seconds of each artifact a bench made (its loop's first, in the order they were
    made; resumed runs list what this and earlier invocations made), from the ``timings.json``
    side files of :class:`~socialworld.rundir.RunDir`."""
    return [(f"loop/{k}", v) for k, v in RunDir(Path(out) / "loop").timings().items()] + list(RunDir(out).timings().items())


def _ratio(b: float, a: float) -> float | None:
    """B/X as a ratio of means; undefined (None) when X's mean is 0."""
    return None if a == 0 else b / a


# ------------------------------------------------------------------ suites

SUITES: dict[str, dict[str, dict]] = {
    # M0 (untrained) is every variant's cycle 0; each entry overrides the full loop's settings
    "methods": {
        # behaviour cloning of the expert's trajectories alone: no DAgger labels, no replay, one track
        "M1-sft": {"tracks": ("action",), "sleep": {"wake_chosen": "best", "label_gate": "margin", "replay": 0.0}},
        "M2-grpo": {"train": {"method": "grpo", "steps": 20, "learning_rate": 1e-4}, "tracks": ("action",),
                    "sleep": {"gating": "off", "replay": 0.0}},
        "M3-dpo-trajectory-ungated": {"train": {"method": "dpo", "learning_rate": 1e-4}, "tracks": ("dialogue",),
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


def _training_task() -> dict:
    """Ray resources of a task that trains: a GPU where this machine has one (a Ray task that asks
    for none sees no GPU), else one CPU."""
    import torch

    return {"num_gpus": 1} if torch.cuda.is_available() else {}


def _variant_loop(lc: LoopConfig) -> list[dict]:
    """One suite variant's loop (a Ray task under ``BenchConfig.ray``; its lines go to the worker's log)."""
    return run_loop(lc, log=print)


def run_suite(cfg: BenchConfig, suite: str, log: Callable[[str], None] = print, progress: Progress | None = None) -> dict:
    """Every variant of ``suite`` under the same protocol and budget; returns (and writes to
    ``<out>/<suite>/suite.json`` and ``suite.md``) per-variant last-cycle metrics with intervals,
    paired differences against M0 (the untrained cycle 0), R tables and forgetting."""
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; known: {', '.join(SUITES)}")
    kw = {"seed": cfg.seed, "resamples": cfg.resamples}
    scenarios = bench_scenarios(cfg, Path(cfg.out) / suite / next(iter(SUITES[suite])))  # the first variant's loop
    if cfg.ray:
        ray_init(cfg.ray)
    run = RunDir(Path(cfg.out) / suite)
    cfg_doc = config_doc(recorded(cfg, scenarios), scenarios.user)
    run.write_config(cfg_doc, defaults=ADDED_FIELDS)
    rows: dict[str, dict] = {}
    names = list(SUITES[suite])
    first = variant_config(cfg, suite, names[0], reuse_from="")
    log(f"{suite}: {names[0]}")
    runs = {names[0]: run_loop(first, log=log, progress=progress)}  # the untrained artifacts the others reuse
    rest = [variant_config(cfg, suite, name, reuse_from=first.out) for name in names[1:]]
    if cfg.ray:  # independent runs over the shared untrained artifacts: one Ray task each
        log(f"{suite}: {', '.join(names[1:])} as Ray tasks")
        runs.update(zip(names[1:], pmap(_variant_loop, rest, ray=cfg.ray, options=_training_task())))
    else:
        for name, lc in zip(names[1:], rest):
            log(f"{suite}: {name}")
            runs[name] = run_loop(lc, log=log, progress=progress)
    for name, lc in zip(names, [first, *rest]):
        summaries = runs[name]
        tiers = {s["cycle"]: s["tiers"] for s in summaries}
        last = max(tiers)
        untrained = read_jsonl(Path(lc.out) / "cycle-0/eval/episodes.jsonl")
        per_cycle = {c: read_jsonl(Path(lc.out) / f"cycle-{c}/eval/episodes.jsonl") for c in tiers}
        if "M0-untrained" not in rows:
            rows["M0-untrained" if suite == "methods" else "untrained"] = {
                "metrics": {k: metric_interval(_subset(untrained, tiers[last]), k, **kw).as_dict() for k in MAIN_METRICS},
                "R": {str(c): {t: iv.as_dict() for t, iv in row.items()}
                      for c, row in r_table({c: _subset(untrained, t) for c, t in tiers.items()}, **kw).items()}}
        base_last = [e for e in untrained if (e.scenario_id, e.seed) in {(x.scenario_id, x.seed) for x in per_cycle[last]}]
        r = r_table(per_cycle, **kw)
        rows[name] = {
            "metrics": {k: metric_interval(per_cycle[last], k, **kw).as_dict() for k in MAIN_METRICS},
            "vs_untrained": {k: paired_difference(base_last, per_cycle[last], k, **kw).as_dict() for k in MAIN_METRICS},
            "R": {str(c): {t: iv.as_dict() for t, iv in row.items()} for c, row in r.items()},
            "forgetting": forgetting(r),
            "pairs": [s["pairs"] for s in summaries], "excluded": [s["excluded"] for s in summaries],
        }
    doc = {"version": BENCH_VERSION, "metrics_contract": METRICS_CONTRACT, "suite": suite, "config": cfg_doc,
           "preset": asdict(PRESETS[cfg.preset]), "variants": rows}
    from .report import suite_markdown

    run.produce("suite.json", "suite", lambda p: atomic_write_text(p, json.dumps(doc, indent=1, sort_keys=True) + "\n"))
    run.produce("suite.md", "report", lambda p: atomic_write_text(p, suite_markdown(doc) + "\n"), inputs=["suite.json"])
    return doc
