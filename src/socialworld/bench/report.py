"""Bench reports: ``report.md`` and a self-contained ``report.html`` (tables, plots as embedded
PNGs, and an episode viewer over every evaluated episode's five dimensions).

Everything shown is read from the bench document (:func:`socialworld.bench.protocol.bench_document`) and
the episode records; nothing is computed here that the document does not hold, except the
viewer's per-step projection of the records.
"""

from __future__ import annotations

import html
import json
from typing import Any, Callable, Sequence

from socialworld.bench.document import BenchDoc, SameRun, SuiteDoc, VariantRow
from socialworld.figures import PAGE_CSS, png, pyplot
from socialworld.metric_registry import KEYS, METRICS, PASS, SIGNAL_KEYS, SOLVE, metric
from socialworld.metrics.lifelong import Lost
from socialworld.metrics.stats import Interval
from socialworld.records import EpisodeRecord
from socialworld.rundir import RunDir

VIEWER_VERSION = "viewer-v3"
"""the viewer's projection of the records (v3: a voiced reply carries its template line and voice status)"""


def _iv(d: Interval | None, digits: int = 2, n: bool = False) -> str:
    """``mean [lo, hi]``, with ``n=…`` when ``n``; one value has no interval: ``mean (n=1)``."""
    if d is None:
        return "–"
    if d.n < 2:
        return f"{d.mean:.{digits}f} (n={d.n})"
    return f"{d.mean:.{digits}f} [{d.lo:.{digits}f}, {d.hi:.{digits}f}]" + (f" n={d.n}" if n else "")


def _num(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:+.{digits}f}"


# ------------------------------------------------------------------ tables (rows of strings)


def main_rows(doc: BenchDoc) -> tuple[list[str], list[list[str]]]:
    head = ["arm", "n"] + [m.label for m in METRICS]
    rows = [[arm, str(ivs[PASS].n)] + [_iv(ivs[k]) for k in KEYS] for arm, ivs in doc.main.items()]
    rows += [[f"{name} (paired)", str(d[PASS].n)] + [_iv(d[k]) for k in KEYS]
             for name, d in doc.paired.items() if name in ("B-A", "B-C")]
    rows += [[name, "–"] + [("–" if (r := d.get(k)) is None else f"{r:.2f}") for k in KEYS] for name, d in doc.ratios.items()]
    return head, rows


def tier_rows(doc: BenchDoc) -> tuple[list[str], list[list[str]]]:
    """B's paired PassRate difference against A and against C on each tier's last-cycle episodes
    (none for a document written before ``paired_by_tier``)."""
    tiers = sorted({t for d in doc.paired_by_tier.values() for t in d})
    return ["paired", *tiers], [[name, *(_iv(d.get(t), n=True) for t in tiers)] for name, d in doc.paired_by_tier.items()]


def r_rows(doc: BenchDoc) -> tuple[list[str], list[list[str]]]:
    tiers = sorted({t for tab in doc.R.values() for row in tab.values() for t in row})
    head = ["arm", "cycle", "unlocked"] + tiers
    rows = []
    for arm, tab in doc.R.items():
        for c, row in tab.items():
            rows.append([arm, c, "+".join(doc.tiers_per_cycle[c])] + [_iv(row.get(t), n=True) for t in tiers])
    return head, rows


def lifelong_rows(doc: BenchDoc) -> tuple[list[str], list[list[str]]]:
    """Forgetting per arm and tier, with its paired bootstrap interval where the document has one, and
    forward transfer."""
    tiers = sorted({t for f in doc.forgetting.values() for t in f} | {t for f in doc.forward_transfer.values() for t in f})
    head = ["arm"] + [f"F {t}" for t in tiers] + [f"FWT {t}" for t in tiers]

    def f(arm: str, t: str) -> str:
        iv = doc.forgetting_intervals.get(arm, {}).get(t)
        return _num(doc.forgetting[arm].get(t)) if iv is None else f"{iv.mean:+.2f} [{iv.lo:+.2f}, {iv.hi:+.2f}]"

    rows = [[arm] + [f(arm, t) for t in tiers] + [_num(doc.forward_transfer.get(arm, {}).get(t)) for t in tiers]
            for arm in doc.forgetting]
    return head, rows


def lost_note(doc: BenchDoc) -> str | None:
    """The episodes behind B's forgetting: each earlier-tier episode it passed in an earlier cycle and fails
    in the last, and whether arm C passes it (None when the document lists none, or predates the list)."""
    if not doc.lost:
        return None

    def c(x: Lost) -> str:
        return "" if x.reference_passed is None else ("; C passes it" if x.reference_passed else "; C fails it too")

    eps = "; ".join(f"{x.tier} {x.scenario_id} seed {x.seed} (passed in cycle {', '.join(map(str, x.passed_in))}{c(x)})"
                    for x in doc.lost)
    n = len(doc.lost)
    return (f"B lost {n} episode{'s' if n > 1 else ''} of earlier tiers in the last cycle: {eps}. Each F interval resamples "
            "the tier's evaluation episodes, the same seeds in every cycle.")


LOOP_SHOWN = (PASS, SOLVE, "D")
"""the metrics the loop table shows per cycle"""


