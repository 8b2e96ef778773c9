"""Wake-sleep-deploy (DESIGN §7–§9), resumable in a run directory.

Per cycle ``c``::

    cycle-c/wake/episodes.jsonl         the current policy on *training* seeds
    cycle-c/wake/reference.jsonl        the continuation policy on the same seeds (dialogue pairs) and on
                                        ``reference_episodes`` training seeds per scenario (reference pairs)
    cycle-c/sleep/pairs-action.parquet  gated step-level pairs
    cycle-c/sleep/pairs-dialogue.parquet
    cycle-c/sleep/gating.json           every exclusion counted by reason
    cycle-c/train/<track>/adapter/      PEFT LoRA adapter per track: action resumed from cycle c-1's,
                                        dialogue from the deployed action adapter (see _train_cycle);
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

import json
import shutil
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Literal, Sequence

from .evaluate import episode_seeds
from .config import at_least
from .scale import RAY_HELP, check_ray, ray_init, rollouts
from .lm.models import parse_model_spec
from .judge import check_judge, checked_judgement, judge_episodes, read_judged, write_judged
from .lifelong import next_unlocked, progressive_schedule
from .metrics import METRICS_CONTRACT, ContractMismatch, aggregate, group_by, require_contract
from .policies import make_policy
from .records import EpisodeRecord, JudgeRec, atomic_write_text, read_jsonl, record_from_json, write_jsonl
from .rng import derive_seed
from .rundir import CONTRACT_KEY, LEGACY_CONTRACT, LEGACY_PAIRS, PAIRS_KEY, RunDir, with_defaults
from .runner import EpisodeJob, per_turn, run_episodes, turn_budget
from .sleep import PAIR_SCHEMA, GatingReport, SleepConfig, add_replay, candidate_pairs, read_pairs, screen_and_gate, write_pairs
from .spec import SCENARIO_STORE, RunScenarios, ScenarioError, capped, resolve_scenarios, run_scenarios, spec_yaml
from .stats import paired_difference
from .lm.policy import SAY_TOKENS
from .templates import POLICY_PROMPT_VERSION
from .train import TrainConfig, grpo_rows, train_adapter

JUDGE_MAX_ENDPOINT_FAILURES = 0.2
"""the loop stops (and retries when rerun) when its judge's endpoint gave no reply on more than this share of episodes"""

TRACKS = ("action", "dialogue")
COMPARED = ("pass", "solve", "D", "CR", "U", "A_e", "S_npc")


