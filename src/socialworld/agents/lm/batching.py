"""Continuous batching for a local transformers model: what ``socialworld serve`` decodes with.

A :class:`Job` is one reply to decode (a request's prompt, its sampling, its grammar). The decoder
(:meth:`ContinuousDecoder.run`) keeps a batch of rows on one KV cache (transformers' ``DynamicCache``,
left-aligned: each row's tokens end at the last column, its positions its own count) and, between
two steps, takes in the jobs that arrived while it decoded (``admit``), as vLLM's continuous batching
does: a newcomer's prompt is prefilled on its own cache, then joined to the batch (the shorter of the
two left-padded, masked); a finished or cancelled row leaves at once (its reply delivered), and the
columns no remaining row reads are cut. So a multi-turn client's next request, which arrives while
other clients' replies decode, joins them instead of waiting for the batch to end.

Each row samples on its own: greedy, or at its temperature and top-p (transformers' logits warpers)
from its own generator (a seeded request's own, else the server's stream), under its grammar when it
has one. Grammars are llguidance's (:func:`grammar`): a regular expression, a JSON schema, a choice
list or a Lark grammar, compiled against the model's tokenizer; a row's mask is the matcher's
allowed tokens, and the row ends when the matcher has reached the end (its only token then is the
end token). Log-probabilities are the model's raw ones (before the grammar, temperature and top-p),
as vLLM reports them by default.

A model whose cache is not plain dynamic layers (sliding windows, recurrent states) decodes the jobs
it starts with and takes no newcomers mid-batch (:attr:`ContinuousDecoder.joins` says which).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

Finish = Literal["stop", "length"]
GrammarKind = Literal["regex", "json", "choice", "grammar", "json_object"]

GREEDY_BELOW = 1e-6
"""temperatures below it decode greedily: sampling is then the argmax anyway, and below about 1e-37 the
scaled logits overflow float32 (``temperature: 1e-40`` was a 500 from the sampler)"""


@dataclass(frozen=True)
class Sampling:
    temperature: float
    top_p: float
    seed: int | None

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


@dataclass(frozen=True)
class TokenLogprob:
    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()

    def openai(self) -> dict:
        entry = lambda t, lp: {"token": t, "logprob": lp, "bytes": list(t.encode())}  # noqa: E731
        return {**entry(self.token, self.logprob), "top_logprobs": [entry(t, lp) for t, lp in self.top]}


@dataclass(frozen=True)
class Generated:
    text: str
    tokens_in: int
    tokens_out: int
    finish_reason: Finish
    logprobs: tuple[TokenLogprob, ...] | None = None
    """the reply's tokens (those inside ``text``) with their log-probabilities, when asked"""


@dataclass
class Job:
    """One reply waiting for (or being given) its decoding."""

    prompt: str
    max_tokens: int
    stops: tuple[str, ...]
    sampling: Sampling
    program: tuple | None = None
    """the project's reply grammar, decoded by its own constrained decoder (:mod:`.constrained`, greedy)"""
    grammar: Any = None
    """an llguidance ``LLMatcher`` (this job's own) the reply must follow (:func:`grammar`)"""
    logprobs: int | None = None
    """``None``: no log-probabilities; ``k``: each reply token's, with the ``k`` likeliest beside it"""
    emit: Callable[[str], None] | None = None
    """called (from the decoding thread) with the reply so far after each decoded token: streaming"""
    request: int = 0
    """the request this job is one of ``n`` samples of (a seeded request's samples decode together)"""
    batch: int = 0
    """the largest batch it was decoded in (the batcher's count)"""
    cancelled: bool = False
    finished: bool = False
    """its reply has been delivered"""
    deliver: Callable[[Generated], None] | None = None
    """called once with the reply (from the decoding thread) by whoever decodes the job"""
    future: asyncio.Future | None = None

    @property
    def lane(self) -> tuple:
        """Jobs of one lane may share a batch: the project's grammar has its own decoder; a seeded,
        sampled request decodes alone (its samples depend on its seed only); every other job joins
        the running batch."""
        if self.program is not None:
            return ("program",)
        if self.sampling.seed is not None and not self.sampling.greedy:
            return ("seeded", self.request)
        return ("shared",)


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """``text`` up to the first of ``stops`` (which is left out), and whether one was found."""
    at = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:at], True) if at >= 0 else (text, False)


