"""Text-generation backends: a local Hugging Face model (batched, left-padded, greedy) and any
OpenAI-compatible HTTP server (concurrent, bounded, with timeouts). Both turn chat
conversations into :class:`Completion` records; a failed request is a completion with an
``error`` (counted by the policy as an unparseable step), never an exception that ends a run."""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from .constrained import PrefixCache

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class Completion:
    text: str
    tokens_in: int = 0
    tokens_out: int = 0
    latency_s: float = 0.0
    error: str | None = None


class Backend(Protocol):
    name: str
    decoding: dict[str, Any]

    def complete(self, conversations: Sequence[Messages]) -> list[Completion]: ...


@dataclass
class HFBackend:
    """A transformers causal LM: batched greedy generation (left padding, KV cache) and
    grammar-constrained greedy decoding on a shared-prefix KV cache."""

    model: Any
    tokenizer: Any
    name: str
    max_new_tokens: int = 64
    batch_size: int = 16
    decoding: dict[str, Any] = field(default_factory=dict)
    prefix_cache: PrefixCache = field(default_factory=PrefixCache)
    """KV states of system prompts; clear it (``prefix_cache.clear()``) if the weights change"""

    def __post_init__(self) -> None:
        self.decoding = {"strategy": "greedy", "max_new_tokens": self.max_new_tokens, "batch_size": self.batch_size,
                         "dtype": str(self.model.dtype).replace("torch.", "")}

    def prompts(self, conversations: Sequence[Messages]) -> list[str]:
        """Chat-templated prompt texts, each ending in the opened assistant turn."""
        return [self.tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
                for c in conversations]

    def complete(self, conversations: Sequence[Messages]) -> list[Completion]:
        return self.generate(self.prompts(conversations), self.max_new_tokens)

    def generate(self, texts: Sequence[str], max_new_tokens: int, stop_at_newline: bool = False) -> list[Completion]:
        import torch

        tok = self.tokenizer
        out: list[Completion] = []
        for start in range(0, len(texts), self.batch_size):
            chunk = list(texts[start : start + self.batch_size])
            enc = tok(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
            t0 = time.perf_counter()
            with torch.inference_mode():
                gen = self.model.generate(
                    **enc, max_new_tokens=max_new_tokens, do_sample=False,
                    pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                )
            dt = (time.perf_counter() - t0) / len(chunk)
            new = gen[:, enc["input_ids"].shape[1] :]
            for row, mask in zip(new, enc["attention_mask"]):
                ids = row.tolist()
                n_out = next((i + 1 for i, t in enumerate(ids) if t == tok.eos_token_id), len(ids))
                text = tok.decode(ids[:n_out], skip_special_tokens=True)
                if stop_at_newline:
                    text = text.split("\n", 1)[0]
                out.append(Completion(text, int(mask.sum()), n_out, dt))
        return out

    def constrained(self, conversations: Sequence[Messages], programs: Sequence[Sequence[Any]]) -> list[Completion]:
        """Greedy decoding of each conversation's reply under its program (grammar); see
        :mod:`socialworld.lm.constrained`. Parseable by construction. The system message's KV
        state is cached across calls (it is the same at every step of a scenario)."""
        from .constrained import decode

        systems = [self.tokenizer.apply_chat_template(c[:1], tokenize=False) if c and c[0]["role"] == "system" else ""
                   for c in conversations]
        rows = decode(self.model, self.tokenizer, self.prompts(conversations), programs, self.batch_size,
                      prefixes=systems, prefix_cache=self.prefix_cache)
        return [Completion(r.text, r.tokens_in, r.tokens_out, r.latency_s) for r in rows]


def _content(content: Any) -> str:
    """A chat message's content as text: a string, null (no text), or a list of content parts
    (the OpenAI spec's ``[{"type": "text", "text": ...}]``), whose text parts are joined. Anything
    else raises ``TypeError`` (a malformed response)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        return "".join(p["text"] for p in content if p.get("type") == "text" and isinstance(p.get("text"), str))
    raise TypeError(f"message content is {type(content).__name__}, not text")


def _count(n: Any) -> int:
    """A usage count; missing or null (some servers send ``"prompt_tokens": null``) is 0, never a lost reply."""
    return n if isinstance(n, int) and not isinstance(n, bool) else 0


@dataclass
class OpenAIBackend:
    """An OpenAI-compatible ``/v1/chat/completions`` endpoint (vLLM, llama.cpp, Ollama, hosted)."""

    model: str
    base_url: str
    max_new_tokens: int = 64
    concurrency: int = 8
    timeout_s: float = 60.0
    api_key: str | None = None
    decoding: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.api_key = self.api_key or os.environ.get("SOCIALWORLD_API_KEY") or os.environ.get("OPENAI_API_KEY")
        self.decoding = {"strategy": "greedy", "temperature": 0, "max_tokens": self.max_new_tokens,
                         "concurrency": self.concurrency, "timeout_s": self.timeout_s}

    @property
    def name(self) -> str:
        return f"openai:{self.model}@{self.base_url}"

    def _one(self, messages: Messages) -> Completion:
        body = json.dumps({"model": self.model, "messages": messages, "temperature": 0,
                           "max_tokens": self.max_new_tokens}).encode()
        req = urllib.request.Request(f"{self.base_url}/chat/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {self.api_key}"} if self.api_key else {})})
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                data = json.loads(resp.read())
            text = _content(data["choices"][0]["message"]["content"])
            usage = data.get("usage") or {}
            return Completion(text, _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens")),
                              time.perf_counter() - t0)
        except urllib.error.HTTPError as err:
            return Completion("", latency_s=time.perf_counter() - t0, error=f"HTTP {err.code} from {self.base_url}")
        except http.client.HTTPException as err:  # a truncated body (IncompleteRead), a broken status line
            return Completion("", latency_s=time.perf_counter() - t0, error=f"broken response from {self.base_url}: {err!r}")
        except (urllib.error.URLError, TimeoutError, OSError) as err:
            return Completion("", latency_s=time.perf_counter() - t0, error=f"cannot reach {self.base_url}: {err}")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as err:
            return Completion("", latency_s=time.perf_counter() - t0, error=f"malformed response from {self.base_url}: {err!r}")

    def complete(self, conversations: Sequence[Messages]) -> list[Completion]:
        with ThreadPoolExecutor(max_workers=max(1, self.concurrency)) as pool:
            return list(pool.map(self._one, conversations))
