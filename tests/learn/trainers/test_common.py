"""What the trainers share: planned steps, LoRA layers, balanced rows, the training set."""

from importlib.util import find_spec

import pytest

pytestmark = pytest.mark.skipif(not (find_spec("trl") and find_spec("peft")), reason="needs the train extra")
slow = pytest.mark.slow  # TRL training on a tiny model: run by CI's `pytest -m slow`

from socialworld.learn.config import TrainConfig  # noqa: E402
from socialworld.learn.trainers.common import TrainingSet, action_kind, balanced_indices, lora_layers, planned_steps  # noqa: E402


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
