"""The ``socialworld`` command: a thin layer, each command one library call."""

from __future__ import annotations

import errno
import inspect
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, Optional

import typer
from rich.markup import escape
from rich.text import Text

from socialworld.agents.registry import check_voice
from socialworld.bench.config import BenchConfig
from socialworld.cli.console import Table, console, quiet_libraries, run_log, say, show
from socialworld.cli.options import App, config_command, fail, require
from socialworld.cli.progress import bars, with_bars
from socialworld.config import SHARE, at_least, within
from socialworld.learn.config import LoopConfig
from socialworld.learn.runconfig import RECORDED_KEYS, read_as_claimed
from socialworld.metric_registry import CR, KEYS, METRICS, PASS, SOLVE, D
from socialworld.rollout.config import AuditConfig, EvalConfig, help_for
from socialworld.swm.config import ChainConfig, ForeseeConfig, TomConfig
from socialworld.text.templates import JUDGE_DIMENSIONS
from socialworld.world.spec import ScenarioError, load_builtin_scenarios, resolve_scenarios

COUNT, SEED, PORT = at_least(1), at_least(0), within(1, 65535)
"""the rules of the hand-declared options (the configs' fields declare theirs in their metadata)"""

app = App(add_completion=False, no_args_is_help=True, help="A seeded social world for language agents.")
H = lambda name: help_for(EvalConfig, name)  # noqa: E731


@app.callback()
def _quiet_libraries() -> None:
    """Before any command: the libraries' own progress bars off (weight loading, dataset maps:
    socialworld shows its own), transformers' log records below errors off, Python warnings (the
    libraries' FutureWarnings) to :data:`LOG_FILE` instead of the console. Environment variables
    the libraries read when imported (a variable the user set wins), so light commands import nothing."""
    quiet_libraries()


def _param(name: str, annotation, option) -> inspect.Parameter:
    """A command's own option beside its config's fields."""
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=option)


def adapters_help(option: str = "--policy") -> str:
    """``--adapters``' help, naming the option that takes the model (``--policy``, ``serve``'s ``--model``)."""
    return (f"a trained policy's LoRA adapters deployed on {option} (a local model): a loop or bench run folder "
            f"(its last cycle), a cycle folder (cycle-<c>) or one adapter folder; the same as {option} <model>+<folder>")


ADAPTERS_HELP = adapters_help()


_ADAPTERS = _param("adapters", str, typer.Option("", help=ADAPTERS_HELP))
_JSON = _param("as_json", bool, typer.Option(False, "--json", help="print one JSON document instead of tables"))


def _policy_spec(policy: str, adapters: str) -> str:
    """``--policy`` with ``--adapters`` joined into one spec, checked before any work starts."""
    from socialworld.agents.models import parse_model_spec, with_adapters

    spec = with_adapters(policy, adapters)
    parse_model_spec(spec)
    return spec


@app.command()
def scenarios(as_json: bool = typer.Option(False, "--json", help="print one JSON document")) -> None:
    """List the shipped scenarios with their tiers."""
    specs = load_builtin_scenarios()
    if as_json:
        print(json.dumps([{"id": s.id, "tier": s.tier} for s in specs.values()]))
        return
    t = Table()
    for head in ("id", "tier", "name", "npcs", "decisions", "turns"):  # words wrap, ids and numbers never
        t.add_column(head, no_wrap=head not in ("name", "decisions"), justify="right" if head in ("npcs", "turns") else "left")
    for s in specs.values():
        t.add_row(s.id, s.tier, s.name, str(len(s.npcs)), ", ".join(s.slot_ids), str(s.turn_budget))
    console.print(t)


@app.command()
def play(
    scenario: str = typer.Argument(..., help="scenario id (with or without -vN) or a YAML path"),
    policy: str = typer.Option("expert", help=H("policy")),
    adapters: str = typer.Option("", help=ADAPTERS_HELP),
    seed: int = typer.Option(0, help=f"episode seed ({SEED})"),
    npc_voice: str = typer.Option("template", help=H("npc_voice")),
) -> None:
    """Play one episode and print it readably: the five dimensions per step, replies, signals."""
    try:
        require("--seed", seed, SEED)
        policy = _policy_spec(policy, adapters)
        check_voice(npc_voice, loads=True)
        spec = resolve_scenarios([scenario])[0]
        from socialworld.rollout.play import play_episode

        play_episode(spec, policy, seed, console, npc_voice)
    except (ScenarioError, ValueError, OSError) as err:
        fail(str(err))


