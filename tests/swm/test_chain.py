"""Episode chains: the same cast across episodes, NPCs who remember, memory modes built from the
public record, the expert using memory, and the chain document and command."""

import json

import pytest

from socialworld.agents.scripted import ExpertPolicy
from socialworld.rollout.runner import EpisodeJob, run_episodes
from socialworld.swm.chain import KEPT_LIFT, SLIGHT_DROP, Cast, ChainResult, build_memory, carry_over, chain_seed, run_chains
from socialworld.swm.config import ChainConfig
from socialworld.world.engine import World
from socialworld.world.spec import load_builtin_scenarios
from socialworld.world.visibility import observe, render


@pytest.fixture(scope="module")
def expert_episodes():
    spec = load_builtin_scenarios()["team_lunch-v1"]
    return spec, run_episodes(ExpertPolicy(), [EpisodeJob(spec, s) for s in (28, 32)])  # seeds where people state wishes


def test_memory_modes_come_from_the_public_record(expert_episodes):
    _, eps = expert_episodes
    assert build_memory("none", eps) is None and build_memory("full", []) is None
    with pytest.raises(ValueError, match="unknown memory mode"):
        build_memory("everything", eps)
    full, summary = build_memory("full", eps), build_memory("summary", eps)
    said = [s.dialogue.utterance for e in eps for s in e.steps if s.dialogue.utterance]
    assert all(any(u in line for line in full.lines) for u in said)  # every line of every episode
    assert len("\n".join(summary.lines)) < len("\n".join(full.lines)) / 2
    assert summary.lines[0].startswith("Meeting 1:") and "Worked:" in summary.lines[0]
    # facts keep what was said, marked by how many episodes ago (-2: the older episode)
    assert {f.step for f in full.facts} <= {-1, -2} and any(f.step == -2 for f in full.facts)
    assert all(f.kind in ("prefers", "vetoes", "dislikes") for f in summary.facts)
    last = eps[-1].steps[-1].observation.structured
    low = {n["id"] for n in last["npcs"] if n["cue_bucket"] == "low" or not n["present"]}
    assert set(full.aggrieved) >= low


def test_carry_over_keeps_the_cast_and_remembers_promises_and_slights(expert_episodes):
    spec, eps = expert_episodes
    cast = Cast.of(spec, 11)
    prev = eps[0]
    a, b = spec.npc_ids[0], spec.npc_ids[1]
    commitments = [{"npc": a, "offer": "x", "slot": "s", "option": "o", "target_slot": "t", "target_option": "p",
                    "status": "broken", "step": 1},
                   {"npc": b, "offer": "x", "slot": "s", "option": "o", "target_slot": "t", "target_option": "p",
                    "status": "kept", "step": 1}]
    moods = {**prev.final.moods, a: 0.9, b: 0.9}
    moods[spec.npc_ids[2]] = 0.1
    prev = prev.model_copy(update={"final": prev.final.model_copy(update={"commitments": commitments, "moods": moods})})
    fresh, w = World(spec, 99), World(spec, 99)
    applied = carry_over(w, cast, prev, {a: 0.5})
    for k, h in w.hid.items():
        assert h.utilities == cast.utilities[k] and h.vetoes == cast.vetoes[k] and h.threshold == cast.thresholds[k]
    assert applied[a]["reasons"] == ["promise broken"] and w.hid[a].grievance and w.hid[a].trust == 0.5
    assert w.hid[b].mood == pytest.approx(min(1.0, fresh.hid[b].mood + KEPT_LIFT)) and not w.hid[b].grievance
    c = spec.npc_ids[2]
    assert "ended unhappy" in applied[c]["reasons"] and w.hid[c].mood == pytest.approx(max(0.0, fresh.hid[c].mood - SLIGHT_DROP))


