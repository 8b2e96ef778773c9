"""--ray: the same artifacts as one process, byte for byte, on a local Ray with 2 CPUs."""

import pytest

from socialworld.agents.registry import make_policy
from socialworld.learn.config import SleepConfig
from socialworld.learn.pairs.gating import GatingReport
from socialworld.learn.pairs.record import write_pairs
from socialworld.learn.pairs.sleep import candidate_pairs
from socialworld.learn.pairs.sources import SleepInputs
from socialworld.records import write_jsonl
from socialworld.rollout.config import check_ray
from socialworld.rollout.runner import EpisodeJob, run_episodes
from socialworld.rollout.scale import pmap, rollouts


def test_without_ray_nothing_imports_it(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "ray", raising=False)
    ticks = []
    assert pmap(lambda x: x * x, [1, 2, 3], tick=ticks.append) == [1, 4, 9] and ticks == [1, 4, 9]  # ticked with each result
    assert "ray" not in sys.modules
    check_ray("")  # off: nothing to check


def test_asking_for_ray_without_it_fails_before_any_work(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(ValueError, match=r"Ray is not installed; pip install 'socialworld\[scale\]'"):
        check_ray("local")
    from socialworld.learn.config import LoopConfig

    with pytest.raises(ValueError, match="Ray is not installed"):
        LoopConfig(ray="local")


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    yield "local"
    ray.shutdown()


def _wake_and_reference(specs):
    ids = ("team_lunch-v1", "book_club-v1")
    jobs = [EpisodeJob(specs[s], seed) for s in ids for seed in (3, 4)]
    wake = run_episodes(make_policy("random", seed=1), jobs)
    ref = {(e.scenario_id, e.seed): e for e in run_episodes(make_policy("expert"), jobs)}
    return {s: specs[s] for s in ids}, wake, ref


@pytest.mark.slow
def test_sleep_scoring_on_ray_equals_one_process(specs, local_ray, tmp_path):
    specs2, wake, ref = _wake_and_reference(specs)
    cfg = SleepConfig(sources=("action", "reference", "dialogue", "utterance", "judge"), reference_chosen="own", wake_chosen="label")
    out = {}
    for name, ray in (("one", ""), ("ray", local_ray)):
        report, ticks = GatingReport(), []
        pairs = candidate_pairs(SleepInputs(specs2, wake, ref), cfg, report, progress=lambda what, n: ticks.append, ray=ray)
        write_pairs(tmp_path / f"{name}.parquet", pairs)
        out[name] = (pairs, report.as_dict(), len(ticks))
    assert out["ray"][0] == out["one"][0] and len(out["one"][0]) > 10
    assert out["ray"][1] == out["one"][1] and out["ray"][2] == out["one"][2] == 4 * 3 + 4
    assert (tmp_path / "ray.parquet").read_bytes() == (tmp_path / "one.parquet").read_bytes()


@pytest.mark.slow
def test_rollouts_on_ray_equal_one_process(specs, local_ray, tmp_path):
    jobs = [EpisodeJob(specs[s], seed) for s in ("birthday_budget-v1", "hackathon-v1") for seed in (1, 2, 3)]
    for policy in ("random", "expert"):
        write_jsonl(tmp_path / "one.jsonl", rollouts(policy, jobs, seed=5))
        write_jsonl(tmp_path / "ray.jsonl", rollouts(policy, jobs, ray=local_ray, seed=5))
        assert (tmp_path / "ray.jsonl").read_bytes() == (tmp_path / "one.jsonl").read_bytes()


@pytest.mark.slow
def test_a_loop_on_ray_makes_the_same_artifacts(tiny_dir, local_ray, tmp_path):
    """One tiny cycle with and without --ray: every artifact's hash equal (config.yaml too: how a
    run executes is not recorded), so a run can be resumed either way. The language model's
    episodes record each decision's wall time (``latency_s``), the one field two runs never share:
    they are compared without it."""
    from dataclasses import replace

    from socialworld.learn.config import LoopConfig, TrainConfig
    from socialworld.learn.loop import run_loop
    from socialworld.rundir import RunDir

    base = LoopConfig(model=str(tiny_dir), cycles=1, tiers=("L0",), train_episodes=1, reference_episodes=2, eval_episodes=1,
                      lm_batch_size=4, max_turns=4, sleep=SleepConfig(rollouts=1, horizon=3, max_candidates=4, sources=("action", "reference", "dialogue", "utterance", "judge"),
                                                                                   reference_chosen="own"),
                      train=TrainConfig(method="sft", steps=1, batch_size=2, max_length=1024))
    from socialworld.records import read_jsonl

    lm_episodes = ("cycle-0/eval/episodes.jsonl", "cycle-1/wake/episodes.jsonl", "cycle-1/eval/episodes.jsonl")
    hashes, episodes = {}, {}
    for name, ray in (("one", ""), ("ray", local_ray)):
        run_loop(replace(base, out=str(tmp_path / name), ray=ray), log=lambda _: None)
        hashes[name] = {rel: a["sha256"] for rel, a in RunDir(tmp_path / name).artifacts.items() if rel not in lm_episodes}
        episodes[name] = [[s.model_dump(exclude={"policy": {"latency_s"}}) for e in read_jsonl(tmp_path / name / rel) for s in e.steps]
                          for rel in lm_episodes]
    assert hashes["ray"] == hashes["one"] and episodes["ray"] == episodes["one"]
    assert {"cycle-1/sleep", "cycle-1/wake/reference.jsonl", "cycle-1/train/action/adapter"} <= set(hashes["one"])
    import yaml

    configs = [yaml.safe_load((tmp_path / name / "config.yaml").read_text()) for name in ("one", "ray")]
    assert all("ray" not in c for c in configs)  # how a run executes is not recorded: only its folder differs
    assert [{k: v for k, v in c.items() if k != "out"} for c in configs][0] == {k: v for k, v in configs[1].items() if k != "out"}


@pytest.mark.slow
def test_suite_variants_on_ray_give_the_same_suite(tiny_dir, tmp_path, local_ray):
    """The methods suite's variants after the first as Ray tasks: the same suite document."""
    import json

    from socialworld.bench.config import BenchConfig
    from socialworld.bench.protocol import run_suite

    tiny = str(tiny_dir)
    docs = {}
    for name, ray in (("one", ""), ("ray", local_ray)):
        cfg = BenchConfig(out=str(tmp_path / name), model=tiny, preset="smoke", cycles=1, lm_batch_size=4, resamples=1000, ray=ray)
        doc = run_suite(cfg, "methods", log=lambda _: None)
        docs[name] = doc.model_copy(update={"config": {k: v for k, v in doc.config.items() if k != "out"}}).to_json()
    assert docs["ray"] == docs["one"]
    assert list(json.loads(docs["ray"])["variants"]) == ["M0-untrained", "M1-sft", "M2-grpo", "M3-dpo-trajectory-ungated", "M4-full"]


@pytest.mark.slow
def test_eval_on_ray_writes_the_same_records(tmp_path, local_ray):
    from socialworld.rollout.config import EvalConfig
    from socialworld.rollout.evaluate import evaluate

    for name, ray in (("one", ""), ("ray", local_ray)):
        evaluate(EvalConfig(policy="random", scenarios=["team_lunch", "hackathon"], episodes=2, out=tmp_path / name, ray=ray))
    for f in ("episodes.jsonl", "metrics.json"):
        assert (tmp_path / "ray" / f).read_bytes() == (tmp_path / "one" / f).read_bytes()


@pytest.mark.slow
def test_bench_on_ray_writes_the_same_bench_json(tiny_dir, tmp_path, local_ray):
    """The smoke bench with and without --ray: bench.json (which records the config) the same but for the folder."""
    import json

    from socialworld.bench.config import BenchConfig
    from socialworld.bench.protocol import run_bench

    tiny = str(tiny_dir)
    docs = {}
    for name, ray in (("one", ""), ("ray", local_ray)):
        run_bench(BenchConfig(out=str(tmp_path / name), model=tiny, preset="smoke", cycles=1, lm_batch_size=4, resamples=1000, ray=ray),
                  log=lambda _: None)
        docs[name] = json.loads((tmp_path / name / "bench.json").read_text())
        assert "ray" not in docs[name]["config"]
        docs[name]["config"].pop("out")
    assert docs["ray"] == docs["one"]


def test_a_wrong_ray_address_fails_before_any_artifact(tmp_path, monkeypatch):
    pytest.importorskip("ray")
    import socialworld.rollout.scale as scale
    from socialworld.learn.config import LoopConfig
    from socialworld.learn.loop import run_loop

    def refuse(address, num_cpus=None):
        raise ConnectionError(f"could not connect to {address}")

    monkeypatch.setattr(scale, "ray_init", refuse)
    import socialworld.learn.loop as loop_mod

    monkeypatch.setattr(loop_mod, "ray_init", refuse)
    with pytest.raises(ConnectionError, match="ray://nowhere:1"):
        run_loop(LoopConfig(out=str(tmp_path / "run"), ray="ray://nowhere:1"))
    assert not (tmp_path / "run").exists()
