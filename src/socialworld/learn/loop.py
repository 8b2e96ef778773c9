"""Wake-sleep-deploy (contract §7–§9), resumable in a run directory.

Per cycle ``c``::

    cycle-c/wake/episodes.jsonl         the current policy on *training* seeds
    cycle-c/wake/reference.jsonl        the continuation policy on the same seeds (dialogue pairs) and on
                                        ``reference_episodes`` training seeds per scenario (reference pairs)
    cycle-c/sleep/pairs-action.parquet  gated step-level pairs
    cycle-c/sleep/pairs-dialogue.parquet
    cycle-c/sleep/gating.json           every exclusion counted by reason
    cycle-c/train/<track>/adapter/      PEFT LoRA adapter per track: action resumed from cycle c-1's,
                                        dialogue from the deployed action adapter (see train);
                                        or train/merged/adapter/ for both (ablation E1)
    cycle-c/eval/episodes.jsonl         the deployed policy (base + both adapters) on eval seeds
    cycle-c/summary.json                with paired-bootstrap differences against cycle 0
    cycle-0/eval/episodes.jsonl         the untrained policy on the same eval seeds (the baseline)

``unlock`` picks the tiers of each cycle: all of them, the protocol's progressive unlocking
(L0; L0+L1; all), or adaptive unlocking. Every artifact goes through :class:`~socialworld.rundir.RunDir`, so a killed loop resumes from
its last complete artifact.

Cycle ``c``'s evaluation policy is cycle ``c+1``'s wake policy (base + cycle ``c``'s adapters;
cycle 0: the untrained model), so when cycle ``c+1``'s tiers are known in advance (every unlock
mode but adaptive after cycle 1) its wake episodes run in the same lockstep rollout as cycle
``c``'s evaluation: one policy load and fuller batches instead of a second, mostly idle rollout.
The records are the same kind either way; a run killed between the two commits makes the wake
on its own when resumed.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Callable, Sequence

from socialworld.agents.lm.policy import SAY_TOKENS
from socialworld.agents.models import TRACKS
from socialworld.agents.registry import make_policy, make_voice
from socialworld.layout import SCENARIO_STORE, CycleFiles, cycle_files
from socialworld.learn.checks import base_path, check_model, check_unlockable, held_out
from socialworld.learn.config import LoopConfig, PairBuild, Progress, SleepConfig, TrainConfig
from socialworld.learn.documents import CycleSummary, read_train_record
from socialworld.learn.listwise import PromptKV
from socialworld.learn.pairs.gating import Gating, GatingReport, read_gating, screen_and_gate
from socialworld.learn.pairs.record import PAIR_SCHEMA, read_pairs, write_pairs
from socialworld.learn.pairs.sleep import run_sleep
from socialworld.learn.pairs.sources import SleepInputs
from socialworld.learn.runconfig import CONTRACT_KEY, RunConfig, read_resumed, read_stored
from socialworld.learn.scenarios import resolve_in_run, run_scenarios
from socialworld.learn.train import train_adapter
from socialworld.learn.trainers.common import TrainingSet
from socialworld.metric_registry import KEYS, PASS
from socialworld.metrics.core import METRICS_CONTRACT, Aggregate, ContractMismatch, aggregate, group_by, require_contract
from socialworld.metrics.lifelong import next_unlocked, progressive_schedule
from socialworld.metrics.stats import paired_difference
from socialworld.records import EpisodeRecord, JudgeRec, atomic_write_text, read_jsonl, record_from_json, write_jsonl
from socialworld.rollout.evaluate import episode_seeds
from socialworld.rollout.judge import checked_judgement, judge_episodes, read_judged, write_judged
from socialworld.rollout.runner import EpisodeJob, per_turn, run_episodes, turn_budget
from socialworld.rollout.scale import ray_init, rollouts
from socialworld.rundir import RunDir
from socialworld.text.templates import POLICY_PROMPT_VERSION
from socialworld.world.rng import derive_seed
from socialworld.world.spec import ScenarioSpec, capped, spec_yaml
from socialworld.world.variation import variant
from socialworld.world.voice import Voice

JUDGE_MAX_ENDPOINT_FAILURES = 0.2
"""the loop stops (and retries when rerun) when its judge's endpoint gave no reply on more than this share of episodes"""

