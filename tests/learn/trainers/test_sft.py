"""SFT through TRL on a tiny model: the upper layers only, and its completion-only loss equal to TRL's."""

from importlib.util import find_spec

import pytest

pytestmark = pytest.mark.skipif(not (find_spec("trl") and find_spec("peft")), reason="needs the train extra")
slow = pytest.mark.slow  # TRL training on a tiny model: run by CI's `pytest -m slow`

from socialworld.learn.config import TrainConfig  # noqa: E402
from socialworld.learn.train import train_adapter  # noqa: E402
from socialworld.learn.trainers.common import TrainingSet  # noqa: E402
from socialworld.testing import lora_b  # noqa: E402


@slow
def test_sft_trains_the_upper_layers_only(tiny_dir, pairs, tmp_path):
    sft = train_adapter(tiny_dir, tmp_path / "sft", TrainConfig(method="sft", steps=1, batch_size=2, lora_upper=0.5), TrainingSet(tuple(pairs)))
    assert sft.steps == 1 and (tmp_path / "sft" / "adapter_config.json").exists()
    assert {k.split(".layers.")[1].split(".")[0] for k in lora_b(tmp_path / "sft")} == {"1"}  # the upper of 2 layers only


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
