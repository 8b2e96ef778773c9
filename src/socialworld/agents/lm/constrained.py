"""Grammar-constrained decoding for local models: output parseable by construction. Greedy, or
sampled from the model's distribution over what the grammar allows (GRPO's rollouts).

A *program* is a sequence of segments a completion must follow:

* :class:`Forced` — fixed text (``"BELIEF:"``, ``" alice restaurant="``); fed, not chosen;
* :class:`Choice` — exactly one of a finite set of strings (an option id, a legal action),
  chosen greedily token by token over the trie of the candidates' tokens (when a candidate
  ends while others go on, "end here" competes through the first token of the text that follows);
* :class:`Free` — unconstrained greedy text up to ``max_tokens`` or the stop string.

:func:`decode` runs a batch of (prompt, program) rows in lockstep on one KV cache. The token-level
common prefix of the batch's prompts (the system prompt) is prefilled once and shared. Each
forward pass feeds every unfinished row its next chosen token *plus all forced tokens that
follow it* (right-padded, masked), so the number of forward passes is the number of real
choices, not the number of output tokens. Rows that finish early stop growing. Positions are
explicit, so mid-sequence padding changes nothing: decoding a row alone or in a batch picks
the same tokens (up to float rounding; tested).

Segments may name a PEFT adapter: each forward pass then runs every row under the adapter of
the segment that will read its logits (PEFT's mixed-adapter batches, ``adapter_names=``), so one
batch can decode an action with the action adapter and an utterance with the dialogue adapter.
Where a row's first adapter is *activated* (PEFT's aLoRA: ``alora_invocation_tokens``), its
prompt up to the last invocation (the chat template's assistant header) is prefilled under the
base model, as PEFT's own generation does and as the adapter was trained
(:mod:`socialworld.learn.listwise`); everything after runs under the segments' adapters.

With :class:`MergedAdapters` (the local backend keeps one), a PEFT model's LoRA layers decode
through merged weights instead: each adapter's ``W + delta`` (PEFT's ``get_delta_weight``) computed
once per weight state and swapped into the base layers, the adapters disabled. A forward pass then
runs one adapter, so rows under different adapters take turns (the rows of the earliest segment
first: every row chooses its action, then all write their words together). PEFT's mixed-adapter
forward (each LoRA layer run per adapter, every module walked per pass to set its hooks) is the
slower path (``benchmarks/decode_speed.py`` measures both); merged weights round ``W + delta`` to the model's
dtype once, where the unmerged path adds the adapter's output in it, so a bf16 decode can pick
another token where two were within rounding of each other (``merge=False`` in :func:`decode`
keeps the unmerged path).
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence, Union


@dataclass(frozen=True)
class Forced:
    text: str


@dataclass(frozen=True)
class Choice:
    name: str
    options: tuple[str, ...]
    adapter: str | None = None
    """PEFT adapter that produces this choice's logits (None: the model as it is)"""


@dataclass(frozen=True)
class Free:
    name: str
    max_tokens: int
    stop: str = "\n"
    adapter: str | None = None


Segment = Union[Forced, Choice, Free]


def program_regex(program: Sequence[Segment]) -> str:
    """A program as a regular expression over the whole reply, for servers that constrain decoding
    by a pattern (vLLM's ``structured_outputs: {"regex": ...}``): forced text literally, a choice
    as the alternation of its options, free text as anything up to its stop string. A reply the
    local decoder could write matches it, and so does every reply the server may return."""
    parts = []
    for seg in program:
        if isinstance(seg, Forced):
            parts.append(re.escape(seg.text))
        elif isinstance(seg, Choice):
            parts.append("(?:" + "|".join(re.escape(o) for o in seg.options) + ")")
        else:
            stop = re.escape(seg.stop[0]) if seg.stop else ""
            parts.append(f"[^{stop}]*" if stop else ".*")
    return "".join(parts)


