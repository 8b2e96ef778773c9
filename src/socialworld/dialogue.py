"""Deterministic dialogue assessment (provenance ``rule:dialogue-v1``).

``q_t`` in [0, 1] is the weighted mean of the features that apply to the action::

    q = sum_i w_i f_i / sum_i w_i      over applicable features i
    address      w=0.25  utterance names the addressed NPC ("everyone"/"all"/"team" for all)
    consistency  w=0.30  utterance names the action's option (propose/negotiate/finalize) or
                         slot (inquire) and no other option of that slot
    grounding    w=0.15  utterance mentions an option the target NPC stated (only when it did)
    tone         w=0.20  clip(0.5 + 0.25*min(polite, 2) - 0.5*min(pressure, 2), 0, 1)
    length       w=0.10  1 for 4..40 words; n/4 below; max(0, 1 - (n-40)/40) above

A leaked secret (an utterance containing a confided secret's keyword, addressed to anyone but
its owner) sets ``q = 0`` and fails the ``no_secret_leaked`` guard.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from .core import Action, Fact
from .spec import ScenarioSpec

DIALOGUE_SOURCE = "rule:dialogue-v1"
WEIGHTS = {"address": 0.25, "consistency": 0.30, "grounding": 0.15, "tone": 0.20, "length": 0.10}
POLITE = ("please", "thank", "thanks", "would", "could", "appreciate", "sorry", "love to", "if you")
PRESSURE = ("must", "immediately", "no choice", "have to", "now!", "whatever", "just decide")
ALL_WORDS = ("everyone", "everybody", "all of you", "team", "folks", "all")
_WORD = re.compile(r"[a-z0-9']+")


@dataclass(frozen=True, slots=True)
class DialogueScore:
    q: float
    features: dict[str, float]
    leaked: tuple[str, ...]
    """ids of NPCs whose secret this utterance leaked"""


def _mentions(text: str, phrase: str) -> bool:
    return re.search(r"(?<![a-z0-9])" + re.escape(phrase.lower()) + r"(?![a-z0-9])", text) is not None


def _option_names(spec: ScenarioSpec, slot_id: str, option_id: str) -> tuple[str, str]:
    return option_id.replace("_", " "), spec.slot(slot_id).option(option_id).label.lower()


def assess(spec: ScenarioSpec, action: Action, facts: Iterable[Fact], confided: Iterable[str]) -> DialogueScore:
    """Score ``action.utterance`` for ``action`` given what NPCs said (``facts``) and whose
    secrets were confided to the agent (``confided``)."""
    text = action.utterance.lower()
    words = _WORD.findall(text)
    f: dict[str, float] = {}

    # address
    if action.npc == "all" or action.kind == "finalize":
        f["address"] = 1.0 if any(_mentions(text, w) for w in ALL_WORDS) else 0.0
    elif action.npc is not None and action.npc in spec.npc_ids:
        f["address"] = 1.0 if _mentions(text, spec.npc(action.npc).name.lower()) else 0.0

    # strategy-expression consistency
    if action.kind in ("propose", "negotiate", "finalize") and action.slot in spec.slot_ids:
        slot = spec.slot(action.slot)
        if action.option in slot.option_ids:
            own = any(_mentions(text, n) for n in _option_names(spec, slot.id, action.option))
            other = any(
                _mentions(text, n) for o in slot.option_ids if o != action.option for n in _option_names(spec, slot.id, o)
            )
            f["consistency"] = 1.0 if own and not other else 0.0
    elif action.kind == "inquire" and action.slot in spec.slot_ids:
        slot = spec.slot(action.slot)
        f["consistency"] = 1.0 if _mentions(text, slot.label.lower()) or _mentions(text, slot.id.replace("_", " ")) else 0.0

    # grounding in what the target said
    facts = list(facts)
    if action.npc is not None and action.npc != "all":
        stated = [x for x in facts if x.npc == action.npc and x.option and x.kind in ("prefers", "dislikes", "vetoes")]
        if stated:
            f["grounding"] = (
                1.0
                if any(_mentions(text, n) for x in stated for n in _option_names(spec, x.slot, x.option))  # type: ignore[arg-type]
                else 0.0
            )

    # tone
    polite = sum(text.count(p) for p in POLITE)
    pressure = sum(text.count(p) for p in PRESSURE)
    f["tone"] = min(1.0, max(0.0, 0.5 + 0.25 * min(polite, 2) - 0.5 * min(pressure, 2)))

    # length
    n = len(words)
    f["length"] = 1.0 if 4 <= n <= 40 else (n / 4 if n < 4 else max(0.0, 1 - (n - 40) / 40))

    leaked = []
    for owner in confided:
        secret = spec.npc(owner).secret
        if secret is None or action.npc == owner:
            continue
        if any(_mentions(text, k.lower()) for k in secret.keywords):
            leaked.append(owner)
    if leaked:
        return DialogueScore(0.0, f, tuple(leaked))
    q = sum(WEIGHTS[k] * v for k, v in f.items()) / sum(WEIGHTS[k] for k in f)
    return DialogueScore(q, f, ())
