"""The scripted policies: the expert reads what was done from the observation's moves."""

from socialworld.agents.registry import make_policy
from socialworld.agents.scripted import ExpertPolicy, _ExpertMemory
from socialworld.core import Action
from socialworld.learn.pairs.counterfactual import replay
from socialworld.rollout.runner import EpisodeJob, run_episodes
from socialworld.world.engine import World
from socialworld.world.visibility import observe


def test_the_expert_recalls_what_was_done_from_the_moves(specs):
    """Fed another policy's states, the expert's memory of whom it asked, approached, pressed and what
    it offered is what that policy did (the observation's moves), not what the expert would have done."""
    spec = specs["book_club-v1"]
    w = World(spec, 3)
    for key in ("inquire(tom, book)", "inquire(tom, book)", "approach(leo)", "propose(book, scifi, grace)", "negotiate(leo, date, x, y)"):
        w.step(Action.parse(key))  # the last one is illegal: recorded, never recalled
    w.step(None, "no ACTION line")
    obs = observe(spec, w.pub)
    assert obs.moves[-2:] == ("negotiate(leo, date, x, y) (illegal)", "(unparseable)")
    m = _ExpertMemory().recall(obs)
    assert m.asked[("tom", "book")] == 2 and m.approached == {"leo"} and m.pressed == {("grace", "book", "scifi")}
    assert m.offered == set() and m.asked[("leo", "book")] == 0
    # an expert fed these states labels them as a fresh expert would: its memory is the moves'
    labeller = ExpertPolicy()
    labeller.reset(["k"])
    fresh = ExpertPolicy()
    fresh.reset(["k"])
    assert labeller.act(["k"], [obs])[0].action.key == fresh.act(["k"], [obs])[0].action.key


def test_the_expert_acts_on_its_own_episodes_as_a_fresh_expert_recalling_them(specs):
    """What the expert keeps beyond the moves (options given up, quarrel repairs) rarely decides: at its
    own states a fresh expert, recalling the moves alone, takes its action nearly always."""
    eps = run_episodes(make_policy("expert"), [EpisodeJob(s, seed) for s in specs.values() for seed in (1, 2, 3, 4)])
    same = total = 0
    for e in eps:
        spec = specs[e.scenario_id]
        for s, w in replay(spec, e):
            fresh = ExpertPolicy()
            fresh.reset(["k"])
            same += fresh.act(["k"], [observe(spec, w.pub)])[0].action.key == s.action.executed
            total += 1
    assert same / total > 0.9, (same, total)


def test_the_expert_repairs_a_quarrel_by_what_was_done_since_it_began(specs):
    """Fed another policy's states, the expert reads a quarrel's repairs from the moves made since it first
    saw the quarrel: after a repair of the wrong side (nobody counts as repaired) it names the other side,
    and that repair counts; after a repair that counted, the other side, which ends the quarrel. Its own
    first pick stays its own until a move is made (it does not switch sides on a step it did not take)."""
    seen = set()
    for sid, spec in specs.items():
        for seed in range(1, 13):
            w, expert = World(spec, seed), ExpertPolicy()
            expert.reset(["k"])
            while not w.done and not any(not c.resolved for c in w.pub.conflicts):
                w.step(expert.act(["k"], [observe(spec, w.pub)])[0].action)
            if w.done:
                continue
            pick = expert.act(["k"], [observe(spec, w.pub)])[0].action.npc
            assert expert.act(["k"], [observe(spec, w.pub)])[0].action.npc == pick  # asked twice, no move made
            i = next(i for i, c in enumerate(w.pub.conflicts) if not c.resolved)
            a, b = w.pub.conflicts[i].npcs
            for first in (a, b):  # the student repairs either side, then follows the expert
                f = w.fork()
                labeller = ExpertPolicy()
                labeller.reset(["k"])
                labeller.act(["k"], [observe(spec, f.pub)])  # it saw the quarrel before the student's move
                f.step(Action("repair", npc=first))
                counted = bool(f.pub.conflicts[i].repaired)
                nxt = labeller.act(["k"], [observe(spec, f.pub)])[0].action
                assert nxt.kind == "repair" and nxt.npc == (b if first == a else a), (sid, seed, first, counted)
                f.step(nxt)
                c = f.pub.conflicts[i]
                assert c.repaired[:1] == ([first] if counted else [nxt.npc]) and c.resolved == counted
                seen.add("counted" if counted else "wrong side")
    assert seen == {"counted", "wrong side"}, seen


def test_a_proposal_is_carried_by_three_yes_and_a_majority_without_a_veto(specs):
    """``carried``: three or more of the present stakeholders, and more than half, said yes, and nobody
    present is known to have vetoed it; two yes of three, or a standing proposal with a known veto, is not."""
    from socialworld.agents.beliefs import Beliefs, carried

    seen = set()
    for sid in ("book_club-v1", "activity_debrief-v1", "charity_fundraising-v1"):
        spec = specs[sid]
        for seed in range(1, 25):
            w = World(spec, seed)
            s0 = spec.slots[0]
            w.step(Action("propose", slot=s0.id, option=s0.options[0].id, npc="all"))
            obs = observe(spec, w.pub)
            s, b = obs.slot(s0.id), Beliefs().update(obs)
            here = [h for h in s.stakeholders if obs.npc(h).present]
            yes = len([h for h in here if h in s.accepted_by])
            vetoed = b.vetoed(here, s.id, s.proposal)
            expected = s.proposal if yes >= 3 and 2 * yes > len(here) and not vetoed else None
            assert carried(obs, b, s) == expected, (sid, seed, s.accepted_by, s.rejected_by)
            seen.add("carried" if expected else "vetoed" if vetoed else f"{yes} of {len(here)}")
    assert {"carried", "vetoed", "2 of 3"} <= seen, seen


def test_the_expert_wins_over_whoever_said_no_to_a_carried_proposal(specs):
    """At its own states, while a decision it works on has a carried proposal it has not given up on, the
    expert finalizes it, negotiates for it or puts it to one alone who has not said yes (expert-v5): it never
    asks about that decision, approaches, or proposes another option there (expert-v4 asked whoever said no
    what they wanted and turned to their favourite, losing the others' yes)."""
    from socialworld.agents.beliefs import Beliefs, carried

    kinds = set()
    for sid, spec in specs.items():
        for seed in range(1, 9):
            w, expert = World(spec, seed), ExpertPolicy()
            expert.reset(["k"])
            while not w.done:
                obs = observe(spec, w.pub)
                a = expert.act(["k"], [obs])[0].action
                b = Beliefs().update(obs)
                s = next((x for x in obs.slots if x.id == a.slot), None) if a.slot else None
                held = carried(obs, b, s) if s is not None and s.status == "open" else None
                if held is not None and (s.id, held) not in expert._mem["k"].tried:
                    assert a.kind in ("finalize", "negotiate", "propose") and a.option == held, (sid, seed, a.key)
                    assert a.kind != "propose" or (a.npc != "all" and a.npc not in s.accepted_by), (sid, seed, a.key)
                    kinds.add(a.kind)
                w.step(a)
    assert kinds == {"finalize", "negotiate", "propose"}, kinds
