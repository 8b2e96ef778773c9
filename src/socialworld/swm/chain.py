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

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Final, Literal, Sequence

from socialworld.core import Fact, Memory
from socialworld.metrics.stats import Interval
from socialworld.records import Document, EpisodeRecord
from socialworld.swm.config import MODES, ChainConfig
from socialworld.text.templates import (
    MEMORY_FULL_EPISODE,
    MEMORY_SUMMARY_EPISODE,
    MEMORY_SUMMARY_NPC,
    MEMORY_TEXT_VERSION,
)
from socialworld.world.engine import World
from socialworld.world.npc import GOOD_RELATIONS_MIN
from socialworld.world.spec import ScenarioSpec

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
        w.set_npc(k, utilities=cast.utilities[k], vetoes=cast.vetoes[k], threshold=cast.thresholds[k], grievance=bool(reasons),
                  mood=min(1.0, max(0.0, h.mood + shift)), trust=trust.get(k, h.trust))
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


def chain_seed(run_seed: int, scenario_id: str, chain: int, position: int) -> int:
    from socialworld.world.rng import derive_seed

    return derive_seed(run_seed, "chain", scenario_id, chain, position)


CHAIN_RESULT_SCHEMA: Final = "chain-result-v1"


class ChainRow(Document):
    """One memory mode at one chain position, over every chain."""

    position: int
    """1 for each chain's first episode"""
    metrics: dict[str, Interval]
    """pass, solve and the core metrics: means with 95% bootstrap intervals"""
    prompt_tokens_per_step: float
    memory_chars_per_step: float
    vs_none: dict[str, Interval] | None = None
    """this mode minus no memory at the same position, paired (after the first position)"""


class ChainResult(Document):
    """``chain.json``: per memory mode, the metrics by chain position."""

    schema_version: Literal["chain-result-v1"] = CHAIN_RESULT_SCHEMA
    metrics_contract: str
    policy: str
    config: ChainConfig
    chains: int
    memory_version: str
    modes: dict[str, list[ChainRow]]
    rules: dict[str, float]
    """the carry-over rules' constants"""


def run_chains(cfg: ChainConfig, progress=None) -> ChainResult:
    """Run every chain in every memory mode, position by position (each position's episodes in
    lockstep); write ``<mode>/episodes.jsonl`` and ``chain.json``: per mode and position the
    pass rate and core metrics with 95% bootstrap intervals over chains, the paired difference
    of each mode from ``none``, and prompt growth (mean prompt tokens per decision; mean memory
    characters per observation). ``progress(what, total)`` may return a per-episode callback."""
    from socialworld.agents.models import SCRIPTED
    from socialworld.agents.registry import make_policy, make_voice
    from socialworld.metric_registry import KEYS
    from socialworld.metrics.core import METRICS_CONTRACT
    from socialworld.metrics.stats import metric_interval, paired_difference
    from socialworld.records import atomic_write_text, write_jsonl
    from socialworld.rollout.runner import EpisodeJob, run_episodes
    from socialworld.world.spec import resolve_scenarios

    for m in cfg.modes:
        if m not in MODES:
            raise ValueError(f"unknown memory mode {m!r}; expected one of {', '.join(MODES)}")
    if cfg.chains < 1 or cfg.length < 1:
        raise ValueError("chains and length must be at least 1")
    specs = resolve_scenarios(cfg.scenarios, cfg.tiers)
    if not specs:
        raise ValueError("no scenario matches the chosen scenarios and tiers")
    policy = make_policy(cfg.policy, seed=cfg.seed, **({} if cfg.policy in SCRIPTED else {"batch_size": cfg.lm_batch_size}))
    voice = make_voice(cfg.npc_voice, batch_size=cfg.lm_batch_size)
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
                setup: Callable[[World], dict]
                if pos > 0:
                    key = (mode, s.id, c)

                    def carried(w, cast=casts[(s.id, c)], prev=hist[-1], key=key, mode=mode, pos=pos, c=c):
                        carry = carry_over(w, cast, prev, trust[key])
                        trust[key] = {k: v["trust"] for k, v in carry.items()}
                        return {"chain": f"{w.spec.id}/{c}", "position": pos, "mode": mode, "memory": MEMORY_TEXT_VERSION,
                                "carry": carry}
                    setup = carried
                else:
                    def first(w, c=c):
                        return {"chain": f"{w.spec.id}/{c}", "position": 0, "mode": "shared", "memory": MEMORY_TEXT_VERSION,
                                "carry": {}}
                    setup = first
                jobs.append(EpisodeJob(s, chain_seed(cfg.seed, s.id, c, pos), tag=f"chain{c}-{mode}-p{pos}", setup=setup,
                                       memory=build_memory(mode, hist) if pos > 0 else None))
                owners.append((mode, s.id, c))
        on_episode = progress(f"position {pos + 1}/{cfg.length}", len(jobs)) if progress else None
        eps = run_episodes(policy, jobs, batch_size=max(1, len(jobs)), on_episode=on_episode, run_seed=cfg.seed, voice=voice)
        for (mode, sid, c), ep in zip(owners, eps):
            for into in (cfg.modes if mode == "shared" else [mode]):
                history.setdefault((into, sid, c), []).append(ep)
                if mode == "shared":
                    trust[(into, sid, c)] = {}
    out = Path(cfg.out)
    per_mode: dict[str, list[ChainRow]] = {}
    for m in cfg.modes:
        eps_m = [ep for (mm, _, _), h in history.items() if mm == m for ep in h]
        write_jsonl(out / m / "episodes.jsonl", eps_m)
        rows = []
        for pos in range(cfg.length):
            at = [history[(m, s.id, c)][pos] for s, c in chains]
            steps = [st for e in at for st in e.steps]
            vs_none = None
            if m != "none" and "none" in cfg.modes and pos > 0:
                base = [history[("none", s.id, c)][pos] for s, c in chains]
                vs_none = {k: paired_difference(base, at, k, seed=cfg.seed) for k in KEYS}
            rows.append(ChainRow(
                position=pos + 1, metrics={k: metric_interval(at, k, seed=cfg.seed) for k in KEYS},
                prompt_tokens_per_step=sum(st.policy.tokens_in for st in steps) / max(1, len(steps)),
                memory_chars_per_step=sum(len("\n".join(_memory_lines(st))) for st in steps) / max(1, len(steps)),
                vs_none=vs_none))
        per_mode[m] = rows
    doc = ChainResult(metrics_contract=METRICS_CONTRACT, policy=policy.policy_id, config=cfg, chains=len(chains),
                      memory_version=MEMORY_TEXT_VERSION, modes=per_mode, rules={"slight_drop": SLIGHT_DROP, "kept_lift": KEPT_LIFT})
    atomic_write_text(out / "chain.json", doc.to_json())
    return doc


def _memory_lines(step) -> list[str]:
    mem = step.observation.structured.get("memory")
    return list(mem["lines"]) if mem else []
