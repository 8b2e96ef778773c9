"""The wake-sleep-deploy loop on a tiny model: end to end, resumable, same artifacts after a kill."""

import json
import shutil
from dataclasses import replace
from importlib.util import find_spec
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.skipif(not find_spec("trl"), reason="needs the train extra")
slow = pytest.mark.slow  # the tests that train LoRA adapters with TRL (~1 min on 2 cores)

from socialworld.learn import loop as loop_mod  # noqa: E402
from socialworld.learn.config import (
    LoopConfig,
    SleepConfig,  # noqa: E402
    TrainConfig,  # noqa: E402
)
from socialworld.learn.loop import run_loop, train_seeds  # noqa: E402
from socialworld.learn.pairs.sources import SleepInputs
from socialworld.rollout.evaluate import episode_seeds  # noqa: E402
from socialworld.text.templates import POLICY_PROMPT_VERSION  # noqa: E402


def _cfg(tiny_dir, out):
    return LoopConfig(out=str(out), model=str(tiny_dir), cycles=2, tiers=("L0",), train_episodes=1, eval_episodes=1,
                      lm_batch_size=4, sleep=SleepConfig(rollouts=1, horizon=3, max_candidates=4, quality_threshold=0.0),
                      train=TrainConfig(method="dpo", steps=1, batch_size=2, max_length=1024))


def test_seeds_are_disjoint():
    ev = set(episode_seeds(0, "team_lunch-v1", 50))
    assert all(ev.isdisjoint(train_seeds(0, "team_lunch-v1", c, 50)) for c in (1, 2, 3))


def test_unlocking_schedules():
    base = LoopConfig(tiers=("L0", "L1", "L2"))
    assert loop_mod.unlocked_tiers(base, 2, ("L0", "L1", "L2"), []) == ("L0", "L1", "L2")
    prog = replace(base, unlock="progressive")
    assert [loop_mod.unlocked_tiers(prog, c, (), []) for c in (1, 2, 3, 4)] == [
        ("L0",), ("L0", "L1"), ("L0", "L1", "L2"), ("L0", "L1", "L2")]
    with pytest.raises(ValueError, match="tracks"):
        LoopConfig(tracks=("actions",))


@slow
def test_progressive_merged_loop(tiny_dir, tmp_path):
    cfg = replace(_cfg(tiny_dir, tmp_path / "m"), tiers=("L0", "L1"), unlock="progressive", merged=True, baseline=False)
    cfg = replace(cfg, reference_episodes=2, sleep=replace(cfg.sleep, replay=1.0, sources=("action", "reference", "dialogue", "utterance", "judge"),
                                                                   reference_chosen="own"))
    out = run_loop(cfg, log=lambda _: None)
    # the expert plays reference_episodes training seeds per scenario; one wake episode each
    refs = [json.loads(line) for line in (tmp_path / "m" / "cycle-1/wake/reference.jsonl").read_text().splitlines()]
    assert sorted(r["seed"] for r in refs if r["scenario_id"] == "team_lunch-v1") == sorted(train_seeds(0, "team_lunch-v1", 1, 2))
    wake = [json.loads(line) for line in (tmp_path / "m" / "cycle-1/wake/episodes.jsonl").read_text().splitlines()]
    assert len(wake) == len(refs) // 2
    # cycle 2 replays what cycle 1 kept: its pair files hold cycle 1's pairs too
    from socialworld.learn.pairs.record import read_pairs
    kept1 = {p.id for t in ("action", "dialogue") for p in read_pairs(tmp_path / "m" / f"cycle-1/sleep/pairs-{t}.parquet")}
    kept2 = {p.id for t in ("action", "dialogue") for p in read_pairs(tmp_path / "m" / f"cycle-2/sleep/pairs-{t}.parquet")}
    assert out[0].replayed == {} and sum(out[1].replayed.values()) == len(kept1 & kept2) > 0
    assert sum(out[1].replayed.values()) + sum(out[1].pairs.values()) == len(kept2)
    assert [s.tiers for s in out] == [["L0"], ["L0", "L1"]]
    assert set(out[1].by_tier) == {"L0", "L1"} and out[1].vs_baseline is None
    manifest = json.loads((tmp_path / "m" / "manifest.json").read_text())["artifacts"]
    assert manifest["cycle-2/sleep"]["inputs"]["cycle-1/sleep"] == manifest["cycle-1/sleep"]["sha256"]
    assert "cycle-1/train/merged/adapter" in manifest and not any("/train/action" in k for k in manifest)
    eps = [json.loads(line) for line in (tmp_path / "m" / "cycle-2/eval/episodes.jsonl").read_text().splitlines()]
    h = eps[0]["steps"][0]["policy"]["adapter_hash"]
    action, dialogue = (part.split("=", 1)[1] for part in h.split(";"))
    assert action == dialogue  # one adapter deployed for both tracks


