"""Continuous batching (socialworld.agents.lm.batching): a job that joins a running batch decodes
the reply it would decode alone; the batcher hands newcomers to the running batch of their lane."""

import asyncio
import json
import threading

import pytest

pytest.importorskip("torch")
pytest.importorskip("llguidance")

from socialworld.agents.lm.batching import ContinuousDecoder, Generated, Job, Sampling, grammar  # noqa: E402
from socialworld.agents.models import load_hf  # noqa: E402


@pytest.fixture(scope="module")
def decoder(tiny_dir):
    import torch

    model, tok = load_hf(tiny_dir, dtype="float32")
    with torch.no_grad():  # sharp attention: at the random init every position weighs about the same, so a
        for layer in model.model.layers:  # key or a position out of place would change no reply
            layer.self_attn.q_proj.weight.mul_(12)
            layer.self_attn.k_proj.weight.mul_(12)
    stream = torch.Generator().manual_seed(0)
    return ContinuousDecoder(model, tok, threading.Lock(), stream)


def _prompt(dec, text):
    return dec.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)


def _job(dec, text, n, **kw):
    return Job(_prompt(dec, text), n, (), Sampling(0.0, 1.0, None), **kw)


def _run(dec, jobs, arrivals=None):
    """Decode ``jobs[0]``; ``arrivals[k]`` (step -> jobs) join at the k-th call of admit. Returns each job's reply."""
    got: dict[int, Generated] = {}
    for i, j in enumerate(jobs):
        j.deliver = lambda g, i=i: got.__setitem__(i, g)
    calls = [0]

    def admit():
        calls[0] += 1
        return [jobs[i] for i in (arrivals or {}).get(calls[0], [])]

    dec.run([jobs[0]], admit)
    return [got[i] for i in range(len(jobs))]


def test_a_job_that_joins_a_running_batch_decodes_as_it_would_alone(decoder):
    """Newcomers of shorter and longer prompts join at different steps, rows of different lengths
    leave while others decode: every greedy reply (grammar-constrained too) is the one it gets alone."""
    texts = ["Turn 1/7. Here: alice, ben", "hi", "A much longer message that needs many more tokens than the first one did",
             "Turn 4/7."]
    yes_no = grammar("regex", "(yes|no)( indeed)?")

    def jobs():
        return [_job(decoder, texts[0], 12), _job(decoder, texts[1], 3), _job(decoder, texts[2], 10),
                _job(decoder, texts[3], 8, grammar=decoder.matcher(yes_no))]

    alone = [_run(decoder, [j])[0] for j in jobs()]
    for g, j in zip(alone[:3], jobs()):  # alone, as transformers' own greedy generate decodes it
        ids = decoder.tokenizer(j.prompt, add_special_tokens=False, return_tensors="pt")
        out = decoder.model.generate(**ids, max_new_tokens=j.max_tokens, do_sample=False, pad_token_id=decoder.pad)
        assert g.text == decoder.tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    joined = _run(decoder, jobs(), arrivals={2: [1], 4: [2, 3]})
    assert [g.text for g in joined] == [g.text for g in alone]
    assert [(g.tokens_in, g.tokens_out, g.finish_reason) for g in joined] == [(g.tokens_in, g.tokens_out, g.finish_reason) for g in alone]
    assert joined[3].text in {"yes", "no", "yes indeed", "no indeed"} and joined[3].finish_reason == "stop"
    assert [g.finish_reason for g in joined[:3]] == ["length"] * 3  # the random model's replies ran to their max_tokens


def test_rows_sample_under_their_grammar_and_seed(decoder):
    """A seeded request's samples follow its seed alone; every sample follows its grammar."""
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "n": {"type": "integer", "maximum": 9}},
              "required": ["answer", "n"], "additionalProperties": False}

    def sampled(seed, kind, spec, n=3):
        jobs = [Job(_prompt(decoder, "Answer."), 40, (), Sampling(1.0, 0.9, seed), grammar=decoder.matcher(grammar(kind, spec)),
                    request=7) for _ in range(n)]
        return [g.text for g in _run(decoder, jobs, arrivals={1: [1, 2]} if n > 1 else None)]

    first = sampled(5, "choice", ["alice's place", 'Ben "B" Ng', "café", "x"])
    assert first == sampled(5, "choice", ["alice's place", 'Ben "B" Ng', "café", "x"])
    assert set(first) <= {"alice's place", 'Ben "B" Ng', "café", "x"}
    replies = [json.loads(t) for t in sampled(1, "json", schema)]
    assert all(r["answer"] in ("yes", "no") and isinstance(r["n"], int) and set(r) == {"answer", "n"} for r in replies)


def test_a_grammar_that_does_not_compile_is_a_value_error(decoder):
    for kind, spec in (("regex", "(yes|no"), ("grammar", "start: undefined_rule"), ("json", "{not json")):
        with pytest.raises(ValueError):
            decoder.matcher(grammar(kind, spec))


class Recorder:
    """A decoder that steps until its jobs are done (4 steps each), calling admit between steps."""

    def __init__(self):
        self.runs: list[list[str]] = []
        self.started = threading.Event()
        self.go_on = threading.Event()

    def prompt(self, messages):
        return messages[-1]["content"]

    def count(self, text):
        return 1

    def __call__(self, jobs, admit):
        rows = {id(j): [j, 0] for j in jobs}
        self.runs.append([j.prompt for j in jobs])
        self.started.set()
        self.go_on.wait(5)
        while rows:
            for j in admit():
                rows[id(j)] = [j, 0]
                self.runs[-1].append(j.prompt)
            for key, row in list(rows.items()):
                row[1] += 1
                if row[1] == 4:
                    row[0].deliver(Generated(row[0].prompt, 1, 4, "length"))
                    del rows[key]


