"""One training run (``train_adapter``) on a tiny in-process model: the adapters it saves deploy, hash the
same in every process, and resume without a hub lookup."""

from importlib.util import find_spec

import pytest

pytestmark = pytest.mark.skipif(not (find_spec("trl") and find_spec("peft")), reason="needs the train extra")
slow = pytest.mark.slow  # TRL training on a tiny model: run by CI's `pytest -m slow`

from socialworld.learn.config import TrainConfig  # noqa: E402
from socialworld.learn.train import train_adapter  # noqa: E402
from socialworld.learn.trainers.common import TrainingSet  # noqa: E402
from socialworld.rollout.runner import EpisodeJob, run_episodes  # noqa: E402


@slow
def test_deployed_policy_records_both_adapters(specs, tiny_dir, pairs, tmp_path):
    from socialworld.agents.registry import make_lm_policy

    cfg = TrainConfig(method="sft", steps=1, batch_size=2)
    for track in ("action", "dialogue"):
        train_adapter(tiny_dir, tmp_path / track, cfg, TrainingSet(tuple(pairs)))
    pol = make_lm_policy(str(tiny_dir), dtype="float32", batch_size=4,
                         adapters={"action": str(tmp_path / "action"), "dialogue": str(tmp_path / "dialogue")})
    ep = run_episodes(pol, [EpisodeJob(specs["team_lunch-v1"], 3)])[0]
    h = ep.steps[0].policy.adapter_hash
    assert h.startswith("action=") and ";dialogue=" in h and all(s.policy.adapter_hash == h for s in ep.steps)
    assert all(s.action.parse_status == "ok" for s in ep.steps)
    with pytest.raises(ValueError, match="action and/or dialogue"):
        make_lm_policy(str(tiny_dir), dtype="float32", adapters={"x": str(tmp_path / "action")})
    with pytest.raises(ValueError, match="decoding must be auto, free or constrained"):
        make_lm_policy(str(tiny_dir), decoding="greedy")


@slow
def test_adapter_hash_is_the_same_across_processes_and_hash_seeds(tiny_dir, pairs, tmp_path):
    """Two processes with different PYTHONHASHSEED train the same adapter: the same bytes, the same hash."""
    import os
    import subprocess
    import sys

    from socialworld.learn.pairs.record import write_pairs

    write_pairs(tmp_path / "pairs.parquet", pairs)
    code = ("import sys; from socialworld.learn.config import TrainConfig; from socialworld.learn.train import train_adapter; "
            "from socialworld.learn.trainers.common import TrainingSet; "
            "train_adapter(sys.argv[1], sys.argv[2], TrainConfig(method='sft', steps=2, batch_size=2, dtype='float32'), "
            "TrainingSet.read(sys.argv[3]))")
    for seed in ("1", "2"):
        subprocess.run([sys.executable, "-c", code, str(tiny_dir), str(tmp_path / f"a{seed}"), str(tmp_path / "pairs.parquet")],
                       check=True, env=os.environ | {"PYTHONHASHSEED": seed}, capture_output=True)
    from socialworld.rundir import sha256_path

    assert sha256_path(tmp_path / "a1") == sha256_path(tmp_path / "a2")
    assert not [p for p in tmp_path.iterdir() if "trainer" in p.name]  # the trainer's scratch is gone


@slow
def test_an_adapter_naming_the_bundled_base_trains_on_without_a_hub_lookup(tiny_dir, pairs, tmp_path):
    """Adapters name the bundled base ``bundled``; resuming one and saving it must not ask the
    Hugging Face hub about a repository called "bundled" (PEFT's embedding check would)."""
    import warnings

    from socialworld.testing import random_adapter

    random_adapter(tiny_dir, tmp_path / "a0", base_name="bundled")
    cfg = TrainConfig(method="sft", steps=1, batch_size=2, max_length=512)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        train_adapter(tiny_dir, tmp_path / "a1", cfg, TrainingSet(tuple(pairs)), resume_from=tmp_path / "a0")
    assert not [w for w in seen if "bundled" in str(w.message) and ("remote" in str(w.message) or "config" in str(w.message))]
