"""Training with TRL + PEFT on a tiny in-process model: adapters train, save, reload trainable."""

from importlib.util import find_spec

import pytest

pytestmark = pytest.mark.skipif(not (find_spec("trl") and find_spec("peft")), reason="needs the train extra")
slow = pytest.mark.slow  # ~35 s of TRL training on 2 cores: run by CI's `pytest -m slow`

from socialworld.agents.registry import make_policy  # noqa: E402
from socialworld.learn.config import SleepConfig, TrainConfig
from socialworld.learn.documents import TRAIN_RECORD, TrainRecord  # noqa: E402
from socialworld.learn.pairs.gating import GatingReport  # noqa: E402
from socialworld.learn.pairs.sources import Unit, action_pairs
from socialworld.learn.train import train_adapter  # noqa: E402
from socialworld.learn.trainers.common import TrainingSet, action_kind, balanced_indices, lora_layers, planned_steps  # noqa: E402
from socialworld.learn.trainers.grpo import policy_rollout, simulator_reward  # noqa: E402
from socialworld.rollout.runner import EpisodeJob, run_episodes  # noqa: E402


@pytest.fixture(scope="module")
def pairs(specs):
    lunch = specs["team_lunch-v1"]
    ep = run_episodes(make_policy("random", seed=3), [EpisodeJob(lunch, 12)])[0]  # a seed with 4+ pairs
    ps = action_pairs(Unit(lunch, ep), SleepConfig(rollouts=1, horizon=4, max_candidates=6), GatingReport())
    assert len(ps) >= 4
    return ps


def test_steps_layers_and_options():
    assert planned_steps(TrainConfig(steps=120, batch_size=4), 10) == 120  # no epoch cap: steps decide
    assert planned_steps(TrainConfig(steps=120, batch_size=4, max_epochs=4), 10) == 10  # 4 passes over 10 rows
    assert planned_steps(TrainConfig(steps=120, batch_size=4, max_epochs=4), 1000) == 120
    assert planned_steps(TrainConfig(steps=5, batch_size=4, max_epochs=0.1), 3) == 1  # at least one step
    assert lora_layers(30, 1.0) is None and lora_layers(30, 0.5) == list(range(15, 30)) and lora_layers(2, 0.5) == [1]
    for bad in ({"lora_upper": 0.0}, {"lora_upper": 1.5}, {"dtype": "fp8"}, {"steps": 0}, {"max_epochs": -1}, {"balance": -1}):
        with pytest.raises(ValueError):
            TrainConfig(**bad)


def test_balance_repeats_rare_kinds_up_to_the_cap():
    turn = lambda key: [{"role": "assistant", "content": f"BELIEF: ann x=a mood=mid\nACTION: {key}\nSAY: hi"}]
    assert action_kind(turn("negotiate(ann, x, a, pay)")) == "negotiate" and action_kind(turn("end()")) == "end"
    assert action_kind([{"role": "assistant", "content": "SAY: hi"}]) is None and action_kind([]) is None
    kinds = ["propose"] * 8 + ["finalize"] * 2 + ["approach"] + [None]
    # against the majority's 8 rows: propose once, finalize round(8 / 2) = 4 times, approach 8 -> 4 (capped)
    got = balanced_indices(kinds, 4)
    assert [kinds[i] for i in got].count("finalize") == 8 and got.count(10) == 4 and got.count(11) == 1
    assert balanced_indices(["propose"] * 5 + ["finalize"] * 2, 4).count(5) == 2  # round(2.5) = 2
    assert [kinds[i] for i in got].count("propose") == 8 and got == sorted(got)
    assert balanced_indices(kinds, 2).count(10) == 2  # the cap
    assert balanced_indices(kinds, 0) == list(range(12)) and balanced_indices([None, None], 4) == [0, 1]


def test_balanced_dataset_from_pairs_and_parquet(pairs, tmp_path):
    from socialworld.learn.pairs.record import write_pairs

    # the last pair's chosen turn made a rare kind
    last = pairs[-1].chosen[0]["content"].replace("ACTION: propose(", "ACTION: finalize(")
    pairs = [*pairs[:-1], pairs[-1].model_copy(update={"chosen": [{"role": "assistant", "content": last}]})]
    write_pairs(tmp_path / "pairs.parquet", pairs)
    kinds = [action_kind(p.chosen) for p in pairs]
    want = [pairs[i].chosen[0]["content"] for i in balanced_indices(kinds, 3)]
    assert len(set(kinds)) > 1 and len(want) > len(pairs)  # something is repeated
    for data in (TrainingSet(tuple(pairs)), TrainingSet.read(tmp_path / "pairs.parquet")):
        assert [m[0]["content"] for m in data.dataset("sft", 3)["completion"]] == want
        assert [m[0]["content"] for m in data.dataset("dpo", 3)["chosen"]] == want
        assert len(data.dataset("sft")) == len(pairs)


