"""A listwise objective over the legal actions of a state, on the same PEFT LoRA adapters.

Constrained decoding (:mod:`socialworld.agents.lm.constrained`) picks the action greedily over the
token trie of the legal actions: at each branch point the model's logits restricted to the
children there. So the policy's distribution over legal actions is

    P(a | s) = prod_j softmax_{allowed(node_j)}(logits_j)[a_j]

(the trie's children of ``a``'s first j tokens; a node with one child contributes 1). This trainer
fits that distribution to a soft target over the candidates the sleep phase scored
(:attr:`socialworld.learn.pairs.Pair.candidates`, values from the simulator):

    support = {chosen} + {a : V(a) >= V(chosen) + value_margin}
    p(a) = exp(V(a) / value_temperature) / sum_{b in support} exp(V(b) / value_temperature)

chosen is the pair's own label (the expert's action, DAgger's), kept where the values do not
separate the candidates by ``value_margin``; where a candidate beats it by that much, the
simulator's improvement takes the mass. The loss per state is

    L = NLL(BELIEF line, SAY line of chosen) / tokens - W * sum_a p(a) log P(a | s)

the words and belief by plain next-token likelihood (the warm start, what SFT taught), the
decision by the listwise term only: a gradient that moves mass among legal actions alone, never
toward text the decoder cannot write. :data:`DECISION_WEIGHT` is chosen, not derived: the decision's
summed log-probabilities (many nats untrained) can dominate a row's clipped gradient and slow the
words, while at cloning's own share (the decision's few branch tokens among a turn's many) the
decision barely moves. A pair without candidates has the support {chosen} (and without a legal set
its action is learned by likelihood too). The bench's recipe (``bench.RECIPE_TRAIN``) sets W = 1 on
an activated adapter, with the label as the only target, and trains long enough to fit both terms
(design.md, the learning recipe).

One row per state: the prompt and the BELIEF line once, then one block per support candidate
(its action tokens; chosen's followed by its SAY line), each block attending to the shared prefix
and to itself (a 4-D attention mask, position ids continuing the prefix): one forward pass scores
every candidate. TRL has no listwise trainer; this one is a plain AdamW loop over the PEFT model
(the same LoRA layers, saving, record and seeds as TRL's: :mod:`socialworld.learn.trainers.listwise`).

An *activated* adapter (PEFT's aLoRA: ``alora_invocation_tokens``, the chat template's assistant
header; :attr:`TrainConfig.activated`) acts from the reply's header on: the prompt is the base
model's. Each batch then reads its prompts once under the base model without gradient (their KV
cache) and runs only the replies (header, BELIEF line, candidate blocks) through the adapter: the
prompt, most of a row's tokens, never enters the backward pass. The base model's weights never change, so
neither does a prompt's KV, nor, below the first layer the adapter trains, the reply's hidden
states: :class:`PromptKV` keeps each row's (up to :data:`PROMPT_KV_BYTES`), and a row seen again in a
later pass skips its prompt and runs its reply through the adapted layers alone (the upper half for
the bench's recipe). The loop keeps one store for all its trainings: a cycle replays earlier
cycles' rows, and the dialogue track trains on the action track's. The decoder prefills such an adapter's prompts under the
base model too (:mod:`socialworld.agents.lm.constrained`).
"""

from __future__ import annotations

import math
import random
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from socialworld.agents.lm.constrained import activation_start, adapter_invocation
from socialworld.learn.config import TrainConfig
from socialworld.learn.pairs.record import Pair
from socialworld.text.reply import ACTION, SAY, action_kind, reply_fields


@dataclass(frozen=True)
class Row:
    """One state's tokens and targets."""

    ids: list[int]
    positions: list[int]
    blocks: list[tuple[int, int]]
    """[start, end) of each block after the shared prefix (the prefix is ``ids[:blocks[0][0]]``)"""
    nll: list[int]
    """positions whose next token is trained by likelihood (the position predicting ``ids[i + 1]``
    within the prefix, or a block's own next token)"""
    nll_targets: list[int]
    choices: list[tuple[int, int, list[int], int]]
    """(candidate index, predicting position, allowed token ids, target token) at each branch point"""
    probs: list[float]
    """target probability of each candidate (block)"""
    keys: list[str]
    """the action key of each candidate (block), chosen's first"""
    kind: str | None
    shared: int = 0
    """how many of the prompt's first tokens are its system message (the same in every row of a
    scenario, so :class:`PromptKV` reads them once); 0 where the prompt has none"""


