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