def loop_rows(doc: BenchDoc) -> tuple[list[str], list[list[str]]]:
    head = ["cycle", "unlocked", "action pairs", "dialogue pairs", "excluded (by reason)", "final loss", *LOOP_SHOWN]
    rows = []
    for s in doc.loop:
        excl = ", ".join(f"{k} {v}" for k, v in sorted(s.excluded.items())) or "–"
        loss = ", ".join(f"{k} {v:.3f}" for k, v in s.final_loss.items() if v is not None) or "–"
        rows.append([str(s.cycle), "+".join(s.tiers), str(s.pairs.get("action", 0)), str(s.pairs.get("dialogue", 0)),
                     excl, loss, *(f"{s.eval[k]:.2f}" for k in LOOP_SHOWN)])
    return head, rows


def diagnostics_rows(doc: BenchDoc) -> tuple[list[str], list[list[str]]]:
    """One row per arm; the primary failures in one column (most frequent first), so the table
    keeps its width however many failure categories occur."""
    head = ["arm", "failed", "coverage", "mean confidence", "primary failures (episodes)"]
    rows = [[arm, str(d.coverage.failed), f"{d.coverage.coverage:.2f}", f"{d.coverage.mean_confidence:.2f}",
             ", ".join(f"{k} {v}" for k, v in sorted(d.primary_failures.items(), key=lambda kv: (-kv[1], kv[0])) if v) or "–"]
            for arm, d in doc.diagnostics.items()]
    return head, rows


def judge_rows(doc: BenchDoc) -> tuple[list[str], list[list[str]]]:
    """The LM judge's means per arm (last cycle), with its failures counted; no rows without a judge."""
    head = ["arm", "judged", "endpoint failures", "unparseable", "goal (0-10)", "believability (0-10)"]
    arms = doc.judge.arms if doc.judge else {}
    rows = [[arm, f"{j['judged']}/{j['episodes']}", str(j["endpoint_failures"]), str(j["unparseable"]),
             _num(j["means"]["goal"]), _num(j["means"]["believability"])] for arm, j in arms.items()]
    return head, rows


def holdout_rows(doc: BenchDoc) -> tuple[list[str], list[list[str]]]:
    """Every arm on the scenarios B never trained on, and B's paired differences there (no rows without
    held-out scenarios)."""
    head = ["arm", "n"] + [m.label for m in METRICS] + ["PassRate by scenario"]
    h = doc.holdout
    if h is None:
        return head, []
    rows = [[arm, str(ivs[PASS].n)] + [_iv(ivs[k]) for k in KEYS]
            + [", ".join(f"{sid} {v:.2f}" for sid, v in h.by_scenario.get(arm, {}).items())] for arm, ivs in h.main.items()]
    rows += [[f"{name} (paired)", str(d[PASS].n)] + [_iv(d[k]) for k in KEYS] + ["–"] for name, d in h.paired.items()]
    return head, rows


def voice_rows(doc: BenchDoc) -> tuple[list[str], list[list[str]]]:
    """With an NPC voice: each arm's voiced − template on its last-cycle episodes, every metric over them all
    and PassRate per tier (no rows without a voice)."""
    tiers = sorted({t for fx in doc.voice_effect.values() for t in fx.by_tier})
    head = ["arm", "n"] + [m.label for m in METRICS] + [f"PassRate {t}" for t in tiers]
    return head, [[arm, str(fx.all[PASS].n)] + [_iv(fx.all[k]) for k in KEYS] + [_iv(fx.by_tier[t][PASS]) if t in fx.by_tier else "–"
                                                                              for t in tiers] for arm, fx in doc.voice_effect.items()]


TABLES = (("Main table (last cycle, 95% bootstrap intervals)", main_rows),
          ("PassRate differences by tier (last cycle, paired, 95% bootstrap intervals)", tier_rows),
          ("Scenarios never trained on (held out of every cycle; the last cycle's policy; 95% bootstrap intervals)", holdout_rows),
          ("Hierarchical pass rates R[cycle][tier]", r_rows),
          ("Forgetting and forward transfer", lifelong_rows),
          ("Closed loop (arm B) per cycle", loop_rows),
          ("Diagnostics: coverage and failure attribution (last cycle)", diagnostics_rows),
          ("LM judge (last cycle; proxy evidence, beside the rule metrics, never in them)", judge_rows),
          ("Voiced − template (last cycle: the same seeds played again by the same policy with the template lines; "
           "how much of the skill survives people's language; paired, 95% bootstrap intervals)", voice_rows))


def _md_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A Markdown table's lines."""
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows)]


def judge_note(doc: BenchDoc) -> str | None:
    """How often the judge ordered two episodes of one task (scenario and seed) as the world's returns
    do, over every two arms' last-cycle episodes (None without a judge)."""
    a = doc.judge.agreement if doc.judge else None
    if not a:
        return None
    rate = "no pair to compare" if a["agreement"] is None else f"agreement {a['agreement']:.2f}"
    return (f"Against the world: of {a['compared']} pairs of arms' episodes of the same task whose returns differ, the judge "
            f"ranked {a['agree']} as the returns do, {a['disagree']} the other way and scored {a['judge_ties']} alike ({rate}; "
            f"a coin's is 0.5); {a['world_ties']} pairs with equal returns were not compared.")


def table_note(table: Callable[[BenchDoc], tuple[list[str], list[list[str]]]], doc: BenchDoc) -> str | None:
    """The paragraph under a table, where it has one: the judge's agreement with the world under the judge's
    table, B's lost episodes under forgetting."""
    notes = {judge_rows: judge_note, lifelong_rows: lost_note}
    return notes[table](doc) if table in notes else None


