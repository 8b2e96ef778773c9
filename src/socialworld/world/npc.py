"""The NPC response model, shared by the world and the oracle: its constants and formulas.

::

    accept(i, option) iff not vetoed and not in an unresolved conflict and
        u_i(option) + MOOD_W*(mood_i - 0.5) + concession_i + pressure_i + DIALOGUE_W*(q - 0.5)
        >= threshold_i
    pressure_i = PRESSURE_W * agreeableness_i * sum_{j accepted} influence_j / max(1, n - 1)
    p_truth(inquire) = clip(0.25 + 0.4*openness + 0.3*engagement + 0.2*(mood - 0.5), 0.05, 0.98)
"""

from __future__ import annotations

from typing import Iterable

from socialworld.world.spec import ScenarioSpec

MOOD_W = 0.3
DIALOGUE_W = 0.15
PRESSURE_W = 0.12
DIALOGUE_MOOD_NUDGE = 0.06
PENALTY_INVALID = 0.2
PENALTY_WASTE = 0.1
APPROACH_GAIN = 0.4
REPAIR_GAIN = 0.25
REPAIR_NEEDED_BELOW = 0.45
GOOD_RELATIONS_MIN = 0.3
TRUST_VIOLATION_MOOD = 0.35
CONFLICT_DROP = (0.3, 0.15)  # (first, second)
WRONG_ORDER_DROP = 0.15
PATIENCE = 3


def acceptance_score(utility: float, mood: float, concession: float, pressure: float, q: float) -> float:
    """``u + MOOD_W*(mood-0.5) + concession + pressure + DIALOGUE_W*(q-0.5)``."""
    return utility + MOOD_W * (mood - 0.5) + concession + pressure + DIALOGUE_W * (q - 0.5)


def social_pressure(spec: ScenarioSpec, npc: str, accepted: Iterable[str], holders: int) -> float:
    """``PRESSURE_W * agreeableness_npc * sum_{j in accepted} influence_j / max(1, holders - 1)``:
    the pull of those who already accepted (``accepted``, in the slot's stakeholder order, without
    ``npc``) on ``npc``, one of ``holders`` stakeholders."""
    infl = sum(spec.npc(j).traits.influence for j in accepted)
    return PRESSURE_W * spec.npc(npc).traits.agreeableness * infl / max(1, holders - 1)
