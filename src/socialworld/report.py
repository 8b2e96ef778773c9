"""Bench reports: ``report.md`` and a self-contained ``report.html`` (tables, plots as embedded
PNGs, and an episode viewer over every evaluated episode's five dimensions).

Everything shown is read from the bench document (:func:`socialworld.bench.bench_document`) and
the episode records; nothing is computed here that the document does not hold, except the
viewer's per-step projection of the records.
"""

from __future__ import annotations

import base64
import html
import io
import json
from typing import Any, Sequence

from .records import EpisodeRecord
from .rundir import RunDir

METRIC_LABELS = {"U": "U", "A_e": "A_e", "S_npc": "S_npc", "D": "D", "CR": "CR", "pass": "PassRate", "solve": "SolveRate"}
VIEWER_VERSION = "viewer-v1"


def _iv(d: dict | None, digits: int = 2) -> str:
    if d is None:
        return "–"
    return f"{d['mean']:.{digits}f} [{d['lo']:.{digits}f}, {d['hi']:.{digits}f}]"


def _num(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:+.{digits}f}"


# ------------------------------------------------------------------ tables (rows of strings)


def main_rows(doc: dict) -> tuple[list[str], list[list[str]]]:
    keys = list(METRIC_LABELS)
    head = ["arm"] + [METRIC_LABELS[k] for k in keys]
    rows = [[arm] + [_iv(doc["main"][arm][k]) for k in keys] for arm in doc["main"]]
    rows += [[f"{name} (paired)"] + [_iv(d[k]) for k in keys] for name, d in doc["paired"].items() if name in ("B-A", "B-C")]
    rows += [[name] + [("–" if d[k] is None else f"{d[k]:.2f}") for k in keys] for name, d in doc["ratios"].items()]
    return head, rows


def r_rows(doc: dict) -> tuple[list[str], list[list[str]]]:
    tiers = sorted({t for tab in doc["R"].values() for row in tab.values() for t in row})
    head = ["arm", "cycle", "unlocked"] + tiers
    rows = []
    for arm, tab in doc["R"].items():
        for c, row in tab.items():
            rows.append([arm, c, "+".join(doc["tiers_per_cycle"][c])] + [_iv(row.get(t)) for t in tiers])
    return head, rows


def lifelong_rows(doc: dict) -> tuple[list[str], list[list[str]]]:
    tiers = sorted({t for f in doc["forgetting"].values() for t in f} | {t for f in doc["forward_transfer"].values() for t in f})
    head = ["arm"] + [f"F {t}" for t in tiers] + [f"FWT {t}" for t in tiers]
    rows = [[arm] + [_num(doc["forgetting"][arm].get(t)) for t in tiers] + [_num(doc["forward_transfer"].get(arm, {}).get(t)) for t in tiers]
            for arm in doc["forgetting"]]
    return head, rows


def loop_rows(doc: dict) -> tuple[list[str], list[list[str]]]:
    head = ["cycle", "unlocked", "action pairs", "dialogue pairs", "excluded (by reason)", "final loss", "pass", "solve", "D"]
    rows = []
    for s in doc["loop"]:
        excl = ", ".join(f"{k} {v}" for k, v in sorted(s["excluded"].items())) or "–"
        loss = ", ".join(f"{k} {v:.3f}" for k, v in s["final_loss"].items() if v is not None) or "–"
        rows.append([str(s["cycle"]), "+".join(s["tiers"]), str(s["pairs"].get("action", 0)), str(s["pairs"].get("dialogue", 0)),
                     excl, loss, f"{s['eval']['pass_rate']:.2f}", f"{s['eval']['solve_rate']:.2f}", f"{s['eval']['D']:.2f}"])
    return head, rows


def diagnostics_rows(doc: dict) -> tuple[list[str], list[list[str]]]:
    cats = sorted({k for d in doc["diagnostics"].values() for k in d["primary_failures"]})
    head = ["arm", "failed", "coverage", "mean confidence"] + cats
    rows = [[arm, str(d["coverage"]["failed"]), f"{d['coverage']['coverage']:.2f}", f"{d['coverage']['mean_confidence']:.2f}"]
            + [str(d["primary_failures"].get(k, 0)) for k in cats] for arm, d in doc["diagnostics"].items()]
    return head, rows


TABLES = (("Main table (last cycle, 95% bootstrap intervals)", main_rows),
          ("Hierarchical pass rates R[cycle][tier]", r_rows),
          ("Forgetting and forward transfer", lifelong_rows),
          ("Closed loop (arm B) per cycle", loop_rows),
          ("Diagnostics: coverage and failure attribution (last cycle)", diagnostics_rows))


