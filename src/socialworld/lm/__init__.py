"""Language-model policies: the bundled SmolLM2, any Hugging Face model, any OpenAI-compatible server."""

from __future__ import annotations

from .models import ModelSpec, parse_model_spec


def make_lm_policy(spec: str, *, max_new_tokens: int = 64, batch_size: int = 16, dtype: str = "auto",
                   decoding: str = "auto"):
    """Build an :class:`~socialworld.lm.policy.LMPolicy` from a model spec string."""
    from .backends import HFBackend, OpenAIBackend
    from .models import bundled_path, load_hf
    from .policy import LMPolicy

    ms = parse_model_spec(spec)
    if ms.kind == "openai":
        if decoding == "constrained":
            raise ValueError("constrained decoding needs the logits of a local model; use decoding='free' for a server")
        return LMPolicy(OpenAIBackend(ms.name, ms.base_url, max_new_tokens=max_new_tokens, concurrency=batch_size),  # type: ignore[arg-type]
                        decoding="free")
    if ms.kind in ("bundled", "hf"):
        path = bundled_path() if ms.kind == "bundled" else ms.name
        model, tok = load_hf(path, dtype=dtype)
        backend = HFBackend(model, tok, name=ms.display, max_new_tokens=max_new_tokens, batch_size=batch_size)
        return LMPolicy(backend, base_model=ms.display, decoding="constrained" if decoding == "auto" else decoding)
    raise ValueError(f"{spec!r} is a scripted policy, not a language model")


__all__ = ["ModelSpec", "make_lm_policy", "parse_model_spec"]