def cut_note(doc: BenchDoc) -> str | None:
    """What a budget that cuts episodes short means for the numbers (the smoke preset), or None."""
    cap = doc.preset.get("max_turns", 0)
    if not cap:
        return None
    return (f"A smoke-sized run: every episode stops after {cap} turns (preset `{doc.run_config.preset}`), before most "
            "scenarios can be settled, so few or no episodes pass in any arm, the oracle's too, and the plots have little "
            "to draw. It shows that the protocol runs end to end, not what the policy learns: the `default` preset does.")


def markdown(doc: BenchDoc) -> str:
    cfg = doc.run_config
    note = cut_note(doc)
    out = [f"# ASCENT-Bench report ({doc.version}, {doc.metrics_contract})", "", *([f"**{note}**", ""] if note else []),
           f"Model `{cfg.model}`, preset `{cfg.preset}`, seed {cfg.seed}, unlocking `{cfg.unlock}`; "
           f"Pass iff CR >= {doc.thresholds.CR} and D >= {doc.thresholds.D} and no guard is broken; "
           "Solved iff every decision is finalized and no guard is broken (CR counts decisions and conflicts only). "
           f"Mean steps per episode: {', '.join(f'{a} {v:.1f}' for a, v in doc.steps_per_episode.items())}. "
           f"Arms: A untrained, B closed loop, C {cfg.proxy or 'expert'}; oracle and random as references. "
           f"Episodes per arm: {doc.episodes_per_arm}.", ""]
    for title, fn in TABLES:
        head, rows = fn(doc)
        if not rows:
            continue
        if fn is judge_rows and doc.judge:
            title = f"{title}: {doc.judge.judge}"
        out += [f"## {title}", "", *_md_table(head, rows), ""]
        if note := table_note(fn, doc):
            out += [note, ""]
    return "\n".join(out)


def suite_rows(doc: SuiteDoc) -> tuple[list[str], list[list[str]]]:
    """A suite's table: last-cycle metrics per variant, the paired differences of PassRate,
    SolveRate and D against the untrained model and against the full recipe on the same episodes,
    forgetting, the pairs kept, and for GRPO the share of groups whose rewards varied. A variant
    that is another by construction says so in every cell instead of repeating its numbers."""
    full = doc.full
    vs = (PASS, SOLVE, "D")
    head = (["variant"] + [m.label for m in METRICS]
            + [f"{metric(k).label} - untrained" for k in vs] + [f"{metric(PASS).label} - {full or 'full'}", "forgetting (max F)",
                                                                "pairs kept (per cycle)", "GRPO groups with reward variance"])
    rows = []
    for name, v in doc.variants.items():
        if isinstance(v, SameRun):
            rows.append([name] + [f"= {v.same_as}"] * (len(head) - 1))
            continue
        vu, vf = v.vs_untrained or {}, v.vs_full or {}
        pairs = "; ".join(", ".join(f"{k} {n}" for k, n in p.items()) for p in v.pairs) or "–"
        forgot = max(v.forgetting.values(), default=None) if v.forgetting is not None else None
        var = v.groups_with_reward_variance
        rows.append([name] + [_iv(v.metrics[k]) for k in KEYS]
                    + [_iv(vu.get(k)) for k in vs] + [_iv(vf.get(PASS)), _num(forgot), pairs, "–" if var is None else f"{var:.2f}"])
    return head, rows


def suite_r_rows(doc: SuiteDoc) -> tuple[list[str], list[list[str]]]:
    """Each run variant's R table, one row per cycle: PassRate per unlocked tier with its interval."""
    ran = {name: v for name, v in doc.variants.items() if isinstance(v, VariantRow)}
    tiers = sorted({t for v in ran.values() for row in v.R.values() for t in row})
    head = ["variant", "cycle"] + tiers
    rows = [[name, c] + [_iv(row.get(t)) for t in tiers] for name, v in ran.items() for c, row in sorted(v.R.items())]
    return head, rows


def suite_notes(doc: SuiteDoc) -> list[str]:
    """What the table cannot say in a cell: which variants are another by construction, and why."""
    return [f"{name} is {v.same_as} by construction, so it was not run: {v.why}." for name, v in doc.variants.items()
            if isinstance(v, SameRun)]


def suite_intro(doc: SuiteDoc) -> str:
    cfg = doc.run_config
    return (f"Preset `{cfg.preset}` ({doc.preset}), seed {cfg.seed}; every variant under the same "
            "protocol, budget and evaluation seeds, reusing the same untrained wake data. Intervals: 95% bootstrap; "
            "differences paired on the same episodes.")


def suite_markdown(doc: SuiteDoc) -> str:
    """The methods or ablations report: :func:`suite_rows` and :func:`suite_notes`."""
    notes = suite_notes(doc)
    return "\n".join([f"# ASCENT-Bench {doc.suite} suite ({doc.version}, {doc.metrics_contract})", "", suite_intro(doc), "",
                      *_md_table(*suite_rows(doc)), *(["", *notes] if notes else []), "",
                      "## Hierarchical pass rates R[cycle][tier]", "", *_md_table(*suite_r_rows(doc))])


