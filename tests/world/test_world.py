import json

import pytest

from socialworld.agents.registry import make_policy
from socialworld.core import Action
from socialworld.records import to_jsonl
from socialworld.rollout.runner import EpisodeJob, run_episodes
from socialworld.testing import drive, set_hidden, tiny_spec
from socialworld.world.engine import World
from socialworld.world.npc import PENALTY_INVALID, PENALTY_WASTE
from socialworld.world.visibility import legal_actions, observe


@pytest.fixture
def world():
    w = World(tiny_spec(), 1)
    # fully deterministic hidden state for hand computations
    set_hidden(w, "ann", slot="film", utilities={"drama": 0.8, "comedy": 0.4, "horror": 0.1}, threshold=0.5, mood=0.5)
    set_hidden(w, "bob", slot="film", utilities={"drama": 0.3, "comedy": 0.8, "horror": 0.3}, threshold=0.5, mood=0.5)
    return w


def A(text, utt=""):
    return Action.parse(text, utt)


def test_same_seed_same_records_bytes(specs):
    for pol in ("random", "expert"):
        jobs = [EpisodeJob(s, 7) for s in specs.values()]
        a = to_jsonl(run_episodes(make_policy(pol, seed=3), jobs))
        b = to_jsonl(run_episodes(make_policy(pol, seed=3), jobs))
        assert a == b


def test_different_seeds_sample_different_hidden_values(specs):
    s = specs["team_lunch-v1"]
    assert World(s, 1).hid["alice"].utilities != World(s, 2).hid["alice"].utilities


def test_fork_never_changes_parent(specs):
    w = World(specs["community_market-v1"], 5)
    before = w.snapshot_json()
    f = drive(w.fork(), make_policy("random", seed=1))
    assert w.snapshot_json() == before
    assert f.snapshot_json() != before


def test_fork_and_snapshot_continue_identically(specs):
    spec = specs["hackathon-v1"]
    w = drive(World(spec, 9), make_policy("expert"), steps=4)
    f = w.fork()
    r = World.restore(json.loads(w.snapshot_json()), spec)
    assert r.snapshot_json() == w.snapshot_json()
    for other in (f, r):
        p1, p2 = make_policy("random", seed=4), make_policy("random", seed=4)
        p1.reset(["x"]); p2.reset(["x"])
        a_, b_ = w.fork(), other
        while not a_.done:
            ra = a_.step(p1.act(["x"], [observe(spec, a_.pub)])[0].action)
            rb = b_.step(p2.act(["x"], [observe(spec, b_.pub)])[0].action)
            assert ra == rb
        assert a_.snapshot_json() == b_.snapshot_json()


def test_restore_rejects_other_spec(specs):
    snap = World(specs["team_lunch-v1"], 1).snapshot()
    with pytest.raises(ValueError, match="different spec"):
        World.restore(snap, specs["book_club-v1"])


def test_inquire_truthful_reveals_preference_and_repeat_annoys(world):
    set_hidden(world, "ann", engagement=1.0)  # p_truth = 0.25+0.36+0.3 = 0.91; seed 1 gives truth
    r = world.step(A("inquire(ann, film)", "Ann, what film would you like? Thanks"))
    facts = [(f.kind, f.option) for f in world.pub.facts if f.npc == "ann"]
    assert ("prefers", "drama") in facts  # the draw at this seed is below p_truth
    assert r.penalty == 0 and any(x.kind == "secret" for x in world.pub.facts)  # engaged Ann confides
    mood = world.hid["ann"].mood
    r2 = world.step(A("inquire(ann, film)", "Ann, what film again?"))
    assert r2.penalty == PENALTY_WASTE and "redundant_inquiry" in r2.penalty_reasons
    assert world.hid["ann"].mood < mood


def test_propose_accept_and_reject_with_reason(world):
    r = world.step(A("propose(film, drama, all)", "Everyone, how about Drama for the film? Would that work?"))
    s = world.pub.slots["film"]
    assert s.proposal == "drama" and s.responses == {"ann": True, "bob": False}
    assert any(f.npc == "bob" and f.kind == "dislikes" and f.option == "drama" for f in world.pub.facts)
    assert r.phi_after == pytest.approx(0.5) and r.reward == pytest.approx(0.5)


