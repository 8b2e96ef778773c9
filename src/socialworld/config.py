"""The rules the config dataclasses declare: a bad value fails when the config is built, before any
work starts (the CLI builds every config before it loads a model or writes a file).

A numeric field declares its range once, beside its help, as ``metadata={"help": ..., "check":
at_least(1)}``; :func:`check_fields` (called first in each config's ``__post_init__``) checks every
declared range and every ``Literal`` field's choices, so a config built in Python, from the command
line or from ``--config FILE`` obeys the same rule, and the command line's options name theirs in
their help and in their error (``--lora-r: must be at least 1, got 0``). Rules that relate fields
(GRPO's group of at least two) stay in ``__post_init__`` and raise :class:`FieldError`, which names
the fields so the command line can call them as the user gave them; rules that need the model or the disk
(target modules, ``--reuse-from``) run before the command writes anything.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Bound:
    """The range a numeric field's value must lie in (``None``: unbounded on that side)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    """the low end excluded (``value > low``)"""
    high_open: bool = False

    def holds(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.high_open else value > self.high))

    def __str__(self) -> str:
        low, high = _number(self.low), _number(self.high)
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"
        if self.low is not None:
            return f"{'above' if self.low_open else 'at least'} {low}"
        if self.high is not None:
            return f"{'below' if self.high_open else 'at most'} {high}"
        return "a number"


def _number(x: float | None) -> str:
    """An int in full (``4294967295``, not ``4.29497e+09``), a float as ``%g``."""
    return str(x) if x is None or isinstance(x, int) else f"{x:g}"


def at_least(low: float) -> Bound:
    """``value >= low``."""
    return Bound(low=low)


def above(low: float) -> Bound:
    """``value > low``."""
    return Bound(low=low, low_open=True)


def within(low: float, high: float, *, low_open: bool = False) -> Bound:
    """``low <= value <= high`` (``low < value`` with ``low_open``)."""
    return Bound(low=low, high=high, low_open=low_open)


SHARE = within(0, 1)
"""a share: ``0 <= value <= 1``"""


def literal_choices(hint: Any) -> tuple[Any, ...] | None:
    """The choices of a ``Literal`` type, also inside ``X | None`` or a ``tuple[Literal[...], ...]``/``list``."""
    if typing.get_origin(hint) is Literal:
        return typing.get_args(hint)
    for arg in typing.get_args(hint):
        if arg is not Ellipsis and arg is not type(None):
            inner = literal_choices(arg)
            if inner is not None:
                return inner
    return None


@functools.cache
def _rules(cls: type) -> tuple[tuple[str, Bound | None, tuple[Any, ...] | None], ...]:
    hints = typing.get_type_hints(cls)
    return tuple((f.name, f.metadata.get("check"), literal_choices(hints[f.name])) for f in dataclasses.fields(cls))


def violation(value: Any, check: Bound | None, choices: tuple[Any, ...] | None) -> str | None:
    """Why ``value`` breaks a field's declared rule (``None``: it keeps it). A tuple or list is
    checked item by item; ``None`` keeps every rule (an optional field left out)."""
    if value is None:
        return None
    if isinstance(value, (tuple, list)) and choices is not None:
        return next((m for m in (violation(v, None, choices) for v in value) if m), None)
    if choices is not None and value not in choices:
        return f"must be one of {', '.join(map(str, choices))}, got {value!r}"
    if check is not None and isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number {check}, got {value!r}"
    if check is not None and not check.holds(value):
        return f"must be {check}, got {value!r}"
    return None


class FieldError(ValueError):
    """A rule beyond a field's own range broken (one that relates fields, or needs the value parsed):
    ``field`` names the field, and ``rule`` may name ``related`` fields as ``{name}``, so the command
    line names its options (``--num-generations: must be at least 2 with --method grpo``), a config
    file its keys, and Python the field names."""

    def __init__(self, field: str, rule: str, related: tuple[str, ...] = ()) -> None:
        self.field, self.rule, self.related = field, rule, related
        super().__init__(self.named({f: f for f in (field, *related)}))

    def named(self, names: dict[str, str]) -> str:
        """The message with each field called by ``names[field]``."""
        rule = self.rule
        for f in self.related:  # not str.format: the rule may quote a value with braces in it
            rule = rule.replace("{" + f + "}", names[f])
        return f"{names[self.field]}: {rule}"


def check_fields(cfg: Any) -> None:
    """Raise :class:`FieldError` naming the first field of dataclass ``cfg`` whose value breaks its
    declared rule: a ``Literal``'s choices, a range in ``metadata["check"]`` (nested configs check
    themselves when they are built)."""
    cls: type = type(cfg)
    for name, check, choices in _rules(cls):
        msg = violation(getattr(cfg, name), check, choices)
        if msg:
            raise FieldError(name, msg)