@slow
def test_loop_runs_resumes_and_matches_after_a_kill(tiny_dir, tmp_path, monkeypatch):
    logs, starts = [], []
    real = loop_mod.train_adapter

    def recording(base, out, *a, **k):  # (cycle, track, the adapter it started from)
        starts.append((Path(out).parents[3].name, Path(out).parents[1].name, k.get("resume_from")))
        return real(base, out, *a, **k)

    monkeypatch.setattr(loop_mod, "train_adapter", recording)
    full = run_loop(_cfg(tiny_dir, tmp_path / "a"), log=logs.append)
    monkeypatch.setattr(loop_mod, "train_adapter", real)
    assert [s.cycle for s in full] == [1, 2] and all(0 <= s.eval["pass"] <= 1 for s in full)
    # the dialogue adapter starts from the action adapter its cycle trained (the action turns carry the words)
    assert ("cycle-1", "action", None) in starts and any(t == "dialogue" for _, t, _ in starts)
    assert all(r == str(tmp_path / "a" / c / "train/action/adapter") for c, t, r in starts if t == "dialogue")
    from socialworld.learn.pairs.record import read_pairs

    for c, t, _ in starts:  # ... and trains on its pairs together with that cycle's action turns
        if t == "dialogue":
            given = json.loads((tmp_path / "a" / c / "train/dialogue/adapter/socialworld-train.json").read_text())["rows"]["given"]
            assert given == sum(len(read_pairs(tmp_path / "a" / c / f"sleep/pairs-{k}.parquet")) for k in ("action", "dialogue"))
    # each cycle's wake rode in the previous evaluation's rollout (same policy)
    assert [m.split(":")[0] for m in logs if m.endswith("evaluation rollout)")] == ["cycle 1", "cycle 2"]
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())["artifacts"]
    assert "cycle-2/train/action/adapter" in manifest and "cycle-1/sleep" in manifest
    steps = [json.loads(line) for line in (tmp_path / "a" / "cycle-2/eval/episodes.jsonl").read_text().splitlines()]
    assert steps[0]["steps"][0]["policy"]["adapter_hash"].startswith("action=")
    # resuming a finished run redoes nothing
    logs.clear()
    assert run_loop(_cfg(tiny_dir, tmp_path / "a"), log=logs.append) == full
    assert not any("wake" in m for m in logs)
    # ... named another way or moved (where the folder is, is not what it makes)
    shutil.copytree(tmp_path / "a", tmp_path / "moved")
    made = {d: (tmp_path / d / "manifest.json").read_bytes() for d in ("a", "moved")}
    for out in (f"{tmp_path / 'a'}/", str(tmp_path / "moved")):
        assert run_loop(_cfg(tiny_dir, out), log=logs.append) == full
    assert not any("wake" in m for m in logs)
    assert made == {d: (tmp_path / d / "manifest.json").read_bytes() for d in ("a", "moved")}  # nothing remade
    # cycles may grow (extending a finished run), nothing else may change, and cycles may not shrink
    with pytest.raises(ValueError, match="different config"):
        run_loop(replace(_cfg(tiny_dir, tmp_path / "a"), cycles=3, train_episodes=2))
    with pytest.raises(ValueError, match="different config"):
        run_loop(replace(_cfg(tiny_dir, tmp_path / "a"), cycles=1))

    # re-gating the stored wake: the run's own settings reproduce its pairs; variants are subsets/supersets
    sl = _cfg(tiny_dir, "x").sleep
    rg = loop_mod.regate(tmp_path / "a", 1, {"off": replace(sl, gating="off"), "tight": replace(sl, quality_threshold=1.0)})
    assert rg["run"]["same_as_run"] and set(rg["run"]["ids"]) <= set(rg["off"]["ids"])
    assert set(rg["tight"]["ids"]) <= set(rg["run"]["ids"])
    pairs_run = {p.id: p for p in loop_mod.read_pairs(tmp_path / "a" / "cycle-1/sleep/pairs-action.parquet")}
    assert all(pairs_run[i].quality >= 1.0 for i in rg["tight"]["ids"] if i in pairs_run)
    with pytest.raises(ValueError, match="only screening"):
        loop_mod.regate(tmp_path / "a", 1, {"m": replace(sl, rollouts=3)})

    # an ablation on the same data: the untrained policy's artifacts are copied, not re-run
    variant = replace(_cfg(tiny_dir, tmp_path / "c"), cycles=1, reuse_from=str(tmp_path / "a"),
                      sleep=replace(_cfg(tiny_dir, "x").sleep, gating="off"))
    logs.clear()
    run_loop(variant, log=logs.append)
    copied = json.loads((tmp_path / "c" / "manifest.json").read_text())["artifacts"]
    for rel in loop_mod.UNTRAINED:
        assert copied[rel]["sha256"] == manifest[rel]["sha256"] and copied[rel]["producer"].startswith("copied:")
    assert not any("wake" in m for m in logs)
    with pytest.raises(ValueError, match="not the same data"):
        run_loop(replace(variant, out=str(tmp_path / "d"), seed=1))
    monkeypatch.setattr(loop_mod, "POLICY_PROMPT_VERSION", "policy-v0")  # records made under another prompt
    with pytest.raises(ValueError, match=f"made under prompt {POLICY_PROMPT_VERSION}"):
        run_loop(replace(variant, out=str(tmp_path / "prompt")))
    monkeypatch.undo()

    # kill the loop inside cycle 2's training, then resume: same final artifacts
    real = loop_mod.train_adapter

    def dying(base, out, *a, **k):
        if "cycle-2" in str(out):
            raise KeyboardInterrupt
        return real(base, out, *a, **k)

    monkeypatch.setattr(loop_mod, "train_adapter", dying)
    with pytest.raises(KeyboardInterrupt):
        run_loop(_cfg(tiny_dir, tmp_path / "b"))
    monkeypatch.setattr(loop_mod, "train_adapter", real)
    assert run_loop(_cfg(tiny_dir, tmp_path / "b")) == full

    # killed between the evaluation's commit and the fused wake's: the wake then made on its own
    # (a rollout of its own, other batch-mates) has the same records
    real_write, wrote = loop_mod.write_jsonl, []

    def no_fused_wake(path, eps):
        if "cycle-1/wake" in str(path) and not wrote:
            wrote.append(path)
            raise KeyboardInterrupt
        return real_write(path, eps)

    def stop(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(loop_mod, "write_jsonl", no_fused_wake)
    monkeypatch.setattr(loop_mod, "train_adapter", stop)
    for _ in range(2):
        logs.clear()
        with pytest.raises(KeyboardInterrupt):
            run_loop(_cfg(tiny_dir, tmp_path / "e"), log=logs.append)
    assert any(m.startswith("cycle 1 (L0): wake ") for m in logs)  # made on its own
    rel = "cycle-1/wake/episodes.jsonl"
    assert _without_latency(tmp_path / "e" / rel) == _without_latency(tmp_path / "a" / rel)
    monkeypatch.setattr(loop_mod, "write_jsonl", real_write)
    monkeypatch.setattr(loop_mod, "train_adapter", real)
    again = json.loads((tmp_path / "b" / "manifest.json").read_text())["artifacts"]
    assert set(again) == set(manifest)
    # byte-identical except the measured wall-clock latencies inside LM step records
    for rel in manifest:
        if rel.endswith(".jsonl"):
            assert _without_latency(tmp_path / "a" / rel) == _without_latency(tmp_path / "b" / rel), rel
        else:
            assert again[rel]["sha256"] == manifest[rel]["sha256"], rel

    # more kill points, each resumed to the uninterrupted run's artifacts: inside the rollouts
    # (the first evaluation with its fused wake, the expert's reference episodes, a trained
    # evaluation) and inside cycle 2's sleep phase; a kill -9's temporary names are removed
    import tempfile

    from socialworld.rollout.runner import run_episodes

    def killer(real_fn, at):
        calls = []

        def fn(*a, **k):
            calls.append(1)
            if len(calls) == at:
                raise KeyboardInterrupt
            return real_fn(*a, **k)
        return fn

    # run_episodes calls (the language model's rollouts): 1 cycle-0 evaluation + cycle-1 wake, 2 cycle-1
    # (trained) evaluation + cycle-2 wake, 3 cycle-2 evaluation; rollouts calls (the expert's): 1 cycle-1 reference
    for name, target, real_fn, at in (("rollout1", "run_episodes", run_episodes, 1), ("reference1", "rollouts", loop_mod.rollouts, 1),
                                      ("rollout2", "run_episodes", run_episodes, 2), ("rollout3", "run_episodes", run_episodes, 3),
                                      ("sleep2", "run_sleep", loop_mod.run_sleep, 2)):
        monkeypatch.setattr(loop_mod, target, killer(real_fn, at))
        with pytest.raises(KeyboardInterrupt):
            run_loop(_cfg(tiny_dir, tmp_path / name), log=lambda _: None)
        monkeypatch.setattr(loop_mod, target, real_fn)
        tempfile.mkdtemp(prefix=".episodes.jsonl.swtmp-", dir=tmp_path / name)  # what a kill -9 mid-write leaves
        assert run_loop(_cfg(tiny_dir, tmp_path / name), log=lambda _: None) == full, name
        _same_artifacts(tmp_path / name, tmp_path / "a")

    # an input damaged between two runs is made again, and the run ends as the uninterrupted one
    shutil.copytree(tmp_path / "a", tmp_path / "damaged")
    conf = yaml.safe_load((tmp_path / "damaged" / "config.yaml").read_text())
    (tmp_path / "damaged" / "config.yaml").write_text(yaml.safe_dump(conf | {"out": str(tmp_path / "damaged")}, sort_keys=True))
    wake = tmp_path / "damaged" / "cycle-1/wake/episodes.jsonl"
    wake.write_text(wake.read_text()[:100])
    logs.clear()
    assert run_loop(_cfg(tiny_dir, tmp_path / "damaged"), log=logs.append) == full
    assert any(m.startswith("cycle 1 (L0): wake ") for m in logs)  # made again
    _same_artifacts(tmp_path / "damaged", tmp_path / "a")


def _same_artifacts(run, reference):
    """Two loop folders hold the same artifacts, byte for byte (records: but for ``latency_s``),
    and no temporary names."""
    ours, theirs = (json.loads((r / "manifest.json").read_text())["artifacts"] for r in (run, reference))
    assert set(ours) == set(theirs)
    for rel in theirs:
        if rel.endswith(".jsonl"):
            assert _without_latency(run / rel) == _without_latency(reference / rel), rel
        else:
            assert ours[rel]["sha256"] == theirs[rel]["sha256"], rel
    assert not [p for p in run.rglob(".*")], "temporary names left"
    for rel, entry in ours.items():  # every artifact was made from its inputs as they are now
        assert all(ours[i]["sha256"] == h for i, h in entry["inputs"].items()), rel


def _without_latency(path):
    eps = [json.loads(line) for line in path.read_text().splitlines()]
    for e in eps:
        for s in e["steps"]:
            s["policy"]["latency_s"] = 0.0
    return eps


@slow
def test_loop_on_a_user_scenario_file(tiny_dir, tmp_path, my_lunch):
    from typer.testing import CliRunner

    from socialworld.cli.main import app
    from socialworld.learn.pairs.record import read_pairs
    from socialworld.records import read_jsonl
    from socialworld.world.spec import load_spec

    run = tmp_path / "run"
    mine = load_spec(my_lunch)
    cfg = replace(_cfg(tiny_dir, run), cycles=1, scenarios=(str(my_lunch),))
    # pairs from the expert's reference episode too: the world alone decides them, where the random
    # model's wake may give no step the rollouts can improve (it gave none on one CI machine's CPU)
    cfg = replace(cfg, sleep=replace(cfg.sleep, sources=("action", "reference", "dialogue", "utterance", "judge"), reference_chosen="own"))
    full = run_loop(cfg, log=lambda _: None)
    for rel in ("cycle-0/eval/episodes.jsonl", "cycle-1/wake/episodes.jsonl", "cycle-1/eval/episodes.jsonl"):
        eps = read_jsonl(run / rel)
        assert eps and {(e.scenario_id, e.lineage.spec_hash) for e in eps} == {("my_lunch-v1", mine.content_hash)}, rel
    # the run keeps the spec: stored in the manifest, its hash and id (not the path) in the config
    assert load_spec(run / "scenarios" / "my_lunch-v1.yaml").content_hash == mine.content_hash
    assert "scenarios/my_lunch-v1.yaml" in json.loads((run / "manifest.json").read_text())["artifacts"]
    stored = yaml.safe_load((run / "config.yaml").read_text())
    assert stored["scenarios"] == ["my_lunch-v1"] and stored["user_scenarios"] == {"my_lunch-v1": mine.content_hash}
    pairs = read_pairs(run / "cycle-1/sleep/pairs-action.parquet")
    assert {p.scenario_id for p in pairs} == {"my_lunch-v1"} and any(p.chosen_by == "reference" for p in pairs)

    # the file moves away: resume by id, re-gate and fit with the run's own copy
    text = my_lunch.read_text()
    my_lunch.unlink()
    logs = []
    assert run_loop(replace(cfg, scenarios=("my_lunch",)), log=logs.append) == full
    assert not any("wake" in m for m in logs)
    r = CliRunner().invoke(app, ["gate", str(run), "--threshold", "1.0"])
    assert r.exit_code == 0, r.output
    assert loop_mod.regate(run, 1, {})["run"]["same_as_run"]
    own = loop_mod.stored_sleep_config(run)
    with pytest.raises(ValueError, match="only screening and gating settings may differ from the run's, not margin"):
        loop_mod.regate(run, 1, {"wider": replace(own, margin=own.margin + 0.1)})
    r = CliRunner().invoke(app, ["fit", str(run / "cycle-1/sleep/pairs-action.parquet"), "--model", "expert", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["pairs"] == len(pairs)

    # a changed file is refused, by path (before any work) or as a tampered stored copy
    my_lunch.write_text(text.replace("My team lunch", "My changed lunch"))
    with pytest.raises(ValueError, match="my_lunch.yaml: scenario my_lunch-v1 differs from the copy the run"):
        run_loop(cfg)
    my_lunch.write_text(text)
    assert run_loop(cfg, log=lambda _: None) == full  # the same content by path resumes
    copy = run / "scenarios" / "my_lunch-v1.yaml"
    copy.write_text(copy.read_text().replace("My team lunch", "My changed lunch"))
    for call in (lambda: run_loop(replace(cfg, scenarios=("my_lunch-v1",))), lambda: loop_mod.regate(run, 1, {})):
        with pytest.raises(ValueError, match="my_lunch-v1.yaml: changed since the run was made"):
            call()


@slow
def test_one_cycle_raises_the_chosen_actions_probability(tiny_dir, tmp_path):
    """The default recipe's sleep (expert labels, reference pairs) and training (the listwise
    decision on an activated adapter), one cycle on a tiny model: at the states it trained on, the
    chosen action is more likely after than before. The dialogue adapter learns the words alone
    (the same trainer, the decision's weight 0)."""
    from statistics import fmean

    from socialworld.agents.models import load_hf, load_with_adapters
    from socialworld.bench.config import RECIPE_SLEEP, RECIPE_TRAIN
    from socialworld.learn.fit import chosen_action_logprobs
    from socialworld.learn.pairs.record import read_pairs

    cfg = LoopConfig(out=str(tmp_path / "r"), model=str(tiny_dir), cycles=1, tiers=("L0",), train_episodes=1, reference_episodes=2,
                     eval_episodes=1, lm_batch_size=8, baseline=False, dialogue_steps=2,
                     sleep=replace(RECIPE_SLEEP, rollouts=1, horizon=3, max_candidates=4),
                     train=replace(RECIPE_TRAIN, steps=30, learning_rate=1e-2, max_length=1024))
    run_loop(cfg, log=lambda _: None)
    words = json.loads((tmp_path / "r" / "cycle-1/train/dialogue/adapter/socialworld-train.json").read_text())
    assert (words["config"]["method"], words["config"]["decision_weight"], words["steps"]) == ("listwise", 0.0, 2)
    assert words["frozen_hits"] > 0  # the action track's rows, from the store the run keeps for all its trainings
    pairs = read_pairs(tmp_path / "r" / "cycle-1/sleep/pairs-action.parquet")
    assert len(pairs) >= 8
    base, tok = load_hf(tiny_dir, dtype="float32")
    before = chosen_action_logprobs(base, tok, pairs)
    trained, tok, _ = load_with_adapters(tiny_dir, {"action": tmp_path / "r" / "cycle-1/train/action/adapter"}, dtype="float32")
    after = chosen_action_logprobs(trained, tok, pairs)
    assert fmean(after) > fmean(before) + 1.0  # nats per action, on average
    assert sum(a > b for a, b in zip(after, before)) >= 0.8 * len(pairs)


@slow
def test_one_listwise_cycle_raises_the_higher_valued_candidates(tiny_dir, tmp_path):
    """The value recipe, one cycle on a tiny model: every action pair in the run's Parquet carries
    its candidates' values (imagined, with provenance) and the legal set; after listwise training,
    at those states, the target's best action is more likely over the legal set than before."""
    from statistics import fmean

    from socialworld.agents.models import load_hf, load_with_adapters
    from socialworld.bench.config import RECIPE_TRAIN, VALUES_SLEEP
    from socialworld.learn.listwise import candidate_logprobs, targets
    from socialworld.learn.pairs.record import read_pairs

    train = replace(RECIPE_TRAIN, steps=30, learning_rate=1e-2, max_length=1024)
    cfg = LoopConfig(out=str(tmp_path / "r"), model=str(tiny_dir), cycles=1, tiers=("L0",), train_episodes=1, reference_episodes=2,
                     eval_episodes=1, lm_batch_size=8, baseline=False, tracks=("action",),
                     sleep=replace(VALUES_SLEEP, rollouts=2, horizon=3, max_candidates=4), train=train)
    run_loop(cfg, log=lambda _: None)
    pairs = read_pairs(tmp_path / "r" / "cycle-1/sleep/pairs-action.parquet")
    assert len(pairs) >= 8 and all(p.candidates and p.legal and "imagined" in p.provenance for p in pairs)
    base, tok = load_hf(tiny_dir, dtype="float32")
    trained, tok, _ = load_with_adapters(tiny_dir, {"action": tmp_path / "r" / "cycle-1/train/action/adapter"}, dtype="float32")
    best = [max((t := targets(p, train.value_temperature, train.value_margin)), key=t.get) for p in pairs]
    before = [candidate_logprobs(base, tok, p, train)[b] for p, b in zip(pairs, best)]
    after = [candidate_logprobs(trained, tok, p, train)[b] for p, b in zip(pairs, best)]
    assert fmean(after) > fmean(before) + 1.0  # nats per state, on average
    assert sum(a > b for a, b in zip(after, before)) >= 0.8 * len(pairs)


@slow
def test_a_loop_with_a_judge_keeps_its_pairs_out_of_the_action_track(tiny_dir, tmp_path):
    """``--judge``: the judge's records are a run artifact; pairs ranked by it carry proxy evidence,
    so strict gating counts them out of the action track."""
    from socialworld.learn.pairs.gating import GatingReport
    from socialworld.learn.pairs.record import read_pairs
    from socialworld.learn.pairs.sleep import candidate_pairs
    from socialworld.records import read_jsonl
    from socialworld.rollout.judge import read_judged
    from socialworld.world.spec import load_builtin_scenarios

    cfg = replace(_cfg(tiny_dir, tmp_path / "j"), cycles=1, judge=str(tiny_dir),
                  sleep=replace(_cfg(tiny_dir, "x").sleep, judge_margin=0.5))
    run_loop(cfg, log=lambda _: None)
    d = tmp_path / "j" / "cycle-1"
    judged = read_judged(d / "wake" / "judge.jsonl")
    wake, ref = read_jsonl(d / "wake" / "episodes.jsonl"), read_jsonl(d / "wake" / "reference.jsonl")
    assert set(judged) == {e.episode_id for e in [*wake, *ref]} and all(r.judge == str(tiny_dir) for r in judged.values())
    # every wake episode was ranked against its reference: a pair, or a counted reason for none
    report = GatingReport()
    made = candidate_pairs(SleepInputs(load_builtin_scenarios(), wake, {(e.scenario_id, e.seed): e for e in ref}, judged=judged), cfg.sleep, report)
    ranked = [p for p in made if p.evidence["ranking"] == "proxy"]
    assert len(ranked) + sum(v for k, v in report.excluded.items() if k.startswith("judge:")) == len(wake)
    pairs = [p for t in ("action", "dialogue") for p in read_pairs(d / "sleep" / f"pairs-{t}.parquet")]
    assert not any(p.track == "action" and p.evidence["ranking"] == "proxy" for p in pairs)
    gating = json.loads((d / "sleep" / "gating.json").read_text())
    assert gating["excluded"].get("action:proxy_evidence", 0) == sum(
        1 for p in ranked if p.track == "action")  # none slipped in; each counted
    logs: list[str] = []
    run_loop(cfg, log=logs.append)
    assert not any("judged" in m for m in logs)  # resumed: the judgement is not redone


def test_a_loop_with_an_npc_voice_voices_its_wake_and_evaluations_only(tiny_dir, tmp_path):
    """``--npc-voice``: the wake and every evaluation hear the voice (each reply records its fate), the
    reference episodes keep the templates' lines, and the run's config records the voice."""
    import yaml

    from socialworld.records import read_jsonl

    cfg = replace(_cfg(tiny_dir, tmp_path / "v"), cycles=1, npc_voice=str(tiny_dir))
    run_loop(cfg, log=lambda _: None)
    d = tmp_path / "v"
    for rel in ("cycle-0/eval/episodes.jsonl", "cycle-1/eval/episodes.jsonl", "cycle-1/wake/episodes.jsonl"):
        eps = read_jsonl(d / rel)
        replies = [r for e in eps for s in e.steps for r in s.dialogue.replies if r.speaker != "world"]
        assert replies and all(r.voice is not None for r in replies), rel
        assert all(e.lineage.voice.model == str(tiny_dir) for e in eps), rel
    ref = read_jsonl(d / "cycle-1" / "wake" / "reference.jsonl")
    assert all(e.lineage.voice is None and all(r.voice is None for s in e.steps for r in s.dialogue.replies) for e in ref)
    assert yaml.safe_load((d / "config.yaml").read_text())["npc_voice"] == str(tiny_dir)
    with pytest.raises(ValueError, match="npc_voice"):
        replace(cfg, npc_voice="oracle")


_KILL_ARGS = ["--cycles", "2", "--tiers", "L0", "--train-episodes", "1", "--eval-episodes", "1", "--lm-batch-size", "4",
              "--rollouts", "1", "--horizon", "3", "--max-candidates", "4", "--quality-threshold", "0",
              "--method", "dpo", "--steps", "1", "--batch-size", "2", "--max-length", "1024"]


def _artifacts(run: Path) -> dict[str, object]:
    """Every file of a run folder as it must be after a resume: episode records without
    ``latency_s``; the manifest and timings left out (they hash and time the raw files)."""
    out: dict[str, object] = {}
    for p in sorted(run.rglob("*")):
        if p.is_file() and p.name not in ("manifest.json", "timings.json", "socialworld.log"):
            out[str(p.relative_to(run))] = _without_latency(p) if p.suffix == ".jsonl" and "episodes" in p.name else p.read_bytes()
    return out


@slow
def test_a_run_killed_at_a_random_moment_resumes_to_the_same_artifacts(tiny_dir, tmp_path):
    """SIGKILL at a seeded random moment of a two-cycle loop run as a command (a process of its
    own, another hash seed than the resuming one), then the same command again: every artifact
    equals an uninterrupted run's in the same folder. The reference adapter TRL's DPO trainer saves
    beside the trained one held its target modules in hash-seed order, so a resumed run wrote other
    adapter bytes and other adapter hashes into its episodes."""
    import os
    import random
    import signal
    import subprocess
    import sys
    import time

    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "socialworld.cli.main", "loop", "--model", str(tiny_dir), "--out", str(run), *_KILL_ARGS]

    def env(seed: int) -> dict[str, str]:
        return dict(os.environ, PYTHONHASHSEED=str(seed), OMP_NUM_THREADS="1")

    t0 = time.perf_counter()
    subprocess.run(cmd, env=env(1), check=True, capture_output=True)
    whole = time.perf_counter() - t0
    want = _artifacts(run)
    shutil.rmtree(run)
    at = random.Random(0).uniform(0.3, 0.9) * whole
    p = subprocess.Popen(cmd, env=env(2), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(at)
    p.send_signal(signal.SIGKILL)
    p.wait()
    subprocess.run(cmd, env=env(3), check=True, capture_output=True)
    got = _artifacts(run)
    assert sorted(got) == sorted(want)
    assert [k for k in want if got[k] != want[k]] == [], f"killed at {at:.1f} s of {whole:.1f} s"


def test_holding_out_every_first_tier_scenario_is_refused_before_any_work(tiny_dir, tmp_path):
    cfg = replace(_cfg(tiny_dir, tmp_path / "h"), tiers=("L0", "L1"), unlock="progressive")
    with pytest.raises(ValueError, match="leaves no L0 scenario to train on"):
        run_loop(replace(cfg, holdout=("team_lunch", "activity_debrief-v1")))
    with pytest.raises(ValueError, match="--holdout picnic: not one of the run's scenarios"):
        run_loop(replace(cfg, holdout=("picnic",)))
    assert not (tmp_path / "h").exists()


@slow
def test_a_held_out_scenario_is_never_trained_on_and_is_evaluated_apart(tiny_dir, tmp_path):
    """``holdout``: no wake, reference episode or pair on the held-out scenario; the untrained policy and
    the last cycle's evaluated on it apart from the tiers, and the summary pairs the two. Reference
    episodes beyond the wake's seeds on variants of their scenario (``reference_varied``) give pairs at
    the variants' states."""
    from socialworld.learn.pairs.record import read_pairs
    from socialworld.records import read_jsonl
    from socialworld.world.variation import parse_variant

    run = tmp_path / "run"
    cfg = replace(_cfg(tiny_dir, run), cycles=2, scenarios=("team_lunch", "activity_debrief"), holdout=("activity_debrief",),
                  reference_episodes=3, reference_varied=1.0)
    cfg = replace(cfg, sleep=replace(cfg.sleep, sources=("action", "reference", "dialogue", "utterance", "judge"), reference_chosen="own"),
                  train=replace(cfg.train, method="listwise", activated=True))
    out = run_loop(cfg, log=lambda _: None)
    for c in (1, 2):
        wake = read_jsonl(run / f"cycle-{c}/wake/episodes.jsonl")
        ref = read_jsonl(run / f"cycle-{c}/wake/reference.jsonl")
        assert {e.scenario_id for e in wake} == {"team_lunch-v1"}
        # the wake's seed on the scenario itself, the two beyond it on two new variants of it
        assert sorted(e.scenario_id for e in ref if parse_variant(e.scenario_id) is None) == ["team_lunch-v1"]
        assert {parse_variant(e.scenario_id) for e in ref} - {None} == {("team_lunch-v1", 1000 * c + 1), ("team_lunch-v1", 1000 * c + 2)}
        pairs = read_pairs(run / f"cycle-{c}/sleep/pairs-action.parquet")
        assert not any(p.scenario_id.startswith("activity_debrief") for p in pairs)
        assert any(parse_variant(p.scenario_id) for p in pairs)
        assert {e.scenario_id for e in read_jsonl(run / f"cycle-{c}/eval/episodes.jsonl")} == {"team_lunch-v1"}
    for c in (0, 2):  # the untrained policy and the last cycle's on the held-out scenario
        assert {e.scenario_id for e in read_jsonl(run / f"cycle-{c}/eval/holdout.jsonl")} == {"activity_debrief-v1"}
    assert not (run / "cycle-1/eval/holdout.jsonl").exists()
    assert out[0].holdout is None and out[1].holdout is not None and set(out[1].holdout_vs_baseline) >= {"pass", "CR"}
    stored = yaml.safe_load((run / "config.yaml").read_text())
    assert stored["holdout"] == ["activity_debrief-v1"] and stored["reference_varied"] == 1.0
    # resumed: nothing made again
    logs = []
    assert run_loop(replace(cfg, holdout=("activity_debrief-v1",)), log=logs.append) == out
    assert not any("wake" in m for m in logs)