def _lora_b(path):
    from safetensors.torch import load_file

    return {k: v for k, v in load_file(str(path / "adapter_model.safetensors")).items() if "lora_B" in k}


@slow
def test_dpo_trains_saves_and_resumes_trainable(tiny_dir, pairs, tmp_path):
    from socialworld.learn.pairs.record import write_pairs

    cfg = TrainConfig(method="dpo", steps=2, batch_size=2, learning_rate=1e-2, max_length=512)
    write_pairs(tmp_path / "pairs.parquet", pairs)
    first = train_adapter(tiny_dir, tmp_path / "a1", cfg, TrainingSet.read(tmp_path / "pairs.parquet"))
    assert first.steps == 2 and len(first.losses) == 2
    w1 = _lora_b(tmp_path / "a1")
    assert w1 and any(v.abs().sum() > 0 for v in w1.values())  # LoRA B starts at zero: it moved
    second = train_adapter(tiny_dir, tmp_path / "a2", cfg, TrainingSet(tuple(pairs)), resume_from=tmp_path / "a1")
    w2 = _lora_b(tmp_path / "a2")
    assert second.steps == 2 and any((w2[k] - w1[k]).abs().sum() > 0 for k in w1)  # the resumed adapter trained
    import json

    rows = json.loads((tmp_path / "a2" / "socialworld-train.json").read_text())["rows"]
    assert rows["pairs"] == rows["given"] == len(pairs) and 0 < rows["trained_on"] <= len(pairs)  # counted, prompts over max_length dropped
    # TRL drops every row whose prompt fills max_length: that is an error naming the setting, not a crash deep in TRL
    with pytest.raises(ValueError, match="max_length=16"):
        train_adapter(tiny_dir, tmp_path / "a3", TrainConfig(method="dpo", steps=1, batch_size=2, max_length=16), TrainingSet(tuple(pairs)))
    assert not (tmp_path / "a3").exists()


@slow
def test_sft_and_grpo_with_the_simulator_reward(specs, tiny_dir, pairs, tmp_path):
    sft = train_adapter(tiny_dir, tmp_path / "sft", TrainConfig(method="sft", steps=1, batch_size=2, lora_upper=0.5), TrainingSet(tuple(pairs)))
    assert sft.steps == 1 and (tmp_path / "sft" / "adapter_config.json").exists()
    assert {k.split(".layers.")[1].split(".")[0] for k in _lora_b(tmp_path / "sft")} == {"1"}  # the upper of 2 layers only
    rows = TrainingSet(tuple(pairs)).states()
    reward = simulator_reward(specs)
    good = [{"role": "assistant", "content": "ACTION: wait()\nSAY: one moment"}]
    got = reward([rows[0]["prompt"]] * 2, [good, [{"role": "assistant", "content": "nonsense"}]],
                 snapshot=[rows[0]["snapshot"]] * 2, scenario_id=[rows[0]["scenario_id"]] * 2)
    assert got[1] < got[0]  # unparseable output gets the penalty
    grpo = train_adapter(tiny_dir, tmp_path / "grpo", TrainConfig(method="grpo", steps=2, batch_size=4, num_generations=4,
                                                                  max_completion_length=8),
                         TrainingSet(tuple(p for p in pairs if p.track == "action" and p.snapshot is not None)[:2], specs))
    assert grpo.steps == 2 and (tmp_path / "grpo" / "adapter_model.safetensors").exists()
    record = TrainRecord.model_validate_json((tmp_path / "grpo" / TRAIN_RECORD).read_text())
    assert min(record.reward_zero_std) < 1  # the sampled legal moves lead apart: some group has an advantage