def suite_plot(doc: SuiteDoc) -> str:
    """PassRate and D of every run variant at the last cycle (mean, 95% interval), the untrained
    model first; a variant that is another by construction is drawn at that one's values, hollow."""
    plt = pyplot()
    names = list(doc.variants)
    own = {n: doc.variants[v.same_as] if isinstance(v := doc.variants[n], SameRun) else v for n in names}
    with plt.rc_context({"font.size": 9, "axes.titlesize": 10}):
        fig, axes = plt.subplots(1, 2, figsize=(10.2, 0.35 * len(names) + 1.4), squeeze=False, sharey=True)
        for ax, m in zip(axes[0], (metric(PASS), metric("D"))):
            for i, n in enumerate(names):
                row = own[n]
                assert isinstance(row, VariantRow), f"{n} names {doc.variants[n]}, which was not run"
                iv = row.metrics[m.key]
                hollow = isinstance(doc.variants[n], SameRun)
                ax.errorbar([iv.mean], [i], xerr=[[iv.mean - iv.lo], [iv.hi - iv.mean]], fmt="o", capsize=3,
                            color="C0" if i else "C7", markerfacecolor="white" if hollow else None)
            ax.set_xlim(-0.05, 1.05)
            ax.set_title(f"{m.axis}, last cycle")
            ax.grid(axis="x", lw=0.3)
        axes[0][0].set_yticks(range(len(names)), names)
        axes[0][0].invert_yaxis()
        fig.suptitle(f"{doc.suite} suite: mean and 95% bootstrap interval (hollow: the same run as the variant it names)")
        fig.tight_layout()
        return png(fig)


def suite_html(doc: SuiteDoc) -> str:
    """A suite's page: the table, the notes and :func:`suite_plot`."""
    title = f"ASCENT-Bench {doc.suite} suite ({doc.version}, {doc.metrics_contract})"
    notes = "".join(f"<p>{html.escape(n)}</p>" for n in suite_notes(doc))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{CSS}</style></head>"
            f"<body><h1>{html.escape(title)}</h1><p>{html.escape(suite_intro(doc)).replace('`', '')}</p>"
            f"{_table_html(*suite_rows(doc), cls='suite')}{notes}<h2>Hierarchical pass rates R[cycle][tier]</h2>"
            f"{_table_html(*suite_r_rows(doc), cls='r')}"
            f'<figure><img alt="variants" src="data:image/png;base64,{suite_plot(doc)}"></figure></body></html>')


# ------------------------------------------------------------------ plots


ARM_STYLE = {"A": ("o", "-"), "B": ("s", "-"), "C": ("^", "--"), "oracle": ("D", ":"), "random": ("v", ":")}
"""marker and line style per arm, so curves that coincide stay distinguishable"""
def plots(doc: BenchDoc) -> dict[str, str]:
    """name -> base64 PNG: the last cycle's metrics (one panel per metric, on its own scale, n
    under each arm), learning curves per tier (a marker and an offset per arm), and the pass-rate
    heatmap per arm with its colour bar."""
    import numpy as np

    plt = pyplot()

    arms = list(doc.R)
    cycles = sorted({int(c) for tab in doc.R.values() for c in tab})
    tiers = sorted({t for tab in doc.R.values() for row in tab.values() for t in row})
    colours = {arm: f"C{i}" for i, arm in enumerate(arms)}
    out = {}
    with plt.rc_context({"font.size": 9, "axes.titlesize": 10, "legend.fontsize": 9}):
        fig, axes = plt.subplots(2, 4, figsize=(10.2, 4.8), squeeze=False)
        for ax, m in zip(axes.flat, METRICS):
            lo, hi = m.range
            ivs = [doc.main[arm][m.key] for arm in arms]
            x = np.arange(len(arms))
            base = max(lo, 0)  # bars start at 0, or at the scale's floor (S_npc: 1)
            ax.bar(x, [iv.mean - base for iv in ivs], 0.7, bottom=base, color=[colours[a] for a in arms],
                   yerr=[[iv.mean - iv.lo for iv in ivs], [iv.hi - iv.mean for iv in ivs]], capsize=3)
            ax.set_xticks(x, [f"{arm}\nn={iv.n}" for arm, iv in zip(arms, ivs)], fontsize=7)
            ax.set_ylim(lo, hi)
            ax.set_title(m.axis)
            ax.axhline(base, color="k", lw=0.6)
        axes.flat[-1].axis("off")
        fig.suptitle("Last cycle per arm, mean and 95% bootstrap interval (n = episodes)")
        fig.tight_layout()
        out["bars"] = png(fig)

        fig, axes = plt.subplots(1, len(tiers), figsize=(min(10.2, 3.2 * len(tiers)), 2.9), squeeze=False)
        for ax, t in zip(axes[0], tiers):
            for k, arm in enumerate(arms):
                pts = [(c, doc.R[arm][str(c)][t]) for c in cycles if t in doc.R[arm].get(str(c), {})]
                if not pts:
                    continue
                marker, line = ARM_STYLE.get(arm, ("o", "-"))
                dx = (k - (len(arms) - 1) / 2) * 0.06  # side by side when they coincide
                ax.errorbar([c + dx for c, _ in pts], [iv.mean for _, iv in pts],
                            yerr=[[iv.mean - iv.lo for _, iv in pts], [iv.hi - iv.mean for _, iv in pts]],
                            marker=marker, linestyle=line, color=colours[arm], capsize=2, markersize=5, label=arm)
            ns = sorted({iv.n for arm in arms for c in cycles for iv in [doc.R[arm].get(str(c), {}).get(t)] if iv})
            ax.set_title(f"{t} PassRate (n={'/'.join(map(str, ns))})")
            ax.set_ylim(-0.05, 1.05)
            ax.set_xticks(cycles)
            ax.set_xlim(min(cycles) - 0.4, max(cycles) + 0.4)
            ax.set_xlabel("cycle")
        axes[0][0].set_ylabel("PassRate")
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=len(arms), bbox_to_anchor=(0.5, -0.02), frameon=False)
        fig.tight_layout(rect=(0, 0.1, 1, 1))
        out["curves"] = png(fig)

        fig, axes = plt.subplots(1, len(arms), figsize=(min(10.2, 1.9 * len(arms) + 0.8), 2.6), squeeze=False)
        image = None
        for ax, arm in zip(axes[0], arms):
            grid = np.full((len(cycles), len(tiers)), np.nan)
            for i, c in enumerate(cycles):
                for j, t in enumerate(tiers):
                    iv = doc.R[arm].get(str(c), {}).get(t)
                    if iv is not None:
                        grid[i, j] = iv.mean
            image = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis")
            ax.set_title(arm)
            ax.set_xticks(range(len(tiers)), tiers)
            ax.set_yticks(range(len(cycles)), [f"cycle {c}" for c in cycles] if ax is axes[0][0] else [])
            for i in range(len(cycles)):
                for j in range(len(tiers)):
                    if not np.isnan(grid[i, j]):
                        ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", color="w" if grid[i, j] < 0.6 else "k", fontsize=8)
        if image is not None:  # some arm drawn
            fig.colorbar(image, ax=list(axes[0]), shrink=0.9, label="PassRate")
        fig.suptitle("PassRate per cycle and tier (blank: tier not unlocked)")
        out["heatmap"] = png(fig)
    return out