def _run_eval(cfg, adapters: str = "", as_json: bool = False) -> None:
    """Evaluate a policy: metric table per tier and per scenario; records written to --out."""
    from dataclasses import replace

    from socialworld.rollout.evaluate import evaluate
    from socialworld.rollout.runner import per_turn

    policy = cfg.policy
    try:
        policy = _policy_spec(cfg.policy, adapters)
        cfg = replace(cfg, policy=policy)
        cfg = replace(cfg, out=cfg.out_dir())  # the default folder resolved once (the next free one)
        specs = resolve_scenarios(cfg.scenarios, cfg.tiers)
        run_log(cfg.out_dir())
        if as_json:
            result = evaluate(cfg)
        elif cfg.ray:  # episodes finish one by one across the tasks
            with bars() as progress:
                result = evaluate(cfg, on_episode=progress(f"eval {policy} (episodes)", len(specs) * cfg.episodes * (2 if cfg.paired else 1)))
        else:  # a lockstep batch finishes its episodes together: count turns
            with bars() as progress:
                turns = sum(s.turn_budget for s in specs) * cfg.episodes * (2 if cfg.paired else 1)
                result = evaluate(cfg, on_steps=per_turn(progress(f"eval {policy} (turns)", turns)))
    except (ScenarioError, ValueError, OSError) as err:
        fail(str(err))
        return
    summary = result.summary()
    if as_json:
        print(summary.model_dump_json())
        return
    for title, rows in (("by tier", summary.by_tier), ("by scenario", summary.by_scenario)):
        t = Table(title=f"{policy}: {title} ({summary.episodes} episodes, {summary.metrics_contract})")
        t.add_column("tier" if title == "by tier" else "scenario")
        for c in ("n", *(m.label for m in METRICS), "steps"):
            t.add_column(c, justify="right")
        for c, rate in (("parse fail", "parse_failure_rate"), ("endpoint fail", "endpoint_failure_rate")):
            # left out at 80 columns only where it says nothing: a failed step is always shown
            t.add_column(c, justify="right", optional=all(getattr(a, rate) == 0 for a in rows.values()))
        for key, a in rows.items():
            t.add_row(key, str(a.n), *(f"{a[k]:.2f}" for k in KEYS),
                      *(f"{v:.2f}" for v in (a.steps_per_episode, a.parse_failure_rate, a.endpoint_failure_rate)))
        console.print(t)
    if summary.judge is not None:
        t = Table(title=escape(f"LM judge {cfg.judge} ({summary.judge.all['prompt_version']}, source proxy, 0-10; "
                               "beside the rule metrics, never in them)"))
        for c in ("tier", "episodes", "judged", "endpoint fail", "unparseable", *JUDGE_DIMENSIONS):
            t.add_column(c, justify="right" if c != "tier" else "left")
        for key, j in (("all", summary.judge.all), *summary.judge.by_tier.items()):
            t.add_row(key, str(j["episodes"]), str(j["judged"]), str(j["endpoint_failures"]), str(j["unparseable"]),
                      *("-" if j["means"][dim] is None else f"{j['means'][dim]:.2f}" for dim in JUDGE_DIMENSIONS))
        console.print(t)
    if summary.voice is not None:
        v = summary.voice
        t = Table(title=escape(f"NPC voice {v.model}: {v.lines} lines, {v.heard:.0%} heard in its words (the rest as the template's)"))
        for status in v.by_status:
            t.add_column(status, justify="right")
        t.add_row(*(str(n) for n in v.by_status.values()))
        console.print(t)
    if summary.voice_effect is not None:
        fx = summary.voice_effect
        # a metric per row, a group per column, the interval under its mean: whole at 80 columns
        groups = {"all": fx.all, **fx.by_tier}
        t = Table(title="voiced - template, the same seeds (paired bootstrap, 95%)")
        t.add_column("metric")
        for key in groups:
            t.add_column(f"{key} (n={groups[key][KEYS[0]].n})", justify="right", no_wrap=True)
        for m in METRICS:
            t.add_row(m.label, *(f"{r[m.key].mean:+.2f}\n[{r[m.key].lo:+.2f},{r[m.key].hi:+.2f}]" for r in groups.values()))
        console.print(t)
    d = cfg.out_dir()
    say(f"records: {d}/episodes.jsonl, {d}/episodes.parquet{f', {d}/judge.jsonl' if cfg.judge else ''}"
        f"{f', {d}/template/episodes.jsonl' if cfg.paired else ''}; summary: {d}/metrics.json")