def test_memory_reaches_the_observation_and_the_expert_uses_it(expert_episodes):
    spec, eps = expert_episodes
    mem = build_memory("summary", eps)
    job = EpisodeJob(spec, 20, tag="m", memory=mem)
    plain = run_episodes(ExpertPolicy(), [EpisodeJob(spec, 20)])[0]
    with_mem = run_episodes(ExpertPolicy(), [job])[0]
    first = with_mem.steps[0]
    assert first.observation.structured["memory"]["mode"] == "summary"
    assert "From earlier meetings" in first.observation.text and plain.steps[0].observation.structured["memory"] is None
    assert with_mem.episode_id.endswith("/m")
    # remembered preferences are stated from the first step, and fewer questions and proposals are needed
    stated = first.mental_state.stated["preferences"]
    assert any(stated.get(f.npc, {}).get(f.slot) == f.option for f in mem.facts if f.kind == "prefers")
    asks = lambda ep: sum(s.action.executed.startswith(("inquire", "propose")) for s in ep.steps)  # noqa: E731
    assert asks(with_mem) < asks(plain)
    w = World(spec, 20)
    assert "From earlier meetings" not in render(observe(spec, w.pub))


def test_chains_share_the_first_episode_and_are_deterministic(tmp_path):
    cfg = ChainConfig(policy="expert", tiers=["L0"], chains=2, length=3, out=str(tmp_path / "a"))
    doc = run_chains(cfg)
    again = run_chains(ChainConfig(policy="expert", tiers=["L0"], chains=2, length=3, out=str(tmp_path / "b")))
    assert doc == again.model_copy(update={"config": doc.config}) and doc.chains == 2 * 2
    assert ChainResult.model_validate_json((tmp_path / "a" / "chain.json").read_text()) == doc  # the file is the result
    for m in ("none", "full", "summary"):
        a = (tmp_path / "a" / m / "episodes.jsonl").read_text()
        assert a == (tmp_path / "b" / m / "episodes.jsonl").read_text()
        recs = [json.loads(x) for x in a.splitlines()]
        assert len(recs) == 4 * 3
        firsts = [r for r in recs if r["lineage"]["chain"]["position"] == 0]
        assert len(firsts) == 4 and all(r["lineage"]["chain"]["mode"] == "shared" for r in firsts)
        later = [r for r in recs if r["lineage"]["chain"]["position"] > 0]
        assert all(r["lineage"]["chain"]["mode"] == m for r in later)
        assert all((r["steps"][0]["observation"]["structured"]["memory"] is None) == (m == "none") for r in later)
        seeds = {(r["scenario_id"], r["lineage"]["chain"]["chain"], r["lineage"]["chain"]["position"]): r["seed"] for r in recs}
        assert all(s == chain_seed(0, sid, int(ch.rsplit("/", 1)[1]), p) for (sid, ch, p), s in seeds.items())
    rows = doc.modes["full"]
    assert [r.position for r in rows] == [1, 2, 3] and rows[1].vs_none and rows[0].vs_none is None
    assert rows[0].metrics["CR"] == doc.modes["none"][0].metrics["CR"]  # the shared first episode
    assert rows[2].memory_chars_per_step > rows[1].memory_chars_per_step > 0  # memory grows along the chain
    assert doc.modes["summary"][2].memory_chars_per_step < rows[2].memory_chars_per_step
    with pytest.raises(ValueError, match="modes: must be one of none, full, summary, got 'all'"):  # when the config is built
        ChainConfig(modes=["all"], out=str(tmp_path / "c"))
    with pytest.raises(ValueError, match="modes: must name at least one of none, full, summary"):
        ChainConfig(modes=[], out=str(tmp_path / "c"))


def test_chain_command(tmp_path):
    from typer.testing import CliRunner

    from socialworld.cli.main import app

    r = CliRunner().invoke(app, ["chain", "--tier", "L0", "--chains", "1", "--length", "2", "--mode", "none", "--mode", "summary",
                                 "--out", str(tmp_path / "c")])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "c" / "chain.json").read_text())
    assert set(doc["modes"]) == {"none", "summary"} and "memory" in r.output