# ------------------------------------------------------------------ episode viewer


def viewer_episode(arm: str, cycle: int, ep: EpisodeRecord, intern: Callable[[str], int]) -> dict:
    """The five dimensions of each step, as the viewer shows them, and the prompt a language
    model received (its system message as an index into the page's shared list, ``intern``:
    it repeats at every step of a scenario)."""
    m = ep.metrics

    def prompt(s: Any) -> dict | None:
        p = s.policy.prompt
        if p is None:
            return None
        return {"version": p.version, "tokens": s.policy.tokens_in,
                "messages": [{"role": x.role, **({"shared": intern(x.content)} if x.role == "system" else {"content": x.content})}
                             for x in p.messages]}

    return {
        "key": f"{arm} · cycle {cycle} · {ep.scenario_id} · seed {ep.seed}",
        "arm": arm, "cycle": cycle, "scenario": ep.scenario_id, "tier": ep.tier,
        "seed": str(ep.seed),  # a string: JavaScript's numbers round 63-bit seeds (and the page would name another episode)
        "budget": ep.steps[0].setting.turn_budget if ep.steps else None,
        "passed": bool(m.passed) if m else None,
        "metrics": {k: {"value": getattr(m, k).value, "source": getattr(m, k).source} for k in SIGNAL_KEYS} if m else {},
        "steps": [{
            "t": s.setting.step,
            "observation": s.observation.text,
            "prompt": prompt(s),
            "stated": s.mental_state.stated,
            "truth": s.mental_state.truth,
            "raw": s.action.raw,
            "status": s.action.parse_status,
            "error": s.action.error,
            "executed": s.action.executed,
            "utterance": s.dialogue.utterance,
            "replies": [{"speaker": r.speaker, "text": r.text,
                         **({"template": r.voice.template, "voice": r.voice.status} if r.voice is not None else {})}
                        for r in s.dialogue.replies],
            "announcements": list(s.dialogue.announcements),
            "signals": [{"name": n, **sig.model_dump()} for n, sig in
                        [("align", s.signals.align), ("reward", s.signals.reward), ("penalty", s.signals.penalty), ("q", s.signals.q)]
                        + [(f"mood:{k}", v) for k, v in s.signals.moods.items()]],
            "policy": {"id": s.policy.policy_id, "adapter": s.policy.adapter_hash},
        } for s in ep.steps],
    }


def row_links(name: str, doc: BenchDoc) -> list[str | None]:
    """The viewer filter each row of table ``name`` links to (``arm=B&cycle=3``), row for row."""
    last = str(max(int(c) for c in doc.tiers_per_cycle))
    if name == "main_rows":
        return ([f"arm={a}&cycle={last}" for a in doc.main] + [f"arm=B&cycle={last}" for n in doc.paired if n in ("B-A", "B-C")]
                + [None for _ in doc.ratios])
    if name == "tier_rows":
        return [f"arm=B&cycle={last}" for _ in doc.paired_by_tier]
    if name == "r_rows":
        return [f"arm={a}&cycle={c}" for a, tab in doc.R.items() for c in tab]
    if name == "lifelong_rows":
        return [f"arm={a}" for a in doc.forgetting]
    if name == "loop_rows":
        return [f"arm=B&cycle={s.cycle}" for s in doc.loop]
    if name == "diagnostics_rows":
        return [f"arm={a}&cycle={last}&outcome=fail" for a in doc.diagnostics]
    if name == "voice_rows":
        return [f"arm={a}&cycle={last}" for a in doc.voice_effect]
    if name == "judge_rows":
        return [f"arm={a}&cycle={last}" for a in (doc.judge.arms if doc.judge else {})]
    if name == "holdout_rows" and doc.holdout is not None and len(doc.holdout.scenarios) == 1:
        sid = doc.holdout.scenarios[0]
        links: list[str | None] = [f"arm={a}&cycle={last}&scenario={sid}" for a in doc.holdout.main]
        return links + [f"arm=B&cycle={last}&scenario={sid}" for _ in doc.holdout.paired]
    return []


