"""Diagnostic layer (contract §5.4), computed from records only, independent of scoring.

Per step, behavioural consistency checks, each with a confidence:

=============================  =====  ==========================================================
check                          conf.  fails when
=============================  =====  ==========================================================
target_interactable            1.0    the action named an NPC who is absent or unknown
relevant_subgoal               1.0    the action pointed at a slot that is not open
avoidable_wait                 1.0    the world charged an avoidable-wait penalty
respects_stated_preference     1.0    a proposal named an option the target said they veto/dislike
conflict_order                 0.9    a repair in a quarrel drew the "taking sides" reply
strategy_expression_match      0.7    the utterance does not name the action's option/slot
no_relationship_damage         0.8    some NPC's mood fell by >= 0.15 during the step
=============================  =====  ==========================================================

Failure attribution (for failed episodes) maps failed checks and failed sub-goals onto:
goal identification bias, conflict-handling order, inefficient interaction,
strategy-expression mismatch, relationship damage, constraint violation.
"""

from __future__ import annotations

from collections import Counter
from statistics import fmean
from typing import Sequence

from socialworld.records import Check, Diagnostics, EpisodeRecord

CATEGORIES = (
    "goal_identification_bias",
    "conflict_handling_order",
    "inefficient_interaction",
    "strategy_expression_mismatch",
    "relationship_damage",
    "constraint_violation",
)


def _checks(ep: EpisodeRecord) -> list[Check]:
    out: list[Check] = []
    prev_moods = None
    for st in ep.steps:
        t = st.setting.step
        obs = st.observation.structured
        a = st.action.structured
        present = {n["id"]: n["present"] for n in obs["npcs"]}
        slots = {s["id"]: s for s in obs["slots"]}
        if a is not None:
            npc = a.get("npc")
            if npc and npc != "all":
                out.append(Check(step=t, name="target_interactable", ok=bool(present.get(npc)), confidence=1.0, detail=npc))
            slot = a.get("slot")
            if slot:
                ok = slot in slots and slots[slot]["status"] == "open"
                out.append(Check(step=t, name="relevant_subgoal", ok=ok, confidence=1.0, detail=slot))
            if a["kind"] == "propose" and slot in slots:
                targets = slots[slot]["stakeholders"] if npc == "all" else [npc]
                against = [
                    f["npc"] for f in obs["facts"]
                    if f["slot"] == slot and f["option"] == a["option"] and f["kind"] in ("vetoes", "dislikes") and f["npc"] in targets
                ]
                out.append(Check(step=t, name="respects_stated_preference", ok=not against, confidence=1.0, detail=",".join(against)))
            feats = st.signals.q_features
            if "consistency" in feats:
                out.append(Check(step=t, name="strategy_expression_match", ok=feats["consistency"] >= 1.0, confidence=0.7))
            if a["kind"] == "repair" and obs["conflicts"]:
                wrong = any("side before hearing me out" in r.text for r in st.dialogue.replies)
                out.append(Check(step=t, name="conflict_order", ok=not wrong, confidence=0.9))
        if "avoidable_wait" in st.signals.penalty_reasons:
            out.append(Check(step=t, name="avoidable_wait", ok=False, confidence=1.0))
        moods = {k: s.value for k, s in st.signals.moods.items()}
        if prev_moods is not None:
            drops = [k for k, v in moods.items() if (prev_moods.get(k) or 0) - (v or 0) >= 0.15]
            out.append(Check(step=t, name="no_relationship_damage", ok=not drops, confidence=0.8, detail=",".join(drops)))
        prev_moods = moods
    return out


def _attribute(ep: EpisodeRecord, checks: list[Check]) -> dict[str, float]:
    failed = Counter(c.name for c in checks if not c.ok)
    goals = ep.final.subgoals
    steps = max(1, len(ep.steps))
    scores: dict[str, float] = {}
    if ep.steps:
        mean_align = fmean(s.signals.align.value or 0.0 for s in ep.steps)
        if mean_align < 0.5 or failed["respects_stated_preference"]:
            scores["goal_identification_bias"] = min(1.0, 0.5 + (0.5 - mean_align) + 0.2 * failed["respects_stated_preference"])
    if failed["conflict_order"] or any(k.startswith("conflict:") and not v for k, v in goals.items()):
        scores["conflict_handling_order"] = 0.9 if failed["conflict_order"] else 0.6
    waste = sum(1 for s in ep.steps if s.signals.penalty.value)
    if waste / steps >= 0.2 or ep.final.end_reason == "turn_budget":
        scores["inefficient_interaction"] = min(1.0, 0.4 + waste / steps)
    if failed["strategy_expression_match"]:
        scores["strategy_expression_mismatch"] = min(1.0, 0.4 + failed["strategy_expression_match"] / steps)
    if failed["no_relationship_damage"] or goals.get("good_relations") is False or goals.get("commitments_honoured") is False:
        scores["relationship_damage"] = 0.8 if goals.get("commitments_honoured") is False else 0.6
    if goals.get("within_budget") is False or goals.get("no_secret_leaked") is False or any(
        "constraint" in r.text for s in ep.steps for r in s.dialogue.replies
    ):
        scores["constraint_violation"] = 0.9
    return {k: round(v, 3) for k, v in sorted(scores.items(), key=lambda kv: -kv[1])}


def diagnose(ep: EpisodeRecord) -> Diagnostics:
    """Checks, representative steps, an observation summary and failure attribution."""
    checks = _checks(ep)
    failed_steps = sorted({c.step for c in checks if not c.ok})
    by_reward = sorted(ep.steps, key=lambda s: -abs(s.signals.reward.value or 0.0))
    reps = sorted({0, *(s.setting.step for s in by_reward[:2]), *failed_steps[:2]} & {s.setting.step for s in ep.steps})
    last = ep.steps[-1].observation.structured if ep.steps else {}
    summary = (
        f"{len(ep.steps)} steps; "
        + ", ".join(f"{s['id']}={s['status']}" for s in last.get("slots", []))
        + f"; {len(last.get('facts', []))} facts learnt; {len(last.get('announcements', []))} announcements"
    )
    passed = ep.metrics.passed if ep.metrics else None
    attribution = {} if passed else _attribute(ep, checks)
    return Diagnostics(
        representative_steps=reps,
        observation_summary=summary,
        checks=checks,
        attribution=attribution,
        primary_failure=next(iter(attribution), None),
    )


def coverage(episodes: Sequence[EpisodeRecord]) -> dict[str, float]:
    """Share of failed episodes with a failure attribution, and their mean top confidence."""
    failed = [e for e in episodes if e.metrics and not e.metrics.passed]
    if not failed:
        return {"failed": 0, "coverage": 1.0, "mean_confidence": 1.0}
    attributed = [e for e in failed if e.diagnostics and e.diagnostics.attribution]
    conf = [max(e.diagnostics.attribution.values()) for e in attributed]  # type: ignore[union-attr]
    return {"failed": len(failed), "coverage": len(attributed) / len(failed), "mean_confidence": fmean(conf) if conf else 0.0}


def failure_counts(episodes: Sequence[EpisodeRecord]) -> dict[str, int]:
    c = Counter(e.diagnostics.primary_failure for e in episodes if e.diagnostics and e.diagnostics.primary_failure)
    return {k: c.get(k, 0) for k in CATEGORIES}