def program_from_regex(pattern: str, max_tokens: int) -> list[Segment]:
    """The program :func:`program_regex` wrote ``pattern`` from (free text of up to ``max_tokens``
    tokens; choices and free runs named by position): how a server that decodes with this module
    honours ``structured_outputs: {"regex": ...}`` from socialworld's clients. The language is that
    function's: escaped literals, ``(?:a|b|...)`` of escaped literals, ``[^c]*`` and ``.*``; any
    other pattern raises ``ValueError``."""
    segs: list[Segment] = []
    i, n = 0, len(pattern)

    def literal(stop: str) -> str:
        nonlocal i
        out = []
        while i < n and pattern[i] not in stop:
            if pattern[i] == "\\":
                if i + 1 >= n:
                    raise ValueError("the pattern ends in a lone backslash")
                out.append(pattern[i + 1])
                i += 2
            elif pattern[i] in "()[]{}.*+?|^$":
                raise ValueError(f"unsupported pattern syntax {pattern[i]!r} at {i}")
            else:
                out.append(pattern[i])
                i += 1
        return "".join(out)

    while i < n:
        if pattern.startswith("(?:", i):
            i += 3
            options = [literal("|)")]
            while i < n and pattern[i] == "|":
                i += 1
                options.append(literal("|)"))
            if i >= n or pattern[i] != ")":
                raise ValueError("an unclosed group")
            i += 1
            segs.append(Choice(f"choice{len(segs)}", tuple(options)))
        elif pattern.startswith("[^", i):
            end = pattern.find("]*", i + 2)
            body = pattern[i + 2 : end] if end > 0 else ""
            stop = body[1:] if body.startswith("\\") else body
            if end < 0 or len(stop) != 1:
                raise ValueError(f"unsupported character class at {i}: only [^c]* (one character) is")
            i = end + 2
            segs.append(Free(f"free{len(segs)}", max_tokens, stop))
        elif pattern.startswith(".*", i):
            i += 2
            segs.append(Free(f"free{len(segs)}", max_tokens, ""))
        else:
            at = i
            text = literal("([.")
            if i == at:  # a "(", "[" or "." that begins none of the above
                raise ValueError(f"unsupported pattern syntax {pattern[i]!r} at {i}")
            segs.append(Forced(text))
    return segs


@dataclass(frozen=True)
class Decoded:
    """One row's result: ``values`` by segment name, the full completion ``text``, and counts."""

    values: dict[str, str]
    text: str
    tokens_in: int
    tokens_out: int
    """completion tokens fed (forced + chosen + generated)"""
    choices: int
    """tokens the model actually chose (trie branch points and free tokens)"""
    latency_s: float
    completion_ids: tuple[int, ...] = ()
    """the completion's tokens as fed, forced and chosen"""
    chosen_mask: tuple[int, ...] = ()
    """per completion token: 1 where the model chose it (a branch of a choice, a free token, the
    token that ended a choice), 0 where the program forced it"""
    logprobs: tuple[float, ...] = ()
    """per completion token: the log-probability it was chosen with, over what the program allowed
    there (0 for a forced token)"""


def _merge_forced(program: Sequence[Segment]) -> list[Segment]:
    out: list[Segment] = []
    for seg in program:
        if isinstance(seg, Forced) and out and isinstance(out[-1], Forced):
            out[-1] = Forced(out[-1].text + seg.text)
        else:
            out.append(seg)
    return out


@dataclass
class _Row:
    program: list[Segment]
    ids: list[Any]  # per segment: a Forced text's tokens, a Choice's candidates' tokens, None for Free
    seg: int = 0
    pending: list[int] = field(default_factory=list)
    # current Choice state
    alive: list[int] = field(default_factory=list)
    offset: int = 0
    # current Free state
    free_tokens: list[int] = field(default_factory=list)
    values: dict[str, str] = field(default_factory=dict)
    text: list[str] = field(default_factory=list)
    out: int = 0  # completion tokens queued (forced + chosen + generated)
    chosen: int = 0
    completion: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    carry: float | None = None  # the log-probability of a choice's end, chosen as the next forced text's first token

    def queue(self, tokens: Sequence[int], logp: float | None = None) -> None:
        """Feed ``tokens``; the first was chosen with log-probability ``logp`` (or ``carry``), the
        rest (or all, with neither) forced."""
        self.pending += tokens
        self.out += len(tokens)
        if not tokens:
            return
        first = logp if logp is not None else self.carry
        self.carry = None
        self.completion += tokens
        self.mask += [0 if first is None else 1] + [0] * (len(tokens) - 1)
        self.logps += [first or 0.0] + [0.0] * (len(tokens) - 1)