def _table_html(head: Sequence[str], rows: Sequence[Sequence[str]], cls: str, links: Sequence[str | None] = ()) -> str:
    """A table; where ``links[i]`` is a viewer filter, row i's first cell links to its episodes."""
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)

    def cells(i: int, r: Sequence[str]) -> str:
        link = links[i] if i < len(links) else None
        first = html.escape(r[0]) if link is None else \
            f'<a href="#view?{html.escape(link)}" title="show these episodes in the viewer">{html.escape(r[0])}</a>'
        return f"<td>{first}</td>" + "".join(f"<td>{html.escape(c)}</td>" for c in r[1:])

    body = "".join(f"<tr>{cells(i, r)}</tr>" for i, r in enumerate(rows))
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


VIEWER_JS = r"""
const EPISODES = JSON.parse(document.getElementById('episodes').textContent);
const SHARED = JSON.parse(document.getElementById('shared').textContent);
const sel = document.getElementById('episode'), slider = document.getElementById('step');
const FILTERS = {arm: e => e.arm, cycle: e => String(e.cycle), scenario: e => e.scenario, tier: e => e.tier,
                 outcome: e => e.passed === null ? 'unscored' : (e.passed ? 'pass' : 'fail')};
function esc(s) { return String(s ?? '').replace(/[&<>"]/g, c => ({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c])); }
for (const [name, get] of Object.entries(FILTERS)) {
  const box = document.getElementById('f-' + name);
  [...new Set(EPISODES.map(get))].sort().forEach(v => { const o = document.createElement('option'); o.value = v; o.textContent = v; box.appendChild(o); });
  box.addEventListener('change', () => fill());
}
function fill(keep) {
  const want = Object.fromEntries(Object.keys(FILTERS).map(n => [n, document.getElementById('f-' + n).value]));
  const shown = EPISODES.map((e, i) => i).filter(i => Object.entries(FILTERS).every(([n, get]) => !want[n] || get(EPISODES[i]) === want[n]));
  const current = keep ?? sel.value;
  sel.innerHTML = '';
  shown.forEach(i => { const e = EPISODES[i], o = document.createElement('option'); o.value = i;
    o.textContent = e.key + (e.passed ? ' · pass' : ' · fail'); sel.appendChild(o); });
  document.getElementById('count').textContent = `${shown.length} of ${EPISODES.length} episodes`;
  if (shown.map(String).includes(String(current))) sel.value = current; else slider.value = 0;
  show();
}
function belief(stated, truth) {
  const rows = [];
  const npcs = new Set([...Object.keys(truth.preferences || {}), ...Object.keys(truth.moods || {})]);
  for (const n of npcs) {
    for (const [slot, opt] of Object.entries((truth.preferences || {})[n] || {})) {
      const s = stated && stated.preferences && stated.preferences[n] ? stated.preferences[n][slot] : undefined;
      rows.push(`<tr class="${s === opt ? 'ok' : 'bad'}"><td>${esc(n)}</td><td>${esc(slot)}</td><td>${esc(s ?? '—')}</td><td>${esc(opt)}</td></tr>`);
    }
    const sm = stated && stated.moods ? stated.moods[n] : undefined, tm = (truth.moods || {})[n];
    if (tm !== undefined) rows.push(`<tr class="${sm === tm ? 'ok' : 'bad'}"><td>${esc(n)}</td><td>mood</td><td>${esc(sm ?? '—')}</td><td>${esc(tm)}</td></tr>`);
  }
  return '<table class="belief"><tr><th>npc</th><th>item</th><th>stated</th><th>truth</th></tr>' + rows.join('') + '</table>';
}
function prompt(p) {
  if (!p) return '<p class="small">A scripted policy: it reads the structured observation; no prompt.</p>';
  return `<div class="small">prompt ${esc(p.version)} · ${p.tokens} tokens</div>` + p.messages.map(
    m => `<div><b>${esc(m.role)}</b></div><pre>${esc(m.shared !== undefined ? SHARED[m.shared] : m.content)}</pre>`).join('');
}
function compare(e) {
  const same = EPISODES.map((o, i) => [o, i]).filter(([o]) => o.cycle === e.cycle && o.scenario === e.scenario && o.seed === e.seed);
  const n = Math.max(...same.map(([o]) => o.steps.length)), t = +slider.value;
  const head = '<tr><th>step</th>' + same.map(([o, i]) => `<th class="${o.passed ? 'pass' : 'fail'}"><a href="#" data-ep="${i}">${esc(o.arm)}</a>
    · ${o.passed ? 'pass' : 'fail'} · CR ${o.metrics.CR && o.metrics.CR.value !== null ? o.metrics.CR.value.toFixed(2) : '–'}</th>`).join('') + '</tr>';
  let body = '';
  for (let k = 0; k < n; k++) {
    body += `<tr data-step="${k}" class="${k === t ? 'here' : ''}"><td>${k + 1}</td>` + same.map(([o]) => {
      const s = o.steps[k]; if (!s) return '<td></td>';
      const r = s.signals.find(g => g.name === 'reward');
      return `<td><code>${esc(s.executed)}</code> <span class="${s.status}">${s.status === 'ok' ? '' : esc(s.status)}</span>` +
        `<div class="small">${esc(s.utterance)}</div><div class="small">reward ${r && r.value !== null ? (+r.value).toFixed(2) : '–'}</div></td>`;
    }).join('') + '</tr>';
  }
  return `<p class="small">cycle ${e.cycle} · ${esc(e.scenario)} · seed ${e.seed}: every arm on this episode, step by step</p>` +
    `<table class="compare">${head}${body}</table>`;
}
function show() {
  const e = EPISODES[sel.value];
  for (const id of ['obs', 'prompt', 'mind', 'act', 'talk', 'sig', 'cmp', 'meta', 'stepno']) document.getElementById(id).innerHTML = '';
  if (!e) { document.getElementById('meta').textContent = 'no episode matches these filters'; return; }
  slider.max = Math.max(0, e.steps.length - 1); if (+slider.value > +slider.max) slider.value = 0;
  const s = e.steps[+slider.value];
  document.getElementById('meta').innerHTML = esc(e.key) + ' — ' + Object.entries(e.metrics).map(
    ([k, v]) => `${k} ${v.value === null ? '–' : v.value.toFixed(2)} (${v.source})`).join(', ');
  // one counter, the observation's own ("turn 3/7": turns of the scenario's budget already taken)
  document.getElementById('stepno').textContent = s ? `turn ${s.t}/${e.budget} (${e.steps.length} played)` : 'no steps';
  document.getElementById('cmp').innerHTML = compare(e);
  if (!s) return;
  document.getElementById('obs').textContent = s.observation;
  document.getElementById('prompt').innerHTML = prompt(s.prompt);
  document.getElementById('mind').innerHTML = belief(s.stated, s.truth);
  document.getElementById('act').innerHTML = `<div><b>executed</b> <code>${esc(s.executed)}</code> <span class="${s.status}">${esc(s.status)}</span>${s.error ? ' — ' + esc(s.error) : ''}</div><pre>${esc(s.raw)}</pre><div class="small">policy ${esc(s.policy.id)}${s.policy.adapter ? ' · adapters ' + esc(s.policy.adapter) : ''}</div>`;
  document.getElementById('talk').innerHTML = `<div><b>agent:</b> ${esc(s.utterance) || '<i>(silent)</i>'}</div>` +
    s.replies.map(r => `<div><b>${esc(r.speaker)}:</b> ${esc(r.text)}</div>` +
      (r.template !== undefined && r.template !== r.text ? `<div class="small">template (${esc(r.voice)}): ${esc(r.template)}</div>` : '')).join('') +
    s.announcements.map(a => `<div class="small">news: ${esc(a)}</div>`).join('');
  document.getElementById('sig').innerHTML = '<tr><th>signal</th><th>value</th><th>source</th><th>confidence</th><th>detail</th></tr>' +
    s.signals.map(g => `<tr><td>${esc(g.name)}</td><td>${g.value === null ? '–' : (+g.value).toFixed(3)}</td><td>${esc(g.source)}</td><td>${(+g.confidence).toFixed(2)}</td><td>${esc(g.detail)}</td></tr>`).join('');
}
function fromHash() {
  const h = decodeURIComponent(location.hash);
  if (!h.startsWith('#view?')) return;
  const q = new URLSearchParams(h.slice(6));
  for (const n of Object.keys(FILTERS)) {
    const box = document.getElementById('f-' + n), v = q.get(n) ?? '';
    if (v && ![...box.options].some(o => o.value === v)) {  // no episode has it: the filter still holds (0 shown)
      const o = document.createElement('option'); o.value = v; o.textContent = v; box.appendChild(o);
    }
    box.value = v;
  }
  slider.value = 0; fill(''); document.getElementById('viewer').scrollIntoView();
  history.replaceState(null, '', location.pathname + location.search);  // the same link works again
}
document.getElementById('cmp').addEventListener('click', ev => {
  const a = ev.target.closest('a[data-ep]'), row = ev.target.closest('tr[data-step]');
  if (a) { ev.preventDefault(); for (const n of Object.keys(FILTERS)) document.getElementById('f-' + n).value = ''; fill(a.dataset.ep); }
  else if (row) { slider.value = Math.min(+slider.max, +row.dataset.step); show(); }
});
sel.addEventListener('change', () => { slider.value = 0; show(); });
slider.addEventListener('input', show);
document.getElementById('prev').onclick = () => { slider.value = Math.max(0, +slider.value - 1); show(); };
document.getElementById('next').onclick = () => { slider.value = Math.min(+slider.max, +slider.value + 1); show(); };
window.addEventListener('hashchange', fromHash);
fill(); fromHash();
"""

