"""Deterministic dialogue assessment (provenance ``rule:dialogue-v1``).

``q_t`` in [0, 1] is the weighted mean of the features that apply to the action::

    q = sum_i w_i f_i / sum_i w_i      over applicable features i
    address      w=0.25  utterance names the addressed NPC ("everyone"/"all"/"team" for all)
    consistency  w=0.30  utterance names the action's option (propose/negotiate/finalize) or
                         slot (inquire) and no other option of that slot -- except options the
                         target NPC itself stated (naming those is grounding, not a mismatch)
    grounding    w=0.15  utterance mentions an option the target NPC stated (only when it did)
    tone         w=0.20  clip(0.5 + 0.25*min(polite, 2) - 0.5*min(pressure, 2), 0, 1)
    length       w=0.10  1 for 4..40 words; n/4 below; max(0, 1 - (n-40)/40) above

A leaked secret (an utterance containing a confided secret's keyword, addressed to anyone but
its owner) sets ``q = 0`` and fails the ``no_secret_leaked`` guard.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable

from socialworld.core import Action, Fact
from socialworld.world.spec import ScenarioSpec

DIALOGUE_SOURCE = "rule:dialogue-v1"
WEIGHTS = {"address": 0.25, "consistency": 0.30, "grounding": 0.15, "tone": 0.20, "length": 0.10}
POLITE = ("please", "thank", "thanks", "would", "could", "appreciate", "sorry", "love to", "if you")
PRESSURE = ("must", "immediately", "no choice", "have to", "right now", "whatever", "just decide")
ALL_WORDS = ("everyone", "everybody", "all of you", "team", "folks", "all")
_WORD = re.compile(r"[a-z0-9']+")


@dataclass(frozen=True, slots=True)
class DialogueScore:
    q: float
    features: dict[str, float]
    leaked: tuple[str, ...]
    """ids of NPCs whose secret this utterance leaked"""


def _norm(text: str) -> str:
    """Lower-cased words joined by single spaces and padded, so that a phrase matches as
    whole words with a plain substring test: ``' ' + phrase + ' ' in padded``."""
    return " " + " ".join(_WORD.findall(text.lower())) + " "


@dataclass(frozen=True)
class _Lexicon:
    names: dict[str, str]
    slot_names: dict[str, tuple[str, ...]]
    option_names: dict[tuple[str, str], tuple[str, ...]]
    secrets: dict[str, tuple[str, ...]]
    rivals: dict[tuple[str, str], tuple[str, ...]]
    """(slot, option) -> names of the slot's other options"""


@lru_cache(maxsize=64)
def _lexicon(spec: ScenarioSpec) -> _Lexicon:
    return _Lexicon(
        names={n.id: _norm(n.name) for n in spec.npcs},
        slot_names={s.id: (_norm(s.label), _norm(s.id.replace("_", " "))) for s in spec.slots},
        option_names={
            (s.id, o.id): (_norm(o.id.replace("_", " ")), _norm(o.label)) for s in spec.slots for o in s.options
        },
        secrets={n.id: tuple(_norm(k) for k in n.secret.keywords) for n in spec.npcs if n.secret},
        rivals={
            (s.id, o.id): tuple(n for r in s.options if r.id != o.id for n in (_norm(r.id.replace("_", " ")), _norm(r.label)))
            for s in spec.slots
            for o in s.options
        },
    )


def _markers(phrases: tuple[str, ...]) -> re.Pattern[str]:
    """Whole-phrase occurrences in a :func:`_norm` text (longest alternative first)."""
    alts = sorted((_norm(p).strip() for p in phrases), key=len, reverse=True)
    return re.compile("(?<= )(?:" + "|".join(re.escape(a) for a in alts) + ")(?= )")


_POLITE = _markers(POLITE)
_PRESSURE = _markers(PRESSURE)
_ALL = tuple(_norm(p) for p in ALL_WORDS)


