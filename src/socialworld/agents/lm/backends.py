"""Text-generation backends: a local Hugging Face model (batched, left-padded, greedy) and any
OpenAI-compatible HTTP server (concurrent, bounded, with timeouts). Both turn chat
conversations into :class:`Completion` records; a failed request is a completion with an
``error`` (counted by the policy as an unparseable step), never an exception that ends a run."""

from __future__ import annotations

import functools
import http.client
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence, runtime_checkable

from socialworld.agents.lm.constrained import MergedAdapters, PrefixCache, program_regex

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class Completion:
    text: str
    tokens_in: int = 0
    tokens_out: int = 0
    latency_s: float = 0.0
    error: str | None = None


class Backend(Protocol):
    """Writes replies to conversations (free text)."""

    decoding: dict[str, Any]

    @property
    def name(self) -> str: ...

    @property
    def local(self) -> bool:
        """whether the model runs here (its logits are at hand: constrained decoding of any program);
        an endpoint constrains only where the server supports vLLM's structured outputs"""
        ...

    def complete(self, conversations: Sequence[Messages]) -> list[Completion]: ...


@runtime_checkable
class ConstrainedBackend(Backend, Protocol):
    """A backend that can also decode under a grammar program (:mod:`socialworld.agents.lm.constrained`):
    every reply parseable by construction. Both shipped backends can (an endpoint where its server
    supports structured outputs)."""

    def constrained(self, conversations: Sequence[Messages], programs: Sequence[Sequence[Any]]) -> list[Completion]: ...


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
    merged: MergedAdapters = field(default_factory=MergedAdapters)
    """a PEFT model's adapters merged for decoding (recomputed by itself when the weights change)"""
    local = True

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
            enc = tok(chunk, return_tensors="pt", padding=True, add_special_tokens=False).to(self.model.device)
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
        :mod:`socialworld.agents.lm.constrained`. Parseable by construction. The system message's KV
        state is cached across calls (it is the same at every step of a scenario)."""
        from socialworld.agents.lm.constrained import decode

        systems = [self.tokenizer.apply_chat_template(c[:1], tokenize=False) if c and c[0]["role"] == "system" else ""
                   for c in conversations]
        rows = decode(self.model, self.tokenizer, self.prompts(conversations), programs, self.batch_size,
                      prefixes=systems, prefix_cache=self.prefix_cache, merged=self.merged)
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


MAX_RETRY_AFTER_S = 30.0
MAX_REPLY_BYTES = 16 << 20
"""the most bytes of one reply the client reads (a chat completion is a few kB; a server that announces or
sends more is answered as a malformed reply, never by allocating what it asks for)"""


def _retry_after(header: str | None) -> float:
    """Seconds a ``Retry-After`` header asks for (capped at ``MAX_RETRY_AFTER_S``), or -1: none given."""
    try:
        return min(MAX_RETRY_AFTER_S, max(0.0, float(header))) if header is not None else -1.0
    except ValueError:  # an HTTP date: the backoff decides
        return -1.0


def _error_text(err: urllib.error.HTTPError) -> str:
    """What the server said with its error: the OpenAI error body's message, else the body's start."""
    try:
        raw = err.read(2000).decode("utf-8", "replace")
    except (OSError, http.client.HTTPException):
        return ""
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if isinstance(data, dict):  # {"error": {"message": ...}} (OpenAI), {"error": "..."} or {"detail": "..."}
        msg = data["error"].get("message") if isinstance(data.get("error"), dict) else data.get("error") or data.get("detail")
        if isinstance(msg, str) and msg:
            return msg[:300]
    return " ".join(raw.split())[:300]


def _count(n: Any) -> int:
    """A usage count; missing or null (some servers send ``"prompt_tokens": null``) is 0, never a lost reply."""
    return n if isinstance(n, int) and not isinstance(n, bool) else 0


class _Deadline:
    """A whole request's time limit. A socket timeout bounds each read, so a server that drips its
    reply a byte at a time never trips it; this watchdog shuts the request's socket down when
    ``seconds`` have passed, whatever the request is doing then (connecting, sending, waiting for
    the status line, reading the body)."""

    def __init__(self, seconds: float) -> None:
        self.expired = False
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> "_Deadline":
        self._timer.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._timer.cancel()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock = sock
            if self.expired:
                self._shut()

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            self._shut()

    def _shut(self) -> None:
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed
                pass


class _Watched:
    """A connection that hands its socket to a :class:`_Deadline` once connected."""

    def __init__(self, *args: Any, deadline: _Deadline, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        self._deadline = deadline

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        self._deadline.watch(self.sock)  # type: ignore[attr-defined]


class _HTTP(_Watched, http.client.HTTPConnection):
    pass


class _HTTPS(_Watched, http.client.HTTPSConnection):
    pass


def _opener(deadline: _Deadline) -> urllib.request.OpenerDirector:
    """urllib (proxies and redirects as usual) over connections that hand their socket to ``deadline``."""

    class Plain(urllib.request.HTTPHandler):
        def http_open(self, req):  # type: ignore[no-untyped-def]
            return self.do_open(functools.partial(_HTTP, deadline=deadline), req)

    class Secure(urllib.request.HTTPSHandler):
        def https_open(self, req):  # type: ignore[no-untyped-def]
            return self.do_open(functools.partial(_HTTPS, deadline=deadline), req, context=self._context)

    return urllib.request.build_opener(Plain, Secure)


@dataclass
class OpenAIBackend:
    """An OpenAI-compatible ``/v1/chat/completions`` endpoint (vLLM, llama.cpp, Ollama, hosted)."""

    model: str
    base_url: str
    max_new_tokens: int = 64
    concurrency: int = 8
    timeout_s: float = 60.0
    """the most seconds one request may take, from connecting to the reply's last byte (each retry
    has its own)"""
    api_key: str | None = None
    decoding: dict[str, Any] = field(default_factory=dict)
    retries: int = 2
    """retries of a call answered 429 or 5xx, or refused at connection, after ``backoff_s`` doubling
    each time (a ``Retry-After`` header, up to ``MAX_RETRY_AFTER_S``, wins)"""
    backoff_s: float = 0.5
    local = False

    def __post_init__(self) -> None:
        self.api_key = self.api_key or os.environ.get("SOCIALWORLD_API_KEY") or os.environ.get("OPENAI_API_KEY")
        self.decoding = {"strategy": "greedy", "temperature": 0, "max_tokens": self.max_new_tokens,
                         "concurrency": self.concurrency, "timeout_s": self.timeout_s, "retries": self.retries}

    @property
    def name(self) -> str:
        return f"openai:{self.model}@{self.base_url}"

    def _one(self, messages: Messages, regex: str | None = None) -> Completion:
        t0, attempt = time.perf_counter(), 0
        c, wait = self._attempt(messages, t0, regex)
        while c.error is not None and wait is not None and attempt < self.retries:
            time.sleep(wait if wait >= 0 else self.backoff_s * 2**attempt)
            attempt += 1
            c, wait = self._attempt(messages, t0, regex)
        if c.error is None or not attempt:
            return c
        return Completion("", latency_s=c.latency_s, error=f"{c.error} (after {attempt + 1} attempts)")

    def _attempt(self, messages: Messages, t0: float, regex: str | None = None) -> tuple[Completion, float | None]:
        """One request: the completion (or its error) and, when the error is worth a retry (429,
        5xx, a refused connection), the seconds to wait first (-1: the backoff's own)."""
        body = json.dumps({"model": self.model, "messages": messages, "temperature": 0, "max_tokens": self.max_new_tokens,
                           **({"structured_outputs": {"regex": regex}} if regex is not None else {})}).encode()
        req = urllib.request.Request(f"{self.base_url}/chat/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {self.api_key}"} if self.api_key else {})})
        fail = lambda msg: Completion("", latency_s=time.perf_counter() - t0, error=msg)  # noqa: E731
        deadline = _Deadline(self.timeout_s)
        with deadline:  # an error's body is read under it too
            try:
                with _opener(deadline).open(req, timeout=self.timeout_s) as resp:
                    announced = resp.getheader("Content-Length")
                    size = int(announced) if announced is not None and announced.strip().isdigit() else None
                    if size is not None and size > MAX_REPLY_BYTES:
                        return fail(f"broken response from {self.base_url}: it announces {size} bytes, more than the "
                                    f"{MAX_REPLY_BYTES} a reply may have"), None
                    raw = resp.read(MAX_REPLY_BYTES + 1)
                if len(raw) > MAX_REPLY_BYTES:
                    return fail(f"broken response from {self.base_url}: more than the {MAX_REPLY_BYTES} bytes a reply may have"), None
                if size is not None and len(raw) < size:
                    if deadline.expired:  # the watchdog cut the reply short
                        return fail(f"cannot reach {self.base_url}: no complete reply within {self.timeout_s:g} s"), None
                    return fail(f"broken response from {self.base_url}: {len(raw)} of the {size} bytes it announced"), None
                data = json.loads(raw)
                text = _content(data["choices"][0]["message"]["content"])
                usage = data.get("usage") or {}
                return Completion(text, _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens")),
                                  time.perf_counter() - t0), None
            except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError, TypeError, AttributeError,
                    RecursionError, MemoryError) as err:  # a reply nested too deeply for the parser, or too large: malformed
                if deadline.expired:  # whatever broke, it broke because the watchdog cut the request short
                    return fail(f"cannot reach {self.base_url}: no complete reply within {self.timeout_s:g} s ({err!r})"), None
                msg, wait = self._classify(err)
                return fail(msg), wait

    def _classify(self, err: Exception) -> tuple[str, float | None]:
        """A failed request's message and, when worth a retry, the seconds to wait (see :meth:`_attempt`)."""
        if isinstance(err, urllib.error.HTTPError):
            said = _error_text(err)
            retry = err.code == 429 or err.code >= 500
            wait = _retry_after(err.headers.get("Retry-After")) if retry else None
            return f"HTTP {err.code} from {self.base_url}" + (f": {said}" if said else ""), wait
        if isinstance(err, http.client.HTTPException):  # a truncated body (IncompleteRead), a broken status line
            return f"broken response from {self.base_url}: {err!r}", None
        if isinstance(err, OSError):  # URLError, a socket timeout, a reset connection
            refused = isinstance(getattr(err, "reason", err), ConnectionRefusedError)
            return f"cannot reach {self.base_url}: {err}", (-1.0 if refused else None)
        if isinstance(err, RecursionError):
            return f"malformed response from {self.base_url}: JSON nested too deeply", None
        return f"malformed response from {self.base_url}: {err!r}"[:500], None

    def complete(self, conversations: Sequence[Messages]) -> list[Completion]:
        with ThreadPoolExecutor(max_workers=max(1, self.concurrency)) as pool:
            return list(pool.map(self._one, conversations))

    def accepts_grammar(self) -> tuple[bool, str]:
        """Whether the server decodes under vLLM's ``structured_outputs`` regex, asked with one short
        request (no retries) whose pattern allows only ``yes`` or ``no``; and why, in words. A server
        that rejects the field, ignores it (a reply outside the pattern) or cannot be reached: no."""
        c, _ = self._attempt([{"role": "user", "content": "Answer yes or no."}], time.perf_counter(), GRAMMAR_PROBE)
        if c.error is not None:
            return False, f"the grammar probe failed: {c.error}"
        if c.text not in ("yes", "no"):
            return False, f"the server ignored structured_outputs (the probe's reply {c.text[:40]!r} is outside its pattern)"
        return True, "the server decodes under structured_outputs (probed)"

    def constrained(self, conversations: Sequence[Messages], programs: Sequence[Sequence[Any]]) -> list[Completion]:
        """Each reply constrained by the server to its program's grammar, sent as a regular
        expression in vLLM's ``structured_outputs`` field (vLLM >= 0.12; other servers reject or
        ignore the field: the strict parser still checks every reply)."""
        with ThreadPoolExecutor(max_workers=max(1, self.concurrency)) as pool:
            return list(pool.map(self._one, conversations, [program_regex(p) for p in programs]))


GRAMMAR_PROBE = "(?:yes|no)"
"""the pattern :meth:`OpenAIBackend.accepts_grammar` sends (in the reply language of
:func:`~socialworld.agents.lm.constrained.program_regex`, so ``socialworld serve`` takes it too)"""


class EndpointFailure(ValueError):
    """A run whose endpoint (policy or judge) gave no reply too often to score (``max_endpoint_failures``)."""
