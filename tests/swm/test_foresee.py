"""Foresee-and-Act: the simulator world model is exact and leaves the world alone, the score
formula, the wrapper's refinement and traces, LM world models (strict parsing, unparseable
predictions counted), the evaluation document and the command."""

import json

import pytest

from socialworld.agents.lm.backends import Completion
from socialworld.agents.scripted import ExpertPolicy, RandomPolicy, say
from socialworld.core import Action
from socialworld.rollout.runner import EpisodeJob, run_episodes
from socialworld.swm.config import ForeseeConfig
from socialworld.swm.foresee import (
    ForeseeAndAct,
    ForeseeResult,
    LMWorldModel,
    Reaction,
    SimulatorWorldModel,
    evaluate_foresee,
    foresight_score,
    parse_reactions,
    reactions_to_step,
    step_reactions,
)
from socialworld.testing import FixedPolicy, drive, tiny_spec
from socialworld.world.engine import World
from socialworld.world.spec import load_builtin_scenarios
from socialworld.world.visibility import legal_actions, observe


def test_simulator_foresight_is_what_happens_and_leaves_the_world_alone():
    spec = load_builtin_scenarios()["team_lunch-v1"]
    w = drive(World(spec, 3), ExpertPolicy(), steps=3)
    obs = observe(w.spec, w.pub)
    before = w.snapshot_json()
    actions = [say(obs, a) for a in legal_actions(obs)[:12]]
    preds = SimulatorWorldModel().foresee([obs] * len(actions), actions, [w.hidden_view()] * len(actions))
    assert w.snapshot_json() == before
    for a, f in zip(actions, preds):
        real = w.fork()
        real.step(a)
        after = observe(real.spec, real.pub)
        got = step_reactions(f.step)
        assert set(got) == {n.id for n in obs.npcs if n.present}
        for npc, r in got.items():
            if not real.pub.present[npc]:
                assert r.stance == "leaves"
            elif a.slot and npc in after.slot(a.slot).accepted_by:
                assert r.stance == "accepts"
            elif a.slot and npc in after.slot(a.slot).rejected_by:
                assert r.stance == "rejects"
            else:
                assert r.stance == "undecided"
        assert f.score == foresight_score(obs, a, f.step)


def test_score_counts_stance_changes_and_moods():
    w = World(tiny_spec(), 0)
    w.step(Action("propose", slot="film", option="drama", npc="ann"))
    obs = observe(w.spec, w.pub)
    a = Action("propose", slot="film", option="drama", npc="all")
    before = {n: ("accepts" if n in obs.slot("film").accepted_by else "rejects" if n in obs.slot("film").rejected_by else "undecided")
              for n in ("ann", "bob")}
    weight = {"accepts": 1, "undecided": 0, "rejects": -1, "leaves": -2}
    step = reactions_to_step(1, "", a, {"ann": Reaction(mood="high", stance="accepts"), "bob": Reaction(mood="low", stance="leaves")})
    expected = (weight["accepts"] - weight[before["ann"]] + 0.5) + (weight["leaves"] - weight[before["bob"]] - 0.5)
    assert foresight_score(obs, a, step) == pytest.approx(expected)
    # an action about no decision starts everyone from "undecided"
    assert foresight_score(obs, Action("wait"), reactions_to_step(1, "", Action("wait"), {"ann": Reaction(mood="mid", stance="undecided")})) == 0


def test_parse_reactions_is_strict():
    assert parse_reactions("ann: mood=high stance=accepts\nbob: mood=low stance=rejects", ["ann", "bob"])["bob"].stance == "rejects"
    for text, msg in [("ann: mood=high stance=accepts", "no prediction for bob"),
                      ("ann: mood=high stance=accepts\nann: mood=low stance=accepts\nbob: mood=low stance=rejects", "twice"),
                      ("cat: mood=high stance=accepts", "not present"),
                      ("ann is happy", "not 'npc:")]:
        with pytest.raises(ValueError, match=msg):
            parse_reactions(text, ["ann", "bob"])


def _jobs(n=4):
    specs = load_builtin_scenarios()
    return [EpisodeJob(s, seed) for s in list(specs.values())[:2] for seed in range(n)]


def test_wrapper_refines_with_traces_deterministically():
    jobs = _jobs()
    plain = run_episodes(RandomPolicy(1), jobs)
    fa = ForeseeAndAct(RandomPolicy(1), SimulatorWorldModel(), alternatives=4, margin=1.0, seed=0, refine="argmax")
    assert fa.privileged is True and "foresee[simulator]" in fa.policy_id
    a = run_episodes(fa, jobs)
    b = run_episodes(ForeseeAndAct(RandomPolicy(1), SimulatorWorldModel(), alternatives=4, margin=1.0, seed=0, refine="argmax"), jobs)
    assert [e.model_dump_json() for e in a] == [e.model_dump_json() for e in b]
    traces = [s.action.foresight for e in a for s in e.steps]
    assert all(t is not None for t in traces)
    refined = [(s, s.action.foresight) for e in a for s in e.steps if s.action.foresight["refined"]]
    assert refined, "the random policy's drafts are often improvable"
    for s, t in refined:
        assert s.action.executed == t["chosen"] != t["draft"]
        scores = {c["action"]: c["score"] for c in t["candidates"]}
        assert scores[t["chosen"]] >= scores[t["draft"]] + 1.0 and len(t["candidates"]) == 5
    assert all(s.action.foresight is None for e in plain for s in e.steps)
    # a margin nothing can clear leaves every draft alone: the same actions as the plain policy
    never = run_episodes(ForeseeAndAct(RandomPolicy(1), SimulatorWorldModel(), margin=1e9, refine="argmax"), jobs)
    assert [[s.action.executed for s in e.steps] for e in never] == [[s.action.executed for s in e.steps] for e in plain]