config_command(app, "eval", EvalConfig, _run_eval, aliases={"scenarios": "--scenario"}, extra=[_ADAPTERS, _JSON])


def _run_audit(cfg) -> None:
    """Judge a pool of episodes whose outcomes the world knows and set the judge's scores against the rules:
    Cohen's kappa on pass, Spearman's rho with CR and D, pairwise ranking agreement, per tier (and template vs
    voiced), with bootstrap intervals; failures counted apart. Writes pool.jsonl, judge.jsonl, audit.json, audit.md, audit.html."""
    from socialworld.rollout.audit import cell, pool_turns, run_audit
    from socialworld.rollout.runner import per_turn

    try:
        with bars() as progress:
            turns = pool_turns(cfg)
            doc = run_audit(cfg, on_steps=per_turn(progress("judge-audit pool (turns)", turns)) if turns else None)
    except (ScenarioError, ValueError, OSError) as err:
        fail(str(err))
        return

    # whole at 80 columns: the interval under its mean; rho with D, the pairs and the ties are in audit.md
    t = Table(title=escape(f"judge {doc.judge} ({doc.prompt_version}) against the rules; pass at goal >= {doc.pass_score}; "
                           "failed: no reply + unparseable"))
    for c in ("group", "judged", "failed", "kappa (pass)", "rho (goal, CR)", "pairwise agreement"):
        t.add_column(c, justify="left" if c == "group" else "right", no_wrap=c in ("kappa (pass)", "rho (goal, CR)", "pairwise agreement"))
    for r in doc.rows:
        t.add_row(r.group, f"{r.judged}/{r.episodes}", f"{r.failures['endpoint']}+{r.failures['unparseable']}",
                  *(cell(i).replace(" [", "\n[").replace(", ", ",") for i in (r.kappa, r.rho_cr, r.pairwise)))
    console.print(t)
    say(f"pool {', '.join(f'{k} {v}' for k, v in doc.pool.items())}; written to {cfg.out}/audit.json, audit.md (every statistic), "
        "audit.html (the plots), pool.jsonl, judge.jsonl")


config_command(app, "judge-audit", AuditConfig, _run_audit)


@app.command()
def check(
    scenario: list[str] = typer.Argument(None, help="scenario ids or YAML paths (default: all shipped)"),
    seeds: int = typer.Option(50, help=f"seeds for the oracle-solvability and leak checks ({COUNT})"),
    fuzz_seeds: int = typer.Option(200, help=f"seeds of the crash fuzz (random actions; 0 skips it; {SEED})"),
) -> None:
    """Run check_scenario (schema, oracle solvability, determinism, no hidden-value leaks, crash
    fuzz); warnings (likely mistakes) are printed and fail nothing."""
    try:
        require("--seeds", seeds, COUNT)
        require("--fuzz-seeds", fuzz_seeds, SEED)
        specs = resolve_scenarios(scenario or None)
    except (ScenarioError, ValueError) as err:
        fail(str(err))
        return
    from socialworld.rollout.check import check_scenario

    bad = 0
    for spec in specs:
        r = check_scenario(spec, seeds=seeds, fuzz_seeds=fuzz_seeds)
        console.print(Text.assemble(
            ("ok", "green") if r.ok else ("FAIL", "red"),
            f" {spec.id}: oracle pass {r.oracle_pass_rate:.0%}, solves {r.oracle_solve_rate:.0%}, "
            f"{r.observations_checked} observations checked, {r.fuzz_steps} fuzz steps"))
        for p in r.problems:
            say(f"   - {p}")
        for w in r.warnings:
            console.print(Text.assemble("   ", ("warning:", "yellow"), f" {w}"))
        bad += not r.ok
    if bad:
        raise typer.Exit(1)