def targets(pair: Pair, temperature: float, margin: float) -> dict[str, float]:
    """The soft target over actions at ``pair``'s state (see the module docstring)."""
    chosen = reply_fields(pair.chosen[-1]["content"]).get("ACTION", "")
    values = {c.key: c.value for c in pair.candidates or ()}
    if chosen not in values:
        return {chosen: 1.0}
    support = [chosen] + sorted(k for k, v in values.items() if k != chosen and v >= values[chosen] + margin)
    top = max(values[k] for k in support)
    w = {k: math.exp((values[k] - top) / temperature) for k in support}
    z = sum(w.values())
    return {k: x / z for k, x in w.items()}


def _trie(keys: Sequence[list[int]]) -> dict[tuple[int, ...], set[int]]:
    children: dict[tuple[int, ...], set[int]] = {}
    for ids in keys:
        for j in range(len(ids)):
            children.setdefault(tuple(ids[:j]), set()).add(ids[j])
    return children


def build_row(pair: Pair, tok: Any, temperature: float, margin: float, max_length: int,
              encoded: dict[str, list[int]] | None = None) -> Row | None:
    """The row of one pair (None when its prompt alone fills ``max_length``). ``encoded``: the
    token ids of action keys and the reply's fixed pieces, kept across the rows of a run (a state
    has about 50 legal actions, the same in many rows)."""
    turn = pair.chosen[-1]["content"]
    fields = reply_fields(turn)
    head = turn.split(f"\n{ACTION}", 1)[0] + f"\n{ACTION}"
    words = fields.get("SAY", "")
    prompt = tok.apply_chat_template(pair.prompt, tokenize=False, add_generation_prompt=True)
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    known = encoded if encoded is not None else {}

    def piece(text: str) -> list[int]:
        if text not in known:
            known[text] = enc(text)
        return known[text]
    prompt_ids, head_ids = enc(prompt), enc(head)
    # the system message counts as shared only where it tokenizes as the prompt's start (as the decoder's prefixes)
    try:
        system = enc(tok.apply_chat_template(pair.prompt[:1], tokenize=False)) if pair.prompt[0]["role"] == "system" else []
    except Exception:  # a template that refuses a system message alone (some want a user turn): nothing shared
        system = []
    shared = len(system) if 0 < len(system) < len(prompt_ids) and prompt_ids[: len(system)] == system else 0
    prefix = prompt_ids + head_ids
    if len(prefix) >= max_length:
        return None
    probs = targets(pair, temperature, margin)
    chosen = fields.get("ACTION", "")
    children = _trie([piece(" " + k) for k in pair.legal or ()])
    tail = piece(f"\n{SAY}") + (enc(" " + words) if words else []) + [tok.eos_token_id]
    ids, positions = list(prefix), list(range(len(prefix)))
    nll = list(range(len(prompt_ids) - 1, len(prefix) - 1))
    nll_targets = [prefix[i + 1] for i in nll]
    blocks, choices, plist, keys = [], [], [], []
    n = len(prefix)
    for ci, (key, p) in enumerate(sorted(probs.items(), key=lambda kv: kv[0] != chosen)):
        cand = piece(" " + key)
        block = cand + (tail if key == chosen else [])
        start = len(ids)
        for j, t in enumerate(cand if pair.legal else ()):
            allowed = sorted(children.get(tuple(cand[:j]), {t}))
            if len(allowed) > 1:
                choices.append((ci, n - 1 if j == 0 else start + j - 1, allowed, t))
        # chosen's SAY line by likelihood (and its action too where the legal set was not recorded)
        for j in range(len(cand) if pair.legal else 0, len(block)):
            nll.append(n - 1 if j == 0 else start + j - 1)
            nll_targets.append(block[j])
        ids += block
        positions += list(range(n, n + len(block)))
        blocks.append((start, len(ids)))
        plist.append(p)
        keys.append(key)
    return Row(ids, positions, blocks, nll, nll_targets, choices, plist, keys, action_kind(turn), shared)