def _brief(m: Aggregate) -> str:
    """The log's line of an evaluation's scores."""
    return f"pass {m['pass']:.2f} solve {m['solve']:.2f} D {m['D']:.2f} CR {m['CR']:.2f}"


def train_seeds(run_seed: int, scenario_id: str, cycle: int, n: int) -> list[int]:
    """Training seeds of a scenario in a cycle; never equal to an evaluation seed."""
    seeds = [derive_seed(run_seed, "train", scenario_id, cycle, i) for i in range(n)]
    if set(seeds) & set(episode_seeds(run_seed, scenario_id, 1000)):
        raise RuntimeError("a training seed collides with an evaluation seed")
    return seeds


UNTRAINED = (cycle_files(0).eval, cycle_files(1).wake)
"""Artifacts made by the untrained policy alone: the same in every run of the same model and seeds.
(The reference episodes are the expert's: cheap to remake, and their number is a knob.)"""
EVAL_KEYS = ("model", "tiers", "scenarios", "user_scenarios", "holdout", "eval_episodes", "seed", "max_turns", "npc_voice")
WAKE_KEYS = EVAL_KEYS + ("train_episodes",)


def _reusable(cfg: LoopConfig, mine: dict) -> tuple[RunDir, tuple[str, ...]]:
    """The run folder ``cfg.reuse_from`` and the untrained policy's artifacts to copy from it (checked
    before this run writes anything): the cycle-0 evaluation when model, scenarios, eval episodes and
    seed match; cycle 1's wake when, besides, the training episodes and cycle 1's tiers match. Each
    must be complete there, and made under this code's policy prompt."""
    if not Path(cfg.reuse_from).is_dir():
        raise ValueError(f"--reuse-from {cfg.reuse_from}: no such folder")
    if not Path(cfg.reuse_from, "manifest.json").exists():
        raise ValueError(f"--reuse-from {cfg.reuse_from}: not a run folder (no manifest.json)")
    src = RunDir(cfg.reuse_from)
    theirs = read_stored(src.path("config.yaml"))
    if theirs.get(CONTRACT_KEY) != METRICS_CONTRACT:
        raise ContractMismatch(f"--reuse-from {cfg.reuse_from}: scored under {theirs.get(CONTRACT_KEY)}, "
                               f"this version scores under {METRICS_CONTRACT}; its artifacts cannot be mixed with this run's")
    diff = [k for k in EVAL_KEYS if theirs.get(k) != mine[k]]
    if diff:
        raise ValueError(f"--reuse-from {cfg.reuse_from}: differs in {diff}, so its artifacts are not the same data")
    theirs_cfg = LoopConfig(tiers=tuple(theirs["tiers"]), unlock=theirs["unlock"])
    same_wake = all(theirs.get(k) == mine[k] for k in WAKE_KEYS) and \
        unlocked_tiers(theirs_cfg, 1, (), []) == unlocked_tiers(cfg, 1, (), [])
    rels = (UNTRAINED if same_wake else UNTRAINED[:1]) + ((cycle_files(0).holdout,) if mine.get("holdout") else ())
    for rel in rels:
        if not src.complete(rel):
            raise ValueError(f"--reuse-from {cfg.reuse_from}: {rel} is missing or incomplete there")
        with open(src.path(rel), encoding="utf-8") as f:  # a language model's records name the prompt they were made under
            line = f.readline()
        first = record_from_json(EpisodeRecord, line) if line.strip() else None
        require_contract([first] if first is not None else [], f"--reuse-from {cfg.reuse_from}: {rel}")
        decoding = first.steps[0].policy.decoding if first is not None and first.steps else {}
        prompt = decoding.get("prompt")
        if prompt not in (None, POLICY_PROMPT_VERSION):
            raise ValueError(f"--reuse-from {cfg.reuse_from}: {rel} was made under prompt {prompt}, this code "
                             f"prompts with {POLICY_PROMPT_VERSION}, so its artifacts are not the same data")
        if decoding.get("mode") == "constrained" and decoding.get("say_tokens") != SAY_TOKENS:
            raise ValueError(f"--reuse-from {cfg.reuse_from}: {rel} was decoded with SAY lines of {decoding.get('say_tokens')} "
                             f"tokens, this code decodes {SAY_TOKENS}, so its artifacts are not the same data")
    return src, tuple(rels)