def _run_loop(cfg) -> None:
    """Wake-sleep-deploy: roll out on training seeds, build and gate counterfactual pairs, train
    one LoRA adapter per track with TRL, deploy and evaluate; resumable in --out."""
    from socialworld.learn.loop import run_loop
    from socialworld.metrics.core import METRICS_CONTRACT

    run_log(cfg.out)
    summaries = with_bars(lambda progress: run_loop(cfg, log=say, progress=progress))
    t = Table(title=escape(f"loop: {cfg.out} ({METRICS_CONTRACT})"))
    shown = (PASS, SOLVE, D, CR)
    for c in ("cycle", "action pairs", "dialogue pairs", "excluded", "loss action", "loss dialogue", *shown,
              f"{PASS} - untrained", f"{D} - untrained"):
        t.add_column(c, justify="right")
    for s in summaries:
        loss = {k: "-" if v is None else f"{v:.3f}" for k, v in s.final_loss.items()}
        vs = {k: f"{v.mean:+.2f} [{v.lo:+.2f}, {v.hi:+.2f}]" for k, v in (s.vs_baseline or {}).items()}
        pairs = {k: f"{s.pairs.get(k, 0)}" + (f" +{s.replayed[k]} replayed" if s.replayed.get(k) else "") for k in ("action", "dialogue")}
        t.add_row(str(s.cycle), pairs["action"], pairs["dialogue"],
                  str(sum(s.excluded.values())), loss.get("action", "-"), loss.get("dialogue", "-"),
                  *(f"{s.eval[k]:.2f}" for k in shown), vs.get(PASS, "-"), vs.get(D, "-"))
    console.print(t)


config_command(app, "loop", LoopConfig, _run_loop, aliases={"scenarios": "--scenario"}, ignore=RECORDED_KEYS,
               migrate=read_as_claimed)


@app.command("gate")
def gate_cmd(
    run: str = typer.Argument(..., help="a loop run folder (its user scenarios are read from RUN/scenarios/)"),
    cycle: int = typer.Option(1, help=f"the cycle whose wake episodes are re-screened ({COUNT})"),
    threshold: Optional[list[float]] = typer.Option(None, "--threshold", help=f"a quality threshold variant (repeatable; {SHARE})"),
    off: bool = typer.Option(True, help="include the gating-off variant"),
) -> None:
    """The gating ablation on the same data: rebuild a cycle's pairs from its stored wake and
    count what each variant keeps and excludes (no training), against the run's own pairs."""
    from dataclasses import replace

    from socialworld.learn.loop import regate, stored_sleep_config

    try:
        require("--cycle", cycle, COUNT)
        require("--threshold", threshold or [], SHARE)
        own = stored_sleep_config(run)
    except (ValueError, OSError) as err:
        fail(str(err))
        return
    variants = {f"threshold {t:g}": replace(own, quality_threshold=t) for t in (threshold or [])}
    if off:
        variants["gating off"] = replace(own, gating="off")
    try:
        result = regate(run, cycle, variants)
    except (ValueError, OSError) as err:
        fail(str(err))
        return
    t = Table(title=escape(f"gating variants: {run} cycle {cycle}"))
    for c in ("variant", "action kept", "dialogue kept", "excluded (by reason)", "same pairs as the run"):
        t.add_column(c)
    for name, r in result.items():
        excl = ", ".join(f"{k} {v}" for k, v in sorted(r["report"]["excluded"].items()))
        t.add_row(name, str(r["report"]["kept"].get("action", 0)), str(r["report"]["kept"].get("dialogue", 0)), excl,
                  "yes" if r["same_as_run"] else "no")
    console.print(t)