def _row_mask(r: Row) -> Any:
    """Row ``r``'s attention (query x key, True: attends): causal over the shared prefix; each block
    attends to the prefix and causally to itself."""
    import torch

    L = len(r.ids)
    n = r.blocks[0][0] if r.blocks else L
    mask = torch.zeros((L, L), dtype=torch.bool)
    mask[:n, :n] = torch.ones(n, n, dtype=torch.bool).tril()
    for s, e in r.blocks:
        mask[s:e, :n] = True
        mask[s:e, s:e] = torch.ones(e - s, e - s, dtype=torch.bool).tril()
    return mask


def _batch(rows: Sequence[Row], pad: int) -> tuple[Any, Any, Any]:
    """Right-padded ids and position ids, and the 4-D attention mask (None where every row is one
    block: then plain causal attention is the same, and SDPA keeps its fused kernel)."""
    import torch

    L = max(len(r.ids) for r in rows)
    ids = torch.full((len(rows), L), pad, dtype=torch.long)
    pos = torch.zeros((len(rows), L), dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, : len(r.ids)] = torch.tensor(r.ids)
        pos[b, : len(r.ids)] = torch.tensor(r.positions)
    if all(len(r.blocks) <= 1 for r in rows):
        return ids, pos, None
    mask = torch.zeros((len(rows), 1, L, L), dtype=torch.bool)
    for b, r in enumerate(rows):
        mask[b, 0, : len(r.ids), : len(r.ids)] = _row_mask(r)
        for i in range(len(r.ids), L):  # padding attends to itself (no empty softmax)
            mask[b, 0, i, i] = True
    return ids, pos, mask


Logits = Callable[[Sequence[tuple[int, Sequence[int]]]], list[Any]]
"""``logits([(b, positions), ...])``: the float logits at row ``b``'s given positions (row indices),
one tensor per request, every request gathered by one indexing of the batch's logits (one backward
node: a node per request allocated a gradient the size of the whole batch's logits each, a fifth of
an activated step here)"""


def _gather(flat: Any, width: int, requests: Sequence[tuple[int, Sequence[int]]], head: Any = None) -> list[Any]:
    """``requests``' rows of ``flat`` (the batch's logits or hidden states, rows ``b * width + i``),
    through ``head`` when given, as float tensors."""
    import torch

    idx = [b * width + i for b, at in requests for i in at]
    sel = flat[torch.tensor(idx, dtype=torch.long, device=flat.device)]
    sel = (head(sel) if head is not None else sel).float()
    return list(torch.split(sel, [len(at) for _, at in requests]))


def invocation(model: Any) -> list[int] | None:
    """The active adapter's aLoRA invocation tokens (None: not an activated adapter)."""
    return adapter_invocation(model, getattr(model, "active_adapter", None))


def _kept(t: Any) -> Any:
    """A copy of ``t`` (a key or value tensor, or a view of one) to keep, in the dtype attention
    reads it in: under autocast to a lower precision (bf16 training on a CPU or GPU with it), SDPA
    casts its inputs to that dtype, so a key kept there (RoPE leaves keys in float32, a third of a
    prompt's KV bytes) gives the same scores from a third fewer bytes; otherwise as it is."""
    import torch

    dev = t.device.type
    if torch.is_autocast_enabled(dev) and t.is_floating_point() and t.dtype != torch.get_autocast_dtype(dev):
        return t.to(torch.get_autocast_dtype(dev))  # a new tensor
    return t.clone()


PROMPT_KV_BYTES = 4 << 30
"""the most bytes :class:`PromptKV` keeps. The bundled model's KV is 46 kB a prompt token in float32,
23 kB in bf16; with LoRA on its upper half (the bench's recipe) a row keeps only those 15 layers'
prompt KV, 11.5 kB a token in bf16, and its reply's hidden states at the first of them: a few MB a
row, so the cap holds the rows a main job's cycle reads. Rows beyond it are read each time."""


