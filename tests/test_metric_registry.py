"""The metric registry against the record it reads and the tables that show it."""

import typing

import pytest

from socialworld.metric_registry import KEYS, METRICS, SIGNAL_KEYS, metric
from socialworld.records import Metrics, Signal


def test_the_registry_names_every_score_of_the_record_once():
    hints = typing.get_type_hints(Metrics)
    signals = [name for name, t in hints.items() if t is Signal]
    assert list(SIGNAL_KEYS) == signals  # every Signal of the record is a registered metric, in its order
    assert len(set(KEYS)) == len(KEYS) == len(METRICS)
    for m in METRICS:
        assert hints[m.field] is (bool if m.is_rate else Signal), m.key
        lo, hi = m.range
        assert lo < hi and m.direction in ("higher", "lower") and m.label and m.axis and m.doc


def test_an_unknown_metric_is_named_with_the_known_ones():
    assert metric("pass").label == "PassRate"
    with pytest.raises(KeyError, match="'PassRate'.*U, A_e, S_npc, D, CR, pass, solve"):
        metric("PassRate")
