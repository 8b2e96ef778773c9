"""Episode chains: a sequence of episodes of one scenario with the same cast, NPCs who remember,
and an agent whose memory of earlier episodes is ``none``, ``full`` or ``summary``.

Chain rules (named code, applied by :func:`carry_over` to each episode after the first):

* **the same people**: every NPC keeps the utilities, vetoes and threshold it had at the start of
  the chain's first episode, so what it said about itself earlier is still true;
* **commitments**: a promise broken in the previous episode leaves the NPC aggrieved (it holds a
  grievance, which a repair soothes) with its trust carried over (a broken promise had cut it);
  each promise kept lifts its starting mood by ``KEPT_LIFT``;
* **slights**: an NPC who ended the previous episode in a bad mood (below the good-relations
  line) or walked out starts aggrieved and ``SLIGHT_DROP`` lower.

The agent's memory (:func:`build_memory`) is built from earlier episodes' *public* record only
(the facts NPCs stated, commitments, the last mood cues, the dialogue):

* ``none`` — nothing;
* ``full`` — every line of every earlier episode (what the agent said, every reply), plus all
  stated facts;
* ``summary`` — per earlier episode: an overview (what was decided, passed or not), what worked
  (actions followed by progress), and per NPC what was learnt (stated preferences, vetoes,
  dislikes) and how it ended (low mood, walked out, promise broken).

Memory reaches the policy in :attr:`Observation.memory` (text lines for language models; facts
and the aggrieved NPCs as structure for scripted policies — the expert absorbs remembered facts
and makes amends first). The first episode of a chain is the same for every mode, so it is run
once and shared.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from .config import at_least
from .core import Fact, Memory
from .records import EpisodeRecord
from .spec import ScenarioSpec
from .templates import (
    MEMORY_FULL_EPISODE, MEMORY_SUMMARY_EPISODE, MEMORY_SUMMARY_NPC, MEMORY_TEXT_VERSION,
)
from .world import GOOD_RELATIONS_MIN, World

MODES = ("none", "full", "summary")
SLIGHT_DROP = 0.1
KEPT_LIFT = 0.05


@dataclass(frozen=True)
class Cast:
    """The chain's people as they were at the start of its first episode."""

    utilities: dict
    vetoes: dict
    thresholds: dict

    @classmethod
    def of(cls, spec: ScenarioSpec, seed: int) -> Cast:
        w = World(spec, seed)
        return cls({k: h.utilities for k, h in w.hid.items()}, {k: h.vetoes for k, h in w.hid.items()},
                   {k: h.threshold for k, h in w.hid.items()})


def carry_over(w: World, cast: Cast, previous: EpisodeRecord, trust: dict[str, float]) -> dict:
    """Apply the chain rules (module docstring) to a fresh world; returns what was applied (the
    episode's ``lineage.chain["carry"]``). ``trust``: each NPC's trust at the end of the
    previous episode (updated in place with this episode's start)."""
    applied: dict[str, dict] = {}
    broken = {c["npc"] for c in previous.final.commitments if c["status"] == "broken"}
    kept: dict[str, int] = {}
    for c in previous.final.commitments:
        if c["status"] == "kept":
            kept[c["npc"]] = kept.get(c["npc"], 0) + 1
    for k, h in w.hid.items():
        h.utilities, h.vetoes, h.threshold = cast.utilities[k], cast.vetoes[k], cast.thresholds[k]
        reasons, shift = [], 0.0
        if k in broken:
            reasons.append("promise broken")
        if previous.final.moods[k] < GOOD_RELATIONS_MIN:
            reasons.append("ended unhappy")
            shift -= SLIGHT_DROP
        if not previous.final.present.get(k, True):
            reasons.append("walked out")
            shift -= SLIGHT_DROP
        shift += KEPT_LIFT * kept.get(k, 0)
        h.grievance = bool(reasons)
        h.mood = min(1.0, max(0.0, h.mood + shift))
        h.trust = trust.get(k, h.trust)
        applied[k] = {"aggrieved": h.grievance, "reasons": reasons, "mood_shift": round(shift, 6), "trust": h.trust}
    return applied


def _facts(ep: EpisodeRecord, back: int) -> list[Fact]:
    if not ep.steps:
        return []
    return [Fact(f["npc"], f["kind"], f["slot"], f["option"], -back, f.get("text", ""))
            for f in ep.steps[-1].observation.structured["facts"]]


def _aggrieved(ep: EpisodeRecord) -> list[str]:
    """From the public record: promises broken, last cue low, or not present at the last step."""
    if not ep.steps:
        return []
    last = ep.steps[-1].observation.structured
    out = {c["npc"] for c in ep.final.commitments if c["status"] == "broken"}
    out |= {n["id"] for n in last["npcs"] if n["cue_bucket"] == "low" or not n["present"]}
    return sorted(out)


