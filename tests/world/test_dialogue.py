from socialworld.core import Action, Fact
from socialworld.testing import tiny_spec
from socialworld.world.dialogue import assess

SPEC = tiny_spec()


def q(text, action="propose(film, drama, bob)", facts=(), confided=()):
    return assess(SPEC, Action.parse(action, text), facts, confided)


def test_good_utterance_scores_high_and_bad_low():
    good = q("Bob, how about Drama for the film? Would that work for you, please?")
    assert good.q == 1.0
    bad = q("You must take Comedy now!")
    assert bad.features["address"] == 0 and bad.features["consistency"] == 0 and bad.features["tone"] == 0
    assert bad.q < 0.2


def test_grounding_applies_only_when_npc_said_something():
    assert "grounding" not in q("Bob, Drama?").features
    facts = [Fact("bob", "prefers", "film", "comedy", 0)]
    assert q("Bob, Drama? I know you like comedy.", facts=facts).features["grounding"] == 1.0
    assert q("Bob, Drama?", facts=facts).features["grounding"] == 0.0


def test_leak_zeroes_q_except_to_the_owner():
    assert q("Bob, Ann is moving abroad; Drama?", confided=["ann"]).leaked == ("ann",)
    assert q("Ann, since you go abroad, Drama?", action="propose(film, drama, ann)", confided=["ann"]).leaked == ()
    assert q("Bob, Ann is moving abroad; Drama?", confided=[]).leaked == ()


def test_length_feature():
    assert q("Bob").features["length"] == 0.25
    assert q(" ".join(["Bob"] * 80)).features["length"] == 0.0


def test_quoting_the_targets_own_preference_is_grounding_not_mismatch():
    facts = [Fact("bob", "prefers", "film", "comedy", 0)]
    s = q("Bob, I know you mentioned Comedy; how about Drama for the film? Would that work, please?", facts=facts)
    assert s.features["consistency"] == 1.0 and s.features["grounding"] == 1.0 and s.q == 1.0
    # naming an option nobody stated is still a mismatch
    assert q("Bob, Horror or Drama for the film?", facts=facts).features["consistency"] == 0.0
