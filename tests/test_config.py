from dataclasses import dataclass, field
from typing import Literal

import pytest

from socialworld.config import SHARE, above, at_least, check_fields, violation, within


def test_bounds_say_and_check_their_rule():
    assert str(at_least(1)) == "at least 1" and str(above(0)) == "above 0" and str(SHARE) == "in [0, 1]"
    assert str(within(0, 1, low_open=True)) == "in (0, 1]"
    assert at_least(1).holds(1) and not at_least(1).holds(0)
    assert above(0).holds(1e-9) and not above(0).holds(0)
    assert within(0, 1, low_open=True).holds(1) and not within(0, 1, low_open=True).holds(0)
    assert not SHARE.holds(float("nan")) and not SHARE.holds(True) and not SHARE.holds("0.5")
    assert violation(2, SHARE, None) == "must be in [0, 1], got 2"
    assert violation(None, SHARE, None) is None  # an optional field left out keeps every rule


@dataclass(frozen=True)
class _Cfg:
    n: int = field(default=1, metadata={"help": "n", "check": at_least(1)})
    kind: Literal["a", "b"] = "a"
    kinds: tuple[Literal["a", "b"], ...] = ("a",)
    free: float = -5.0

    def __post_init__(self):
        check_fields(self)


@pytest.mark.parametrize("kw, says", [
    ({"n": 0}, "n: must be at least 1, got 0"),
    ({"kind": "c"}, "kind: must be one of a, b, got 'c'"),
    ({"kinds": ("a", "c")}, "kinds: must be one of a, b, got 'c'"),
])
def test_check_fields_names_the_field_and_its_rule(kw, says):
    with pytest.raises(ValueError, match=f"^{says}$"):
        _Cfg(**kw)
    _Cfg(n=3, kind="b", kinds=("b", "a"))  # a field without a rule takes any value of its type


def test_every_config_field_that_counts_declares_a_range():
    """Every int or float field of the command configs declares its range (a count of -1 or a
    share of 2 is an error before any work, not a run that exits 0)."""
    import dataclasses
    import typing

    from socialworld.bench.config import BenchConfig
    from socialworld.learn.config import LoopConfig, SleepConfig, TrainConfig
    from socialworld.rollout.config import EvalConfig
    from socialworld.swm.config import ChainConfig, ForeseeConfig, TomConfig

    bare = []
    for cls in (BenchConfig, LoopConfig, SleepConfig, TrainConfig, EvalConfig, ChainConfig, ForeseeConfig, TomConfig):
        hints = typing.get_type_hints(cls)
        bare += [f"{cls.__name__}.{f.name}" for f in dataclasses.fields(cls)
                 if hints[f.name] in (int, float) and "check" not in f.metadata]
    assert bare == []


def test_a_rule_relating_fields_names_each_as_the_caller_calls_it():
    """FieldError: Python names fields, the command line options, a file its keys; a value with
    braces in the rule is quoted as it is."""
    from socialworld.config import FieldError

    err = FieldError("num_generations", "must be at least 2 with {method} grpo, got {1}", related=("method",))
    assert str(err) == "num_generations: must be at least 2 with method grpo, got {1}"
    assert err.named({"num_generations": "--num-generations", "method": "--method"}) == (
        "--num-generations: must be at least 2 with --method grpo, got {1}")
    assert isinstance(err, ValueError)
