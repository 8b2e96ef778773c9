"""``socialworld judge-audit``: how far an LM judge is from the world's truth.

Social benchmarks score episodes with an LM judge; socialworld computes its outcomes by rules, so it
can measure the judge. A pool of episodes whose outcomes the world knows (by default the random,
expert and oracle policies on the same seeds of every scenario of the tiers: failures, partial and
full successes; with ``npc_voice`` each also with voiced NPCs) is judged as ``eval --judge`` judges
(:mod:`socialworld.rollout.judge`: ``goal`` and ``believability`` 0-10 from the public transcript), and
the judge's ``goal`` score is set against the rules, per group (all, each tier, template and voiced):

* ``kappa``: Cohen's kappa between the rule's pass and the judge's (``goal >= pass_score``);
* ``rho_cr``, ``rho_d``: Spearman's rho between the judge's goal and the episode's CR, and D;
* ``pairwise``: over every two episodes of one scenario, seed and voicing whose CR differ (the world
  orders them), the share the judge orders the same way (a tie in the judge's scores counts as not).

Each with a seeded percentile-bootstrap interval over the episodes (over the pairs for ``pairwise``;
:func:`~socialworld.metrics.stats.bootstrap_statistic`). An episode the judge could not score (no reply,
or no usable scores) is counted by kind and left out of every statistic, never scored 0.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any, Callable, Final, Literal, Sequence

import numpy as np

from socialworld.metric_registry import CR, PASS, D
from socialworld.metrics.stats import Interval, bootstrap, bootstrap_statistic, cohen_kappa, metric_value, spearman
from socialworld.records import Document, EpisodeRecord, JudgeRec
from socialworld.rollout.config import AuditConfig

AUDIT_SCHEMA: Final = "judge-audit-v1"


class AuditRow(Document):
    """The judge against the rules on one group of the pool."""

    group: str
    """``all``, a tier, ``template`` or ``voiced``"""
    episodes: int
    judged: int
    failures: dict[str, int]
    """episodes the judge could not score, by kind (``endpoint``, ``unparseable``)"""
    kappa: dict[str, Any] | None
    """Cohen's kappa, rule pass vs the judge's goal >= pass_score, with its interval (None: undefined)"""
    rho_cr: dict[str, Any] | None
    rho_d: dict[str, Any] | None
    pairs: int
    """pairs the world orders (CR differs) among the judged episodes"""
    pairwise: dict[str, Any] | None
    """the share of those the judge orders the same way, with its interval (None: no pair)"""
    judge_ties: int
    """pairs the world orders that the judge scored equal"""


class AuditDoc(Document):
    """``audit.json``: one judge against the world's truth on a pool of episodes."""

    schema_version: Literal["judge-audit-v1"] = AUDIT_SCHEMA
    judge: str
    prompt_version: str
    pass_score: int
    """the judge's goal score at or above which it counts an episode passed"""
    pool: dict[str, int]
    """episodes per policy (and voicing)"""
    rows: list[AuditRow]


@dataclass(frozen=True)
class Judged:
    """One pool episode with its judgement and its voicing."""

    episode: EpisodeRecord
    judgement: JudgeRec
    voiced: bool

    @property
    def goal(self) -> float | None:
        s = self.judgement.scores.get("goal")
        return None if s is None else s.value


def _interval(i: Interval | None) -> dict[str, Any] | None:
    return None if i is None else i.as_dict()


def audit_row(group: str, items: Sequence[Judged], pass_score: int, resamples: int, seed: int) -> AuditRow:
    """The statistics of the module's docstring over ``items``."""
    scored = [j for j in items if j.judgement.failure is None and j.goal is not None]
    failures = {k: sum(j.judgement.failure == k for j in items) for k in ("endpoint", "unparseable")}
    goal = np.array([j.goal for j in scored], dtype=float)
    passed = np.array([metric_value(j.episode, PASS) == 1.0 for j in scored])
    cr = np.array([metric_value(j.episode, CR) for j in scored])
    d = np.array([metric_value(j.episode, D) for j in scored])

    def stat(fn: Callable[[np.ndarray], float | None]) -> dict[str, Any] | None:
        return _interval(bootstrap_statistic(len(scored), fn, resamples=resamples, seed=seed)) if len(scored) >= 2 else None

    kappa = stat(lambda ix: cohen_kappa(passed[ix], goal[ix] >= pass_score))
    rho_cr = stat(lambda ix: spearman(goal[ix], cr[ix]))
    rho_d = stat(lambda ix: spearman(goal[ix], d[ix]))
    outcomes = []
    ties = 0
    key = lambda j: (j.episode.scenario_id, j.episode.seed, j.voiced)  # noqa: E731
    for (i, a), (k, b) in combinations(enumerate(scored), 2):
        if key(a) != key(b) or cr[i] == cr[k]:
            continue
        if goal[i] == goal[k]:
            ties += 1
        outcomes.append(1.0 if (goal[i] - goal[k]) * (cr[i] - cr[k]) > 0 else 0.0)
    pairwise = _interval(bootstrap(outcomes, resamples=resamples, seed=seed)) if outcomes else None
    return AuditRow(group=group, episodes=len(items), judged=len(scored), failures=failures, kappa=kappa, rho_cr=rho_cr,
                    rho_d=rho_d, pairs=len(outcomes), pairwise=pairwise, judge_ties=ties)