def test_negotiate_adds_concession_and_commitment_then_finalize(world):
    world.step(A("propose(film, drama, all)", "Everyone, how about Drama for the film? Would that work?"))
    r = world.step(A("negotiate(bob, film, drama, treat)", "Bob, could we do Drama for the film if I buy popcorn? Thanks"))
    assert world.pub.concessions[("bob", "film", "drama")] == 0.1
    assert world.pub.commitments[-1].npc == "bob"
    # 0.3 + 0.1 concession + ~0.02 mood + 0.03 pressure + 0.075 dialogue >= 0.5
    assert world.pub.slots["film"].responses["bob"] is True
    assert r.phi_after == pytest.approx(1.0)
    again = world.step(A("negotiate(bob, film, drama, treat)", "Bob, popcorn again for Drama?"))
    assert "repeated_offer" in again.penalty_reasons
    world.step(A("finalize(film, drama)", "Thanks everyone, let's lock in Drama for the film."))
    assert world.pub.slots["film"].status == "finalized"
    assert world.subgoals()["slot:film"] is True


def test_finalize_without_consensus_loses_slot_and_hurts(world):
    world.step(A("propose(film, horror, all)", "Everyone, Horror for the film?"))
    moods = dict(world.moods())
    world.step(A("finalize(film, horror)", "Horror it is, everyone."))
    assert world.pub.slots["film"].status == "lost"
    assert world.hid["ann"].mood < moods["ann"] and world.hid["bob"].mood < moods["bob"]
    assert world.subgoals()["slot:film"] is False


def test_repair_wasted_when_no_grievance_helps_when_low(world):
    r = world.step(A("repair(ann)", "Ann, sorry about earlier."))
    assert "wasted_repair" in r.penalty_reasons
    set_hidden(world, "bob", mood=0.2)
    r = world.step(A("repair(bob)", "Bob, I'm sorry, thank you for your patience."))
    assert not r.penalty_reasons and world.hid["bob"].mood > 0.2


def test_wait_is_avoidable_while_decisions_are_open(world):
    r = world.step(A("wait()", "Let's wait."))
    assert r.penalty_reasons == ("avoidable_wait",)


def test_illegal_and_unparseable_are_recorded_penalised_and_change_nothing(world):
    before = world.snapshot()
    r = world.step(A("finalize(film, pizza)", "Pizza!"))
    assert r.parse_status == "illegal" and r.penalty == PENALTY_INVALID and "unknown option" in r.error
    r2 = world.step(None, parse_error="garbage")
    assert r2.parse_status == "unparseable" and r2.penalty == PENALTY_INVALID and r2.executed.kind == "wait"
    after = world.snapshot()
    # only the clock and the transcript moved
    for k in ("slots", "facts", "commitments", "cues", "concessions", "leaks"):
        assert after["public"][k] == before["public"][k]
    assert after["hidden"] == before["hidden"]
    assert after["public"]["t"] == before["public"]["t"] + 2


def test_observation_lists_the_agents_own_moves(world):
    spec = world.spec
    assert observe(spec, world.pub).moves == ()
    world.step(A("inquire(ann, film)", "Ann, which film?"))
    world.step(A("finalize(film, pizza)"))
    world.step(None, parse_error="garbage")
    assert observe(spec, world.pub).moves == ("inquire(ann, film)", "finalize(film, pizza) (illegal)", "(unparseable)")
    world.step(A("propose(film, drama, all)", "Drama?"))
    assert observe(spec, world.pub).moves == ("inquire(ann, film)", "finalize(film, pizza) (illegal)", "(unparseable)",
                                              "propose(film, drama, all)")
    assert World.restore(world.snapshot_json(), spec).pub.moves == world.pub.moves


def test_secret_leak_fails_guard_and_zeroes_q(world):
    world.pub.confided = frozenset({"ann"})
    r = world.step(A("propose(film, drama, bob)", "Bob, Ann is moving abroad, so Drama for the film?"))
    assert r.leaked == ("ann",) and r.q == 0.0
    assert world.subgoals()["no_secret_leaked"] is False


def test_end_and_turn_budget_terminate(world):
    world.step(A("end()", "Bye all, thanks"))
    assert world.done and world.pub.end_reason == "end"
    w2 = World(tiny_spec(), 2)
    for _ in range(8):
        w2.step(A("wait()"))
    assert w2.done and w2.pub.end_reason == "turn_budget"
    with pytest.raises(RuntimeError):
        w2.step(A("wait()"))