def test_the_batcher_hands_newcomers_of_its_lane_to_the_running_batch():
    from socialworld.agents.lm.server import Batcher

    rec = Recorder()

    async def main():
        batcher = Batcher(rec, max_batch=3)
        task = asyncio.create_task(batcher.run())
        await asyncio.sleep(0)
        greedy = lambda p: Job(p, 4, (), Sampling(0.0, 1.0, None))  # noqa: E731
        first = await batcher.submit(greedy("a"))
        await asyncio.to_thread(rec.started.wait, 5)  # "a" is decoding
        later = [await batcher.submit(j) for j in (greedy("b"), Job("s", 4, (), Sampling(1.0, 1.0, 3), request=9),
                                                   greedy("c"), greedy("d"), Job("p", 4, (), Sampling(0.0, 1.0, None), program=()))]
        rec.go_on.set()
        done = await asyncio.gather(first, *later)
        task.cancel()
        return batcher, [g.text for g in done]

    batcher, texts = asyncio.run(main())
    assert texts == ["a", "b", "s", "c", "d", "p"]
    # b, c joined a (the batch holds 3 at most); the seeded and the program jobs ran alone, and once the
    # seeded job was the oldest waiting, d did not join ahead of it: the batch drained and s had its turn
    assert rec.runs[0] == ["a", "b", "c"] and ["s"] in rec.runs and ["p"] in rec.runs
    assert rec.runs.index(["s"]) < next(i for i, run in enumerate(rec.runs) if "d" in run)
    assert batcher.stats.joined >= 2 and batcher.stats.largest_batch == 3


def test_an_activated_adapter_decodes_as_peft_generates(tiny_dir, tmp_path):
    """A served policy's activated adapter (PEFT's aLoRA, invoked by the assistant header): the
    continuous decoder's greedy replies, rows joining mid-batch, are PEFT's own generate's."""
    import torch

    peft = pytest.importorskip("peft")
    from socialworld.learn.trainers.common import assistant_header

    base, tok = load_hf(tiny_dir, dtype="float32")
    torch.manual_seed(1)
    cfg = peft.LoraConfig(r=4, lora_alpha=512, target_modules=["q_proj", "v_proj", "o_proj"], init_lora_weights=False,
                          alora_invocation_tokens=assistant_header(tok), task_type="CAUSAL_LM")
    peft.get_peft_model(load_hf(tiny_dir, dtype="float32")[0], cfg).save_pretrained(tmp_path / "act")
    model = peft.PeftModel.from_pretrained(base, str(tmp_path / "act")).eval()
    dec = ContinuousDecoder(model, tok, threading.Lock(), torch.Generator().manual_seed(0))
    texts = ["Turn 1/7. Here: alice, ben", "hi", "Turn 4/7. A longer message than the others"]
    jobs = [_job(dec, t, 8) for t in texts]
    joined = [g.text for g in _run(dec, jobs, arrivals={2: [1, 2]})]
    expected = []
    for j in jobs:
        ids = tok(j.prompt, add_special_tokens=False, return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(**ids, max_new_tokens=8, do_sample=False, pad_token_id=dec.pad)
        expected.append(tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True))
    assert joined == expected
    with model.disable_adapter(), torch.inference_mode():  # the adapter changes the replies
        plain = [tok.decode(model.generate(**(ids := tok(j.prompt, add_special_tokens=False, return_tensors="pt")), max_new_tokens=8,
                                           do_sample=False, pad_token_id=dec.pad)[0, ids["input_ids"].shape[1] :],
                            skip_special_tokens=True) for j in jobs]
    assert plain != expected


def test_a_model_whose_cache_cannot_be_joined_takes_no_newcomers(tiny_dir):
    """A sliding-window model (its cache is not plain dynamic layers): the batch it starts with
    decodes as transformers' generate does, rows leaving as they end, and no job joins it mid-way."""
    import torch
    from transformers import MistralConfig, MistralForCausalLM

    _, tok = load_hf(tiny_dir, dtype="float32")
    cfg = MistralConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, sliding_window=4096, max_position_embeddings=4096,
                        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    dec = ContinuousDecoder(MistralForCausalLM(cfg).eval(), tok, threading.Lock(), torch.Generator().manual_seed(0))
    jobs = [_job(dec, "Turn 1/7. Here: alice, ben", 9), _job(dec, "hi", 4), _job(dec, "Turn 2/7.", 6)]
    got: dict[int, Generated] = {}
    for i, j in enumerate(jobs):
        j.deliver = lambda g, i=i: got.__setitem__(i, g)
    asked = []
    dec.run(jobs[:2], lambda: asked.append(1) or [jobs[2]])
    assert dec.joins is False and not asked and set(got) == {0, 1}
    for i, j in enumerate(jobs[:2]):
        ids = tok(j.prompt, add_special_tokens=False, return_tensors="pt")
        out = dec.model.generate(**ids, max_new_tokens=j.max_tokens, do_sample=False, pad_token_id=dec.pad)
        assert got[i].text == tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