@dataclass(frozen=True)
class LoopConfig:
    out: str = field(default="runs/loop", metadata={"help": "run folder (resumed if it exists with the same config)"})
    model: str = field(default="bundled", metadata={"help": "base model: bundled or a local folder"})
    cycles: int = field(default=1, metadata={"help": "wake-sleep-train-deploy cycles"})
    tiers: tuple[str, ...] = field(default=("L0",), metadata={"help": "tiers trained and evaluated"})
    scenarios: tuple[str, ...] = field(default=(), metadata={"help": (
        "scenario ids or YAML paths of your own (repeatable; default: the shipped scenarios of the tiers); "
        "the run stores each file's spec and is resumed by id without it")})
    train_episodes: int = field(default=4, metadata={"help": "wake episodes per scenario per cycle (training seeds)"})
    reference_episodes: int = field(default=0, metadata={"help": (
        "continuation-policy (expert) episodes per scenario per cycle on training seeds, the wake's seeds first "
        "(at least train_episodes; 0: just the wake's); with reference_pairs they give pairs at no language-model cost")})
    eval_episodes: int = field(default=3, metadata={"help": "evaluation episodes per scenario (fixed held-out seeds)"})
    seed: int = field(default=0, metadata={"help": "run seed"})
    max_turns: int = field(default=0, metadata={"help": "cap every scenario's turn budget (0: the scenario's own; smoke runs)"})
    lm_batch_size: int = field(default=12, metadata={"help": "prompts per forward pass"})
    baseline: bool = field(default=True, metadata={"help": "evaluate the untrained policy first (cycle 0) and compare each cycle with it"})
    unlock: Literal["fixed", "progressive", "adaptive"] = field(default="fixed", metadata={"help": (
        "fixed: every cycle trains and evaluates all tiers; progressive: cycle c unlocks the first c tiers "
        "(ASCENT-Bench); adaptive: the next tier unlocks once the newest tier's pass rate reaches adaptive_threshold")})
    adaptive_threshold: float = field(default=0.5, metadata={"help": "adaptive unlocking: pass rate that unlocks the next tier"})
    tracks: tuple[str, ...] = field(default=TRACKS, metadata={"help": "tracks trained (action, dialogue)"})
    merged: bool = field(default=False, metadata={"help": "one adapter trained on both tracks' pairs, used for both (ablation E1)"})
    reuse_from: str = field(default="", metadata={"help": "copy the untrained policy's artifacts (cycle-0 eval, cycle-1 wake) from this run "
                                                       "folder instead of re-running them: ablations on the same data"})
    sleep: SleepConfig = field(default_factory=SleepConfig)
    dialogue_steps: int = field(default=0, metadata={"help": (
        "cap on the dialogue track's optimizer steps per cycle (0: the train steps): it starts from the action "
        "adapter, which already writes the words")})
    train: TrainConfig = field(default_factory=lambda: TrainConfig(method="dpo", steps=20))
    judge: str = field(default="", metadata={"help": (
        "an LM judge's model spec (off when empty): scores each cycle's wake and reference episodes (judge.jsonl); "
        "pairs ranked by its goal score join the candidates with proxy evidence, which strict gating keeps out of "
        "the action track")})
    ray: str = field(default="", metadata={"help": RAY_HELP + " (how the run executes, not what it makes: not in config.yaml)"})

    def __post_init__(self) -> None:
        if not self.tracks or set(self.tracks) - set(TRACKS):
            raise ValueError(f"tracks must be a non-empty subset of {TRACKS}, got {self.tracks}")
        if self.unlock not in ("fixed", "progressive", "adaptive"):
            raise ValueError(f"unlock must be fixed, progressive or adaptive, got {self.unlock!r}")
        at_least(self, 1, "cycles", "train_episodes", "eval_episodes", "lm_batch_size")
        check_ray(self.ray)
        ms = parse_model_spec(self.model)  # before the run folder holds a typo
        if ms.kind not in ("bundled", "hf") or ms.adapters:
            raise ValueError(f"the loop trains a local model: model must be bundled or a model folder (without adapters), "
                             f"got {self.model!r}")
        at_least(self, 0, "reference_episodes", "dialogue_steps")
        check_judge(self.judge)


def train_seeds(run_seed: int, scenario_id: str, cycle: int, n: int) -> list[int]:
    """Training seeds of a scenario in a cycle; never equal to an evaluation seed."""
    seeds = [derive_seed(run_seed, "train", scenario_id, cycle, i) for i in range(n)]
    if set(seeds) & set(episode_seeds(run_seed, scenario_id, 1000)):
        raise RuntimeError("a training seed collides with an evaluation seed")
    return seeds


UNTRAINED = ("cycle-0/eval/episodes.jsonl", "cycle-1/wake/episodes.jsonl")
"""Artifacts made by the untrained policy alone: the same in every run of the same model and seeds.
(The reference episodes are the expert's: cheap to remake, and their number is a knob.)"""
EVAL_KEYS = ("model", "tiers", "scenarios", "user_scenarios", "eval_episodes", "seed", "max_turns")
WAKE_KEYS = EVAL_KEYS + ("train_episodes",)
ADDED_FIELDS = {"max_turns": 0, "user_scenarios": {}, "reference_episodes": 0, "dialogue_steps": 0, "judge": "",
                "sleep": {"reference_pairs": "off", "replay": 0.0, "wake_chosen": "best", "label_gate": "margin",
                          "judge_margin": 2.0},
                "train": {"max_epochs": 0.0, "lora_upper": 1.0, "dtype": "float32", "balance": 0}}
"""Config fields added after runs were written, each with the value that behaves as the code did
before it: a stored config without one resumes as if it had that value. (Not every default
qualifies: ``train.sft_weight`` defaults to 1.0, but runs before it trained plain DPO.)"""


EXECUTION_FIELDS = ("ray", "max_endpoint_failures")
"""config fields that change how a run executes, never its artifacts: left out of ``config.yaml``
(``max_endpoint_failures`` decides whether an endpoint's arm is scored at all, so a rerun may
loosen it)"""