# ------------------------------------------------------------------ grammars (llguidance)


def grammar(kind: GrammarKind, spec: Any) -> str:
    """The llguidance grammar for one of vLLM's ``structured_outputs`` fields: ``regex`` (the whole
    reply matches it), ``json`` (a JSON schema, as an object or its text), ``choice`` (exactly one of
    a list of strings), ``grammar`` (a Lark grammar, llguidance's dialect) or ``json_object`` (any JSON
    object). Raises ``ValueError`` for a spec that is not of its kind's shape (the grammar itself is
    checked when it is compiled, :meth:`ContinuousDecoder.matcher`)."""
    from llguidance import LLMatcher

    if kind == "regex":
        return LLMatcher.grammar_from_regex(spec)
    if kind == "json":
        try:
            return LLMatcher.grammar_from_json_schema(json.loads(spec) if isinstance(spec, str) else spec)
        except (ValueError, TypeError) as err:
            raise ValueError(f"not a JSON schema: {err}") from None
    if kind == "json_object":
        return LLMatcher.grammar_from_json_schema({"type": "object"})
    if kind == "choice":
        if not spec or not all(isinstance(c, str) and c for c in spec):
            raise ValueError("a choice is a non-empty list of non-empty strings")
        return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in spec))
    if kind == "grammar":
        return LLMatcher.grammar_from_lark(spec)
    raise ValueError(f"no grammar of kind {kind!r}")


# ------------------------------------------------------------------ the decoder


@dataclass
class _Row:
    job: Job
    tokens_in: int
    generator: Any
    ids: list[int] = field(default_factory=list)
    logits: Any = None
    """the row's next-token logits (float32, vocabulary), from the last forward pass"""
    scored: list[Any] = field(default_factory=list)
    """its raw log-probability rows, when the job asks for logprobs"""
    activated: bool = False
    """an activated adapter (aLoRA) reads this row's tokens from here on"""
    bits: Any = None
    """its grammar's next-token mask (llguidance's bitmask), allocated once"""