def _decoder(model: Any) -> Any:
    """The module holding ``model``'s decoder layers as ``.layers`` (a PEFT model's base model's
    ``.model``, as in Llama-like models), or None where it has no such list."""
    import torch

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner = getattr(base, "model", None)
    return inner if isinstance(getattr(inner, "layers", None), torch.nn.ModuleList) else None


def frozen_below(model: Any) -> int | None:
    """The first decoder layer with a trainable parameter, where the embeddings and every layer
    below it are frozen (the bench's LoRA on the upper half: 15 of the bundled model's 30); None
    where that cannot be told (no ``.layers`` decoder, a trainable parameter outside the layers
    before them)."""
    import re

    if _decoder(model) is None:
        return None
    first = None
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        m = re.search(r"\.layers\.(\d+)\.", name)
        if m is None:
            if "embed" in name:
                return None  # the inputs themselves train: nothing below the layers is frozen
            continue  # the final norm or head: after every layer
        first = int(m.group(1)) if first is None else min(first, int(m.group(1)))
    return first


@contextmanager
def _only_layers(decoder: Any, lo: int, hi: int) -> Iterator[None]:
    """Within: ``decoder`` runs its layers ``lo`` to ``hi - 1`` only (each keeps its own index into
    the KV cache), then all of them again."""
    import torch

    full = decoder.layers
    decoder.layers = torch.nn.ModuleList(list(full)[lo:hi])
    try:
        yield
    finally:
        decoder.layers = full


@contextmanager
def _all_tokens_active(model: Any) -> Iterator[None]:
    """Within: the adapter's layers run as plain LoRA, for a forward whose every token follows its
    invocation (``alora_offsets = [T] * B``: an activated adapter's replies, their prompts read apart).
    PEFT's aLoRA path would mask nothing there, yet it selects every token and scatters the sum back
    (``index``, ``index_put`` and their backward, a share of every training step), and
    casts each input to the adapter's float32 only for autocast to cast it back to bfloat16. The sum
    is the same; the graph recorded within is kept for the backward pass."""
    import torch
    from peft.tuners.lora.layer import LoraLayer

    autocast = torch.is_autocast_enabled(next(model.parameters()).device.type)
    kept: list[tuple[Any, dict[str, Any], bool]] = []
    for m in model.modules():
        if isinstance(m, LoraLayer) and m.lora_variant:
            kept.append((m, dict(m.lora_variant), getattr(m, "cast_input_dtype_enabled", True)))
            m.lora_variant.clear()
            if autocast:  # the matmul's dtype is autocast's whatever the input's
                m.cast_input_dtype_enabled = False
    try:
        yield
    finally:
        for m, variants, cast in kept:
            m.lora_variant.update(variants)
            m.cast_input_dtype_enabled = cast


def _reply_batch(rows: Sequence[Row], starts: Sequence[int], pad: int) -> tuple[Any, Any, Any, int, int]:
    """The rows' replies (row b's ids from ``starts[b]`` on), right-padded: ids, position ids and the
    4-D attention mask over the prompts' KV (``P`` = the longest prompt, right-padded) and the
    replies (``T`` = the longest reply); returns ``(ids, pos, mask, P, T)``."""
    import torch

    B, P = len(rows), max(starts)
    T = max(len(r.ids) - s for r, s in zip(rows, starts))
    ids = torch.full((B, T), pad, dtype=torch.long)
    pos = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, 1, T, P + T), dtype=torch.bool)
    for b, (r, s) in enumerate(zip(rows, starts)):
        n = len(r.ids) - s
        ids[b, :n] = torch.tensor(r.ids[s:])
        pos[b, :n] = torch.tensor(r.positions[s:])
        full = _row_mask(r)
        mask[b, 0, :n, :s] = full[s:, :s]
        mask[b, 0, :n, P : P + n] = full[s:, s:]
        for i in range(n, T):  # padding attends to itself (no empty softmax)
            mask[b, 0, i, P + i] = True
    return ids, pos, mask, P, T


