"""The policy registry: one spec string builds any policy — ``random``, ``expert``, ``oracle``, the
bundled SmolLM2, any Hugging Face model or adapters folder, any OpenAI-compatible server (``openai:``).
Language-model code (torch, transformers) is imported only when a model is built."""

from __future__ import annotations

import sys

from socialworld.agents.models import parse_model_spec, require_lm
from socialworld.agents.scripted import ExpertPolicy, OraclePolicy, RandomPolicy
from socialworld.core import Policy, PrivilegedPolicy


def make_policy(name: str, seed: int = 0, **lm_options) -> Policy | PrivilegedPolicy:
    """Build a policy from its spec string: ``random``, ``expert``, ``oracle``, or a model spec
    (``bundled``, a local path or hub id, ``openai:<model>@<base_url>``; see :mod:`socialworld.agents.registry`)."""
    if name == "random":
        return RandomPolicy(seed)
    if name == "expert":
        return ExpertPolicy()
    if name == "oracle":
        return OraclePolicy()
    return make_lm_policy(name, **lm_options)


def make_backend(spec: str, *, max_new_tokens: int = 64, batch_size: int = 16, dtype: str = "auto", timeout_s: float = 60.0):
    """A text backend for a model spec string: :class:`~socialworld.agents.lm.backends.HFBackend` for
    local models, :class:`~socialworld.agents.lm.backends.OpenAIBackend` for ``openai:`` specs. A local
    model with adapters generates under its ``action`` adapter (the one that writes the BELIEF and
    ACTION lines; the ``dialogue`` one where it has no other). ``timeout_s`` bounds each request to an endpoint."""
    from socialworld.agents.lm.backends import HFBackend, OpenAIBackend
    from socialworld.agents.models import bundled_path, find_adapters, load_with_adapters

    ms = parse_model_spec(spec)
    if ms.kind == "openai":
        assert ms.base_url is not None  # parse_model_spec requires one in an openai: spec
        return OpenAIBackend(ms.name, ms.base_url, max_new_tokens=max_new_tokens, concurrency=batch_size, timeout_s=timeout_s)
    if ms.kind in ("bundled", "hf"):
        require_lm(spec, "model")
        found = {k: str(v) for k, v in find_adapters(ms.adapters).items()} if ms.adapters else {}
        model, tok, _ = load_with_adapters(bundled_path() if ms.kind == "bundled" else ms.name, found, dtype=dtype)
        if found:
            model.set_adapter("action" if "action" in found else "dialogue")
        return HFBackend(model, tok, name=ms.display, max_new_tokens=max_new_tokens, batch_size=batch_size)
    raise ValueError(f"{spec!r} is a scripted policy, not a language model")


def make_lm_policy(spec: str, *, max_new_tokens: int = 64, batch_size: int = 16, dtype: str = "auto",
                   decoding: str = "auto", adapters: dict[str, str] | None = None, timeout_s: float = 60.0):
    """Build an :class:`~socialworld.agents.lm.policy.LMPolicy` from a model spec string; ``adapters``
    ``{"action": path, "dialogue": path}`` deploys trained LoRA adapters on a local model (as
    does a spec's ``+<adapters folder>``); ``timeout_s`` bounds each request to an ``openai:`` endpoint."""
    from socialworld.agents.lm.backends import HFBackend, OpenAIBackend
    from socialworld.agents.lm.policy import LMPolicy
    from socialworld.agents.models import bundled_path, find_adapters, load_with_adapters

    if decoding not in ("auto", "free", "constrained"):
        raise ValueError(f"decoding must be auto, free or constrained, got {decoding!r}")
    ms = parse_model_spec(spec)
    if ms.adapters:
        if adapters:
            raise ValueError(f"{spec!r} names its adapters; do not pass adapters as well")
        adapters = {k: str(v) for k, v in find_adapters(ms.adapters).items()}
    if ms.kind == "openai":
        # constrained: the server constrains each reply to the grammar (vLLM's structured outputs);
        # auto asks the server once whether it does, and says which mode it took and why
        assert ms.base_url is not None  # parse_model_spec requires one in an openai: spec
        backend = OpenAIBackend(ms.name, ms.base_url, max_new_tokens=max_new_tokens, concurrency=batch_size, timeout_s=timeout_s)
        if decoding == "auto":
            accepts, why = backend.accepts_grammar()
            decoding = "constrained" if accepts else "free"
            print(f"socialworld: {backend.name} decodes {decoding} ({why})", file=sys.stderr, flush=True)
        return LMPolicy(backend, decoding="constrained" if decoding == "constrained" else "free")
    if ms.kind in ("bundled", "hf"):
        require_lm(spec, "model")
        path = bundled_path() if ms.kind == "bundled" else ms.name
        model, tok, digest = load_with_adapters(path, adapters or {}, dtype=dtype)
        local = HFBackend(model, tok, name=ms.display, max_new_tokens=max_new_tokens, batch_size=batch_size)
        if set(adapters or {}) - {"action", "dialogue"}:
            raise ValueError(f"adapters must be named action and/or dialogue, got {sorted(adapters or {})}")
        tracks = (("action" if "action" in adapters else "__base__", "dialogue" if "dialogue" in adapters else "__base__")
                  if adapters else None)
        return LMPolicy(local, base_model=ms.display, decoding="free" if decoding == "free" else "constrained",
                        adapter_hash=digest, adapters=tracks)
    raise ValueError(f"{spec!r} is a scripted policy, not a language model")


NPC_VOICE_TEMPLATE = "template"
"""the ``npc_voice`` value that keeps the templates' lines (the default)"""


def check_voice(spec: str, loads: bool = False) -> None:
    """A config's ``npc_voice``: ``template`` or a language-model spec; raises ``ValueError`` before any work.
    ``loads``: a model folder or hub id must also load (:func:`~socialworld.agents.models.check_loads`)."""
    if spec == NPC_VOICE_TEMPLATE:
        return
    if parse_model_spec(spec).kind == "scripted":
        raise ValueError(f"the NPC voice must be 'template' or a language model spec, not the scripted policy {spec!r}")
    if loads:
        from socialworld.agents.models import check_loads

        check_loads(spec, "--npc-voice")


def make_voice(spec: str, *, batch_size: int = 16, dtype: str = "auto", timeout_s: float = 60.0):
    """The NPC voice of a spec (:mod:`socialworld.world.voice`): None for ``template``, else an
    :class:`~socialworld.agents.lm.voice.LMVoice` over the model's text backend (``bundled``, a local folder,
    ``openai:<model>@<url>``)."""
    check_voice(spec)
    if spec == NPC_VOICE_TEMPLATE:
        return None
    from socialworld.agents.lm.voice import VOICE_MAX_NEW_TOKENS, LMVoice

    return LMVoice(make_backend(spec, max_new_tokens=VOICE_MAX_NEW_TOKENS, batch_size=batch_size, dtype=dtype, timeout_s=timeout_s))
