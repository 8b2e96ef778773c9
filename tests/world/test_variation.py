"""Variants of a scenario: the same structure and play under other names and words."""

import pytest

from socialworld.agents.registry import make_policy
from socialworld.core import Action
from socialworld.rollout.runner import EpisodeJob, run_episodes
from socialworld.world.spec import ScenarioSpec, resolve_scenarios
from socialworld.world.variation import parse_variant, variant, variant_id


def _ids(spec: ScenarioSpec) -> set[str]:
    return {n.id for n in spec.npcs} | {s.id for s in spec.slots} | {o.id for s in spec.slots for o in s.options}


@pytest.mark.parametrize("k", [1, 7, 3005])
def test_a_variant_is_the_scenario_under_other_words(specs, k):
    for spec in specs.values():
        v = variant(spec, k)
        assert v.id == variant_id(spec.id, k) and parse_variant(v.id) == (spec.id, k) and parse_variant(spec.id) is None
        assert v.content_hash == variant(spec, k).content_hash != variant(spec, k + 1).content_hash  # one variant per (spec, k)
        assert not _ids(v) & _ids(spec)  # every person, decision and option renamed
        assert len(_ids(v)) == len(_ids(spec))  # none twice
        # the structure is the scenario's: the same distributions, costs, tags, offers, events, budgets and guards
        assert [n.model_dump(exclude={"id", "name", "preferences"}) for n in v.npcs] == \
               [n.model_dump(exclude={"id", "name", "preferences"}) for n in spec.npcs]
        assert [[list(d.values()) for d in n.preferences.values()] for n in v.npcs] == \
               [[list(d.values()) for d in n.preferences.values()] for n in spec.npcs]
        assert [[o.model_dump(exclude={"id", "label"}) for o in s.options] for s in v.slots] == \
               [[o.model_dump(exclude={"id", "label"}) for o in s.options] for s in spec.slots]
        assert [o.model_dump(exclude={"target_slot"}) for o in v.offers] == [o.model_dump(exclude={"target_slot"}) for o in spec.offers]
        assert (v.turn_budget, v.t_ref, v.budget, v.guards, v.tier) == (spec.turn_budget, spec.t_ref, spec.budget, spec.guards, spec.tier)
        assert [e.kind for e in v.events] == [e.kind for e in spec.events]
        for e in v.events:  # events name the variant's people, in their words too
            assert all(h in {n.id for n in v.npcs} for h in (*e.npcs, *([e.npc] if e.npc else ())))
            assert not any(n.name in e.text for n in spec.npcs if n.name not in {m.name for m in v.npcs})
        # its id names it wherever a scenario is named
        (again,) = resolve_scenarios([v.id])
        assert again.content_hash == v.content_hash


def test_the_expert_plays_a_variant_as_the_scenario(specs):
    """The same seeds give the same moves (renamed) and the same rewards and metrics: a variant is
    exactly as hard as its scenario. One known exception, kept visible: where a shipped scenario's option
    name is also a word of the expert's template (``hackathon``'s stack "Go" in "could we go with ..."),
    the scenario's utterance names a rival option and scores lower on consistency than the variant's;
    only such steps may differ, and only there."""
    from socialworld.world.dialogue import _lexicon, _norm

    collided = set()
    for spec in specs.values():
        v, lex = variant(spec, 2), _lexicon(spec)
        a = run_episodes(make_policy("expert"), [EpisodeJob(spec, s) for s in (1, 2, 3)])
        b = run_episodes(make_policy("expert"), [EpisodeJob(v, s) for s in (1, 2, 3)])
        for x, y in zip(a, b):
            assert [s.action.executed.split("(")[0] for s in x.steps] == [s.action.executed.split("(")[0] for s in y.steps]
            assert [s.signals.reward.value for s in x.steps] == [s.signals.reward.value for s in y.steps]
            differ = [(s, t) for s, t in zip(x.steps, y.steps) if s.signals.q.value != t.signals.q.value]
            for s, t in differ:  # the scenario's words name a rival option; the variant's do not
                act = Action.parse(s.action.executed)
                text = _norm(s.dialogue.utterance)
                assert any(n in text for n in lex.rivals[(act.slot, act.option)]), (spec.id, x.seed, s.dialogue.utterance)
                assert s.signals.q_features["consistency"] == 0.0 and t.signals.q_features["consistency"] == 1.0
                collided.add(spec.id)
            if not differ:
                assert x.metrics.model_dump() == y.metrics.model_dump()
    assert collided <= {"hackathon-v1"}, collided


def test_variant_numbers_start_at_one(specs):
    with pytest.raises(ValueError, match="start at 1"):
        variant(specs["team_lunch-v1"], 0)