def _reuse(run: RunDir, src: RunDir, rels: tuple[str, ...]) -> None:
    """Copy artifacts ``rels`` of run folder ``src`` (:func:`_reusable`) into ``run``."""
    for rel in rels:
        def copy(p: Path, r: str = rel) -> None:
            shutil.copyfile(src.path(r), p)

        run.produce(rel, f"copied:{src.root}@{src.sha(rel)[:12]}", copy)


def _policy(cfg: LoopConfig, adapters: dict[str, str] | None):
    return make_policy(cfg.model, batch_size=cfg.lm_batch_size, adapters=adapters)


def unlocked_tiers(cfg: LoopConfig, c: int, previous: tuple[str, ...], previous_eval: Sequence[EpisodeRecord]) -> tuple[str, ...]:
    """The tiers cycle ``c`` trains and evaluates (see ``LoopConfig.unlock``)."""
    if cfg.unlock == "fixed":
        return tuple(cfg.tiers)
    if cfg.unlock == "progressive" or c == 1:
        return progressive_schedule(c, cfg.tiers)[-1]
    newest = [e for e in previous_eval if e.tier == previous[-1]]
    rate = aggregate(newest)[PASS] if newest else 0.0
    return next_unlocked(previous, rate, cfg.adaptive_threshold, cfg.tiers)


@dataclass(frozen=True)
class LoopRun:
    """What every phase of one loop run reads: its settings, its folder, its scenarios (capped to
    ``max_turns``), the trainer's store of frozen rows kept for all its trainings (a cycle replays
    earlier cycles' rows, and the dialogue track trains on the action track's:
    :class:`~socialworld.learn.listwise.PromptKV`), where it logs and how it shows progress."""

    cfg: LoopConfig
    run: RunDir
    specs: dict[str, ScenarioSpec]
    store: PromptKV
    log: Callable[[str], None] = print
    progress: Progress | None = None
    holdout: frozenset[str] = frozenset()
    """ids of the scenarios never trained on (:attr:`LoopConfig.holdout`), evaluated apart"""
    voice: Voice | None = None
    """the NPCs' voice the wake and every evaluation hear (:attr:`LoopConfig.npc_voice`; None: the templates)"""

    def rollout(self, policy, jobs: list[EpisodeJob], what: str) -> list[EpisodeRecord]:
        on_steps = per_turn(self.progress(f"{what} (turns)", turn_budget(jobs))) if self.progress else None
        return run_episodes(policy, jobs, on_steps=on_steps, voice=self.voice)

    def eval_jobs(self, tiers: Sequence[str]) -> list[EpisodeJob]:
        return [EpisodeJob(s, seed) for s in self.specs.values() if s.tier in tiers and s.id not in self.holdout
                for seed in episode_seeds(self.cfg.seed, s.id, self.cfg.eval_episodes)]

    def holdout_jobs(self) -> list[EpisodeJob]:
        """The held-out scenarios' evaluation episodes (every tier: they are evaluated apart from the unlocking)."""
        return [EpisodeJob(s, seed) for s in self.specs.values() if s.id in self.holdout
                for seed in episode_seeds(self.cfg.seed, s.id, self.cfg.eval_episodes)]

    def wake_jobs(self, c: int, tiers: Sequence[str], n: int | None = None) -> list[EpisodeJob]:
        return [EpisodeJob(s, seed) for s in self.specs.values() if s.tier in tiers and s.id not in self.holdout
                for seed in train_seeds(self.cfg.seed, s.id, c, self.cfg.train_episodes if n is None else n)]

    def reference_jobs(self, c: int, tiers: Sequence[str]) -> list[EpisodeJob]:
        """Cycle ``c``'s reference episodes: the wake's seeds, then up to ``reference_episodes`` per
        scenario, ``reference_varied`` of those beyond the wake's on a new variant of the scenario each
        (:func:`socialworld.world.variation.variant`, numbered by cycle and episode)."""
        cfg = self.cfg
        n = max(cfg.train_episodes, cfg.reference_episodes)
        out = []
        for s in self.specs.values():
            if s.tier not in tiers or s.id in self.holdout:
                continue
            for i, seed in enumerate(train_seeds(cfg.seed, s.id, c, n)):
                j = i - cfg.train_episodes  # the j-th episode beyond the wake's seeds
                varied = j >= 0 and math.floor((j + 1) * cfg.reference_varied) > math.floor(j * cfg.reference_varied)
                out.append(EpisodeJob(variant(s, 1000 * c + i) if varied else s, seed))  # s is capped already
        return out

    def relative(self, adapters: dict[str, str] | None) -> list[str]:
        """The run-relative folders of ``adapters`` (the inputs an artifact made with them names)."""
        return [str(Path(p).relative_to(self.run.root)) for p in (adapters or {}).values()]