def _stack(rows: Sequence[Sequence[tuple[Any, Any]]], width: int) -> list[tuple[Any, Any]]:
    """Per layer, the rows' keys and values (each ``(1, heads, length, dim)``) in one batch,
    right-padded with zeros to ``width`` positions (the attention mask leaves them out)."""
    import torch
    import torch.nn.functional as F

    pad_to = lambda t: F.pad(t, (0, 0, 0, width - t.shape[2]))  # noqa: E731
    return [(torch.cat([pad_to(r[i][0]) for r in rows]), torch.cat([pad_to(r[i][1]) for r in rows])) for i in range(len(rows[0]))]


def _kv_bytes(kv: Sequence[tuple[Any, Any]]) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)


@dataclass
class _Kept:
    """What :class:`PromptKV` keeps of a row: its prompt's KV after the shared prefix in the adapted
    layers (from :func:`frozen_below` on), and its reply's hidden states entering the first of them."""

    kv: list[tuple[Any, Any]]
    hidden: Any


class PromptKV:
    """What the frozen base model computes for each row, kept for one training run: the base weights
    never change, so neither do a row's prompt KV nor, below the first layer the adapter trains
    (:func:`frozen_below`), its reply's hidden states. A row keeps its prompt's KV in the adapted
    layers and its reply's hidden states entering the first of them (for LoRA on the upper half,
    half a prompt's KV, and the lower half of the reply's forward pass skipped at every later step).
    A prompt's shared prefix (its system message, :attr:`Row.shared`: about 170 of the bundled
    model's 410 prompt tokens, the same in every row of a scenario) is read once and kept apart, in
    every layer (a few, one per scenario; counted in ``bytes``). Rows are added until
    ``max_bytes``; later ones are computed each time (no eviction within a run: rows come back once
    a shuffled pass, so a least-recently-used store of fewer rows than a pass would never hit).

    A store may serve several training runs on one base model (the loop keeps one for its whole
    run: a cycle replays earlier cycles' rows, and the dialogue track trains on the action track's):
    :meth:`begin` starts each, dropping the rows the new run does not train on, and everything where
    the run's model is cut at another layer or computes in another dtype."""

    def __init__(self, max_bytes: int = PROMPT_KV_BYTES) -> None:
        self.max_bytes = max_bytes
        self.bytes = self.hits = self.misses = 0
        self._prefix: dict[tuple[int, ...], list[tuple[Any, Any]]] = {}
        self._kv: dict[tuple[int, tuple[int, ...]], _Kept] = {}
        """a row's kept part, by (its prefix's length, its ids)"""
        self._first: tuple[int | None] | None = None
        """:func:`frozen_below` of the run's model, once asked (what every kept row was cut at)"""
        self._run: tuple[str, int | None, str] | None = None
        """(base model, first adapted layer, dtype) of the run :meth:`begin` started"""

    def first_layer(self, model: Any) -> int | None:
        """:func:`frozen_below` of ``model``, the run's model (found once a run: it decides what every
        kept row holds)."""
        if self._first is None:
            self._first = (frozen_below(model),)
        return self._first[0]

    def begin(self, model: Any, dtype: str, rows: Sequence[Row]) -> None:
        """Start a training run of ``model`` (computing in ``dtype``) on ``rows``: keep what an
        earlier run on the same base model (its ``name_or_path``), cut at the same layer and in the
        same dtype, kept of these rows; drop the rest. The counts start again."""
        first = frozen_below(model)
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        run = (str(getattr(base.config, "name_or_path", "")), first, dtype)
        if run != self._run:
            self._prefix.clear()
            self._kv.clear()
        wanted = {tuple(r.ids) for r in rows}
        self._kv = {k: e for k, e in self._kv.items() if k[1] in wanted}
        self._run, self._first = run, (first,)
        self.bytes = sum(_kv_bytes(kv) for kv in self._prefix.values()) + sum(self._size(e) for e in self._kv.values())
        self.hits = self.misses = 0

    @staticmethod
    def _size(e: _Kept) -> int:
        return _kv_bytes(e.kv) + e.hidden.numel() * e.hidden.element_size()

    def _read(self, model: Any, prefix: tuple[int, ...], row: Row, start: int, first: int, pad: int) -> _Kept:
        """The kept part of ``row`` (its prompt: ``row.ids[:start]``, starting with ``prefix``, whose KV
        is kept): its prompt under the base model without gradient, then its reply through the layers
        below ``first``. One row at a time, so what is kept is a function of the row alone (a row
        from the store is the row read afresh, bit for bit, whatever it was read beside)."""
        import torch
        from transformers import DynamicCache

        dev = next(model.parameters()).device
        decoder = _decoder(model)
        n = len(prefix)
        cache = None
        if n:
            if prefix not in self._prefix:
                with torch.no_grad(), model.disable_adapter():
                    out = decoder(input_ids=torch.tensor([prefix], device=dev), use_cache=True)
                self._prefix[prefix] = [(_kept(layer.keys), _kept(layer.values)) for layer in out.past_key_values.layers]
                self.bytes += _kv_bytes(self._prefix[prefix])
            cache = DynamicCache(ddp_cache_data=list(self._prefix[prefix]))
        with torch.no_grad(), model.disable_adapter():  # the decoder alone: a read needs no logits
            out = decoder(input_ids=torch.tensor([row.ids[n:start]], device=dev), past_key_values=cache, use_cache=True,
                          position_ids=torch.arange(n, start, device=dev)[None])
        layers = out.past_key_values.layers  # the whole prompt's KV, the prefix's included
        reply, pos, rmask, _, _ = _reply_batch([row], [start], pad)
        with torch.no_grad():
            if first == 0:
                hidden = decoder.embed_tokens(reply.to(dev))
            else:  # the reply through the frozen layers, attending to its whole prompt there
                lower = [(layer.keys, layer.values) for layer in layers[:first]]
                got: list[Any] = []
                hook = decoder.layers[first - 1].register_forward_hook(lambda m, a, o: got.append(o[0] if isinstance(o, tuple) else o))
                try:
                    with _only_layers(decoder, 0, first):
                        decoder(input_ids=reply.to(dev), attention_mask=rmask.to(dev), position_ids=pos.to(dev),
                                past_key_values=DynamicCache(ddp_cache_data=lower), use_cache=True)
                finally:
                    hook.remove()
                hidden = got[0]
        return _Kept([(_kept(layer.keys[:, :, n:]), _kept(layer.values[:, :, n:])) for layer in layers[first:]], hidden.clone())

    def batch(self, model: Any, rows: Sequence[Row], starts: Sequence[int], pad: int) -> tuple[Any, Any]:
        """For the rows (row b's prompt: its ids before ``starts[b]``), a ``DynamicCache`` of their
        prompts in the layers from :meth:`first_layer` on (none below: those do not run) and their
        replies' hidden states entering that layer, right-padded to the longest prompt and reply;
        each computed under the base model without gradient where not kept."""
        import torch
        from transformers import DynamicCache

        first = self.first_layer(model)
        if first is None:
            raise ValueError("the store needs a model whose layers below the trained ones are frozen (frozen_below)")

        # a prefix leaves each prompt at least one token of its own
        keys = [(min(r.shared, s - 1), tuple(r.ids)) for r, s in zip(rows, starts)]
        new = [k not in self._kv for k in keys]
        self.misses += sum(new)
        self.hits += len(keys) - sum(new)
        fresh: dict[tuple[int, tuple[int, ...]], _Kept] = {}
        for b, (k, m) in enumerate(zip(keys, new)):
            if m and k not in fresh:  # a row twice in a batch is read once
                fresh[k] = e = self._read(model, tuple(rows[b].ids[: k[0]]), rows[b], starts[b], first, pad)
                size = self._size(e)
                if self.bytes + size <= self.max_bytes:
                    self._kv[k] = e
                    self.bytes += size
        kept = [self._kv.get(k) or fresh[k] for k in keys]
        heads = [self._prefix.get(tuple(r.ids[:n])) if n else None for (n, _), r in zip(keys, rows)]
        upper = _stack([[(torch.cat([h[first + i][0], k], 2), torch.cat([h[first + i][1], v], 2)) if h is not None else (k, v)
                         for i, (k, v) in enumerate(e.kv)] for e, h in zip(kept, heads)], max(starts))
        T = max(len(r.ids) - s for r, s in zip(rows, starts))
        hidden = kept[0].hidden.new_zeros((len(rows), T, kept[0].hidden.shape[-1]))
        for b, e in enumerate(kept):
            hidden[b, : e.hidden.shape[1]] = e.hidden
        return DynamicCache(ddp_cache_data=[(None, None)] * first + upper), hidden