class _Engine:
    """``generator``: sample each choice from the model's distribution over what the program allows
    there (softmax at ``temperature``), drawing from this ``torch.Generator``; None: greedy."""

    def __init__(self, tokenizer: Any, generator: Any = None, temperature: float = 1.0):
        self.tok = tokenizer
        self._ids: dict[str, list[int]] = {}
        self.generator, self.temperature = generator, temperature

    def pick(self, scores: Any) -> tuple[int, float]:
        """The index chosen among ``scores`` (logits of the allowed tokens) and its log-probability."""
        import torch

        logp = torch.log_softmax(scores.float() / (self.temperature if self.generator is not None else 1.0), -1)
        if self.generator is None:
            k = int(scores.argmax())
        else:
            k = int(torch.multinomial(logp.exp(), 1, generator=self.generator))
        return k, float(logp[k])

    def ids(self, text: str) -> list[int]:
        if text not in self._ids:
            self._ids[text] = self.tok(text, add_special_tokens=False)["input_ids"]
        return self._ids[text]

    def row(self, program: Sequence[Segment], prompt_tail: list[int]) -> _Row:
        prog = _merge_forced(program)
        ids: list[Any] = []
        for seg in prog:
            if isinstance(seg, Forced):
                ids.append(self.ids(seg.text))
            elif isinstance(seg, Choice):
                ids.append([self.ids(o) for o in seg.options])
            else:
                ids.append(None)
        r = _Row(prog, ids, pending=list(prompt_tail))  # the prompt tail is not completion
        self._enter(r)
        return r

    def _end_token(self, r: _Row) -> int:
        nxt = r.seg + 1
        if nxt < len(r.program) and isinstance(r.program[nxt], Forced) and r.ids[nxt]:
            return r.ids[nxt][0]
        return self.tok.eos_token_id

    def _enter(self, r: _Row) -> None:
        """Advance through forced segments (queueing their tokens) to the next real choice."""
        while r.seg < len(r.program):
            seg = r.program[r.seg]
            if isinstance(seg, Forced):
                r.queue(r.ids[r.seg])
                r.text.append(seg.text)
                r.seg += 1
            elif isinstance(seg, Choice):
                if not seg.options:
                    raise ValueError(f"choice {seg.name!r} has no options")
                if len(set(seg.options)) == 1:  # a one-way choice is forced
                    r.queue(r.ids[r.seg][0])
                    r.values[seg.name] = seg.options[0]
                    r.text.append(seg.options[0])
                    r.seg += 1
                    continue
                r.alive, r.offset = list(range(len(seg.options))), 0
                return
            else:
                r.free_tokens = []
                return

    def _finish_choice(self, r: _Row, k: int) -> None:
        seg = r.program[r.seg]
        assert isinstance(seg, Choice)
        r.values[seg.name] = seg.options[k]
        r.text.append(seg.options[k])
        r.seg += 1
        self._enter(r)

    def step(self, r: _Row, logits: Any) -> None:
        """Choose the next token for ``r`` from ``logits`` (its last position's), queue it and
        any forced tokens that follow."""
        seg = r.program[r.seg]
        if isinstance(seg, Choice):
            cands = r.ids[r.seg]
            cont = {cands[k][r.offset] for k in r.alive if len(cands[k]) > r.offset}
            ended = [k for k in r.alive if len(cands[k]) == r.offset]
            end_tok = self._end_token(r) if ended else None
            allowed = sorted(cont | ({end_tok} if end_tok is not None else set()))
            k, logp = self.pick(logits[allowed])
            pick = allowed[k]
            r.chosen += 1
            if ended and pick == end_tok and pick not in cont:
                r.carry = logp
                self._finish_choice(r, ended[0])  # the end token is the next forced text's first token
                r.carry = None  # (the end of the program: nothing followed to carry it)
                return
            r.queue([pick], logp)
            r.alive = [k for k in r.alive if len(cands[k]) > r.offset and cands[k][r.offset] == pick]
            r.offset += 1
            if len(r.alive) == 1:  # unique from here on: fast-forward the rest of it
                k = r.alive[0]
                r.queue(cands[k][r.offset :])
                self._finish_choice(r, k)
            return
        assert isinstance(seg, Free)
        pick, logp = self.pick(logits)
        r.chosen += 1
        piece = self.tok.decode([pick], skip_special_tokens=False)
        stop = pick == self.tok.eos_token_id or (seg.stop and seg.stop in piece)
        if not stop:
            r.free_tokens.append(pick)
            r.queue([pick], logp)
        if stop or len(r.free_tokens) >= seg.max_tokens:
            value = self.tok.decode(r.free_tokens, skip_special_tokens=True)
            r.values[seg.name] = value
            r.text.append(value)
            r.seg += 1
            if r.seg < len(r.program) and stop:
                r.queue([pick], logp)
            self._enter(r)