def config_doc(cfg, user_scenarios: dict[str, str]) -> dict:
    """What a run's ``config.yaml`` records (a loop's or a bench's): the config (its scenario names
    already the ones :func:`~socialworld.spec.run_scenarios` records: paths replaced by ids),
    ``user_scenarios`` (id -> content hash of each user scenario, stored in
    ``RUN/scenarios/<id>.yaml``, so a changed file is never resumed silently) and the metrics
    contract the run is scored under, and the format of its training pairs."""
    doc = json.loads(json.dumps(asdict(cfg)))
    for name in EXECUTION_FIELDS:  # how a run executes is not what it makes
        doc.pop(name, None)
    return doc | {"user_scenarios": user_scenarios, CONTRACT_KEY: METRICS_CONTRACT, PAIRS_KEY: PAIR_SCHEMA}


def _reuse(run: RunDir, cfg: LoopConfig, mine: dict) -> None:
    """Copy the untrained policy's artifacts from ``cfg.reuse_from``: the cycle-0 evaluation when
    model, scenarios, eval episodes and seed match; cycle 1's wake when, besides, the training
    episodes and cycle 1's tiers match. Each must be complete there, and made under this code's
    policy prompt."""
    import yaml

    if not Path(cfg.reuse_from, "manifest.json").exists():
        raise ValueError(f"--reuse-from {cfg.reuse_from}: not a run folder (no manifest.json)")
    src = RunDir(cfg.reuse_from)
    defaults = json.loads(json.dumps(asdict(LoopConfig()))) | {"user_scenarios": {}}  # a field added later has its default there
    theirs = with_defaults(yaml.safe_load(src.path("config.yaml").read_text()), defaults)
    if theirs.get(CONTRACT_KEY, LEGACY_CONTRACT) != METRICS_CONTRACT:
        raise ContractMismatch(f"--reuse-from {cfg.reuse_from}: scored under {theirs.get(CONTRACT_KEY, LEGACY_CONTRACT)}, "
                               f"this version scores under {METRICS_CONTRACT}; its artifacts cannot be mixed with this run's")
    diff = [k for k in EVAL_KEYS if theirs.get(k) != mine[k]]
    if diff:
        raise ValueError(f"--reuse-from {cfg.reuse_from}: differs in {diff}, so its artifacts are not the same data")
    theirs_cfg = LoopConfig(tiers=tuple(theirs["tiers"]), unlock=theirs["unlock"])
    same_wake = all(theirs.get(k) == mine[k] for k in WAKE_KEYS) and \
        unlocked_tiers(theirs_cfg, 1, (), []) == unlocked_tiers(cfg, 1, (), [])
    rels = UNTRAINED if same_wake else UNTRAINED[:1]
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
    for rel in rels:
        run.produce(rel, f"copied:{src.root}@{src.sha(rel)[:12]}", lambda p, r=rel: shutil.copyfile(src.path(r), p))


def _policy(cfg: LoopConfig, adapters: dict[str, str] | None):
    return make_policy(cfg.model, batch_size=cfg.lm_batch_size, adapters=adapters)


Progress = Callable[[str, int], Callable[[EpisodeRecord], None]]
"""``progress(description, total)`` -> a per-episode callback (the CLI draws bars with it)."""


def check_unlockable(cfg: LoopConfig, scenarios: RunScenarios) -> None:
    """Progressive and adaptive unlocking start with the first tier alone: refuse, before any work,
    scenarios none of which is of that tier (cycle 1 would have nothing to train or evaluate)."""
    first = cfg.tiers[0]
    if cfg.unlock != "fixed" and not any(s.tier == first for s in scenarios.specs):
        raise ScenarioError(f"{cfg.unlock} unlocking starts with {first} alone, and no scenario is {first} "
                            f"({', '.join(f'{s.id} {s.tier}' for s in scenarios.specs)}): add one, or unlock 'fixed'")


def unlocked_tiers(cfg: LoopConfig, c: int, previous: tuple[str, ...], previous_eval: Sequence[EpisodeRecord]) -> tuple[str, ...]:
    """The tiers cycle ``c`` trains and evaluates (see ``LoopConfig.unlock``)."""
    if cfg.unlock == "fixed":
        return tuple(cfg.tiers)
    if cfg.unlock == "progressive" or c == 1:
        return progressive_schedule(c, cfg.tiers)[-1]
    newest = [e for e in previous_eval if e.tier == previous[-1]]
    rate = aggregate(newest).pass_rate if newest else 0.0
    return next_unlocked(previous, rate, cfg.adaptive_threshold, cfg.tiers)