def audit(judge: str, prompt_version: str, items: Sequence[Judged], pass_score: int = 5, resamples: int = 2_000,
          seed: int = 0) -> AuditDoc:
    """The :class:`AuditDoc` of ``items``: a row for all of them, one per tier, and with voiced episodes in
    the pool one for the template's and one for the voiced ones."""
    groups: list[tuple[str, list[Judged]]] = [("all", list(items))]
    groups += [(t, [j for j in items if j.episode.tier == t]) for t in sorted({j.episode.tier for j in items})]
    if any(j.voiced for j in items):
        groups += [("template", [j for j in items if not j.voiced]), ("voiced", [j for j in items if j.voiced])]
    pool: dict[str, int] = {}
    for j in items:
        name = j.episode.policy_id + (" (voiced)" if j.voiced else "")
        pool[name] = pool.get(name, 0) + 1
    return AuditDoc(judge=judge, prompt_version=prompt_version, pass_score=pass_score, pool=pool,
                    rows=[audit_row(g, js, pass_score, resamples, seed) for g, js in groups])


def cell(i: dict[str, Any] | None) -> str:
    """An interval of a row as a table shows it (``-``: undefined)."""
    return "-" if i is None else f"{i['mean']:+.2f} [{i['lo']:+.2f}, {i['hi']:+.2f}]"


AUDIT_HEAD: Final = ("group", "episodes", "judged", "failed (endpoint / unparseable)", "kappa (pass)", "rho (goal, CR)",
                     "rho (goal, D)", "pairs", "pairwise agreement", "judge ties")


def audit_table(doc: AuditDoc) -> list[list[str]]:
    """The rows as ``audit.md`` and ``audit.html`` show them, under :data:`AUDIT_HEAD`."""
    return [[r.group, str(r.episodes), str(r.judged), f"{r.failures['endpoint']} / {r.failures['unparseable']}", cell(r.kappa),
             cell(r.rho_cr), cell(r.rho_d), str(r.pairs), cell(r.pairwise), str(r.judge_ties)] for r in doc.rows]


def _intro(doc: AuditDoc) -> str:
    return (f"Pool: {', '.join(f'{k} {v}' for k, v in doc.pool.items())}. The judge passes an episode at goal >= "
            f"{doc.pass_score}. 95% bootstrap intervals.")


def audit_markdown(doc: AuditDoc) -> str:
    """``audit.md``: the rows as one table."""
    lines = [f"# Judge audit: {doc.judge} ({doc.prompt_version})", "", _intro(doc), "",
             "| " + " | ".join(AUDIT_HEAD) + " |", "|" + "---|" * len(AUDIT_HEAD)]
    lines += ["| " + " | ".join(row) + " |" for row in audit_table(doc)]
    return "\n".join(lines) + "\n"


CHANCE: Final = {"kappa": 0.0, "rho_cr": 0.0, "rho_d": 0.0, "pairwise": 0.5}
"""what a judge that knows nothing gets, on average, on each statistic"""