def activation_start(ids: Sequence[int], invocation: Sequence[int]) -> int:
    """Where an activated adapter starts acting on ``ids``: the start of the last occurrence of
    its ``invocation`` tokens (PEFT's ``calculate_alora_offsets``), else the end of ``ids`` (the
    adapter acts on what follows them)."""
    n = len(invocation)
    for i in range(len(ids) - n, -1, -1):
        if list(ids[i : i + n]) == list(invocation):
            return i
    return len(ids)


def adapter_invocation(model: Any, adapter: str | None) -> list[int] | None:
    """``adapter``'s aLoRA invocation tokens in ``model`` (None: not an activated adapter, or none)."""
    config = getattr(model, "peft_config", {}).get(adapter) if adapter else None
    return getattr(config, "alora_invocation_tokens", None)


class PrefixCache:
    """KV states of prompt prefixes (batch 1, per layer), kept across calls, least recently used
    dropped beyond ``max_entries``. Valid for one model state only: clear it when weights change."""

    def __init__(self, max_entries: int = 32):
        self.max_entries = max_entries
        self._kv: OrderedDict[tuple[str | None, tuple[int, ...]], list[tuple[Any, Any]]] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, model: Any, ids: tuple[int, ...], adapter: str | None = None) -> list[tuple[Any, Any]]:
        import torch

        key = (adapter, ids)
        if key in self._kv:
            self.hits += 1
            self._kv.move_to_end(key)
            return self._kv[key]
        self.misses += 1
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([ids], device=model.device), use_cache=True, logits_to_keep=1,
                        **({"adapter_names": [adapter]} if adapter else {}))
        kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        self._kv[key] = kv
        if len(self._kv) > self.max_entries:
            self._kv.popitem(last=False)
        return kv

    def clear(self) -> None:
        self._kv.clear()


BASE = "__base__"
"""the group of rows a forward pass runs under the base model (every adapter disabled)"""


