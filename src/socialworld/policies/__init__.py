"""Policies. Scripted ones are built by name; language-model policies plug in here later."""

from __future__ import annotations

from ..core import Policy, PrivilegedPolicy
from .scripted import Beliefs, ExpertPolicy, OraclePolicy, RandomPolicy, say, true_mental_state

SCRIPTED = ("random", "expert", "oracle")


def make_policy(name: str, seed: int = 0) -> Policy | PrivilegedPolicy:
    """Build a policy from its spec string (``random``, ``expert``, ``oracle``)."""
    if name == "random":
        return RandomPolicy(seed)
    if name == "expert":
        return ExpertPolicy()
    if name == "oracle":
        return OraclePolicy()
    raise ValueError(f"unknown policy {name!r}; scripted policies are {', '.join(SCRIPTED)}")


__all__ = ["Beliefs", "ExpertPolicy", "OraclePolicy", "RandomPolicy", "SCRIPTED", "make_policy", "say", "true_mental_state"]