def test_grpo_samples_the_policys_own_legal_turns_and_trains_only_what_it_chose(specs, tiny_dir, pairs):
    """M2's completions (TRL's ``rollout_func``): each row's turn drawn under the policy's reply
    grammar at that row's state, reproducibly from the seed; the grammar's forced text is masked out."""
    from types import SimpleNamespace

    from socialworld.agents.lm.prompts import parse_output
    from socialworld.agents.models import load_hf
    from socialworld.world.engine import World
    from socialworld.world.visibility import observe

    model, tok = load_hf(tiny_dir, dtype="float32")
    rows = TrainingSet(tuple(pairs)).states()[:2]
    prompts = [rows[0]["prompt"]] * 4 + [rows[1]["prompt"]] * 4  # as TRL's sampler repeats a group's prompt
    trainer = SimpleNamespace(model=model)
    got = policy_rollout(rows, specs, tok, seed=0)(prompts, trainer)
    assert got == policy_rollout(rows, specs, tok, seed=0)(prompts, trainer)
    assert got != policy_rollout(rows, specs, tok, seed=1)(prompts, trainer)
    assert [len(ids) for ids in got["prompt_ids"]] == [len(tok.apply_chat_template(p, add_generation_prompt=True)["input_ids"])
                                                       for p in prompts]
    for i, (ids, mask) in enumerate(zip(got["completion_ids"], got["env_mask"])):
        row = rows[i // 4]
        w = World.restore(row["snapshot"], specs[row["scenario_id"]])
        action, _belief, error = parse_output(tok.decode(ids), observe(w.spec, w.pub))
        assert error is None and w.check_legal(action) is None
        assert len(mask) == len(ids) == len(got["logprobs"][i]) and 0 < sum(mask) < len(ids)


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
@pytest.mark.parametrize("activated", [False, True])
def test_completion_only_loss_equals_trls(tiny_dir, pairs, tmp_path, monkeypatch, activated):
    """The SFT loss projected at completion positions only is TRL's own loss (fp32, same seed), an
    activated adapter's too (PEFT finds its invocation in each row: the loss moves, it is trained)."""
    from trl import SFTTrainer

    import socialworld.learn.trainers.sft as sft

    cfg = TrainConfig(method="sft", steps=2, batch_size=2, dtype="float32", max_length=1024, activated=activated,
                      learning_rate=1e-2)
    ours = train_adapter(tiny_dir, tmp_path / "ours", cfg, TrainingSet(tuple(pairs)))
    monkeypatch.setattr(sft, "completion_sft_trainer", lambda: SFTTrainer)
    trls = train_adapter(tiny_dir, tmp_path / "trl", cfg, TrainingSet(tuple(pairs)))
    assert ours.losses == pytest.approx(trls.losses, rel=1e-4) and len(ours.losses) == 2


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


def test_the_flat_reward_watchdog_stops_after_its_patience_and_says_why():
    """TRL's frac_reward_zero_std at 1 (every group's rewards equal) for `patience` logged steps in a
    row stops the run; a step with variance resets the count; 0 never stops."""
    pytest.importorskip("transformers")
    from transformers import TrainerControl, TrainerState

    from socialworld.learn.trainers.grpo import flat_reward_stop

    def run(patience, shares):
        dog, state, stopped_at = flat_reward_stop(patience), TrainerState(), None
        for step, share in enumerate(shares, 1):
            state.global_step = step
            control = TrainerControl()
            dog.on_log(None, state, control, logs={"loss": 0.0} if share is None else {"frac_reward_zero_std": share})
            if control.should_training_stop and stopped_at is None:
                stopped_at = step
        return stopped_at, dog.stopped

    # a log line without the metric (step 5) neither counts nor resets
    assert run(3, [1.0, 1.0, 0.5, 1.0, None, 1.0, 1.0, 1.0]) == (
        7, "GRPO stopped at step 7: every group's rewards were equal for 3 steps in a row (no advantage, no gradient)")
    assert run(3, [1.0, 0.75] * 4) == (None, None)
    assert run(0, [1.0] * 10) == (None, None)


def test_grpo_rewards_are_the_steps_exact_returns_reproducibly(specs, pairs):
    """With the sleep phase's continuations (M2's reward) every legal move of a group is scored by
    where it leads, not by its one step: more moves get told apart, the same way on every call."""
    from socialworld.learn.config import PairBuild
    from socialworld.learn.pairs.counterfactual import rollout_returns
    from socialworld.world.engine import World
    from socialworld.world.visibility import legal_actions, observe

    build = PairBuild(rollouts=2, horizon=6, discount=0.9)
    told_apart = {"step": 0, "return": 0}
    for row in TrainingSet(tuple(pairs)).states()[:4]:
        w = World.restore(row["snapshot"], specs[row["scenario_id"]])
        legal = legal_actions(observe(w.spec, w.pub))
        turns = [[{"role": "assistant", "content": f"ACTION: {a.key}\nSAY: ok"}] for a in legal] + \
                [[{"role": "assistant", "content": "nonsense"}]]
        kw = {"snapshot": [row["snapshot"]] * len(turns), "scenario_id": [row["scenario_id"]] * len(turns)}
        one = simulator_reward(specs)([row["prompt"]] * len(turns), turns, **kw)
        exact = simulator_reward(specs, build)([row["prompt"]] * len(turns), turns, **kw)
        assert exact == simulator_reward(specs, build)([row["prompt"]] * len(turns), turns, **kw)
        assert exact[-1] < max(exact[:-1])  # an unparseable reply is penalised and leads nowhere better
        # the last legal move's reward is its continuations' mean return, the first step's reward included
        w2 = World.restore(row["snapshot"], specs[row["scenario_id"]])
        returns = rollout_returns(w2, legal[-1], build, ("grpo", row["scenario_id"], _snap_key(row["snapshot"])))
        assert exact[-2] == pytest.approx(sum(returns) / len(returns))
        told_apart["step"] += len(set(one[:-1]))
        told_apart["return"] += len(set(exact[:-1]))
    assert told_apart["return"] > told_apart["step"]


def _snap_key(snapshot: str) -> str:
    import hashlib

    return hashlib.sha256(snapshot.encode()).hexdigest()[:16]
