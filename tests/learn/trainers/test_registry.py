"""The training methods behind one protocol: each named method has its trainer, each method's options
are its own, and the flat config the command line and ``config.yaml`` show composes them all."""

from dataclasses import fields
from typing import get_args

import pytest

from socialworld.learn.config import TrainConfig, TrainOptions
from socialworld.learn.trainers import TRAINERS
from socialworld.learn.trainers.options import DPOOptions, GRPOOptions, ListwiseOptions


def test_every_method_has_its_trainer_and_its_own_options():
    assert set(TRAINERS) == set(get_args(_method_type()))
    own = {cls: {f.name for f in fields(cls)} for cls in (TrainOptions, DPOOptions, GRPOOptions, ListwiseOptions)}
    names = [n for ns in own.values() for n in ns]
    assert len(names) == len(set(names))  # no method's option shadows another's or a common one
    assert {f.name for f in fields(TrainConfig)} == set(names)  # the flat config is exactly their union
    for cls in (DPOOptions, GRPOOptions, ListwiseOptions):  # each documents itself (the help the CLI shows)
        assert all(f.metadata.get("help") for f in fields(cls)), cls


def _method_type():
    from typing import get_type_hints

    return get_type_hints(TrainOptions)["method"]


def test_each_methods_options_check_their_own_values():
    for cls, bad in ((DPOOptions, {"sft_weight": -1}), (GRPOOptions, {"num_generations": 0}),
                     (ListwiseOptions, {"value_temperature": 0})):
        with pytest.raises(ValueError, match=next(iter(bad))):
            cls(**bad)
        with pytest.raises(ValueError, match=next(iter(bad))):
            TrainConfig(**bad)