@dataclass(frozen=True)
class Cycle:
    """Where cycle ``number`` of a run stands when it starts: its files, its tiers, the adapters it
    starts from (the previous cycle's deployed ones, absolute paths; None: the untrained model)."""

    number: int
    tiers: tuple[str, ...]
    adapters: dict[str, str] | None

    @property
    def files(self) -> CycleFiles:
        return cycle_files(self.number)


@dataclass(frozen=True)
class Wake:
    """A cycle's episodes on its training seeds: the deployed policy's, the continuation policy's
    by (scenario id, seed), and a judge's record of them (by episode id; None without a judge)."""

    episodes: list[EpisodeRecord]
    reference: dict[tuple[str, int], EpisodeRecord]
    judged: dict[str, JudgeRec] | None
    variants: dict[str, ScenarioSpec] = field(default_factory=dict)
    """the scenario variants some reference episodes were played on, by id"""


@dataclass(frozen=True)
class Trained:
    """A cycle's training: each trained adapter's losses (by track, or ``merged``) and the adapters
    deployed after it (absolute paths; a track without pairs keeps its previous one)."""

    losses: dict[str, list[float]]
    adapters: dict[str, str] | None


def run_loop(cfg: LoopConfig, log: Callable[[str], None] = print, progress: Progress | None = None) -> list[CycleSummary]:
    """Run (or resume) the loop of ``cfg``: the untrained baseline, then per cycle the phases
    :func:`wake`, :func:`judge`, :func:`sleep`, :func:`train`, :func:`evaluate` and
    :func:`summarize`, each an artifact of the run folder. Returns the cycles' summaries."""
    loop = start(cfg, log, progress)
    baseline: list[EpisodeRecord] | None = None
    if cfg.baseline:  # every tier that may unlock: the untrained policy is the same in every cycle
        baseline = evaluate(loop, 0, cfg.tiers, None, "cycle 0 eval (untrained)")
        log(f"cycle 0 (untrained): eval {_brief(aggregate(baseline))}")
    tiers: tuple[str, ...] = ()
    evaluated: list[EpisodeRecord] = []
    adapters: dict[str, str] | None = None
    summaries: list[CycleSummary] = []
    for c in range(1, cfg.cycles + 1):
        cycle = Cycle(c, unlocked_tiers(cfg, c, tiers, evaluated), adapters)
        gating = sleep(loop, cycle, wake(loop, cycle))
        trained = train(loop, cycle)
        evaluated = evaluate(loop, c, cycle.tiers, trained.adapters, f"cycle {c} eval")
        summaries.append(summarize(loop, cycle, gating, trained, evaluated, baseline))
        tiers, adapters = cycle.tiers, trained.adapters
    return summaries


def start(cfg: LoopConfig, log: Callable[[str], None] = print, progress: Progress | None = None) -> LoopRun:
    """Check everything a run needs before its folder holds anything (not even ``config.yaml``),
    then open the folder: its config, user scenarios and reused artifacts written."""
    scenarios = run_scenarios(cfg.scenarios, cfg.tiers, cfg.out)
    check_unlockable(cfg, scenarios)
    holdout = held_out(cfg, scenarios)
    check_model(cfg)
    doc = RunConfig(replace(cfg, scenarios=scenarios.names, holdout=holdout), scenarios.user).document()
    reused = _reusable(cfg, doc) if cfg.reuse_from else None
    if cfg.ray:
        ray_init(cfg.ray)  # a wrong address fails here, before any artifact
    run = RunDir(cfg.out)
    run.write_config(doc, may_grow=("cycles",), read=read_resumed)
    for s in scenarios.specs:
        if s.id in scenarios.user:
            def store(p: Path, s: ScenarioSpec = s) -> None:
                atomic_write_text(p, spec_yaml(s))

            run.produce(f"{SCENARIO_STORE}/{s.id}.yaml", "scenario", store)
    if reused is not None:
        _reuse(run, *reused)
    specs = {s.id: capped(s, cfg.max_turns) for s in scenarios.specs}
    return LoopRun(cfg, run, specs, PromptKV(), log, progress, frozenset(holdout),
                   make_voice(cfg.npc_voice, batch_size=cfg.lm_batch_size))