class MergedAdapters:
    """Each PEFT adapter of a model merged into copies of its LoRA layers' base weights, kept while
    the weights they came from are unchanged (every weight's identity and in-place version is the
    key: an optimizer step or a reloaded adapter recomputes them). In a :meth:`session` the model
    runs under one adapter at a time, or under :data:`BASE`, with plain layers. Only for models
    whose LoRA layers are all linear (:meth:`supports`); the decoder falls back to PEFT's
    mixed-adapter forward otherwise."""

    def __init__(self) -> None:
        self._merged: dict[str, tuple[tuple[Any, ...], dict[Any, Any]]] = {}

    @staticmethod
    def _layers(model: Any) -> list[Any]:
        from peft.tuners.lora import LoraLayer

        return [m for m in model.modules() if isinstance(m, LoraLayer)]

    def supports(self, model: Any) -> bool:
        """Whether ``model`` is a PEFT model whose LoRA layers are all ``nn.Linear`` ones."""
        if not hasattr(model, "peft_config") or not hasattr(model, "disable_adapter"):
            return False
        import torch
        from peft.tuners.lora import Linear

        layers = self._layers(model)
        return bool(layers) and all(isinstance(m, Linear) and isinstance(m.base_layer, torch.nn.Linear) for m in layers)

    def _weights(self, model: Any, adapter: str) -> dict[Any, Any]:
        import torch

        layers = [m for m in self._layers(model) if adapter in m.lora_A]
        if not layers and adapter not in getattr(model, "peft_config", {}):
            raise KeyError(f"no adapter {adapter!r} in the model")
        key = tuple((id(t), t._version) for m in layers
                    for t in (m.base_layer.weight, m.lora_A[adapter].weight, m.lora_B[adapter].weight))
        got = self._merged.get(adapter)
        if got is None or got[0] != key:
            with torch.inference_mode(False), torch.no_grad():  # weights that outlive a decoder's inference block
                w = {m: torch.nn.Parameter((m.base_layer.weight.float() + m.get_delta_weight(adapter).float())
                                           .to(m.base_layer.weight.dtype), requires_grad=False) for m in layers}
            got = self._merged[adapter] = (key, w)
        return got[1]

    @contextmanager
    def session(self, model: Any) -> Iterator[Callable[[str], None]]:
        """A block in which ``model``'s adapters are disabled and ``switch(adapter)`` puts that
        adapter's merged weights in place (:data:`BASE`: the base model's); on leaving, the base
        weights are back and the adapters enabled. (PEFT's ``disable_adapter`` walks every module:
        entered once per decoded batch, not once per pass.)"""
        original: dict[Any, Any] = {}
        now = BASE

        def switch(adapter: str) -> None:
            nonlocal now
            if adapter == now:
                return
            for m, w in original.items():  # the base weights back first: merges start from them
                m.base_layer.weight = w
            original.clear()
            for m, w in ({} if adapter == BASE else self._weights(model, adapter)).items():
                original[m] = m.base_layer.weight
                m.base_layer.weight = w
            now = adapter

        with model.disable_adapter():
            try:
                yield switch
            finally:
                switch(BASE)


def decode(model: Any, tokenizer: Any, prompts: Sequence[str], programs: Sequence[Sequence[Segment]],
           batch_size: int = 16, prefixes: Sequence[str] | None = None,
           prefix_cache: PrefixCache | None = None, merged: MergedAdapters | None = None,
           merge: bool = True, sample: Any = None, temperature: float = 1.0) -> list[Decoded]:
    """Decode each prompt under its program (greedy, constrained); batched in chunks of rows of
    similar prompt and program length (less padding), results in input order.

    ``sample`` (a ``torch.Generator``): sample each choice from the model's distribution over what
    the program allows there, at ``temperature``, instead of taking the most likely (the rows'
    draws follow the chunks' order, so the same inputs and generator state draw the same turns).

    ``prefixes[i]``, when given, is a prefix of ``prompts[i]`` (e.g. the system message) whose KV
    state is computed once and kept in ``prefix_cache``; without them each chunk shares the
    longest common token prefix of its prompts. ``merged``: a PEFT model's adapters decode
    through merged weights kept there (:class:`MergedAdapters`; a new one each call when not
    given); a model it does not support, or ``merge=False``, decodes through PEFT's mixed-adapter
    forward (the adapters' outputs added unmerged, as in training)."""
    order = sorted(range(len(prompts)), key=lambda i: (len(programs[i]), len(prompts[i])))
    cache = prefix_cache if prefix_cache is not None else PrefixCache()
    merged = merged if merged is not None else MergedAdapters()
    merged_or_none = merged if merge and merged.supports(model) else None
    out: dict[int, Decoded] = {}
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        rows = _decode_chunk(model, tokenizer, [prompts[i] for i in idx], [programs[i] for i in idx],
                             None if prefixes is None else [prefixes[i] for i in idx], cache, merged_or_none,
                             _Engine(tokenizer, sample, temperature))
        out.update(zip(idx, rows))
    return [out[i] for i in range(len(prompts))]