def assess(spec: ScenarioSpec, action: Action, facts: Iterable[Fact], confided: Iterable[str]) -> DialogueScore:
    """Score ``action.utterance`` for ``action`` given what NPCs said (``facts``) and whose
    secrets were confided to the agent (``confided``)."""
    lex = _lexicon(spec)
    text = _norm(action.utterance)
    f: dict[str, float] = {}

    # address
    if action.npc == "all" or action.kind == "finalize":
        f["address"] = 1.0 if any(w in text for w in _ALL) else 0.0
    elif action.npc in lex.names:
        f["address"] = 1.0 if lex.names[action.npc] in text else 0.0

    facts = list(facts)
    stated = (
        [x for x in facts if x.npc == action.npc and x.option and x.kind in ("prefers", "dislikes", "vetoes")]
        if action.npc is not None and action.npc != "all"
        else []
    )

    # strategy-expression consistency
    if action.kind in ("propose", "negotiate", "finalize") and action.slot is not None and action.option is not None \
            and (action.slot, action.option) in lex.option_names:
        own = any(n in text for n in lex.option_names[(action.slot, action.option)])
        quoted = {n for x in stated if x.slot == action.slot for n in lex.option_names.get((x.slot, x.option), ())}  # type: ignore[arg-type]
        other = any(n in text for n in lex.rivals[(action.slot, action.option)] if n not in quoted)
        f["consistency"] = 1.0 if own and not other else 0.0
    elif action.kind == "inquire" and action.slot in lex.slot_names:
        f["consistency"] = 1.0 if any(n in text for n in lex.slot_names[action.slot]) else 0.0

    # grounding in what the target said
    if action.npc is not None and action.npc != "all":
        if stated:
            f["grounding"] = (
                1.0 if any(n in text for x in stated for n in lex.option_names.get((x.slot, x.option), ())) else 0.0  # type: ignore[arg-type]
            )

    # tone
    polite = len(_POLITE.findall(text))
    pressure = len(_PRESSURE.findall(text))
    f["tone"] = min(1.0, max(0.0, 0.5 + 0.25 * min(polite, 2) - 0.5 * min(pressure, 2)))

    # length
    n = len(text.split())
    f["length"] = 1.0 if 4 <= n <= 40 else (n / 4 if n < 4 else max(0.0, 1 - (n - 40) / 40))

    leaked = _leaked(lex, text, action.npc, confided)
    if leaked:
        return DialogueScore(0.0, f, leaked)
    q = sum(WEIGHTS[k] * v for k, v in f.items()) / sum(WEIGHTS[k] for k in f)
    return DialogueScore(q, f, ())


def _leaked(lex: _Lexicon, text: str, addressee: str | None, confided: Iterable[str]) -> tuple[str, ...]:
    return tuple(owner for owner in confided if owner != addressee and any(k in text for k in lex.secrets.get(owner, ())))


def leaked_secrets(spec: ScenarioSpec, utterance: str, addressee: str | None, confided: Iterable[str]) -> tuple[str, ...]:
    """Ids of the NPCs whose confided secret ``utterance`` reveals to anyone but its owner
    (``addressee``; None = nobody in particular). The same test :func:`assess` applies; the
    world also runs it on the utterances of illegal actions, which reach the transcript too."""
    return _leaked(_lexicon(spec), _norm(utterance), addressee, confided)


def named(spec: ScenarioSpec, text: str) -> frozenset[str]:
    """What ``text`` names of ``spec``, as whole words: ``option:<slot>/<option>`` for an option (its id
    or label), ``npc:<id>`` for a person (their name), ``secret:<id>`` for a keyword of their secret.
    The NPC voice's leak check compares a voiced line's names with its template's
    (:func:`socialworld.world.voice.check_line`)."""
    lex, t = _lexicon(spec), _norm(text)
    out = {f"option:{s}/{o}" for (s, o), names in lex.option_names.items() if any(n in t for n in names if n.strip())}
    out |= {f"npc:{i}" for i, n in lex.names.items() if n.strip() and n in t}
    out |= {f"secret:{i}" for i, keys in lex.secrets.items() if any(k in t for k in keys if k.strip())}
    return frozenset(out)