def run_loop(cfg: LoopConfig, log: Callable[[str], None] = print, progress: Progress | None = None) -> list[dict]:
    def rollout(policy, jobs: list[EpisodeJob], what: str) -> list[EpisodeRecord]:
        on_steps = per_turn(progress(f"{what} (turns)", turn_budget(jobs))) if progress else None
        return run_episodes(policy, jobs, on_steps=on_steps)

    def eval_jobs(tiers: Sequence[str]) -> list[EpisodeJob]:
        return [EpisodeJob(s, seed) for s in specs.values() if s.tier in tiers
                for seed in episode_seeds(cfg.seed, s.id, cfg.eval_episodes)]

    def wake_jobs(c: int, tiers: Sequence[str], n: int | None = None) -> list[EpisodeJob]:
        return [EpisodeJob(s, seed) for s in specs.values() if s.tier in tiers
                for seed in train_seeds(cfg.seed, s.id, c, cfg.train_episodes if n is None else n)]

    def evaluate(c: int, tiers: Sequence[str], adapters: dict[str, str] | None, what: str) -> None:
        """Cycle ``c``'s evaluation, with cycle ``c+1``'s wake in the same rollout when its tiers
        are known now (see the module docstring)."""
        rel, nxt = f"cycle-{c}/eval/episodes.jsonl", f"cycle-{c + 1}/wake/episodes.jsonl"
        inputs = [str(Path(p).relative_to(run.root)) for p in (adapters or {}).values()]
        jobs = eval_jobs(tiers)
        fused: list[EpisodeJob] = []
        if c < cfg.cycles and (cfg.unlock != "adaptive" or c == 0) and not run.complete(rel) and not run.complete(nxt):
            fused = wake_jobs(c + 1, unlocked_tiers(cfg, c + 1, tuple(tiers) if c else (), []))
        held: list[EpisodeRecord] = []

        def write(p: Path) -> None:
            eps = rollout(_policy(cfg, adapters), jobs + fused, what + (f" + cycle {c + 1} wake" if fused else ""))
            write_jsonl(p, eps[: len(jobs)])
            held.extend(eps[len(jobs):])

        run.produce(rel, "eval", write, inputs=inputs)
        if held and run.produce(nxt, "wake", lambda p: write_jsonl(p, held), inputs=inputs):
            log(f"cycle {c + 1}: wake {len(held)} episodes (in cycle {c}'s evaluation rollout)")

    scenarios = run_scenarios(cfg.scenarios, cfg.tiers, cfg.out)  # checked before the run folder is made
    check_unlockable(cfg, scenarios)
    if cfg.ray:
        ray_init(cfg.ray)  # a wrong address fails here, before any artifact
    run = RunDir(cfg.out)
    doc = config_doc(replace(cfg, scenarios=scenarios.names), scenarios.user)
    run.write_config(doc, may_grow=("cycles",), defaults=ADDED_FIELDS)
    for s in scenarios.specs:
        if s.id in scenarios.user:
            run.produce(f"{SCENARIO_STORE}/{s.id}.yaml", "scenario", lambda p, s=s: atomic_write_text(p, spec_yaml(s)))
    specs = {s.id: capped(s, cfg.max_turns) for s in scenarios.specs}
    if cfg.reuse_from:
        _reuse(run, cfg, doc)
    adapters: dict[str, str] | None = None
    summaries: list[dict] = []
    if cfg.baseline:  # every tier that may unlock: the untrained policy is the same in every cycle
        evaluate(0, cfg.tiers, None, "cycle 0 eval (untrained)")
        m0 = aggregate(read_jsonl(run.path("cycle-0/eval/episodes.jsonl"))).as_dict()
        log(f"cycle 0 (untrained): eval pass {m0['pass_rate']:.2f} solve {m0['solve_rate']:.2f} D {m0['D']:.2f} CR {m0['CR']:.2f}")
    tiers: tuple[str, ...] = ()
    evaluated: list[EpisodeRecord] = []
    for c in range(1, cfg.cycles + 1):
        d = f"cycle-{c}"
        tiers = unlocked_tiers(cfg, c, tiers, evaluated)
        prev = [rel for rel in (str(Path(p).relative_to(run.root)) for p in (adapters or {}).values())]
        jobs = wake_jobs(c, tiers)
        if run.produce(f"{d}/wake/episodes.jsonl", "wake", lambda p: write_jsonl(p, rollout(_policy(cfg, adapters), jobs, f"cycle {c} wake")),
                       inputs=prev):
            log(f"cycle {c} ({'+'.join(tiers)}): wake {len(jobs)} episodes")
        run.produce(f"{d}/wake/reference.jsonl", f"wake:{cfg.sleep.continuation}",
                    lambda p: write_jsonl(p, rollouts(cfg.sleep.continuation,
                                                               wake_jobs(c, tiers, max(cfg.train_episodes, cfg.reference_episodes)),
                                                               ray=cfg.ray)))
        wake = read_jsonl(run.path(f"{d}/wake/episodes.jsonl"))
        ref = {(e.scenario_id, e.seed): e for e in read_jsonl(run.path(f"{d}/wake/reference.jsonl"))}
        judged = _judged(cfg, run, d, wake, ref, specs, log)

        earlier = [f"cycle-{k}/sleep" for k in range(1, c)] if cfg.sleep.replay > 0 else []

        def sleep_all(_p: Path) -> None:
            report = GatingReport()
            kept = screen_and_gate(candidate_pairs(specs, wake, ref, cfg.sleep, report, progress, ray=cfg.ray, judged=judged),
                                   cfg.sleep, report)
            if earlier:
                old = [p for rel in earlier for t in TRACKS for p in read_pairs(run.path(f"{rel}/pairs-{t}.parquet"))]
                kept = add_replay(kept, old, cfg.sleep, report, key=(c,))
            _p.mkdir()
            for t in TRACKS:
                report.replaced += write_pairs(_p / f"pairs-{t}.parquet", [p for p in kept if p.track == t])
            atomic_write_text(_p / "gating.json", json.dumps(report.as_dict(), indent=1, sort_keys=True) + "\n")

        run.produce(f"{d}/sleep", "sleep", sleep_all, inputs=[f"{d}/wake/episodes.jsonl", f"{d}/wake/reference.jsonl",
                                                              *([f"{d}/wake/judge.jsonl"] if cfg.judge else []), *earlier])
        gating = json.loads(run.path(f"{d}/sleep/gating.json").read_text())
        log(f"cycle {c}: pairs kept {gating['kept']}, excluded {gating['excluded']}"
            + (f", replayed from earlier cycles {gating['replayed']}" if gating.get("replayed") else ""))
        losses, adapters = _train_cycle(cfg, run, c, adapters, prev, specs, log, progress)
        evaluate(c, tiers, adapters, f"cycle {c} eval")
        evaluated = read_jsonl(run.path(f"{d}/eval/episodes.jsonl"))
        m = aggregate(evaluated).as_dict()
        summary = {"cycle": c, "tiers": list(tiers), "pairs": gating["kept"], "excluded": gating["excluded"],
                   "replayed": gating.get("replayed", {}),
                   "final_loss": {t: (v[-1] if v else None) for t, v in losses.items()}, "eval": m,
                   "by_tier": {t: aggregate(eps).as_dict() for t, eps in sorted(group_by(evaluated, "tier").items())}}
        if cfg.baseline:
            keys = {(e.scenario_id, e.seed) for e in evaluated}
            base = [e for e in read_jsonl(run.path("cycle-0/eval/episodes.jsonl")) if (e.scenario_id, e.seed) in keys]
            summary["vs_baseline"] = {k: paired_difference(base, evaluated, k, seed=cfg.seed).as_dict() for k in COMPARED}
        run.produce(f"{d}/summary.json", "summary",
                    lambda p: atomic_write_text(p, json.dumps(summary, indent=1, sort_keys=True) + "\n"),
                    inputs=[f"{d}/eval/episodes.jsonl", f"{d}/sleep",
                            *(str(Path(p).relative_to(run.root)) for p in (adapters or {}).values()),
                            *(["cycle-0/eval/episodes.jsonl"] if cfg.baseline else [])])
        log(f"cycle {c}: eval pass {m['pass_rate']:.2f} solve {m['solve_rate']:.2f} D {m['D']:.2f} CR {m['CR']:.2f}")
        for k, iv in summary.get("vs_baseline", {}).items():
            log(f"cycle {c}: {k} - untrained = {iv['mean']:+.3f}, 95% paired bootstrap [{iv['lo']:+.3f}, {iv['hi']:+.3f}]")
        summaries.append(summary)
    return summaries