def audit_plots(doc: AuditDoc, items: Sequence[Judged]) -> dict[str, str]:
    """name -> base64 PNG. ``scores``: the judge's goal against the rules' CR, a point per judged episode (a
    colour and a small offset per pool policy and voicing, filled where the rules passed the episode, its
    area the number of episodes there), with the pass score's line. ``agreement``: each statistic per group,
    the mean and its interval, beside what a judge that knows nothing gets (:data:`CHANCE`); an undefined
    one is named, not drawn."""
    from socialworld.figures import png, pyplot

    plt = pyplot()
    out: dict[str, str] = {}
    scored = [j for j in items if j.judgement.failure is None and j.goal is not None]
    names = list(dict.fromkeys(j.episode.policy_id + (" (voiced)" if j.voiced else "") for j in scored))
    with plt.rc_context({"font.size": 9, "axes.titlesize": 10, "legend.fontsize": 8}):
        fig, ax = plt.subplots(figsize=(7.0, 3.6))
        for k, name in enumerate(names):
            at: dict[tuple[float, float, bool], int] = {}
            for j in scored:
                if j.episode.policy_id + (" (voiced)" if j.voiced else "") == name:
                    point = (metric_value(j.episode, CR), float(j.goal or 0.0), metric_value(j.episode, PASS) == 1.0)
                    at[point] = at.get(point, 0) + 1
            dx = 0.012 * (k - (len(names) - 1) / 2)
            for filled in (True, False):
                pts = [(x + dx, y, n) for (x, y, p), n in at.items() if p == filled]
                if pts:
                    ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=[16 * p[2] for p in pts], edgecolors=f"C{k}",
                               facecolors=f"C{k}" if filled else "white", label=f"{name} ({'passed' if filled else 'failed'})")
        ax.axhline(doc.pass_score - 0.5, color="0.5", lw=0.8, ls="--")
        ax.set(xlabel="CR (the rules; a point's area: its episodes)", ylabel="goal (the judge, 0-10)", xlim=(-0.06, 1.06), ylim=(-0.5, 10.5),
               title=f"{doc.judge}: the judge's goal against the rules (dashed: its pass line, goal >= {doc.pass_score})")
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
        ax.grid(lw=0.3)
        out["scores"] = png(fig)

        stats = (("kappa", "Cohen's kappa (pass)"), ("rho_cr", "Spearman rho (goal, CR)"), ("rho_d", "Spearman rho (goal, D)"),
                 ("pairwise", "pairwise agreement"))
        fig, axes = plt.subplots(1, len(stats), figsize=(10.2, 0.32 * len(doc.rows) + 1.3), sharey=True, squeeze=False)
        for ax, (key, title) in zip(axes[0], stats):
            for i, r in enumerate(doc.rows):
                iv = getattr(r, key)
                if iv is None:
                    ax.text(CHANCE[key], i, "undefined", ha="center", va="center", color="0.4", fontsize=8)
                else:
                    # the interval, then the point: a percentile bootstrap's point can lie outside its interval
                    # (a rank statistic on few episodes), which errorbar's non-negative arms cannot draw
                    ax.errorbar([(iv["lo"] + iv["hi"]) / 2], [i], xerr=[[(iv["hi"] - iv["lo"]) / 2]], fmt="none", capsize=3, color="C0")
                    ax.plot([iv["mean"]], [i], "o", color="C0")
            ax.axvline(CHANCE[key], color="0.5", lw=0.8, ls="--")
            ax.set(xlim=(-0.05, 1.05) if key == "pairwise" else (-1.05, 1.05), title=title)
            ax.grid(axis="x", lw=0.3)
        axes[0][0].set_yticks(range(len(doc.rows)), [r.group for r in doc.rows])
        axes[0][0].invert_yaxis()
        fig.suptitle("agreement with the rules, mean and 95% bootstrap interval (dashed: a judge that knows nothing)")
        fig.tight_layout()
        out["agreement"] = png(fig)
    return out


def audit_html(doc: AuditDoc, images: dict[str, str]) -> str:
    """``audit.html``: the table of ``audit.md`` and :func:`audit_plots`, one self-contained page."""
    from socialworld.figures import PAGE_CSS

    esc = html.escape
    title = f"Judge audit: {doc.judge} ({doc.prompt_version})"
    head = "".join(f"<th>{esc(h)}</th>" for h in AUDIT_HEAD)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in audit_table(doc))
    figs = "".join(f'<figure><img alt="{esc(name)}" src="data:image/png;base64,{b64}"></figure>' for name, b64 in images.items())
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title><style>{PAGE_CSS}</style></head>"
            f"<body><h1>{esc(title)}</h1><p>{esc(_intro(doc))} kappa: Cohen's kappa between the rules' pass and the "
            "judge's; rho: Spearman's rank correlation of the judge's goal with the episode's CR and D; pairwise "
            "agreement: over the pairs of episodes of one scenario, seed and voicing whose CR differ, the share the judge "
            "orders as the rules do (a tie counts as not). Failed judgements are counted and left out of every statistic.</p>"
            f"<table><tr>{head}</tr>{body}</table>{figs}</body></html>\n")


def read_pool(paths: Sequence[str | Path]) -> list[EpisodeRecord]:
    """Episode records from ``episodes.jsonl`` files or folders holding one (an eval's ``--out``)."""
    from socialworld.records import read_jsonl

    out: list[EpisodeRecord] = []
    for p in map(Path, paths):
        f = p / "episodes.jsonl" if p.is_dir() else p
        if not f.is_file():
            raise ValueError(f"{p}: no episodes.jsonl there")
        out += read_jsonl(f)
    return out