def evaluate(loop: LoopRun, c: int, tiers: Sequence[str], adapters: dict[str, str] | None, what: str) -> list[EpisodeRecord]:
    """Cycle ``c``'s evaluation (``adapters``: the policy it deploys; None: the untrained model),
    with cycle ``c+1``'s wake in the same rollout when its tiers are known now (see the module
    docstring). Returns the evaluation's episodes."""
    cfg, run = loop.cfg, loop.run
    rel, nxt, aside = cycle_files(c).eval, cycle_files(c + 1).wake, cycle_files(c).holdout
    inputs = loop.relative(adapters)
    jobs = loop.eval_jobs(tiers)
    fused: list[EpisodeJob] = []
    if c < cfg.cycles and (cfg.unlock != "adaptive" or c == 0) and not run.complete(rel) and not run.complete(nxt):
        fused = loop.wake_jobs(c + 1, unlocked_tiers(cfg, c + 1, tuple(tiers) if c else (), []))
    apart = loop.holdout_jobs() if c in (0, cfg.cycles) and not run.complete(aside) else []
    held: list[EpisodeRecord] = []
    kept: list[EpisodeRecord] = []

    def write(p: Path) -> None:
        eps = loop.rollout(_policy(cfg, adapters), jobs + apart + fused,
                           what + (" + held-out scenarios" if apart else "") + (f" + cycle {c + 1} wake" if fused else ""))
        write_jsonl(p, eps[: len(jobs)])
        kept.extend(eps[len(jobs): len(jobs) + len(apart)])
        held.extend(eps[len(jobs) + len(apart):])

    run.produce(rel, "eval", write, inputs=inputs)
    if apart:  # made in the evaluation's rollout, or on their own when a resumed run finds the evaluation made
        run.produce(aside, "eval", lambda p: write_jsonl(p, kept or loop.rollout(_policy(cfg, adapters), apart, what + " (held-out scenarios)")),
                    inputs=inputs)
    if held and run.produce(nxt, "wake", lambda p: write_jsonl(p, held), inputs=inputs):
        loop.log(f"cycle {c + 1}: wake {len(held)} episodes (in cycle {c}'s evaluation rollout)")
    return read_jsonl(run.path(rel))


def wake(loop: LoopRun, cycle: Cycle) -> Wake:
    """The cycle's wake: the deployed policy on the training seeds (unless the previous evaluation
    made it), the continuation policy on at least as many, and a judge's record of them."""
    cfg, run, c, d = loop.cfg, loop.run, cycle.number, cycle.files
    jobs = loop.wake_jobs(c, cycle.tiers)
    if run.produce(d.wake, "wake", lambda p: write_jsonl(p, loop.rollout(_policy(cfg, cycle.adapters), jobs, f"cycle {c} wake")),
                   inputs=loop.relative(cycle.adapters)):
        loop.log(f"cycle {c} ({'+'.join(cycle.tiers)}): wake {len(jobs)} episodes")
    ref_jobs = loop.reference_jobs(c, cycle.tiers)
    run.produce(d.reference, f"wake:{cfg.sleep.continuation}",
                lambda p: write_jsonl(p, rollouts(cfg.sleep.continuation, ref_jobs, ray=cfg.ray)))
    episodes = read_jsonl(run.path(d.wake))
    ref = {(e.scenario_id, e.seed): e for e in read_jsonl(run.path(d.reference))}
    return Wake(episodes, ref, judge(loop, d, episodes, ref), {j.spec.id: j.spec for j in ref_jobs if j.spec.id not in loop.specs})