@app.command("fit")
def fit_cmd(
    pairs: str = typer.Argument(..., help="an action pairs Parquet file, e.g. RUN/cycle-1/sleep/pairs-action.parquet"),
    model: str = typer.Option("bundled", help="policy: expert, random, bundled, or a local model path"),
    adapter: str = typer.Option("", help="a LoRA adapter folder deployed on the action track, e.g. RUN/cycle-1/train/action/adapter"),
    batch: int = typer.Option(16, help=f"states per forward pass ({COUNT})"),
    scenario: Optional[list[str]] = typer.Option(None, "--scenario", help=(
        "a YAML path of a scenario the pairs name (repeatable); needed only for pairs outside a run folder "
        "(a run's own scenarios are read from RUN/scenarios/)")),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """Training fit: restore each pair's state and count how often the policy takes the chosen
    action (exactly, and of the same kind), with the chosen-by-taken confusion table."""
    from socialworld.learn.fit import fit_file

    try:
        require("--batch", batch, COUNT)
        f = fit_file(pairs, model, adapter or None, batch, scenarios=tuple(scenario or ()))
    except (ValueError, OSError) as err:
        fail(str(err))
        return
    if as_json:
        print(json.dumps(f.as_dict()))
        return
    taken = sorted({v for row in f.confusion.values() for v in row})
    t = Table(title=escape(f"{model}{' + ' + adapter if adapter else ''} on {pairs}: exact {f.exact}/{f.pairs} "
                           f"({f.exact_rate:.2f}), same kind {f.same_verb}/{f.pairs} ({f.verb_rate:.2f}), unparsed {f.unparsed}"))
    t.add_column("chosen / taken")
    for v in taken:
        t.add_column(v, justify="right")
    for v, row in f.confusion.items():
        t.add_row(v, *(str(row.get(x, 0)) for x in taken))
    console.print(t)


@app.command("agreement")
def agreement_cmd(
    episodes: str = typer.Argument(..., help="an episodes JSONL file, e.g. RUN/loop/cycle-3/eval/episodes.jsonl"),
    scenario: Optional[list[str]] = typer.Option(None, "--scenario", help=(
        "a YAML path of a scenario the episodes name (repeatable); needed only for episodes outside a run folder")),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """Teacher agreement: replay each recorded episode and count, per tier, how often the agent's move was
    the expert's at the same state, with the expert-by-agent table of the moves that differ."""
    from socialworld.learn.fit import agreement_file

    try:
        result = agreement_file(episodes, scenarios=tuple(scenario or ()))
    except (ValueError, OSError) as err:
        fail(str(err))
        return
    if as_json:
        print(json.dumps({tier: a.as_dict() for tier, a in result.items()}))
        return
    t = Table(title=escape(f"the expert's move at the agent's states: {episodes}"))
    for col in ("tier", "steps", "same move", "rate", "same kind"):
        t.add_column(col, justify="left" if col == "tier" else "right")
    for tier, a in result.items():
        t.add_row(tier, str(a.steps), str(a.same), f"{a.rate:.2f}", str(a.same_kind))
    console.print(t)
    for tier, a in result.items():
        if tier != "all" and a.confusion:
            console.print(escape(f"{tier}, where they differ (expert -> agent): " + "; ".join(
                f"{want} -> " + ", ".join(f"{got} {n}" for got, n in row.items()) for want, row in a.confusion.items())))


def _with_policy(cfg, adapters: str, study):
    """``study(cfg, progress=...)`` under :func:`_with_bars`, with ``--adapters`` folded into
    ``cfg.policy`` (a bad spec is one line) and the log beside ``cfg.out``."""
    from dataclasses import replace

    def run(progress):
        c = replace(cfg, policy=_policy_spec(cfg.policy, adapters))
        run_log(c.out)
        return study(c, progress=progress)

    return with_bars(run)


def _run_bench(cfg, suite: str = "main") -> None:
    """ASCENT-Bench: arms A (untrained), B (closed loop), C (proxy or expert), oracle and random
    through the lifelong protocol; writes bench.json, report.md and report.html to --out.
    With --suite methods|ablations, every variant under the same protocol and budget."""
    from socialworld.bench.protocol import SUITES, phase_seconds, run_bench, run_suite
    from socialworld.bench.report import judge_rows, main_rows, r_rows, tier_rows

    out, judge = cfg.out, cfg.judge
    run_log(out)
    if suite in SUITES:
        with_bars(lambda progress: run_suite(cfg, suite, log=say, progress=progress))
        say((Path(out) / suite / "report.md").read_text())
        return
    result = with_bars(lambda progress: run_bench(cfg, log=say, progress=progress))
    for title, fn in (("main table (last cycle)", main_rows), ("PassRate differences by tier (last cycle, paired)", tier_rows),
                      ("R[cycle][tier]", r_rows),
                      (f"LM judge {judge} (last cycle, proxy: beside the rule metrics)", judge_rows)):
        head, rows = fn(result.doc)
        if not rows:
            continue
        t = Table(title=f"{title}, {result.doc.metrics_contract}")
        for i, h in enumerate(head):
            t.add_column(h, justify="left" if i == 0 else "right")
        for r in rows:
            t.add_row(*r)
        show(t)
    t = Table(title="phases (wall seconds; timings.json)")
    t.add_column("artifact")
    t.add_column("seconds", justify="right")
    phases = phase_seconds(out)
    for rel, sec in phases:
        t.add_row(escape(rel), f"{sec:.0f}")
    t.add_row("total", f"{sum(s for _, s in phases):.0f}")
    show(t)
    say(f"report: {Path(out) / 'report.html'}")


config_command(app, "bench", BenchConfig, _run_bench, aliases={"scenarios": "--scenario"}, ignore=RECORDED_KEYS,
               migrate=read_as_claimed, extra=[
    _param("suite", Literal["main", "methods", "ablations"], typer.Option(
        "main", help="main (arms A, B, C and references), methods (M0-M4) or ablations (E0-E6; with the bundled model "
                     "as --judge unless one is named, so E2 has proxy evidence to admit)"))])


def _run_tom(cfg) -> None:
    """Theory of mind on generated Sally-Anne stories: S3AP parser quality (the model and a scripted
    reference parser) and QA accuracy without S3AP, with the exact reference S3AP, and with the
    model's own parse; 95% bootstrap intervals; writes tom.json and answers.jsonl to --out."""
    from socialworld.swm.tom import evaluate_tom

    try:
        run_log(cfg.out)
        with bars() as progress:
            doc = evaluate_tom(cfg, progress=progress)
    except (ScenarioError, ValueError, OSError) as err:
        fail(str(err))
        return
    _tom_tables(f"{cfg.stories} generated stories", doc)
    if doc.world:
        _tom_tables(f"{doc.world.stories} stories from world episodes", doc.world)


config_command(app, "tom", TomConfig, _run_tom, aliases={"scenarios": "--scenario"})


def _tom_tables(what: str, doc) -> None:
    """The parser and QA tables of a :class:`~socialworld.swm.tom.TomResult` (or its world-stories part)."""
    fmt = lambda iv: f"{iv.mean:.2f} [{iv.lo:.2f}, {iv.hi:.2f}]"  # noqa: E731
    t = Table(title=f"S3AP parser quality ({what})")
    for c in ("parser", "quality", "structural", "observation accuracy", "valid", "attempts"):
        t.add_column(c, justify="right")
    for name, r in doc.parser.items():
        t.add_row(name, fmt(r.quality), fmt(r.structural), fmt(r.observation_accuracy), str(r.valid), str(r.attempts))
    console.print(t)
    t = Table(title=f"QA accuracy ({what}: {doc.questions} questions per row)")
    for c in ("S3AP in prompt", "all", "reality", "first order", "second order"):
        t.add_column(c, justify="right")
    for source, r in doc.qa.items():
        t.add_row(source, fmt(r.all), fmt(r.reality), fmt(r.first_order), fmt(r.second_order))
    console.print(t)


def _run_foresee(cfg, adapters: str = "") -> None:
    """Foresee-and-Act vs the plain policy on the same episodes: per-metric means and the paired
    difference with 95% bootstrap intervals, and how often the draft was refined; writes
    plain/ and foresee/ episodes and foresee.json to --out."""
    from socialworld.swm.foresee import evaluate_foresee

    doc = _with_policy(cfg, adapters, evaluate_foresee)
    fmt = lambda iv: f"{iv.mean:+.3f} [{iv.lo:+.3f}, {iv.hi:+.3f}]"  # noqa: E731
    t = Table(title=escape(f"{doc.policy}: plain vs Foresee-and-Act [{doc.world_model}], {doc.episodes} episodes, "
                           f"{doc.metrics_contract}"))
    for c in ("metric", "plain", "foresee", "foresee - plain (paired)"):
        t.add_column(c, justify="right")
    for k, d in doc.difference.items():
        t.add_row(k, fmt(doc.metrics["plain"][k]), fmt(doc.metrics["foresee"][k]), fmt(d))
    console.print(t)
    r = doc.refinement
    say(f"refined {r.refined} of {r.steps} steps; {r.unparsed} of {r.predictions} predictions unparsed; "
         f"prompt tokens plain {r.tokens_in['plain']}, foresee {r.tokens_in['foresee']}")


config_command(app, "foresee", ForeseeConfig, _run_foresee, aliases={"scenarios": "--scenario", "tiers": "--tier"},
               extra=[_ADAPTERS])


def _run_chain(cfg, adapters: str = "") -> None:
    """Episode chains with the same cast (NPCs remember promises, slights and what they said):
    per memory mode (none, full, summary) and chain position, pass rate, CR and A_e with 95%
    intervals, the paired difference from no memory, and prompt growth; writes <mode>/episodes.jsonl
    and chain.json to --out."""
    from socialworld.swm.chain import run_chains

    doc = _with_policy(cfg, adapters, run_chains)
    fmt = lambda iv: f"{iv.mean:.2f} [{iv.lo:.2f}, {iv.hi:.2f}]"  # noqa: E731
    t = Table(title=escape(f"{doc.policy}: {doc.chains} chains of {cfg.length}, {doc.metrics_contract}"))
    for c in ("memory", "position", "pass", "solve", "CR", "A_e", "CR vs none", "prompt tokens/step", "memory chars/step"):
        t.add_column(c, justify="right")
    for m, rows in doc.modes.items():
        for r in rows:
            vs = (r.vs_none or {}).get("CR")
            t.add_row(m, str(r.position), fmt(r.metrics["pass"]), fmt(r.metrics["solve"]), fmt(r.metrics["CR"]), fmt(r.metrics["A_e"]),
                      "" if vs is None else f"{vs.mean:+.2f} [{vs.lo:+.2f}, {vs.hi:+.2f}]",
                      f"{r.prompt_tokens_per_step:.0f}", f"{r.memory_chars_per_step:.0f}")
    console.print(t)


config_command(app, "chain", ChainConfig, _run_chain, aliases={"scenarios": "--scenario", "tiers": "--tier", "modes": "--mode"},
               extra=[_ADAPTERS])


@app.command("report")
def report_cmd(
    run: Path = typer.Argument(..., help="a finished bench's --out (bench.json), or a suite's folder in it (<out>/methods, <out>/ablations)"),
) -> None:
    """Make a finished bench's or suite's report.md and report.html again from its stored document and
    episodes, and print report.md. A document written by an older version is rewritten in this
    version's form first; nothing is run."""
    from socialworld.bench.protocol import remake_reports

    try:
        remake_reports(run, log=say)
    except (ValueError, OSError) as err:
        fail(str(err))
        return
    say((run / "report.md").read_text())


@app.command("pool")
def pool_cmd(
    runs: list[Path] = typer.Argument(..., help="finished benches of one config and different --seed (their --out folders)"),
    out: Optional[Path] = typer.Option(None, help="folder to write pool.json and pool.md in (default: print only)"),
    resamples: int = typer.Option(10_000, help=f"bootstrap resamples of each interval ({COUNT})"),
) -> None:
    """Pool finished benches over run seeds: each arm's PassRate per tier over every run's last
    cycle, B - A and B - C paired within each run and bootstrapped over all of them, each run's
    forgetting, and the held-out scenarios the same way; print it as Markdown. Nothing is run."""
    from socialworld.bench.pool import pool_benches, pool_markdown, write_pool

    require("--resamples", resamples, COUNT)
    try:
        doc = pool_benches(runs, resamples=resamples)
        if out is not None:
            write_pool(doc, out)
    except (ValueError, OSError) as err:
        fail(str(err))
        return
    say(pool_markdown(doc))


@app.command("export")
def export_cmd(
    policy: str = typer.Option(..., help="a trained policy: a local model with adapters (<model>+<run folder>), or the run folder"),
    adapters: str = typer.Option("", help=ADAPTERS_HELP),
    out: Path = typer.Option(..., help="new folder for the merged model"),
    track: Literal["action", "dialogue"] = typer.Option("action", help="the adapter merged in: action (it writes the BELIEF and ACTION lines) or dialogue"),
) -> None:
    """Export a trained policy as one plain model folder (its adapter merged into the base weights),
    for servers without LoRA support (docs/serving.md)."""
    from socialworld.agents.models import export_merged

    try:
        say(f"wrote {export_merged(_policy_spec(policy, adapters), out, track)}")
    except (ValueError, OSError) as err:
        fail(str(err))


@app.command("serve")
def serve_cmd(
    model: str = typer.Option("bundled", help="model spec to serve: bundled, a local path or hub id (also its model id)"),
    adapters: str = typer.Option("", help=adapters_help("--model") + "; the action adapter writes the replies"),
    host: str = typer.Option("127.0.0.1", help="address to bind"),
    port: int = typer.Option(8000, help=f"port ({PORT})"),
    max_new_tokens: int = typer.Option(64, help=f"default max_tokens of a request ({COUNT})"),
    dtype: Literal["auto", "float32", "bfloat16"] = typer.Option(
        "auto", help="auto (bfloat16 where the hardware has it natively, else float32), float32 or bfloat16"),
    max_batch: int = typer.Option(16, help=f"most requests decoded together (a request joins the batch that is decoding while it has room; {COUNT})"),
) -> None:
    """Serve a policy model over an OpenAI-compatible API (/v1/models, /v1/chat/completions): requests
    that arrive together are batched. One process, one model: for throughput at scale serve the
    model with vLLM and evaluate it as --policy openai:<model>@<url> (docs/serving.md)."""
    with _server_errors(host, port):
        require("--port", port, PORT)
        require("--max-new-tokens", max_new_tokens, COUNT)
        require("--max-batch", max_batch, COUNT)
        from socialworld.agents.lm.server import serve

        serve(_policy_spec(model, adapters), host, port, max_new_tokens, dtype, max_batch)


@contextmanager
def _server_errors(host: str, port: int):  # type: ignore[no-untyped-def]
    """A server command's bad option, or a port it cannot bind, as one line (exit 2)."""
    try:
        yield
    except ValueError as err:  # ScenarioError too
        fail(str(err))
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            fail(f"{host}:{port} is in use by another program: choose another --port")
        else:  # an address that does not resolve or is not this machine's: name it
            fail(f"--host {host} --port {port}: cannot listen there ({err.strerror or err})")


env_app = App(no_args_is_help=True, help="The social world on the environment standards trainers plug in.")
app.add_typer(env_app, name="env")


@env_app.command("serve")
def env_serve_cmd(
    scenario: Optional[list[str]] = typer.Option(None, "--scenario", help=(
        "scenario ids or YAML paths the server offers (repeatable; default all shipped); a client picks one "
        "by id or short name at reset")),
    host: str = typer.Option("127.0.0.1", help="address to bind"),
    port: int = typer.Option(8001, help=f"port ({PORT}; 8001 leaves 8000 to socialworld serve)"),
    max_sessions: int = typer.Option(16, help=f"most concurrent sessions, one world each ({COUNT})"),
    observation: Literal["prompt", "render"] = typer.Option(
        "prompt", help="the observation text: prompt (the user message a language-model policy receives) or render (the world's long render)"),
    max_turns: int = typer.Option(0, help=f"cap every episode's turn budget (0: the scenario's own; {SEED})"),
    scripted: bool = typer.Option(False, "--scripted", help=(
        "let a step ask the expert or the oracle for its reply (SocialAction scripted=expert|oracle): baselines "
        "through this server; the oracle reads hidden state, so never on a server a policy trains against")),
    npc_voice: str = typer.Option("template", help=H("npc_voice")),
) -> None:
    """Serve the social world as an OpenEnv environment (pip install -e '.[openenv]'): OpenEnv's own
    server, one world per WebSocket session; reset(seed, scenario) and step(reply) from OpenEnv's
    client (socialworld.rollout.openenv.SocialWorldClient) or any trainer that takes an OpenEnv URL."""
    with _server_errors(host, port):
        require("--port", port, PORT)
        require("--max-sessions", max_sessions, COUNT)
        require("--max-turns", max_turns, SEED)
        specs = {s.id: s for s in resolve_scenarios(scenario or None)}
        check_voice(npc_voice, loads=True)
        try:
            from socialworld.rollout.openenv import make_app
        except ImportError:
            raise ValueError("env serve needs OpenEnv: pip install -e '.[openenv]'") from None
        from socialworld.agents.lm.server import bind, server_for
        from socialworld.agents.registry import make_voice

        voice = make_voice(npc_voice)  # loaded before the port is bound: a model that cannot load fails first
        sock = bind(host, port)
        app_ = make_app(specs, max_sessions=max_sessions, observation=observation, max_turns=max_turns, scripted=scripted,
                        voice=voice)
        console.print(f"serving the social world ({len(specs)} scenarios) as an OpenEnv environment on "
                      f"http://{host}:{sock.getsockname()[1]} (WebSocket /ws)")
        server_for(app_, sock).run(sockets=[sock])


if __name__ == "__main__":
    app()