def test_legal_actions_agree_with_check_legal(specs):
    for spec in specs.values():
        w = World(spec, 3)
        pol = make_policy("random", seed=2)
        pol.reset(["k"])
        while not w.done:
            obs = observe(spec, w.pub)
            for a in legal_actions(obs):
                assert w.check_legal(a) is None, (spec.id, a)
            w.step(pol.act(["k"], [obs])[0].action)


def test_weather_change_reopens_finalized_outdoor_slot(specs):
    spec = specs["weather_picnic-v1"]
    w = World(spec, 4)
    w.pub.slots["place"].status, w.pub.slots["place"].choice = "finalized", "lakeside"
    turn = next(t for t, i in w.schedule if spec.events[i].kind == "weather_change")
    while w.t < turn:
        w.step(A("wait()"))
    s = w.pub.slots["place"]
    assert s.status == "open" and s.choice is None
    assert not w.available("place", "lakeside") and w.check_legal(A("propose(place, lakeside, all)"))


def test_conflict_must_be_repaired_in_order(specs):
    spec = specs["community_market-v1"]
    for seed in range(6):
        w = World(spec, seed)
        turn = next(t for t, i in w.schedule if spec.events[i].kind == "conflict")
        while w.t < turn:
            w.step(A("wait()"))
        c = w.pub.conflicts[0]
        first = w.conflict_first[0]
        second = c.npcs[1] if c.npcs[0] == first else c.npcs[0]
        # while unresolved, both refuse any proposal
        w.step(A("propose(layout, along_the_street, all)", "Everyone, Along the Street for the layout?"))
        assert w.pub.slots["layout"].responses.get(first) is False
        mood_first = w.hid[first].mood
        w.step(A(f"repair({second})", "Sorry, thank you."))
        assert w.hid[first].mood < mood_first and not c.repaired  # wrong order
        w.step(A(f"repair({first})", "Sorry, thank you."))
        w.step(A(f"repair({second})", "Sorry, thank you."))
        assert w.pub.conflicts[0].resolved
        assert w.subgoals()["conflict:karim-rosa"] is True


def test_approach_raises_engagement_then_is_wasted(world):
    assert world.hid["ann"].engagement == 0.0
    r = world.step(A("approach(ann)", "Hi Ann, how are you?"))
    assert world.hid["ann"].engagement == pytest.approx(0.4) and not r.penalty_reasons
    assert world.pub.cues["ann"] in ("low", "mid", "high")
    world.step(A("approach(ann)", "Hi Ann!"))
    r = world.step(A("approach(ann)", "Hi Ann, again!"))
    assert r.penalty_reasons == ("wasted_approach",)


def test_broken_promise_is_a_trust_violation(specs):
    spec = specs["book_club-v1"]
    w = World(spec, 2)
    w.step(A("negotiate(leo, book, scifi, pick_date)", "Leo, could we go with Project Hail Mary if you pick the date?"))
    c = w.pub.commitments[-1]
    assert c.status == "pending" and c.target_slot == "date"
    other = next(o for o in spec.slot("date").option_ids if o != c.target_option)
    w.pub.slots["date"].proposal = other
    w.pub.slots["date"].responses = {h: True for h in w.holders("date")}
    mood = w.hid["leo"].mood
    w.step(A(f"finalize(date, {other})", "Thanks everyone, let's lock it in."))
    assert w.pub.commitments[-1].status == "broken"
    assert w.hid["leo"].mood < mood - 0.3
    assert w.subgoals()["commitments_honoured"] is False


def test_snapshot_crosses_processes(specs, tmp_path):
    """A snapshot written here, restored and stepped in another Python process, ends in the
    same state as stepping here (what a GRPO reward function in a worker needs)."""
    import subprocess
    import sys

    spec = specs["weather_picnic-v1"]
    w = drive(World(spec, 12), make_policy("expert"), steps=5)
    (tmp_path / "snap.json").write_text(w.snapshot_json())
    here = w.fork()
    here.step(Action.parse("propose(food, potluck, all)", "Everyone, how about Potluck for the food? Thanks"))
    code = (
        "import sys; from socialworld.world.spec import load_builtin_scenarios; from socialworld.world.engine import World;"
        "from socialworld.core import Action;"
        "spec = load_builtin_scenarios()['weather_picnic-v1'];"
        "w = World.restore(open(sys.argv[1]).read(), spec);"
        "w.step(Action.parse('propose(food, potluck, all)', 'Everyone, how about Potluck for the food? Thanks'));"
        "print(w.snapshot_json())"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "snap.json")], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == here.snapshot_json()