def _forward(model: Any, rows: Sequence[Row], pad: int, prompt_kv: PromptKV | None = None) -> Logits:
    """The rows' logits under ``model`` (a PEFT model or a plain one): one forward pass, or for an
    activated adapter the prompts under the base model without gradient (kept in ``prompt_kv``
    when given), then the replies."""
    inv = invocation(model)
    if inv is not None:
        return _forward_activated(model, rows, pad, inv, prompt_kv)
    ids, pos, mask = _batch(rows, pad)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    hidden = base.model(input_ids=ids.to(base.device), attention_mask=None if mask is None else mask.to(base.device),
                        position_ids=pos.to(base.device), use_cache=False).last_hidden_state
    B, L = hidden.shape[:2]
    flat = hidden.reshape(B * L, -1)
    return lambda requests: _gather(flat, L, requests, base.get_output_embeddings())


def _forward_activated(model: Any, rows: Sequence[Row], pad: int, inv: Sequence[int],
                       prompt_kv: PromptKV | None = None) -> Logits:
    """:func:`_forward` for an activated adapter: row b's ids before its last invocation (``S_b``)
    are read by the base model (the KV cache, no gradient); the rest, under the adapter, attends to
    them as :func:`_row_mask` says."""
    import torch

    starts = [activation_start(r.ids, inv) for r in rows]
    for r, s in zip(rows, starts):
        if any(i < s for i in r.nll) or any(c[1] < s for c in r.choices):
            raise ValueError("an activated adapter's trained tokens must follow its invocation tokens in the prompt")
    dev = next(model.parameters()).device
    ids, pos, mask, P, T = _reply_batch(rows, starts, pad)
    B = len(rows)
    first = prompt_kv.first_layer(model) if prompt_kv is not None else None
    if P and prompt_kv is not None and all(starts) and first is not None:
        # the frozen part from the store: the prompts' KV in the adapted layers, the replies entering them
        cache, hidden = prompt_kv.batch(model, rows, starts, pad)
        decoder = _decoder(model)
        with _only_layers(decoder, first, len(decoder.layers)), _all_tokens_active(model):
            logits = model(inputs_embeds=hidden, attention_mask=mask.to(dev), position_ids=pos.to(dev), past_key_values=cache,
                           use_cache=True, alora_offsets=[T] * B).logits
    else:
        cache = None
        if P:
            prompt = torch.full((B, P), pad, dtype=torch.long)
            prompt_mask = torch.zeros((B, P), dtype=torch.long)
            for b, (r, s) in enumerate(zip(rows, starts)):
                prompt[b, :s] = torch.tensor(r.ids[:s], dtype=torch.long)
                prompt_mask[b, :s] = 1
            with torch.no_grad(), model.disable_adapter():
                cache = model(input_ids=prompt.to(dev), attention_mask=prompt_mask.to(dev), use_cache=True,
                              position_ids=torch.arange(P, device=dev).expand(B, -1), logits_to_keep=1).past_key_values
        with _all_tokens_active(model):
            logits = model(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev), past_key_values=cache,
                           use_cache=cache is not None, alora_offsets=[T] * B).logits
    flat = logits.reshape(B * T, -1)
    return lambda requests: _gather(flat, T, [(b, [i - starts[b] for i in at]) for b, at in requests])