def _full_lines(eps: Sequence[EpisodeRecord]) -> list[str]:
    lines = []
    for n, ep in enumerate(eps, 1):
        lines.append(MEMORY_FULL_EPISODE.format(n=n))
        for s in ep.steps:
            if s.dialogue.utterance:
                lines.append(f"  You: {s.dialogue.utterance}")
            lines += [f"  {r.speaker}: {r.text}" for r in s.dialogue.replies]
    return lines


def _summary_lines(eps: Sequence[EpisodeRecord]) -> list[str]:
    lines = []
    for n, ep in enumerate(eps, 1):
        decided = [k.split(":", 1)[1] for k, ok in ep.final.subgoals.items() if ok and k.startswith("slot:")]
        slots = ep.steps[-1].observation.structured["slots"] if ep.steps else []
        chosen = {s["id"]: s["choice"] for s in slots if s["choice"]}
        outcome = "decided " + (", ".join(f"{d}={chosen.get(d, '?')}" for d in decided) or "nothing")
        outcome += "; passed" if ep.metrics is not None and ep.metrics.passed else "; not passed"
        worked = [s.action.executed for s in ep.steps if (s.signals.reward.value or 0) > 0][:3]
        lines.append(MEMORY_SUMMARY_EPISODE.format(n=n, outcome=outcome, worked="; ".join(worked) or "nothing"))
        known: dict[str, list[str]] = {}
        for f in _facts(ep, 0):
            if f.kind in ("prefers", "vetoes", "dislikes"):
                item = f"{f.kind} {f.slot}={f.option}"
                if item not in known.setdefault(f.npc, []):
                    known[f.npc].append(item)
        ends = {}
        for npc in _aggrieved(ep):
            ends[npc] = "let down or unhappy at the end"
        for npc in sorted(set(known) | set(ends)):
            lines.append(MEMORY_SUMMARY_NPC.format(npc=npc, known=", ".join(known.get(npc, [])) or "nothing learnt",
                                                   ending=f"; {ends[npc]}" if npc in ends else ""))
    return lines


def build_memory(mode: str, earlier: Sequence[EpisodeRecord]) -> Memory | None:
    """The agent's memory of ``earlier`` episodes (oldest first) in ``mode`` (module docstring)."""
    if mode not in MODES:
        raise ValueError(f"unknown memory mode {mode!r}; expected one of {', '.join(MODES)}")
    if mode == "none" or not earlier:
        return None
    facts: list[Fact] = []
    for back, ep in zip(range(len(earlier), 0, -1), earlier):
        facts += _facts(ep, back)
    if mode == "summary":
        facts = [f for f in facts if f.kind in ("prefers", "vetoes", "dislikes")]
    lines = _full_lines(earlier) if mode == "full" else _summary_lines(earlier)
    return Memory(mode, tuple(lines), tuple(facts), tuple(_aggrieved(earlier[-1])))  # type: ignore[arg-type]


# ------------------------------------------------------------------ running chains


@dataclass
class ChainConfig:
    """Configuration of ``socialworld chain``; each field's help is the CLI's help."""

    policy: str = field(default="expert", metadata={"help": "policy: random, expert, oracle, bundled, a model path, openai:<model>@<url>"})
    tiers: list[str] | None = field(default=None, metadata={"help": "tiers (L0, L1, L2); default all"})
    scenarios: list[str] | None = field(default=None, metadata={"help": "scenario ids or YAML paths; default all shipped scenarios"})
    chains: int = field(default=3, metadata={"help": "chains per scenario (each its own cast)"})
    length: int = field(default=3, metadata={"help": "episodes per chain"})
    modes: list[str] = field(default_factory=lambda: list(MODES), metadata={"help": "memory modes: none, full, summary"})
    seed: int = field(default=0, metadata={"help": "run seed: chain casts, episode seeds, bootstrap"})
    lm_batch_size: int = field(default=12, metadata={"help": "language models: prompts per forward pass"})
    out: str = field(default="runs/chain", metadata={"help": "folder for <mode>/episodes.jsonl and chain.json"})

    def __post_init__(self) -> None:
        at_least(self, 1, "chains", "length", "lm_batch_size")
        if not self.modes or set(self.modes) - set(MODES):
            raise ValueError(f"modes must be a non-empty subset of {', '.join(MODES)}, got {self.modes}")


def chain_seed(run_seed: int, scenario_id: str, chain: int, position: int) -> int:
    from .rng import derive_seed

    return derive_seed(run_seed, "chain", scenario_id, chain, position)