class ContinuousDecoder:
    """Decodes :class:`Job` s on a transformers causal LM (a PEFT model too, its adapters as they are
    set), taking in newcomers between steps. ``lock`` guards the tokenizer (a fast tokenizer is not
    safe across threads); ``stream`` is the generator unseeded rows sample from."""

    def __init__(self, model: Any, tokenizer: Any, lock: Any, stream: Any) -> None:
        self.model, self.tokenizer, self.lock, self.stream = model, tokenizer, lock, stream
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        self.eos = {t for t in [tokenizer.eos_token_id, *(gen_eos if isinstance(gen_eos, list) else [gen_eos])] if t is not None}
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._ll: Any = None
        self.joins: bool | None = None
        """whether newcomers join a running batch (known after the first prefill: plain dynamic layers)"""

    # ---------------------------------------------------------------- grammars

    def matcher(self, grammar_text: str) -> Any:
        """An llguidance matcher for ``grammar_text`` on this model's tokenizer; ``ValueError`` with
        llguidance's message when the grammar does not compile."""
        from llguidance import LLMatcher

        if self._ll is None:
            import llguidance.hf

            with self.lock:
                vocab = self.model.get_output_embeddings().weight.shape[0]
                self._ll = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=vocab, eos_token=sorted(self.eos)[0])
        m = LLMatcher(self._ll, grammar_text, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    # ---------------------------------------------------------------- the loop

    def run(self, jobs: Sequence[Job], admit: Callable[[], list[Job]]) -> None:
        """Decode ``jobs`` and those ``admit()`` hands over between steps (when this model's cache can
        take them in), delivering each reply as its row ends; return when no row is left."""
        import torch

        rows: list[_Row] = []
        cache: Any = None
        mask: Any = None
        fresh = list(jobs)
        with torch.inference_mode():
            while True:
                fresh = [j for j in fresh if not j.cancelled]
                if fresh:
                    new_rows, new_cache, new_mask = self._prefill(fresh)
                    if self.joins is None:
                        from transformers.cache_utils import DynamicLayer

                        self.joins = all(type(layer) is DynamicLayer for layer in new_cache.layers)
                    cache, mask = (new_cache, new_mask) if cache is None else _join(cache, mask, new_cache, new_mask)
                    rows += new_rows
                    fresh = []
                keep = [i for i, r in enumerate(rows) if not r.job.cancelled and not self._choose(r)]
                if len(keep) < len(rows):
                    rows = [rows[i] for i in keep]
                    if not rows:
                        cache = mask = None
                    else:
                        cache, mask = _select(cache, mask, keep, trim=bool(self.joins))
                if self.joins:
                    fresh = admit()
                if not rows:
                    if fresh:
                        continue
                    return
                mask = self._step(rows, cache, mask)

    def _prefill(self, jobs: Sequence[Job]) -> tuple[list[_Row], Any, Any]:
        import torch
        from transformers import DynamicCache

        with self.lock:
            enc = [self.tokenizer(j.prompt, add_special_tokens=False)["input_ids"] for j in jobs]
        width = max(len(e) for e in enc)
        ids = torch.full((len(jobs), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(jobs), width), dtype=torch.long)
        for b, e in enumerate(enc):
            ids[b, width - len(e) :] = torch.tensor(e)
            mask[b, width - len(e) :] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        dev = self.model.device
        cache = DynamicCache(config=self.model.config)
        out = self.model(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev), past_key_values=cache,
                         use_cache=True, logits_to_keep=1)
        activated = self._activated()
        rows, seeded = [], {}
        for b, (job, e) in enumerate(zip(jobs, enc)):
            gen = self.stream
            if job.sampling.seed is not None and not job.sampling.greedy:  # one generator per request, its n rows in turn
                if job.request not in seeded:
                    seeded[job.request] = torch.Generator().manual_seed(job.sampling.seed)
                gen = seeded[job.request]
            rows.append(_Row(job, len(e), gen, logits=out.logits[b, -1].float().cpu(), activated=activated))
        return rows, cache, mask.to(dev)

    def _activated(self) -> bool:
        """Whether the served model's active adapter is activated (aLoRA): after the prompt (where PEFT
        finds its invocation) it reads every token fed, and must be told so."""
        config = getattr(self.model, "peft_config", None)
        if not config:
            return False
        active = getattr(self.model, "active_adapter", None)
        return bool(getattr(config.get(active), "alora_invocation_tokens", None))

    def _step(self, rows: list[_Row], cache: Any, mask: Any) -> Any:
        """One forward pass feeding each row its last token; returns the mask with that column."""
        import torch

        dev = self.model.device
        ids = torch.tensor([[r.ids[-1]] for r in rows], device=dev)
        pos = torch.tensor([[r.tokens_in + len(r.ids) - 1] for r in rows], device=dev)  # the last token's own position
        extra = {"alora_offsets": [1 if r.activated else None for r in rows]} if any(r.activated for r in rows) else {}
        mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True, **extra)
        logits = out.logits[:, -1].float().cpu()
        for b, r in enumerate(rows):
            r.logits = logits[b]
        return mask

    def _choose(self, r: _Row) -> bool:
        """Pick row ``r``'s next token from its logits; deliver its reply and say True when it ends."""
        import torch

        job, logits = r.job, r.logits
        if job.logprobs is not None:
            r.scored.append(torch.log_softmax(logits, dim=-1))
        if job.grammar is not None:
            from llguidance.torch import allocate_token_bitmask, apply_token_bitmask_inplace, fill_next_token_bitmask

            if r.bits is None:
                r.bits = allocate_token_bitmask(1, logits.shape[-1])
            fill_next_token_bitmask(job.grammar, r.bits, 0)
            logits = logits.clone()
            apply_token_bitmask_inplace(logits, r.bits)
        if job.sampling.greedy:
            token = int(logits.argmax())
        else:
            from transformers import TemperatureLogitsWarper, TopPLogitsWarper

            scores = TemperatureLogitsWarper(job.sampling.temperature)(None, logits[None])
            if job.sampling.top_p < 1:
                scores = TopPLogitsWarper(job.sampling.top_p)(None, scores)
            token = int(torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=r.generator)[0, 0])
        ended = token in self.eos
        if not ended:
            r.ids.append(token)
        if job.grammar is not None:
            job.grammar.consume_token(token)
            ended = ended or job.grammar.is_stopped()  # the grammar is complete: only the end token is left
        with self.lock:
            text = self.tokenizer.decode(r.ids, skip_special_tokens=True)
        cut, stopped = cut_at_stop(text, job.stops)
        if job.emit is not None:
            job.emit(text)
        if not (ended or stopped or len(r.ids) >= job.max_tokens):
            return False
        self._deliver(r, cut if stopped else text, "stop" if ended or stopped else "length", stopped)
        return True

    def _deliver(self, r: _Row, text: str, finish: Finish, stopped: bool) -> None:
        job = r.job
        logprobs = None
        ids = r.ids
        if stopped:  # the tokens inside the text cut at its stop string, and the cut text's own count
            with self.lock:
                k = 0
                while k < len(ids) and len(self.tokenizer.decode(ids[: k + 1], skip_special_tokens=True)) <= len(text):
                    k += 1
                n_out = len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            ids = ids[:k]
        else:
            n_out = len(ids)
        if job.logprobs is not None:
            logprobs = self._logprobs(r.scored[: len(ids)], ids, job.logprobs)
        if job.deliver is not None:
            job.deliver(Generated(text, r.tokens_in, n_out, finish, logprobs))

    def _logprobs(self, scored: list[Any], ids: list[int], top: int) -> tuple[TokenLogprob, ...]:
        with self.lock:
            piece = lambda t: self.tokenizer.decode([t])  # noqa: E731
            out = []
            for lp, t in zip(scored, ids):
                best = lp.topk(top) if top else None
                out.append(TokenLogprob(piece(t), float(lp[t]), tuple((piece(int(i)), float(v)) for i, v in zip(best.indices, best.values))
                                        if best is not None else ()))
            return tuple(out)


