"""Worlds the agent cannot tell apart: the same public state, other hidden preferences.

A counterfactual value computed in the true world rewards what only the hidden state knows (to
propose the option everyone secretly likes, before anyone said so). A policy that sees only its
observation cannot learn that; it can learn what is good *on average over the worlds consistent
with what it has seen*. :func:`imagine` draws one such world: every NPC's preferences (utilities
and vetoes of every decision) drawn afresh from the scenario's distributions, then made to agree
with the public record, fact by fact in the order they were said:

* ``prefers X`` — X is not vetoed and becomes the favourite (its utility swapped with the
  current favourite's);
* ``vetoes X`` — X is vetoed;
* ``dislikes X`` — X is not the favourite (swapped with the best other option);
* ``unsettled`` — what was said of that decision before no longer binds (later facts do).

Everything else is kept: the public state (proposals and who accepted them, commitments, what was
said), and the NPCs' thresholds, moods, trust, engagement and patience (moods show through cues;
the rest is what the NPC is, not what it wants). So no preference of the true world survives into
an imagined one: values averaged over imagined worlds are a function of the public record and the
seed alone (tested)."""

from __future__ import annotations

from socialworld.core import preferred_option
from socialworld.world.engine import World
from socialworld.world.rng import derive_seed


def imagine(w: World, seed: int) -> World:
    """A fork of ``w`` whose NPC preferences are redrawn (prior sample ``seed``) to agree with
    the public facts, and whose future randomness is the stream of ``seed``."""
    prior = World(w.spec, derive_seed(seed, "prior"))
    out = w.fork(reseed=derive_seed(seed, "stream"))
    for npc, h in prior.hid.items():
        us = {s: dict(u) for s, u in h.utilities.items()}
        vs = {s: set(v) for s, v in h.vetoes.items()}
        said: dict[str, list] = {}
        for f in w.pub.facts:
            if f.npc != npc or f.slot not in us:
                continue
            if f.kind == "unsettled":
                said[f.slot] = []
            elif f.kind in ("prefers", "vetoes", "dislikes"):
                said.setdefault(f.slot, []).append(f)
        for slot, facts in said.items():
            for f in facts:
                u, v = us[slot], vs[slot]
                if f.option not in u:
                    continue
                if f.kind == "vetoes":
                    if len(v | {f.option}) < len(u):  # someone can live with something
                        v.add(f.option)
                elif f.kind == "prefers":
                    v.discard(f.option)
                    fav = preferred_option(u, frozenset(v))
                    u[f.option], u[fav] = u[fav], u[f.option]
                elif preferred_option(u, frozenset(v)) == f.option:  # dislikes the favourite: not any more
                    rest = {o: x for o, x in u.items() if o != f.option and o not in v}
                    if rest:
                        other = max(rest, key=lambda o: (rest[o], o))
                        u[f.option], u[other] = u[other], u[f.option]
        out.set_npc(npc, utilities=us, vetoes={s: frozenset(v) for s, v in vs.items()})
    return out
