"""Checks the config dataclasses share: a bad value fails when the config is built, before any
work starts (the CLI builds every config before it loads a model or writes a file)."""

from __future__ import annotations

from typing import Any


def at_least(cfg: Any, low: int, *names: str) -> None:
    """Raise ``ValueError`` naming the first field of ``names`` whose value is below ``low``."""
    for name in names:
        value = getattr(cfg, name)
        if value < low:
            raise ValueError(f"{name} must be at least {low}, got {value}")


def one_of(cfg: Any, name: str, choices: tuple[str, ...]) -> None:
    """Raise ``ValueError`` unless field ``name`` is one of ``choices``."""
    value = getattr(cfg, name)
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