def judge(loop: LoopRun, d: CycleFiles, wake: list[EpisodeRecord], ref: dict[tuple[str, int], EpisodeRecord]
          ) -> dict[str, JudgeRec] | None:
    """With ``cfg.judge``: the judge's record of every wake episode of cycle folder ``d`` and of the
    reference episode on its seed, the two a judge ranks (made once, ``wake/judge.jsonl``), by
    episode id; else None. Reference episodes on the other training seeds pair with no wake
    episode, so nothing reads a judgement of them."""
    cfg, run = loop.cfg, loop.run
    if not cfg.judge:
        return None
    eps = [*wake, *(ref[k] for k in sorted({(e.scenario_id, e.seed) for e in wake}))]
    if run.produce(d.wake_judged, f"judge:{cfg.judge}",
                   lambda p: write_judged(p, checked_judgement(
                       cfg.judge, judge_episodes(cfg.judge, eps, loop.specs, batch_size=cfg.lm_batch_size), JUDGE_MAX_ENDPOINT_FAILURES)),
                   inputs=[d.wake, d.reference]):
        loop.log(f"{d.root}: judged {len(eps)} wake and reference episodes with {cfg.judge}")
    return read_judged(run.path(d.wake_judged))


def sleep(loop: LoopRun, cycle: Cycle, woke: Wake) -> Gating:
    """The cycle's pairs per track, screened and gated, with earlier cycles' replayed
    (``sleep/``), and its gating report."""
    cfg, run, d = loop.cfg, loop.run, cycle.files
    earlier = [cycle_files(k) for k in range(1, cycle.number)] if cfg.sleep.replay > 0 else []

    def write(folder: Path) -> None:
        old = [p for e in earlier for t in TRACKS for p in read_pairs(run.path(e.pairs(t)))]
        result = run_sleep(SleepInputs(loop.specs | woke.variants, woke.episodes, woke.reference, woke.judged), cfg.sleep, earlier=old,
                           replay_key=(cycle.number,), progress=loop.progress, ray=cfg.ray)
        kept, report = result.kept, result.report
        folder.mkdir()
        for t in TRACKS:
            report.replaced += write_pairs(folder / Path(d.pairs(t)).name, [p for p in kept if p.track == t])
        atomic_write_text(folder / Path(d.gating).name, report.document().to_json())

    run.produce(d.sleep, "sleep", write, inputs=[d.wake, d.reference, *([d.wake_judged] if cfg.judge else []),
                                                  *(e.sleep for e in earlier)])
    gating = read_gating(run.path(d.gating))
    loop.log(f"cycle {cycle.number}: pairs kept {gating.kept}, excluded {gating.excluded}"
             + (f", replayed from earlier cycles {gating.replayed}" if gating.replayed else ""))
    return gating