def _judged(cfg: LoopConfig, run: RunDir, d: str, wake: list[EpisodeRecord], ref: dict[tuple[str, int], EpisodeRecord],
            specs: dict, log: Callable[[str], None]) -> dict[str, JudgeRec] | None:
    """With ``cfg.judge``: the judge's record of every wake and reference episode of cycle folder
    ``d`` (made once, ``wake/judge.jsonl``), by episode id; else None."""
    if not cfg.judge:
        return None
    eps = [*wake, *(ref[k] for k in sorted(ref))]
    if run.produce(f"{d}/wake/judge.jsonl", f"judge:{cfg.judge}",
                   lambda p: write_judged(p, checked_judgement(
                       cfg.judge, judge_episodes(cfg.judge, eps, specs, batch_size=cfg.lm_batch_size), JUDGE_MAX_ENDPOINT_FAILURES)),
                   inputs=[f"{d}/wake/episodes.jsonl", f"{d}/wake/reference.jsonl"]):
        log(f"{d}: judged {len(eps)} wake and reference episodes with {cfg.judge}")
    return read_judged(run.path(f"{d}/wake/judge.jsonl"))


def _train_cycle(cfg: LoopConfig, run: RunDir, c: int, adapters: dict[str, str] | None, prev: list[str],
                 specs: dict, log: Callable[[str], None], progress: Progress | None = None
                 ) -> tuple[dict[str, list[float]], dict[str, str] | None]:
    """Train this cycle's adapters: one per track in ``cfg.tracks`` (resumed from the previous
    cycle's), or one ``merged`` adapter on both tracks' pairs deployed for both (ablation E1).
    The dialogue adapter starts from the deployed action adapter where there is one (this cycle's,
    or the previous one when the action track had no pairs; the action track's turns end in the
    expert's words for their action, :mod:`socialworld.sleep`, so it already writes them) and trains on the dialogue pairs together with that cycle's
    action turns: a few pairs alone overwrite the words (the first cycle's seven, six of them
    ``wait()``, made it say "Let's give it a moment" after every action), and a dialogue adapter
    trained apart on its own pairs wrote belief-like text on a third of its SAY lines
    (docs/experiments/2026-11-24-words-in-the-action-track.md). A track without gated pairs keeps
    its previous adapter."""
    d = f"cycle-{c}"
    losses: dict[str, list[float]] = {}
    trained: dict[str, str] = dict(adapters or {})
    fresh: list[str] = []  # run-relative folders of the adapters trained this cycle
    groups = {"merged": [t for t in TRACKS if t in cfg.tracks]} if cfg.merged else {t: [t] for t in TRACKS if t in cfg.tracks}
    for name, members in groups.items():
        if cfg.train.method == "grpo" and members != ["action"]:
            log(f"cycle {c}: grpo trains the action track only (its reward is the simulator's step return)")
            continue
        pairs = [p for t in members for p in read_pairs(run.path(f"{d}/sleep/pairs-{t}.parquet"))]
        if not pairs:  # nothing passed gating: the track keeps its adapter
            log(f"cycle {c}: no {name} pairs passed gating; the {name} adapter is not retrained")
            continue
        rel = f"{d}/train/{name}/adapter"
        resume = trained.get(members[0])
        data: dict = {"pairs": run.path(f"{d}/sleep/pairs-{members[0]}.parquet")} if len(members) == 1 else {"pairs": pairs}
        if name == "dialogue" and "action" in cfg.tracks and "action" in trained:
            resume = trained["action"]
            data = {"pairs": pairs + read_pairs(run.path(f"{d}/sleep/pairs-action.parquet"))}
        if cfg.train.method == "grpo":
            data = {"grpo_rows": grpo_rows(pairs), "specs": specs}
        tcfg = replace(cfg.train, steps=min(cfg.train.steps, cfg.dialogue_steps)) if name == "dialogue" and cfg.dialogue_steps else cfg.train
        run.produce(rel, f"train:{cfg.train.method}",
                    lambda p, data=data, r=resume, t=tcfg, n=name: train_adapter(
                        _base_path(cfg), p, t, resume_from=r,
                        progress=(lambda total: progress(f"cycle {c} train {n} (steps)", total)) if progress else None, **data),
                    inputs=[f"{d}/sleep"] + prev + fresh)
        fresh.append(rel)
        info = json.loads(run.path(f"{rel}/socialworld-train.json").read_text())
        losses[name] = info["losses"]
        rows = info.get("rows", {})
        if rows.get("trained_on", 0) < rows.get("given", 0):
            log(f"cycle {c}: {name}: {rows['given'] - rows['trained_on']} of {rows['given']} pairs dropped by TRL "
                f"(prompt of max_length={cfg.train.max_length} tokens or more)")
        for t in members:
            trained[t] = str(run.path(rel))
    return losses, (trained or None)