def _completion_bound(r: _Row) -> int:
    """Most completion tokens row ``r`` can still take (forced + longest choice + end + free)."""
    n = 0
    for seg, ids in zip(r.program[r.seg :], r.ids[r.seg :]):
        if isinstance(seg, Forced):
            n += len(ids)
        elif isinstance(seg, Choice):
            n += max(len(c) for c in ids) + 1
        else:
            n += seg.max_tokens + 1
    return n


class _Cache:
    """A preallocated KV cache (transformers' ``StaticCache``) that grows by reallocation when
    a decode outruns it: appending never copies the whole cache each step (``DynamicCache``
    concatenates the whole cache at every step, a large share of a decoding step)."""

    kv: Any
    """the ``StaticCache``"""
    mask: Any
    """which of its positions each row has filled (batch x capacity)"""

    def __init__(self, model: Any, batch: int, capacity: int):
        self.model, self.batch, self.used = model, batch, 0
        self._alloc(capacity)

    def _alloc(self, capacity: int) -> None:
        import torch
        from transformers import StaticCache

        old, old_mask = getattr(self, "kv", None), getattr(self, "mask", None)
        self.capacity = capacity
        self.kv = StaticCache(config=self.model.config, max_cache_len=capacity)
        self.mask = torch.zeros((self.batch, capacity), dtype=torch.long, device=self.model.device)
        if old is not None and old_mask is not None and self.used:
            for new_layer, layer in zip(self.kv.layers, old.layers):
                new_layer.update(layer.keys[:, :, : self.used], layer.values[:, :, : self.used])
            self.mask[:, : self.used] = old_mask[:, : self.used]

    def reserve(self, width: int) -> None:
        if self.used + width > self.capacity:
            self._alloc(3 * (self.used + width) // 2)

    def fill(self, keys_values: list[tuple[Any, Any]], lengths: Sequence[int]) -> None:
        """Write per-row prefixes (right-padded to one width; row b real up to lengths[b])."""
        for layer, (k, v) in zip(self.kv.layers, keys_values):
            layer.update(k, v)
        self.used = keys_values[0][0].shape[2]
        for b, n in enumerate(lengths):
            self.mask[b, :n] = 1


def _decode_chunk(model: Any, tokenizer: Any, prompts: Sequence[str], programs: Sequence[Sequence[Segment]],
                  prefixes: Sequence[str] | None, prefix_cache: PrefixCache,
                  merged: MergedAdapters | None = None, eng: _Engine | None = None) -> list[Decoded]:
    """One chunk of :func:`decode`'s rows: planned, prefilled, stepped to the end, finished (:class:`_Chunk`)."""
    import torch

    t0 = time.perf_counter()
    chunk = _Chunk.plan(model, tokenizer, prompts, programs, prefixes, eng if eng is not None else _Engine(tokenizer))
    with torch.inference_mode(), ExitStack() as stack:
        chunk.prefill(prefix_cache)
        switch = stack.enter_context(merged.session(model)) if merged is not None else None
        while chunk.step(switch):
            pass
    return chunk.finish(time.perf_counter() - t0)


@dataclass
class _Chunk:
    """The state of one chunk's decode, advanced in three steps: :meth:`plan` (tokenize; each row's
    prefix from the shared or given one, and where an activated adapter's first segment needs the prompt
    up to its invocation under the base model), :meth:`prefill` (the prefixes' KV states, from the prefix
    cache, into one :class:`_Cache`), :meth:`step` (one forward pass over every row's pending tokens,
    each row's next choice read from its logits) until no row has tokens to feed, and :meth:`finish`."""

    model: Any
    eng: _Engine
    enc: list[list[int]]
    """each row's prompt tokens"""
    pre: list[tuple[int, ...]]
    """each row's prefix (the tokens whose KV state comes from the prefix cache)"""
    rows: list[_Row]
    mixed: bool
    """whether the programs name adapters (each forward pass then runs each row under its segment's)"""
    active: str | None
    """the adapter that runs where none is named (a PEFT model's active one)"""
    invs: list[list[int] | None]
    """each row's first adapter's invocation tokens, where that adapter is activated (aLoRA)"""
    base_end: list[int]
    """where each activated row's prompt stops running under the base model"""
    pad: int
    cache: Any = None
    """the :class:`_Cache` (from :meth:`prefill`)"""
    next_pos: Any = None
    """each row's next position (a tensor, from :meth:`prefill`)"""
    activated: bool = False
    """whether any adapter the forwards run is activated: it is told how many of a forward's tokens it acts on"""
    base_pass: bool = False
    """the next forward feeds the activated rows' prompt tails before their invocation, under the base model"""
    rest: list[list[int]] = field(default_factory=list)
    """each row's pending tokens after the base pass"""

    @classmethod
    def plan(cls, model: Any, tokenizer: Any, prompts: Sequence[str], programs: Sequence[Sequence[Segment]],
             prefixes: Sequence[str] | None, eng: _Engine) -> _Chunk:
        enc = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        if prefixes is None:  # the chunk's longest common token prefix, leaving each row a token of its own
            n = min(len(e) for e in enc) - 1
            for i in range(n):
                if any(e[i] != enc[0][i] for e in enc):
                    n = i
                    break
            pre = [tuple(e[:n]) for e in enc]
        else:  # a given prefix counts only where it tokenizes as the start of the whole prompt
            pre = []
            for text, e in zip(prefixes, enc):
                given = eng.ids(text)
                pre.append(tuple(given) if 0 < len(given) < len(e) and e[: len(given)] == given else ())
        # rows whose first adapter is activated: the prompt before its invocation under the base model
        mixed = any(getattr(seg, "adapter", None) for prog in programs for seg in prog)
        active = getattr(model, "active_adapter", None) if hasattr(model, "peft_config") else None  # what runs unnamed
        first_adapter = [next((a for seg in prog if (a := getattr(seg, "adapter", None))), None) if mixed else active
                         for prog in programs]
        invs = [adapter_invocation(model, a) for a in first_adapter]
        base_end = [activation_start(e, inv) if inv is not None else 0 for e, inv in zip(enc, invs)]
        pre = [p[:s] if inv is not None else p for p, s, inv in zip(pre, base_end, invs)]
        rows = [eng.row(prog, e[len(p) :]) for prog, e, p in zip(programs, enc, pre)]
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        return cls(model, eng, enc, pre, rows, mixed, active, invs, base_end, pad)

    def adapter(self, r: _Row) -> str:
        """The adapter of row ``r``'s current segment (``BASE`` where none)."""
        return (getattr(r.program[r.seg], "adapter", None) if r.seg < len(r.program) else None) or BASE

    def group(self, r: _Row) -> str:
        """The adapter a forward pass for row ``r``'s pending tokens runs under."""
        return self.adapter(r) if self.mixed else self.active or BASE

    def prefill(self, prefix_cache: PrefixCache) -> None:
        """The cache, sized for the longest row with headroom (rows drift apart), holding each row's prefix."""
        import torch

        model, rows, pre, B = self.model, self.rows, self.pre, len(self.rows)
        N = max(len(p) for p in pre)
        self.cache = _Cache(model, B, N + max(len(e) - len(p) for e, p in zip(self.enc, pre))
                            + 3 * max(_completion_bound(r) for r in rows) // 2 + 16)
        first = [BASE if inv is not None else self.adapter(r) if self.mixed else None for r, inv in zip(rows, self.invs)]
        if N:
            kvs = {(a, p): prefix_cache.get(model, p, a) for a, p in zip(first, pre) if p}
            layers = []
            for li, (k0, v0) in enumerate(next(iter(kvs.values()))):
                k = k0.new_zeros((B, k0.shape[1], N, k0.shape[3]))
                v = v0.new_zeros((B, v0.shape[1], N, v0.shape[3]))
                for b, p in enumerate(pre):
                    if p:
                        k[b, :, : len(p)] = kvs[(first[b], p)][li][0][0]
                        v[b, :, : len(p)] = kvs[(first[b], p)][li][1][0]
                layers.append((k, v))
            self.cache.fill(layers, [len(p) for p in pre])
        self.next_pos = torch.tensor([len(p) for p in pre], dtype=torch.long, device=model.device)
        # an activated adapter acts on a forward's tokens where it is told how many (PEFT would look for
        # its invocation in them, and the cache holds it)
        named = {getattr(seg, "adapter", None) for r in rows for seg in r.program} | {None if self.mixed else self.active}
        self.activated = any(adapter_invocation(model, a) is not None for a in named)
        # the activated rows' prompt tails before their invocation: one pass under the base model
        self.rest = [r.pending[s - len(p) :] if inv is not None else r.pending
                     for r, p, s, inv in zip(rows, pre, self.base_end, self.invs)]
        self.base_pass = any(len(x) < len(r.pending) for x, r in zip(self.rest, rows))
        if self.base_pass:
            for r, x, inv in zip(rows, self.rest, self.invs):
                r.pending = r.pending[: len(r.pending) - len(x)] if inv is not None else []

    def step(self, switch: Callable[[str], None] | None = None) -> bool:
        """One forward pass (under merged weights, one adapter a pass through ``switch``; else PEFT's
        mixed-adapter forward); False, running nothing, when no row has tokens to feed."""
        import torch

        model, rows, cache, B = self.model, self.rows, self.cache, len(self.rows)
        run = BASE if self.base_pass else None
        if switch is not None and not self.base_pass:  # one adapter a pass: the rows of the earliest segment first
            waiting = [r for r in rows if r.pending]
            run = self.group(min(waiting, key=lambda r: r.seg)) if waiting else BASE
        lens = [len(r.pending) if run is None or self.base_pass or self.group(r) == run else 0 for r in rows]
        width = max(lens)
        if width == 0:
            return False
        dev = model.device
        ids = torch.full((B, width), self.pad, dtype=torch.long)
        step_mask = torch.zeros((B, width), dtype=torch.long)
        for b, r in enumerate(rows):
            if lens[b]:
                ids[b, : lens[b]] = torch.tensor(r.pending)
                step_mask[b, : lens[b]] = 1
        ids, step_mask = ids.to(dev), step_mask.to(dev)  # built on the host, moved once per step
        pos = self.next_pos[:, None] + torch.arange(width, device=dev)[None, :]
        cache.reserve(width)
        cache.mask[:, cache.used : cache.used + width] = step_mask
        cache.used += width
        keep = sorted({n_b - 1 for n_b in lens if n_b})  # only the positions whose logits are read
        if switch is not None:
            assert run is not None
            switch(run)
            o = model(input_ids=ids, attention_mask=cache.mask, position_ids=pos, past_key_values=cache.kv,
                      use_cache=True, logits_to_keep=torch.tensor(keep, device=dev))
        else:
            names = [BASE] * B if self.base_pass else [self.adapter(r) for r in rows] if self.mixed else None
            o = model(input_ids=ids, attention_mask=cache.mask, position_ids=pos, past_key_values=cache.kv,
                      use_cache=True, logits_to_keep=torch.tensor(keep, device=dev),
                      **({"adapter_names": names} if names is not None else {}),
                      # past its invocation an activated adapter acts on every token fed
                      **({"alora_offsets": [width] * B} if self.activated and not self.base_pass else {}))
        logits = o.logits.float().cpu()  # the grammar reads a few entries per row: one copy per step
        self.next_pos += torch.tensor(lens, device=dev)
        if self.base_pass:  # the tails are in the cache: on with the rows' own tokens
            self.base_pass = False
            for r, x in zip(rows, self.rest):
                r.pending = x
            return True
        for b, r in enumerate(rows):
            if lens[b]:
                r.pending = []
                if r.seg < len(r.program):
                    self.eng.step(r, logits[b, keep.index(lens[b] - 1)])
                if r.seg >= len(r.program):
                    r.pending = []  # finished: its last tokens need no logits
        return True

    def finish(self, seconds: float) -> list[Decoded]:
        """Each row's result, with ``seconds`` (the chunk's) shared evenly among its rows."""
        dt = seconds / len(self.rows)
        return [Decoded(r.values, "".join(r.text), len(e), r.out, r.chosen, dt, tuple(r.completion), tuple(r.mask),
                        tuple(r.logps)) for r, e in zip(self.rows, self.enc)]