def train(loop: LoopRun, cycle: Cycle) -> Trained:
    """Train this cycle's adapters: one per track in ``cfg.tracks`` (resumed from the previous
    cycle's), or one ``merged`` adapter on both tracks' pairs deployed for both (ablation E1).
    The dialogue adapter starts from the deployed action adapter where there is one (this cycle's,
    or the previous one when the action track had no pairs; the action track's turns end in the
    expert's words for their action, :mod:`socialworld.learn.pairs`, so it already writes them) and trains on the dialogue pairs together with that cycle's
    action turns: a few pairs alone overwrite the words (a cycle whose pairs are mostly ``wait()``
    teaches one sentence for every action), and a dialogue adapter trained apart on its own pairs
    writes belief-like text in its SAY lines (design.md, "the words with the decision"). A track without gated pairs keeps
    its previous adapter. Every training keeps the frozen part of its listwise rows in the run's
    store (:attr:`LoopRun.store`)."""
    cfg, run, c, d, log, progress = loop.cfg, loop.run, cycle.number, cycle.files, loop.log, loop.progress
    prev = loop.relative(cycle.adapters)
    losses: dict[str, list[float]] = {}
    trained: dict[str, str] = dict(cycle.adapters or {})
    fresh: list[str] = []  # run-relative folders of the adapters trained this cycle
    groups = {"merged": [t for t in TRACKS if t in cfg.tracks]} if cfg.merged else {t: [t] for t in TRACKS if t in cfg.tracks}
    for name, members in groups.items():
        if cfg.train.method == "grpo" and members != ["action"]:
            log(f"cycle {c}: grpo trains the action track only (its reward is the simulator's step return)")
            continue
        pairs = [p for t in members for p in read_pairs(run.path(d.pairs(t)))]
        if not pairs:  # nothing passed gating: the track keeps its adapter
            log(f"cycle {c}: no {name} pairs passed gating; the {name} adapter is not retrained")
            continue
        rel = d.adapter(name)
        resume = trained.get(members[0])
        data = TrainingSet(tuple(pairs), loop.specs, cfg.sleep.build if cfg.train.method == "grpo" else None)
        if name == "dialogue" and "action" in cfg.tracks and "action" in trained:
            resume = trained["action"]
            data = TrainingSet(tuple(pairs + read_pairs(run.path(d.pairs("action")))))  # the dialogue pairs, read above
        tcfg = replace(cfg.train, steps=min(cfg.train.steps, cfg.dialogue_steps)) if name == "dialogue" and cfg.dialogue_steps else cfg.train
        if name == "dialogue" and tcfg.method == "listwise":  # the words by likelihood, no decision term (design.md)
            tcfg = replace(tcfg, decision_weight=0.0)
        def fit(p: Path, data: TrainingSet = data, r: str | None = resume, t: TrainConfig = tcfg, n: str = name) -> None:
            shown = (lambda total: progress(f"cycle {c} train {n} (steps)", total)) if progress else None
            train_adapter(base_path(cfg), p, t, data, resume_from=r, progress=shown, prompt_kv=loop.store)

        run.produce(rel, f"train:{cfg.train.method}", fit, inputs=[d.sleep] + prev + fresh)
        fresh.append(rel)
        info = read_train_record(run.path(rel))
        losses[name] = info.losses
        rows = info.rows
        if info.stopped:
            log(f"cycle {c}: {name}: {info.stopped}")
        if rows.get("trained_on", 0) < rows.get("given", 0):
            log(f"cycle {c}: {name}: {rows['given'] - rows['trained_on']} of {rows['given']} pairs dropped by TRL "
                f"(prompt of max_length={cfg.train.max_length} tokens or more)")
        for t in members:
            trained[t] = str(run.path(rel))
    return Trained(losses, trained or None)


def summarize(loop: LoopRun, cycle: Cycle, gating: Gating, trained: Trained, evaluated: list[EpisodeRecord],
              baseline: list[EpisodeRecord] | None) -> CycleSummary:
    """The cycle's summary (``summary.json``): its pairs, its losses, its evaluation overall and by
    tier, and with a ``baseline`` (the untrained policy's cycle-0 evaluation) its paired bootstrap
    against it; logged."""
    cfg, run, c, d, log = loop.cfg, loop.run, cycle.number, cycle.files, loop.log
    m = aggregate(evaluated)
    vs = None
    if baseline is not None:
        keys = {(e.scenario_id, e.seed) for e in evaluated}
        base = [e for e in baseline if (e.scenario_id, e.seed) in keys]
        vs = {k: paired_difference(base, evaluated, k, seed=cfg.seed) for k in KEYS}
    apart = [d.holdout] if run.complete(d.holdout) else []
    held = read_jsonl(run.path(d.holdout)) if apart else []
    held_vs = None
    if held and run.complete(cycle_files(0).holdout):
        apart.append(cycle_files(0).holdout)
        held_base = read_jsonl(run.path(cycle_files(0).holdout))
        held_vs = {k: paired_difference(held_base, held, k, seed=cfg.seed) for k in KEYS}
    summary = CycleSummary(
        cycle=c, tiers=list(cycle.tiers), pairs=gating.kept, excluded=gating.excluded, replayed=gating.replayed,
        final_loss={t: (v[-1] if v else None) for t, v in trained.losses.items()}, eval=m,
        by_tier={t: aggregate(eps) for t, eps in sorted(group_by(evaluated, "tier").items())}, vs_baseline=vs,
        holdout=aggregate(held) if held else None, holdout_vs_baseline=held_vs)
    run.produce(d.summary, "summary", lambda p: atomic_write_text(p, summary.to_json()),
                inputs=[d.eval, d.sleep, *loop.relative(trained.adapters), *([cycle_files(0).eval] if baseline is not None else []),
                        *apart])
    log(f"cycle {c}: eval {_brief(m)}")
    for k, iv in (summary.vs_baseline or {}).items():
        log(f"cycle {c}: {k} - untrained = {iv.mean:+.3f}, 95% paired bootstrap [{iv.lo:+.3f}, {iv.hi:+.3f}]")
    if summary.holdout is not None:
        log(f"cycle {c}: held-out scenarios ({', '.join(sorted(loop.holdout))}): {_brief(summary.holdout)}")
        for k, iv in (summary.holdout_vs_baseline or {}).items():
            log(f"cycle {c}: held-out {k} - untrained = {iv.mean:+.3f}, 95% paired bootstrap [{iv.lo:+.3f}, {iv.hi:+.3f}]")
    return summary