def stored_sleep_config(run_dir: str | Path) -> SleepConfig:
    """The sleep settings a loop run was written with (fields added since filled by ``ADDED_FIELDS``)."""
    import yaml

    doc = yaml.safe_load(Path(run_dir, "config.yaml").read_text())
    return SleepConfig(**with_defaults(doc["sleep"], ADDED_FIELDS["sleep"]))


def regate(run_dir: str | Path, cycle: int, variants: dict[str, SleepConfig]) -> dict[str, dict]:
    """Rebuild one cycle's candidate pairs from its stored wake episodes and screen and gate them
    under each variant's settings (margin, rollouts and horizon must match the run's, so the
    candidates are the same): the gating ablation on exactly the same data, without training.
    Returns, per variant, its gating report, its kept pair ids, and whether they equal the run's
    (replay from earlier cycles is not redone: it only adds pairs those cycles kept)."""
    import yaml

    run = RunDir(run_dir)
    cfg_doc = yaml.safe_load(run.path("config.yaml").read_text())
    if cfg_doc.get(PAIRS_KEY, LEGACY_PAIRS) != PAIR_SCHEMA:
        raise ValueError(f"{run.root}: its training pairs are {cfg_doc.get(PAIRS_KEY, LEGACY_PAIRS)}, this version builds "
                         f"{PAIR_SCHEMA}: re-gating would not rebuild the run's pairs")
    own = stored_sleep_config(run_dir)
    d = f"cycle-{cycle}"
    for rel in (f"{d}/wake/episodes.jsonl", f"{d}/wake/reference.jsonl", f"{d}/sleep"):
        if not run.complete(rel):
            raise ValueError(f"{run.root}: {rel} is missing or incomplete")
    wake = read_jsonl(run.path(f"{d}/wake/episodes.jsonl"))
    ref = {(e.scenario_id, e.seed): e for e in read_jsonl(run.path(f"{d}/wake/reference.jsonl"))}
    specs = {s.id: s for s in resolve_scenarios(sorted({e.scenario_id for e in wake}), max_turns=cfg_doc.get("max_turns", 0),
                                                run_dir=run_dir)}
    build = GatingReport()
    judged = read_judged(run.path(f"{d}/wake/judge.jsonl")) if run.complete(f"{d}/wake/judge.jsonl") else None
    pairs = candidate_pairs(specs, wake, ref, own, build, judged=judged)
    built = {p.id for p in pairs}  # the run's files also hold pairs replayed from earlier cycles
    run_ids = sorted(p.id for t in TRACKS for p in read_pairs(run.path(f"{d}/sleep/pairs-{t}.parquet")) if p.id in built)
    out = {}
    for name, v in {"run": own, **variants}.items():
        fixed = ("margin", "rollouts", "horizon", "continuation", "max_candidates", "seed", "reference_pairs", "wake_chosen",
                 "label_gate", "q_margin", "utterance_pairs", "judge_margin")
        if any(getattr(v, k) != getattr(own, k) for k in fixed):
            raise ValueError(f"variant {name}: only screening and gating settings may differ from the run's")
        report = GatingReport(candidates=build.candidates, excluded=build.excluded.copy())
        ids = sorted(p.id for p in screen_and_gate(pairs, v, report))
        out[name] = {"report": report.as_dict(), "ids": ids, "same_as_run": ids == run_ids}
    return out


def _base_path(cfg: LoopConfig) -> str:
    from .lm.models import bundled_path, parse_model_spec

    ms = parse_model_spec(cfg.model)
    return str(bundled_path()) if ms.kind == "bundled" else ms.name