def markdown(doc: dict) -> str:
    cfg = doc["config"]
    out = [f"# ASCENT-Bench report ({doc['version']}, {doc['metrics_contract']})", "",
           f"Model `{cfg['model']}`, preset `{cfg['preset']}`, seed {cfg['seed']}, unlocking `{cfg['unlock']}`; "
           f"Pass iff CR >= {doc['thresholds']['CR']} and D >= {doc['thresholds']['D']} and no guard is broken; "
           "Solved iff every decision is finalized and no guard is broken (CR counts decisions and conflicts only). "
           f"Mean steps per episode: {', '.join(f'{a} {v:.1f}' for a, v in doc['steps_per_episode'].items())}. "
           f"Arms: A untrained, B closed loop, C {cfg['proxy'] or 'expert'}; oracle and random as references. "
           f"Episodes per arm: {doc['episodes_per_arm']}.", ""]
    for title, fn in TABLES:
        head, rows = fn(doc)
        out += [f"## {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(r) + " |" for r in rows]
        out.append("")
    return "\n".join(out)


def suite_markdown(doc: dict) -> str:
    """The methods or ablations table: last-cycle metrics per variant, and the paired
    difference of PassRate and D against the untrained model on the same episodes."""
    keys = list(METRIC_LABELS)
    head = ["variant"] + [METRIC_LABELS[k] for k in keys] + ["PassRate - untrained", "SolveRate - untrained", "D - untrained",
                                                           "pairs kept (per cycle)"]
    out = [f"# ASCENT-Bench {doc['suite']} suite ({doc['version']}, {doc['metrics_contract']})", "",
           f"Preset `{doc['config']['preset']}` ({doc['preset']}), seed {doc['config']['seed']}; every variant under the same "
           "protocol, budget and evaluation seeds, reusing the same untrained wake data.", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, v in doc["variants"].items():
        vs = v.get("vs_untrained", {})
        pairs = "; ".join(", ".join(f"{k} {n}" for k, n in p.items()) for p in v.get("pairs", [])) or "–"
        out.append("| " + " | ".join([name] + [_iv(v["metrics"][k]) for k in keys]
                                     + [_iv(vs.get("pass")), _iv(vs.get("solve")), _iv(vs.get("D")), pairs]) + " |")
    return "\n".join(out)


# ------------------------------------------------------------------ plots


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def plots(doc: dict) -> dict[str, str]:
    """name -> base64 PNG: pass-rate heatmap per arm, metric bars with intervals, learning curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    arms = list(doc["R"])
    cycles = sorted({int(c) for tab in doc["R"].values() for c in tab})
    tiers = sorted({t for tab in doc["R"].values() for row in tab.values() for t in row})
    out = {}
    fig, axes = plt.subplots(1, len(arms), figsize=(2.2 * len(arms), 2.4), squeeze=False)
    for ax, arm in zip(axes[0], arms):
        m = np.full((len(cycles), len(tiers)), np.nan)
        for i, c in enumerate(cycles):
            for j, t in enumerate(tiers):
                iv = doc["R"][arm].get(str(c), {}).get(t)
                if iv is not None:
                    m[i, j] = iv["mean"]
        ax.imshow(m, vmin=0, vmax=1, cmap="viridis")
        ax.set_title(arm)
        ax.set_xticks(range(len(tiers)), tiers)
        ax.set_yticks(range(len(cycles)), [f"c{c}" for c in cycles])
        for i in range(len(cycles)):
            for j in range(len(tiers)):
                if not np.isnan(m[i, j]):
                    ax.text(j, i, f"{m[i, j]:.2f}", ha="center", va="center", color="w" if m[i, j] < 0.6 else "k", fontsize=8)
    fig.suptitle("PassRate per cycle and tier")
    out["heatmap"] = _png(fig)

    keys = ["U", "A_e", "D", "CR", "pass", "solve"]
    fig, ax = plt.subplots(figsize=(7, 2.8))
    width = 0.8 / len(arms)
    for k, arm in enumerate(arms):
        means = [doc["main"][arm][m]["mean"] for m in keys]
        err = [[doc["main"][arm][m]["mean"] - doc["main"][arm][m]["lo"] for m in keys],
               [doc["main"][arm][m]["hi"] - doc["main"][arm][m]["mean"] for m in keys]]
        ax.bar(np.arange(len(keys)) + k * width, means, width, yerr=err, label=arm, capsize=2)
    ax.set_xticks(np.arange(len(keys)) + 0.4 - width / 2, [METRIC_LABELS[m] for m in keys])
    ax.legend(fontsize=7, ncol=len(arms))
    ax.set_title("Last cycle, 95% intervals")
    out["bars"] = _png(fig)

    fig, axes = plt.subplots(1, len(tiers), figsize=(2.6 * len(tiers), 2.4), squeeze=False)
    for ax, t in zip(axes[0], tiers):
        for arm in arms:
            pts = [(c, doc["R"][arm][str(c)][t]) for c in cycles if t in doc["R"][arm].get(str(c), {})]
            if pts:
                ax.errorbar([c for c, _ in pts], [iv["mean"] for _, iv in pts],
                            yerr=[[iv["mean"] - iv["lo"] for _, iv in pts], [iv["hi"] - iv["mean"] for _, iv in pts]],
                            marker="o", capsize=2, label=arm)
        ax.set_title(f"{t} PassRate")
        ax.set_ylim(-0.05, 1.05)
        ax.set_xticks(cycles)
        ax.set_xlabel("cycle")
    axes[0][0].legend(fontsize=7)
    out["curves"] = _png(fig)
    return out


# ------------------------------------------------------------------ episode viewer


def viewer_episode(arm: str, cycle: int, ep: EpisodeRecord) -> dict:
    """The five dimensions of each step, as the viewer shows them."""
    m = ep.metrics
    return {
        "key": f"{arm} · cycle {cycle} · {ep.scenario_id} · seed {ep.seed}",
        "arm": arm, "cycle": cycle, "scenario": ep.scenario_id, "tier": ep.tier, "seed": ep.seed,
        "passed": bool(m.passed) if m else None,
        "metrics": {k: {"value": getattr(m, k).value, "source": getattr(m, k).source} for k in ("U", "A_e", "S_npc", "D", "CR")} if m else {},
        "steps": [{
            "t": s.setting.step,
            "observation": s.observation.text,
            "stated": s.mental_state.stated,
            "truth": s.mental_state.truth,
            "raw": s.action.raw,
            "status": s.action.parse_status,
            "error": s.action.error,
            "executed": s.action.executed,
            "utterance": s.dialogue.utterance,
            "replies": [{"speaker": r.speaker, "text": r.text} for r in s.dialogue.replies],
            "announcements": list(s.dialogue.announcements),
            "signals": [{"name": n, **sig.model_dump()} for n, sig in
                        [("align", s.signals.align), ("reward", s.signals.reward), ("penalty", s.signals.penalty), ("q", s.signals.q)]
                        + [(f"mood:{k}", v) for k, v in s.signals.moods.items()]],
            "policy": {"id": s.policy.policy_id, "adapter": s.policy.adapter_hash},
        } for s in ep.steps],
    }


def _table_html(head: Sequence[str], rows: Sequence[Sequence[str]], cls: str) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


VIEWER_JS = r"""
const EPISODES = JSON.parse(document.getElementById('episodes').textContent);
const sel = document.getElementById('episode'), slider = document.getElementById('step');
EPISODES.forEach((e, i) => { const o = document.createElement('option'); o.value = i;
  o.textContent = e.key + (e.passed ? ' · pass' : ' · fail'); sel.appendChild(o); });
function esc(s) { return String(s ?? '').replace(/[&<>"]/g, c => ({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c])); }
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
function show() {
  const e = EPISODES[sel.value]; if (!e) return;
  slider.max = Math.max(0, e.steps.length - 1); if (+slider.value > +slider.max) slider.value = 0;
  const s = e.steps[+slider.value];
  document.getElementById('meta').innerHTML = esc(e.key) + ' — ' + Object.entries(e.metrics).map(
    ([k, v]) => `${k} ${v.value === null ? '–' : v.value.toFixed(2)} (${v.source})`).join(', ');
  document.getElementById('stepno').textContent = s ? `step ${s.t + 1} / ${e.steps.length}` : 'no steps';
  if (!s) return;
  document.getElementById('obs').textContent = s.observation;
  document.getElementById('mind').innerHTML = belief(s.stated, s.truth);
  document.getElementById('act').innerHTML = `<div><b>executed</b> <code>${esc(s.executed)}</code> <span class="${s.status}">${esc(s.status)}</span>${s.error ? ' — ' + esc(s.error) : ''}</div><pre>${esc(s.raw)}</pre><div class="small">policy ${esc(s.policy.id)}${s.policy.adapter ? ' · adapters ' + esc(s.policy.adapter) : ''}</div>`;
  document.getElementById('talk').innerHTML = `<div><b>agent:</b> ${esc(s.utterance) || '<i>(silent)</i>'}</div>` +
    s.replies.map(r => `<div><b>${esc(r.speaker)}:</b> ${esc(r.text)}</div>`).join('') +
    s.announcements.map(a => `<div class="small">news: ${esc(a)}</div>`).join('');
  document.getElementById('sig').innerHTML = '<tr><th>signal</th><th>value</th><th>source</th><th>confidence</th><th>detail</th></tr>' +
    s.signals.map(g => `<tr><td>${esc(g.name)}</td><td>${g.value === null ? '–' : (+g.value).toFixed(3)}</td><td>${esc(g.source)}</td><td>${(+g.confidence).toFixed(2)}</td><td>${esc(g.detail)}</td></tr>`).join('');
}
sel.addEventListener('change', () => { slider.value = 0; show(); });
slider.addEventListener('input', show);
document.getElementById('prev').onclick = () => { slider.value = Math.max(0, +slider.value - 1); show(); };
document.getElementById('next').onclick = () => { slider.value = Math.min(+slider.max, +slider.value + 1); show(); };
show();
"""

CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.2em;font-size:13px}td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f3f3f3}td:first-child{text-align:left}img{max-width:100%}
.viewer{display:grid;grid-template-columns:1fr 1fr;gap:10px}.viewer section{border:1px solid #ddd;padding:8px;border-radius:4px}
pre{white-space:pre-wrap;font-size:12px;background:#fafafa;padding:6px}.ok td{background:#e8f6e8}.bad td{background:#fbeaea}
.small{font-size:11px;color:#666}.unparseable,.illegal{color:#b00;font-weight:bold}
"""


def html_report(doc: dict, images: dict[str, str], episodes: list[dict]) -> str:
    tables = "".join(f"<h2>{html.escape(title)}</h2>" + _table_html(*fn(doc), cls=fn.__name__.replace("_rows", ""))
                     for title, fn in TABLES)
    figs = "".join(f'<figure><img alt="{name}" src="data:image/png;base64,{b64}"></figure>' for name, b64 in images.items())
    data = json.dumps(episodes).replace("</", "<\\/")
    cfg = doc["config"]
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>ASCENT-Bench report</title><style>{CSS}</style></head>
<body><h1>ASCENT-Bench report</h1>
<p>{html.escape(doc['version'])} · {html.escape(doc['metrics_contract'])} · model <code>{html.escape(cfg['model'])}</code> · preset <code>{html.escape(cfg['preset'])}</code>
· seed {cfg['seed']} · unlocking <code>{html.escape(cfg['unlock'])}</code> · Pass iff CR &ge; {doc['thresholds']['CR']} and D &ge; {doc['thresholds']['D']} and no guard is broken
· Solved iff every decision is finalized and no guard is broken</p>
{tables}<h2>Plots</h2>{figs}
<h2>Episode viewer</h2>
<p><select id="episode"></select> <button id="prev">&larr;</button> <input id="step" type="range" min="0" value="0">
<button id="next">&rarr;</button> <span id="stepno"></span></p><p id="meta" class="small"></p>
<div class="viewer"><section><h3>Observation (what the agent saw)</h3><pre id="obs"></pre></section>
<section><h3>Mental state: stated vs truth</h3><div id="mind"></div></section>
<section><h3>Action</h3><div id="act"></div></section>
<section><h3>Dialogue</h3><div id="talk"></div></section>
<section style="grid-column:1/3"><h3>Signals and their provenance</h3><table id="sig"></table></section></div>
<script type="application/json" id="episodes">{data}</script>
<script>{VIEWER_JS}</script></body></html>
"""


def write_reports(run: RunDir, doc: dict, per_cycle: dict[str, dict[int, list[EpisodeRecord]]]) -> None:
    """``report.md`` and ``report.html`` into the run folder, as manifest artifacts."""
    from .records import atomic_write_text

    episodes = [viewer_episode(arm, c, e) for arm, cyc in per_cycle.items() for c, eps in sorted(cyc.items()) for e in eps]
    run.produce("report.md", "report", lambda p: atomic_write_text(p, markdown(doc) + "\n"), inputs=["bench.json"])
    run.produce("report.html", f"report:{VIEWER_VERSION}",
                lambda p: atomic_write_text(p, html_report(doc, plots(doc), episodes)), inputs=["bench.json"])