def _join(cache: Any, mask: Any, new_cache: Any, new_mask: Any) -> tuple[Any, Any]:
    """One cache of two batches: the shorter left-padded (zeros, masked out), then stacked."""
    import torch
    import torch.nn.functional as F

    a, b = mask.shape[1], new_mask.shape[1]
    width = max(a, b)
    for old, new in zip(cache.layers, new_cache.layers):
        old.keys = torch.cat([F.pad(old.keys, (0, 0, width - a, 0)), F.pad(new.keys, (0, 0, width - b, 0))], dim=0)
        old.values = torch.cat([F.pad(old.values, (0, 0, width - a, 0)), F.pad(new.values, (0, 0, width - b, 0))], dim=0)
    return cache, torch.cat([F.pad(mask, (width - a, 0)), F.pad(new_mask, (width - b, 0))], dim=0)


def _select(cache: Any, mask: Any, keep: list[int], trim: bool) -> tuple[Any, Any]:
    """The cache of rows ``keep`` only; with ``trim`` (plain dynamic layers), less the leading columns
    none of them reads."""
    import torch

    idx = torch.tensor(keep, device=mask.device)
    mask = mask.index_select(0, idx)
    if not trim:
        cache.batch_select_indices(idx)
        return cache, mask
    start = int((mask.sum(0) > 0).nonzero()[0]) if mask.numel() else 0
    for layer in cache.layers:
        layer.keys = layer.keys.index_select(0, idx)[:, :, start:]
        layer.values = layer.values.index_select(0, idx)[:, :, start:]
    return cache, mask[:, start:]
