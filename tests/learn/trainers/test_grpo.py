"""GRPO at the action track's states: the simulator's reward and returns, the policy's own sampled turns, the watchdog."""

from importlib.util import find_spec

import pytest

pytestmark = pytest.mark.skipif(not (find_spec("trl") and find_spec("peft")), reason="needs the train extra")
slow = pytest.mark.slow  # TRL training on a tiny model: run by CI's `pytest -m slow`

from socialworld.learn.config import TrainConfig  # noqa: E402
from socialworld.learn.documents import TRAIN_RECORD, TrainRecord  # noqa: E402
from socialworld.learn.train import train_adapter  # noqa: E402
from socialworld.learn.trainers.common import TrainingSet  # noqa: E402
from socialworld.learn.trainers.grpo import policy_rollout, simulator_reward  # noqa: E402


@slow
def test_grpo_trains_with_the_simulator_reward(specs, tiny_dir, pairs, tmp_path):
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
