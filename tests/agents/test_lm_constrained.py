"""The constrained decoder's chunk, step by step (plan, prefill, step, finish), on a tiny random model."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch  # noqa: E402

from socialworld.agents.lm.constrained import Choice, Forced, Free, PrefixCache, _Chunk, _Engine, decode  # noqa: E402
from socialworld.agents.models import load_hf  # noqa: E402

SYSTEM = "You coordinate a team lunch. Reply with one action.\n"
PROMPTS = [SYSTEM + "alice wants sushi", SYSTEM + "bob is out today, and carol is vegetarian", SYSTEM + "done?"]
PROGRAM = [Forced("ACTION:"), Choice("a", ("ask", "propose", "wait")), Forced(" SAY:"), Free("say", 4)]


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return load_hf(tiny_dir, dtype="float32")


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_plan_shares_the_longest_common_prefix_and_leaves_each_row_its_tail(tiny):
    model, tok = tiny
    chunk = _Chunk.plan(model, tok, PROMPTS, [PROGRAM] * 3, None, _Engine(tok))
    enc = [_ids(tok, p) for p in PROMPTS]
    n = len(chunk.pre[0])
    assert all(p == tuple(enc[0][:n]) for p in chunk.pre)
    assert any(e[n] != enc[0][n] for e in enc) and all(len(e) > n for e in enc)  # as long as it can be
    for r, e in zip(chunk.rows, enc):  # the prompt's tail, then the program's first forced text
        assert r.pending == e[n:] + _ids(tok, "ACTION:")
    given = _Chunk.plan(model, tok, PROMPTS, [PROGRAM] * 3, [SYSTEM, SYSTEM, "not its start"], _Engine(tok))
    assert given.pre[:2] == [tuple(_ids(tok, SYSTEM))] * 2 and given.pre[2] == ()  # a prefix counts only where it starts the prompt


def test_prefill_puts_each_rows_prefix_in_the_cache_at_its_positions(tiny):
    model, tok = tiny
    chunk = _Chunk.plan(model, tok, PROMPTS, [PROGRAM] * 3, [SYSTEM, SYSTEM, "x"], _Engine(tok))
    with torch.inference_mode():
        chunk.prefill(PrefixCache())
    lens = [len(p) for p in chunk.pre]
    assert chunk.cache.used == max(lens) and chunk.next_pos.tolist() == lens
    assert [int(m.sum()) for m in chunk.cache.mask] == lens and not chunk.base_pass  # no activated adapter here
    with torch.inference_mode():  # the cached keys are the prefix's own
        own = model(torch.tensor([list(chunk.pre[0])]), use_cache=True).past_key_values
    assert torch.allclose(chunk.cache.kv.layers[0].keys[0, :, : lens[0]], own.layers[0].keys[0], atol=1e-5)


def test_steps_run_one_forward_each_until_no_row_has_tokens_and_finish_as_decode_does(tiny):
    model, tok = tiny
    calls = []
    hook = model.register_forward_hook(lambda m, args, kwargs, out: calls.append(kwargs["input_ids"].shape), with_kwargs=True)
    try:
        chunk = _Chunk.plan(model, tok, PROMPTS, [PROGRAM] * 3, None, _Engine(tok))
        with torch.inference_mode():
            chunk.prefill(PrefixCache())
            calls.clear()  # the prefix's own forward
            widths = [len(r.pending) for r in chunk.rows]
            assert chunk.step() and calls == [(3, max(widths))]  # every row's tail and forced text in one pass
            assert all(r.chosen for r in chunk.rows) and chunk.next_pos.tolist() == [len(p) + w for p, w in zip(chunk.pre, widths)]
            steps = 1
            while chunk.step():
                steps += 1
            assert len(calls) == steps  # the last call ran nothing
            assert not chunk.step() and len(calls) == steps
        assert all(r.seg == len(r.program) and not r.pending for r in chunk.rows)
    finally:
        hook.remove()
    got = chunk.finish(3.0)
    assert [g.latency_s for g in got] == [1.0, 1.0, 1.0]
    want = decode(model, tok, PROMPTS, [PROGRAM] * 3, batch_size=3)
    assert [(g.values, g.text, g.completion_ids, g.tokens_in) for g in got] == [(w.values, w.text, w.completion_ids, w.tokens_in) for w in want]