def _choice_logps(at: Any, r: Row) -> list[Any]:
    """log P(candidate | state) of each block of row ``r``, from ``at`` (the logits at its branch
    points, in ``r.choices``' order): the sum over the candidate's branch points of the log-softmax
    over the legal children there."""
    import torch

    logp: list[Any] = [torch.zeros((), dtype=torch.float32, device=at.device) for _ in r.probs]
    for k, (ci, _, allowed, t) in enumerate(r.choices):
        logp[ci] = logp[ci] + torch.log_softmax(at[k, allowed], -1)[allowed.index(t)]
    return logp


def _block_logps(logits: Logits, b: int, r: Row) -> list[Any]:
    """:func:`_choice_logps` of row ``r``, row ``b`` of ``logits``."""
    return _choice_logps(logits([(b, [c[1] for c in r.choices])])[0], r)


def candidate_logprobs(model: Any, tok: Any, pair: Pair, cfg: TrainConfig) -> dict[str, float]:
    """The policy's log-probability over the legal actions (constrained decoding's distribution) of
    each action in ``pair``'s soft target: what training should raise for the higher-valued ones."""
    import torch

    row = build_row(pair, tok, cfg.value_temperature, cfg.value_margin, 1 << 30)
    assert row is not None
    with torch.no_grad():
        logp = _block_logps(_forward(model, [row], tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id), 0, row)
    return {k: float(x) for k, x in zip(row.keys, logp)}