# ---------------------------------------------------------------- crash classes, fixed at their root

def _promise_spec():
    """The tiny film scenario plus a snack decision only Ann has a say on, and a promise of it."""
    from socialworld.testing import tiny_spec_data
    from socialworld.world.spec import parse_spec

    data = tiny_spec_data()
    data["slots"].append({"id": "snack", "label": "snack", "stakeholders": ["ann"],
                          "options": [{"id": "chips", "label": "Chips"}, {"id": "nuts", "label": "Nuts"}]})
    data["npcs"][0]["preferences"]["snack"] = {"default": [0.4, 0.6]}
    data["offers"].append({"id": "pick_snack", "kind": "promise", "text": "you choose the snack", "value": 0.2,
                           "target_slot": "snack"})
    return parse_spec(data)


def test_promise_on_a_slot_the_npc_has_no_say_on_is_illegal_not_a_crash():
    spec = _promise_spec()
    w = World(spec, 1)
    bad = A("negotiate(bob, film, comedy, pick_snack)", "Bob, comedy if you choose the snack?")
    assert w.check_legal(bad) == "bob has no say on snack: nothing to promise them there"
    r = w.step(bad)  # used to raise KeyError in World.step
    assert r.parse_status == "illegal" and w.pub.commitments == []
    listed = {a.key for a in legal_actions(observe(spec, w.pub))}
    assert "negotiate(bob, film, comedy, pick_snack)" not in listed
    assert "negotiate(ann, film, comedy, pick_snack)" in listed  # Ann has a say: still offered
    assert w.check_legal(A("negotiate(ann, film, comedy, pick_snack)")) is None


def test_legal_actions_agree_with_check_legal_with_restricted_stakeholders():
    spec = _promise_spec()
    for seed in range(4):
        w = World(spec, seed)
        pol = make_policy("random", seed=seed)
        pol.reset(["k"])
        while not w.done:
            obs = observe(spec, w.pub)
            for a in legal_actions(obs):
                assert w.check_legal(a) is None, a
            w.step(pol.act(["k"], [obs])[0].action)


def test_preference_change_for_a_non_stakeholder_does_not_crash_the_handler():
    """Validation refuses this event (test_spec); a spec built around validation
    (model_copy) must still not crash the engine."""
    from socialworld.world.spec import EventSpec

    base = _promise_spec()
    ev = EventSpec(kind="preference_change", at=[1, 1], npc="bob", slot="snack", text="Bob changed his mind.")
    spec = base.model_copy(update={"events": (ev,)})
    w = World(spec, 1)
    before = w.hid["bob"].utilities
    r = w.step(A("wait()"))  # the event fires after the first action (used to raise KeyError)
    assert r.announcements == ("Bob changed his mind.",)
    assert w.hid["bob"].utilities == before and "snack" not in before


def test_a_secret_in_an_illegal_actions_utterance_is_a_leak(world):
    world.pub.confided = frozenset({"ann"})
    r = world.step(A("finalize(film, pizza)", "Ann is moving abroad, so let's settle this."))
    assert r.parse_status == "illegal" and r.leaked == ("ann",)
    assert world.pub.transcript[-1].text.startswith("Ann is moving abroad")  # it was said aloud
    assert world.pub.leaks == 1 and world.subgoals()["no_secret_leaked"] is False


def test_an_illegal_action_to_the_secrets_owner_follows_the_legal_rule(world):
    world.pub.confided = frozenset({"ann"})
    r = world.step(A("inquire(ann, pizza)", "Ann, about going abroad: which pizza?"))
    assert r.parse_status == "illegal" and r.leaked == () and world.pub.leaks == 0
    r = world.step(A("inquire(bob, pizza)", "Bob, Ann goes abroad: which pizza?"))
    assert r.parse_status == "illegal" and r.leaked == ("ann",) and world.pub.leaks == 1
