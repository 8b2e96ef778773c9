"""Policies. Scripted ones are built by name; language-model policies plug in here later."""

from __future__ import annotations

from ..core import Policy, PrivilegedPolicy
from .scripted import Beliefs, ExpertPolicy, OraclePolicy, RandomPolicy, say, true_mental_state

SCRIPTED = ("random", "expert", "oracle")


def make_policy(name: str, seed: int = 0, **lm_options) -> Policy | PrivilegedPolicy:
    """Build a policy from its spec string: ``random``, ``expert``, ``oracle``, or a model spec
    (``bundled``, a local path or hub id, ``openai:<model>@<base_url>``; see :mod:`socialworld.lm`)."""
    if name == "random":
        return RandomPolicy(seed)
    if name == "expert":
        return ExpertPolicy()
    if name == "oracle":
        return OraclePolicy()
    from ..lm import make_lm_policy  # imported lazily: scripted use never needs torch

    return make_lm_policy(name, **lm_options)


__all__ = ["Beliefs", "ExpertPolicy", "OraclePolicy", "RandomPolicy", "SCRIPTED", "make_policy", "say", "true_mental_state"]