def row_loss(model: Any, rows: Sequence[Row], pad: int, decision_weight: float, prompt_kv: PromptKV | None = None) -> Any:
    """Mean over ``rows`` of the per-state loss (the module docstring's L, W = ``decision_weight``);
    an activated adapter's prompts come from ``prompt_kv`` where it keeps them."""
    import torch
    import torch.nn.functional as F

    decide = decision_weight > 0
    logits = _forward(model, rows, pad, prompt_kv)
    # one gather: every row's likelihood positions (a row without any: its first, times 0), then its
    # branch points (none at W = 0: the words alone, the dialogue track)
    got = logits([(b, r.nll or [0]) for b, r in enumerate(rows)] + [(b, [c[1] for c in r.choices]) for b, r in enumerate(rows) if decide])
    losses = []
    for b, r in enumerate(rows):
        at = got[b]
        if r.nll:
            loss = F.cross_entropy(at, torch.tensor(r.nll_targets, device=at.device), reduction="mean")
        else:
            loss = at.sum() * 0
        if decide:
            loss = loss - decision_weight * sum(p * lp for p, lp in zip(r.probs, _choice_logps(got[len(rows) + b], r)))
        losses.append(loss)
    return torch.stack(losses).mean()


def train_listwise(model: Any, tok: Any, pairs: Sequence[Pair], cfg: TrainConfig, dtype: str,
                   kinds_balance: Callable[[list[str | None]], list[int]], steps: int,
                   on_step: Callable[[], None] | None = None, prompt_kv: PromptKV | None = None) -> tuple[list[float], dict[str, int]]:
    """Train ``model`` (a PEFT model with trainable LoRA weights) on ``pairs`` for ``steps``
    AdamW steps of ``cfg.batch_size`` rows, the learning rate decaying linearly to 0 (as TRL's
    trainers do). Rows are balanced by ``kinds_balance`` (indices, repeats allowed) and shuffled
    each pass by ``cfg.seed``; an activated adapter's prompt KV is kept across passes in
    ``prompt_kv`` (a new :class:`PromptKV` when not given). Returns the losses per step and the row
    counts."""
    import torch

    encoded: dict[str, list[int]] = {}
    built = [build_row(p, tok, cfg.value_temperature, cfg.value_margin, cfg.max_length, encoded) for p in pairs]
    given = kinds_balance([r.kind if r is not None else None for r in built])
    order = [i for i in given if built[i] is not None]  # a row whose prompt fills max_length is dropped, as TRL does
    if not order:
        raise ValueError(f"all {len(built)} training rows have prompts of max_length={cfg.max_length} tokens or more: raise max_length")
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=0.0)  # as TRL's trainers: no decay
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1 - s / steps))
    rng = random.Random(cfg.seed)
    queue: list[int] = []
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    bf16 = dtype == "bfloat16"
    device = next(model.parameters()).device
    prompt_kv = prompt_kv if prompt_kv is not None else PromptKV()
    prompt_kv.begin(model, dtype, [r for r in built if r is not None])
    losses = []
    model.train()
    for _ in range(steps):
        batch: list[Row] = []
        while len(batch) < cfg.batch_size:
            if not queue:
                queue = list(order)
                rng.shuffle(queue)
            row = built[queue.pop()]
            assert row is not None
            batch.append(row)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = row_loss(model, batch, pad, cfg.decision_weight, prompt_kv)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)  # as TRL's trainers (max_grad_norm 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step()
    return losses, {"pairs": len(pairs), "given": len(given), "trained_on": len(order)}