def stored_sleep_config(run_dir: str | Path) -> SleepConfig:
    """The sleep settings a loop run was written with (an earlier version's file migrated)."""
    return _stored_loop(run_dir).config.sleep


def _stored_loop(run_dir: str | Path) -> RunConfig[LoopConfig]:
    path = Path(run_dir, "config.yaml")
    if not path.is_file():
        raise ValueError(f"{run_dir}: not a run folder (no config.yaml)")
    if not isinstance(read_stored(path).get("sleep"), dict):
        inner = " (a bench keeps its loop in its loop/ folder)" if Path(run_dir, "loop", "config.yaml").is_file() else ""
        raise ValueError(f"{path}: not a loop run's config (no sleep settings){inner}")
    return RunConfig.read(path, LoopConfig)


def regate(run_dir: str | Path, cycle: int, variants: dict[str, SleepConfig]) -> dict[str, dict]:
    """Rebuild one cycle's candidate pairs from its stored wake episodes and screen and gate them
    under each variant's settings (a variant keeps the run's :class:`PairBuild`, so the candidates
    are the same; checked before any work): the gating ablation on exactly the same data, without training.
    Returns, per variant, its gating report, its kept pair ids, and whether they equal the run's
    (replay from earlier cycles is not redone: it only adds pairs those cycles kept)."""
    run = RunDir(run_dir)
    stored = _stored_loop(run_dir)
    if stored.pair_schema != PAIR_SCHEMA:
        raise ValueError(f"{run.root}: its training pairs are {stored.pair_schema}, this version builds "
                         f"{PAIR_SCHEMA}: re-gating would not rebuild the run's pairs")
    own = stored.config.sleep
    d = cycle_files(cycle)
    for rel in (d.wake, d.reference, d.sleep):
        if not run.complete(rel):
            raise ValueError(f"{run.root}: {rel} is missing or incomplete")
    wake = read_jsonl(run.path(d.wake))
    ref = {(e.scenario_id, e.seed): e for e in read_jsonl(run.path(d.reference))}
    ids = sorted({e.scenario_id for e in wake} | {sid for sid, _ in ref})  # reference episodes may be on variants
    specs = {s.id: s for s in resolve_in_run(ids, run_dir, max_turns=stored.config.max_turns)}
    judged = read_judged(run.path(d.wake_judged)) if run.complete(d.wake_judged) else None
    for name, v in variants.items():
        if v.build != own.build:
            differ = [f.name for f in fields(PairBuild) if getattr(v, f.name) != getattr(own, f.name)]
            raise ValueError(f"variant {name}: only screening and gating settings may differ from the run's, not {', '.join(differ)}")
    result = run_sleep(SleepInputs(specs, wake, ref, judged), own)  # no earlier pairs: nothing replayed
    built = {p.id for p in result.candidates}  # the run's files also hold pairs replayed from earlier cycles
    run_ids = sorted(p.id for t in TRACKS for p in read_pairs(run.path(d.pairs(t))) if p.id in built)
    out = {}
    for name, v in {"run": own, **variants}.items():
        if name == "run":
            report, kept = result.report, result.kept
        else:
            report = GatingReport(candidates=result.built.candidates, excluded=result.built.excluded.copy())
            kept = screen_and_gate(result.candidates, v, report)
        ids = sorted(p.id for p in kept)
        out[name] = {"report": report.as_dict(), "ids": ids, "same_as_run": ids == run_ids}
    return out