def pool_episodes(cfg: AuditConfig, on_steps: Callable[[int], None] | None = None) -> list[tuple[EpisodeRecord, bool]]:
    """The pool ``cfg`` names: its episode files as they are, or each policy's episodes on the same seeds of
    every scenario of the tiers (and, with a voice, each again voiced); each with whether it was voiced."""
    from socialworld.agents.models import SCRIPTED
    from socialworld.agents.registry import make_policy, make_voice
    from socialworld.rollout.evaluate import episode_seeds
    from socialworld.rollout.runner import EpisodeJob, run_episodes
    from socialworld.world.spec import resolve_scenarios

    if cfg.episodes:
        return [(e, e.lineage.voice is not None) for e in read_pool(cfg.episodes)]
    specs = resolve_scenarios(None, list(cfg.tiers))
    jobs = [EpisodeJob(s, seed) for s in specs for seed in episode_seeds(cfg.seed, s.id, cfg.per_scenario)]
    voice = make_voice(cfg.npc_voice, batch_size=cfg.lm_batch_size, timeout_s=cfg.request_timeout)
    out: list[tuple[EpisodeRecord, bool]] = []
    for p in cfg.policies:
        lm = {} if p in SCRIPTED else {"batch_size": cfg.lm_batch_size, "timeout_s": cfg.request_timeout}
        for v in (None, voice) if voice is not None else (None,):
            out += [(e, v is not None) for e in run_episodes(make_policy(p, seed=cfg.seed, **lm), jobs, run_seed=cfg.seed,
                                                             on_steps=on_steps, voice=v)]
    return out


def pool_turns(cfg: AuditConfig) -> int:
    """The most turns playing ``cfg``'s pool takes (what :func:`pool_episodes`' ``on_steps`` counts to; 0 when it reads files)."""
    from socialworld.world.spec import resolve_scenarios

    if cfg.episodes:
        return 0
    voicings = 1 if cfg.npc_voice == "template" else 2
    return sum(s.turn_budget for s in resolve_scenarios(None, list(cfg.tiers))) * cfg.per_scenario * len(cfg.policies) * voicings


def run_audit(cfg: AuditConfig, on_steps: Callable[[int], None] | None = None) -> AuditDoc:
    """Play (or read) the pool, judge it, and write ``pool.jsonl``, ``judge.jsonl`` (one record per pool
    episode, in its order), ``audit.json``, ``audit.md`` and ``audit.html`` (the table and the plots) to ``cfg.out``."""
    from socialworld.agents.models import check_loads
    from socialworld.agents.registry import check_voice
    from socialworld.records import atomic_write_text, write_jsonl
    from socialworld.rollout.judge import judge_episodes, write_judged
    from socialworld.text.templates import JUDGE_PROMPT_VERSION
    from socialworld.world.spec import load_builtin_scenarios

    if not cfg.judge:
        raise ValueError("--judge: give the judge to audit (a model spec)")
    check_loads(cfg.judge, "--judge")
    check_voice(cfg.npc_voice, loads=True)
    out = Path(cfg.out)
    if (out / "audit.json").exists() or (out / "pool.jsonl").exists():
        raise ValueError(f"{out} already holds an audit: use another --out")
    out.mkdir(parents=True, exist_ok=True)
    pool = pool_episodes(cfg, on_steps)
    if not pool:
        raise ValueError("the pool holds no episode")
    specs = load_builtin_scenarios()
    unknown = sorted({e.scenario_id for e, _ in pool} - specs.keys())
    if unknown:
        raise ValueError(f"the pool holds episodes of scenarios this version does not ship: {', '.join(unknown)}")
    write_jsonl(out / "pool.jsonl", [e for e, _ in pool])
    recs = judge_episodes(cfg.judge, [e for e, _ in pool], specs, batch_size=cfg.lm_batch_size, timeout_s=cfg.request_timeout)
    write_judged(out / "judge.jsonl", recs)
    items = [Judged(e, r, v) for (e, v), r in zip(pool, recs, strict=True)]
    doc = audit(cfg.judge, JUDGE_PROMPT_VERSION, items, pass_score=cfg.pass_score, resamples=cfg.resamples, seed=cfg.seed)
    atomic_write_text(out / "audit.json", doc.to_json())
    atomic_write_text(out / "audit.md", audit_markdown(doc))
    atomic_write_text(out / "audit.html", audit_html(doc, audit_plots(doc, items)))
    return doc