def run_chains(cfg: ChainConfig, progress=None) -> dict:
    """Run every chain in every memory mode, position by position (each position's episodes in
    lockstep); write ``<mode>/episodes.jsonl`` and ``chain.json``: per mode and position the
    pass rate and core metrics with 95% bootstrap intervals over chains, the paired difference
    of each mode from ``none``, and prompt growth (mean prompt tokens per decision; mean memory
    characters per observation). ``progress(what, total)`` may return a per-episode callback."""
    from .metrics import METRIC_KEYS, METRICS_CONTRACT
    from .policies import SCRIPTED, make_policy
    from .records import atomic_write_text, write_jsonl
    from .runner import EpisodeJob, run_episodes
    from .spec import resolve_scenarios
    from .stats import PASS, SOLVE, metric_interval, paired_difference

    for m in cfg.modes:
        if m not in MODES:
            raise ValueError(f"unknown memory mode {m!r}; expected one of {', '.join(MODES)}")
    if cfg.chains < 1 or cfg.length < 1:
        raise ValueError("chains and length must be at least 1")
    specs = resolve_scenarios(cfg.scenarios, cfg.tiers)
    if not specs:
        raise ValueError("no scenario matches the chosen scenarios and tiers")
    policy = make_policy(cfg.policy, seed=cfg.seed, **({} if cfg.policy in SCRIPTED else {"batch_size": cfg.lm_batch_size}))
    chains = [(s, c) for s in specs for c in range(cfg.chains)]
    casts = {(s.id, c): Cast.of(s, chain_seed(cfg.seed, s.id, c, 0)) for s, c in chains}
    history: dict[tuple[str, str, int], list[EpisodeRecord]] = {}
    trust: dict[tuple[str, str, int], dict[str, float]] = {}
    for pos in range(cfg.length):
        variants = ["shared"] if pos == 0 else list(cfg.modes)
        jobs, owners = [], []
        for s, c in chains:
            for mode in variants:
                hist = [] if pos == 0 else history[(mode, s.id, c)]
                setup = None
                if pos > 0:
                    key = (mode, s.id, c)

                    def setup(w, cast=casts[(s.id, c)], prev=hist[-1], key=key, mode=mode, pos=pos, c=c):
                        carry = carry_over(w, cast, prev, trust[key])
                        trust[key] = {k: v["trust"] for k, v in carry.items()}
                        return {"chain": f"{w.spec.id}/{c}", "position": pos, "mode": mode, "memory": MEMORY_TEXT_VERSION,
                                "carry": carry}
                else:
                    def setup(w, c=c):
                        return {"chain": f"{w.spec.id}/{c}", "position": 0, "mode": "shared", "memory": MEMORY_TEXT_VERSION,
                                "carry": {}}
                jobs.append(EpisodeJob(s, chain_seed(cfg.seed, s.id, c, pos), tag=f"chain{c}-{mode}-p{pos}", setup=setup,
                                       memory=build_memory(mode, hist) if pos > 0 else None))
                owners.append((mode, s.id, c))
        on_episode = progress(f"position {pos + 1}/{cfg.length}", len(jobs)) if progress else None
        eps = run_episodes(policy, jobs, batch_size=max(1, len(jobs)), on_episode=on_episode, run_seed=cfg.seed)
        for (mode, sid, c), ep in zip(owners, eps):
            modes = cfg.modes if mode == "shared" else [mode]
            for m in modes:
                history.setdefault((m, sid, c), []).append(ep)
                if mode == "shared":
                    trust[(m, sid, c)] = {}
    keys = (PASS, SOLVE, *METRIC_KEYS)
    out = Path(cfg.out)
    per_mode: dict[str, dict] = {}
    for m in cfg.modes:
        eps_m = [ep for (mm, _, _), h in history.items() if mm == m for ep in h]
        write_jsonl(out / m / "episodes.jsonl", eps_m)
        rows = []
        for pos in range(cfg.length):
            at = [history[(m, s.id, c)][pos] for s, c in chains]
            steps = [st for e in at for st in e.steps]
            row = {"position": pos + 1, **{k: metric_interval(at, k, seed=cfg.seed).as_dict() for k in keys},
                   "prompt_tokens_per_step": sum(st.policy.tokens_in for st in steps) / max(1, len(steps)),
                   "memory_chars_per_step": sum(len("\n".join(_memory_lines(st))) for st in steps) / max(1, len(steps))}
            if m != "none" and "none" in cfg.modes and pos > 0:
                base = [history[("none", s.id, c)][pos] for s, c in chains]
                row["vs_none"] = {k: paired_difference(base, at, k, seed=cfg.seed).as_dict() for k in keys}
            rows.append(row)
        per_mode[m] = rows
    doc = {"metrics_contract": METRICS_CONTRACT, "policy": policy.policy_id, "config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
           "chains": len(chains), "memory_version": MEMORY_TEXT_VERSION, "modes": per_mode,
           "rules": {"slight_drop": SLIGHT_DROP, "kept_lift": KEPT_LIFT}}
    atomic_write_text(out / "chain.json", json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return doc


def _memory_lines(step) -> list[str]:
    mem = step.observation.structured.get("memory")
    return list(mem["lines"]) if mem else []