CSS = PAGE_CSS + """
.viewer{display:grid;grid-template-columns:minmax(0,1fr) minmax(0,1fr);gap:10px}.viewer section{border:1px solid #ddd;padding:8px;border-radius:4px;min-width:0}
.wide{grid-column:1/3}pre{white-space:pre-wrap;overflow-wrap:anywhere;font-size:12px;background:#fafafa;padding:6px;margin:2px 0 6px}
.ok td{background:#e8f6e8}.bad td{background:#fbeaea}
.small{font-size:11px;color:#666}.unparseable,.illegal{color:#b00;font-weight:bold}
.filters label{margin-right:10px;font-size:13px}#episode{max-width:100%}
table.compare{width:100%;table-layout:fixed}table.compare td{text-align:left;vertical-align:top;overflow-wrap:anywhere}
table.compare td:first-child,table.compare th:first-child{width:3em}table.compare th{text-align:left}
table.diagnostics td:last-child{text-align:left}table.compare tr.here td{background:#fff7d6}table.compare tr[data-step]{cursor:pointer}
th.pass{background:#e8f6e8}th.fail{background:#fbeaea}
"""


def html_report(doc: BenchDoc, images: dict[str, str], episodes: list[dict], shared: Sequence[str] = ()) -> str:
    """The page: tables (rows link to their episodes), plots, and the viewer over ``episodes``
    (``shared``: the texts their prompts refer to by index)."""
    tables = "".join(f"<h2>{html.escape(title)}</h2>" + _table_html(*fn(doc), cls=fn.__name__.replace("_rows", ""),
                                                                 links=row_links(fn.__name__, doc))
                     + (f"<p>{html.escape(note)}</p>" if (note := table_note(fn, doc)) else "")
                     for title, fn in TABLES if fn(doc)[1])
    figs = "".join(f'<figure><img alt="{name}" src="data:image/png;base64,{b64}"></figure>' for name, b64 in images.items())
    data = json.dumps(episodes).replace("<", "\\u003c")  # no "</script>" or "<!--" can end the script element
    texts = json.dumps(list(shared)).replace("<", "\\u003c")
    cfg = doc.run_config
    filters = "".join(f'<label>{name} <select id="f-{name}"><option value="">any</option></select></label>'
                      for name in ("arm", "cycle", "scenario", "tier", "outcome"))
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>ASCENT-Bench report</title><style>{CSS}</style></head>
<body><h1>ASCENT-Bench report</h1>
{f'<p class="note"><b>{html.escape(note).replace("`", "")}</b></p>' if (note := cut_note(doc)) else ""}
<p>{html.escape(doc.version)} · {html.escape(doc.metrics_contract)} · model <code>{html.escape(cfg.model)}</code> · preset <code>{html.escape(cfg.preset)}</code>
· seed {cfg.seed} · unlocking <code>{html.escape(cfg.unlock)}</code> · Pass iff CR &ge; {doc.thresholds.CR} and D &ge; {doc.thresholds.D} and no guard is broken
· Solved iff every decision is finalized and no guard is broken. Intervals are 95% percentile bootstrap intervals over n episodes;
a table row's first cell opens its episodes in the viewer.</p>
{tables}<h2>Plots</h2>{figs}
<h2 id="viewer">Episode viewer</h2>
<p class="filters">{filters} <span id="count" class="small"></span></p>
<p><select id="episode"></select> <button id="prev">&larr;</button> <input id="step" type="range" min="0" value="0">
<button id="next">&rarr;</button> <span id="stepno"></span></p><p id="meta" class="small"></p>
<div class="viewer"><section><h3>Observation (the world's render of what the agent observed)</h3><pre id="obs"></pre></section>
<section><h3>Prompt (what the language model received)</h3><div id="prompt"></div></section>
<section><h3>Mental state: stated vs truth</h3><p class="small">stated: what the agent wrote on its BELIEF line (its
estimate of each NPC's preferred option and mood); truth: the NPC's hidden state, which the agent never sees. U scores the
share of these it gets right.</p><div id="mind"></div></section>
<section><h3>Action</h3><div id="act"></div></section>
<section><h3>Dialogue</h3><div id="talk"></div></section>
<section><h3>Signals and their provenance</h3><p class="small">align: share of the hidden facts the stated mental state
gets right (align_t); reward: the world's step reward (r_t); penalty: the step's waste cost (c_t: illegal, unparseable, an
avoidable wait or repeat); q: the words' dialogue score (q_t); mood:&lt;npc&gt;: that NPC's mood after the step. Source: where
the number comes from (direct: the simulator; fused; proxy: a model's judgement); detail: the rule that made it.</p>
<table id="sig"></table></section>
<section class="wide"><h3>Same episode, every arm (click a step or an arm)</h3><div id="cmp"></div></section></div>
<script type="application/json" id="episodes">{data}</script>
<script type="application/json" id="shared">{texts}</script>
<script>{VIEWER_JS}</script></body></html>
"""


def write_suite_reports(run: RunDir, doc: SuiteDoc) -> None:
    """A suite's ``report.md`` and ``report.html`` into its folder, as manifest artifacts made from ``suite.json``."""
    from socialworld.records import atomic_write_text

    run.produce("report.md", "report", lambda p: atomic_write_text(p, suite_markdown(doc) + "\n"), inputs=["suite.json"])
    run.produce("report.html", "report", lambda p: atomic_write_text(p, suite_html(doc)), inputs=["suite.json"])


def write_reports(run: RunDir, doc: BenchDoc, per_cycle: dict[str, dict[int, list[EpisodeRecord]]],
                  holdout: dict[str, list[EpisodeRecord]] | None = None) -> None:
    """``report.md`` and ``report.html`` into the run folder, as manifest artifacts; the viewer shows
    the ``holdout`` scenarios' episodes (arm -> episodes) with the last cycle's."""
    from socialworld.records import atomic_write_text

    shared: dict[str, int] = {}

    def intern(text: str) -> int:
        return shared.setdefault(text, len(shared))

    episodes = [viewer_episode(arm, c, e, intern) for arm, cyc in per_cycle.items() for c, eps in sorted(cyc.items()) for e in eps]
    last = max((c for cyc in per_cycle.values() for c in cyc), default=0)
    episodes += [viewer_episode(arm, last, e, intern) for arm, eps in (holdout or {}).items() for e in eps]
    run.produce("report.md", "report", lambda p: atomic_write_text(p, markdown(doc) + "\n"), inputs=["bench.json"])
    run.produce("report.html", f"report:{VIEWER_VERSION}",
                lambda p: atomic_write_text(p, html_report(doc, plots(doc), episodes, list(shared))), inputs=["bench.json"])
