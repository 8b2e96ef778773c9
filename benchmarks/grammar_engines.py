"""Grammar engines for `socialworld serve`'s structured outputs, and the reply grammar's two decoders, in one run.

Run: ``python benchmarks/grammar_engines.py`` (the bundled model's tokenizer and model). Two parts:

1. **The engines** (llguidance, which serve uses; xgrammar and outlines-core when installed:
   ``pip install --no-deps xgrammar apache-tvm-ffi outlines-core``): for three grammars (the regex
   ``(yes|no)``, a JSON schema, and the project's reply grammar on the L2 scenario's first
   observation as ``program_regex`` writes it), the time to compile it against the tokenizer and the
   mean time to compute one next-token mask and take the token, over one fixed path through the
   grammar (a reply it allows, tokenized as the tokenizer writes it), from a fresh matcher 20 times.
2. **The reply grammar, decoded** (greedy, the eight scenarios' first observations in one batch):
   the project's constrained decoder (what serve uses for it) against serve's continuous decoder
   under llguidance's mask; the replies they agree on and each one's wall time.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Callable

SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "n": {"type": "integer", "minimum": 0, "maximum": 9},
                                           "why": {"type": "string", "maxLength": 40}},
          "required": ["answer", "n", "why"], "additionalProperties": False}


def _grammars() -> dict[str, tuple[str, Any, str]]:
    """name -> (kind, spec, a reply it allows)."""
    from socialworld.agents.lm.constrained import Choice, Forced, program_regex
    from socialworld.agents.lm.policy import program
    from socialworld.world.engine import World
    from socialworld.world.spec import load_builtin_scenarios
    from socialworld.world.visibility import observe

    l2 = next(s for s in load_builtin_scenarios().values() if s.tier == "L2")
    prog = program(observe(l2, World(l2, seed=0).pub), 24)
    reply = "".join(seg.text if isinstance(seg, Forced) else seg.options[-1] if isinstance(seg, Choice) else "Let us meet at noon."
                    for seg in prog)
    return {"(yes|no)": ("regex", "(yes|no)", "yes"),
            "JSON schema": ("json", SCHEMA, json.dumps({"answer": "no", "n": 3, "why": "it rains"}, separators=(",", ":"))),
            f"reply grammar ({l2.id})": ("regex", program_regex(prog), reply)}


def _llguidance(tok: Any, vocab: int) -> Callable[[str, Any], tuple[Any, Callable[[Any], None], Callable[[Any, int], None]]]:
    import llguidance.hf
    from llguidance.torch import allocate_token_bitmask, fill_next_token_bitmask

    from socialworld.agents.lm.batching import grammar

    ll = llguidance.hf.from_tokenizer(tok, n_vocab=vocab)  # the tokenizer's conversion, once, outside the timings
    bits = allocate_token_bitmask(1, vocab)

    def compile_(kind: str, spec: Any) -> tuple[Any, Callable[[Any], None], Callable[[Any, int], None]]:
        m = llguidance.LLMatcher(ll, grammar(kind, spec), log_level=0)  # type: ignore[arg-type]
        if m.is_error():
            raise ValueError(m.get_error())
        return m, lambda m: fill_next_token_bitmask(m, bits, 0), lambda m, t: m.consume_token(t)
    return compile_


def _xgrammar(tok: Any, vocab: int) -> Callable[[str, Any], tuple[Any, Callable[[Any], None], Callable[[Any, int], None]]]:
    import xgrammar as xgr

    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab), cache_enabled=False)
    bits = xgr.allocate_token_bitmask(1, vocab)

    def compile_(kind: str, spec: Any) -> tuple[Any, Callable[[Any], None], Callable[[Any, int], None]]:
        g = compiler.compile_regex(spec) if kind == "regex" else compiler.compile_json_schema(json.dumps(spec))
        return xgr.GrammarMatcher(g), lambda m: m.fill_next_token_bitmask(bits, 0), lambda m, t: m.accept_token(t)
    return compile_


def _outlines(tok: Any, vocab: int) -> Callable[[str, Any], tuple[Any, Callable[[Any], None], Callable[[Any, int], None]]]:
    import torch
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    back = {c: b for b, c in bytes_to_unicode().items()}
    tokens: dict[bytes, list[int]] = {}
    for piece, i in tok.get_vocab().items():
        if i != tok.eos_token_id and i not in tok.all_special_ids:
            tokens.setdefault(bytes(back[c] for c in piece), []).append(i)
    voc = Vocabulary(tok.eos_token_id, tokens)
    mask = torch.zeros((vocab + 31) // 32, dtype=torch.int32)

    def compile_(kind: str, spec: Any) -> tuple[Any, Callable[[Any], None], Callable[[Any, int], None]]:
        guide = Guide(Index(spec if kind == "regex" else build_regex_from_schema(json.dumps(spec)), voc))
        return guide, lambda g: g.write_mask_into(mask.data_ptr(), mask.numel(), 4), lambda g, t: g.advance(t)
    return compile_


REPEAT = 20


def engines(tok: Any, vocab: int) -> None:
    grammars = _grammars()
    paths = {name: tok(text, add_special_tokens=False)["input_ids"] for name, (_, _, text) in grammars.items()}
    for engine, make in (("llguidance", _llguidance), ("xgrammar", _xgrammar), ("outlines-core", _outlines)):
        try:
            compile_ = make(tok, vocab)
        except ImportError as err:
            print(f"{engine:>13}: not installed ({err.name})")
            continue
        for name, (kind, spec, _) in grammars.items():
            t0 = time.perf_counter()
            try:
                m, fill, take = compile_(kind, spec)
            except Exception as err:  # noqa: BLE001 - an engine that cannot take a grammar is a row of the table
                print(f"{engine:>13} {name}: does not compile it ({type(err).__name__}: {str(err)[:80]})")
                continue
            compiled = time.perf_counter() - t0
            took = 0.0
            for k in range(REPEAT):  # the reply's path, from a fresh matcher each time
                if k:
                    m, fill, take = compile_(kind, spec)
                t0 = time.perf_counter()
                for t in paths[name]:
                    fill(m)
                    take(m, t)
                took += time.perf_counter() - t0
            per = took / (REPEAT * len(paths[name]))
            print(f"{engine:>13} {name}: compile {1000 * compiled:.1f} ms, mask + take {1000 * per:.3f} ms/token "
                  f"({len(paths[name])} tokens x {REPEAT})")


def reply_grammar(model: Any, tok: Any) -> None:
    import threading

    import torch

    from socialworld.agents.lm.batching import ContinuousDecoder, Generated, Job, Sampling, grammar
    from socialworld.agents.lm.constrained import decode, program_from_regex, program_regex
    from socialworld.agents.lm.policy import program
    from socialworld.agents.lm.prompts import build_messages
    from socialworld.world.engine import World
    from socialworld.world.spec import load_builtin_scenarios
    from socialworld.world.visibility import observe

    obs = [observe(s, World(s, seed=0).pub) for s in load_builtin_scenarios().values()]
    prompts = [tok.apply_chat_template(build_messages(o), tokenize=False, add_generation_prompt=True) for o in obs]
    regexes = [program_regex(program(o, 24)) for o in obs]
    for _ in range(2):  # warm-up, then timed
        t0 = time.perf_counter()
        decoded = decode(model, tok, prompts, [program_from_regex(r, 24) for r in regexes], batch_size=len(prompts))
        t_trie = time.perf_counter() - t0
        trie = [d.text for d in decoded]
        dec = ContinuousDecoder(model, tok, threading.Lock(), torch.Generator().manual_seed(0))
        got: dict[int, Generated] = {}
        # as many tokens as the constrained decoder's reply (its free SAY runs 24 tokens at most, a regex cannot say so)
        jobs = [Job(p, d.tokens_out, (), Sampling(0.0, 1.0, None), grammar=dec.matcher(grammar("regex", r)))
                for p, r, d in zip(prompts, regexes, decoded)]
        for i, j in enumerate(jobs):
            j.deliver = lambda g, i=i: got.__setitem__(i, g)
        t0 = time.perf_counter()
        dec.run(jobs, lambda: [])
        t_llg = time.perf_counter() - t0
    same = sum(a == got[i].text for i, a in enumerate(trie))
    print(f"reply grammar, 8 first observations, greedy, one batch: constrained decoder {t_trie:.2f} s, "
          f"continuous decoder + llguidance {t_llg:.2f} s ({t_llg / t_trie:.2f}x); the same reply in {same} of {len(trie)}")
    for i, a in enumerate(trie):
        if a != got[i].text:
            print(f"  differ: {a!r}\n      vs: {got[i].text!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="bundled", help="model spec whose tokenizer (and model, for part 2) to use")
    args = ap.parse_args()

    from socialworld.agents.models import cpu_description
    from socialworld.agents.registry import make_backend

    backend = make_backend(args.model)
    vocab = backend.model.get_output_embeddings().weight.shape[0]
    print(f"CPU: {cpu_description()}; model {args.model} ({backend.decoding['dtype']}), vocabulary {vocab}")
    engines(backend.tokenizer, vocab)
    reply_grammar(backend.model, backend.tokenizer)


if __name__ == "__main__":
    main()