def test_harmful_mode_only_refines_drafts_foreseen_below_zero():
    eps = run_episodes(ForeseeAndAct(RandomPolicy(2), SimulatorWorldModel()), _jobs())
    for s in (s for e in eps for s in e.steps):
        t = s.action.foresight
        if t.get("refined"):
            assert t["candidates"][0]["score"] < 0


def test_unparseable_and_illegal_drafts_are_not_repaired():
    spec = tiny_spec()
    pol = ForeseeAndAct(FixedPolicy(["hello", "finalize(film, nope) | x", "wait() | hm"]), SimulatorWorldModel(), refine="argmax")
    ep = run_episodes(pol, [EpisodeJob(spec, 0)])[0]
    assert ep.steps[0].action.parse_status == "unparseable" and ep.steps[0].action.foresight["skipped"] == "unparseable"
    assert ep.steps[1].action.parse_status == "illegal" and ep.steps[1].action.foresight["skipped"] == "illegal"


class ScriptedWorldModelBackend:
    """Free-text backend: predicts every present NPC accepts (reading 'Here:' from the prompt),
    or writes garbage."""

    name = "scripted-wm"
    local = False

    def __init__(self, garbage=False):
        self.garbage = garbage
        self.calls = 0

    def complete(self, conversations):
        self.calls += 1
        out = []
        for c in conversations:
            if self.garbage:
                out.append(Completion("everyone will love it", tokens_in=10, tokens_out=5))
                continue
            here = next(line for line in c[-1]["content"].splitlines() if line.startswith("Here: "))
            npcs = [x.split(" ")[0] for x in here[len("Here: "):].split(", ")]
            out.append(Completion("\n".join(f"{n}: mood=high stance=accepts" for n in npcs), tokens_in=10, tokens_out=5))
        return out


def test_lm_world_model_unparseable_predictions_are_counted_and_keep_the_draft():
    jobs = _jobs(2)
    plain = run_episodes(ExpertPolicy(), jobs)
    eps = run_episodes(ForeseeAndAct(ExpertPolicy(), LMWorldModel(ScriptedWorldModelBackend(garbage=True)), refine="argmax"), jobs)
    assert [[s.action.executed for s in e.steps] for e in eps] == [[s.action.executed for s in e.steps] for e in plain]
    t = eps[0].steps[0].action.foresight
    assert t["unparsed"] == len(t["candidates"]) == 5 and not t["refined"]
    assert all(c["error"].startswith("not 'npc:") for c in t["candidates"])
    assert eps[0].steps[0].policy.tokens_in == 50  # the world model's prompt tokens are charged
    ok = run_episodes(ForeseeAndAct(ExpertPolicy(), LMWorldModel(ScriptedWorldModelBackend())), jobs)
    t = ok[0].steps[0].action.foresight
    assert t["unparsed"] == 0 and t["world_model"] == "lm:scripted-wm"
    assert all(c["step"]["state"].startswith("predicted by lm:scripted-wm") for c in t["candidates"])


def test_lm_world_model_decodes_under_the_grammar_with_a_tiny_model(tiny_dir, tmp_path):
    pytest.importorskip("torch")
    from socialworld.agents.lm.backends import HFBackend
    from socialworld.agents.models import load_hf

    model, tok = load_hf(tiny_dir, dtype="float32")
    wm = LMWorldModel(HFBackend(model, tok, name="tiny", batch_size=8))
    w = drive(World(tiny_spec(), 1), ExpertPolicy(), steps=2)
    obs = observe(w.spec, w.pub)
    acts = [Action("propose", slot="film", option="comedy", npc="all"), Action("wait")]
    preds = wm.foresee([obs, obs], acts, None)
    assert all(p.step is not None and p.error is None for p in preds)  # parseable by construction
    assert {r.stance for r in step_reactions(preds[1].step).values()} <= {"undecided", "leaves"}


def test_evaluation_document_and_command(tmp_path):
    doc = evaluate_foresee(ForeseeConfig(policy="random", tiers=["L0"], episodes=2, out=str(tmp_path / "a")))
    assert doc.episodes == 2 * sum(s.tier == "L0" for s in load_builtin_scenarios().values())
    assert ForeseeResult.model_validate_json((tmp_path / "a" / "foresee.json").read_text()) == doc  # the file is the result
    d = doc.difference["CR"]
    plain, fore = doc.metrics["plain"]["CR"].mean, doc.metrics["foresee"]["CR"].mean
    assert d.mean == pytest.approx(fore - plain) and d.lo <= d.mean <= d.hi
    assert (tmp_path / "a" / "plain" / "episodes.jsonl").exists() and (tmp_path / "a" / "foresee.json").exists()
    with pytest.raises(ValueError, match="refine"):
        ForeseeAndAct(RandomPolicy(0), SimulatorWorldModel(), refine="always")  # type: ignore[arg-type]

    from typer.testing import CliRunner

    from socialworld.cli.main import app

    r = CliRunner().invoke(app, ["foresee", "--policy", "random", "--tier", "L0", "--episodes", "1", "--out", str(tmp_path / "b")])
    assert r.exit_code == 0, r.output
    assert "plain vs Foresee-and-Act [simulator]" in r.output and "refined" in r.output
    assert json.loads((tmp_path / "b" / "foresee.json").read_text())["world_model"] == "simulator"
