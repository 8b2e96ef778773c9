"""`socialworld serve` against the official openai client: every request answered, parameters
honoured, concurrent requests batched, a client that goes away cancels its work."""

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from socialworld.agents.lm.server import Generated, HFGenerate, cut_at_stop, make_app  # noqa: E402
from socialworld.agents.models import load_hf  # noqa: E402
from socialworld.testing import serving  # noqa: E402

MSG = [{"role": "user", "content": "Turn 1/7. Here: alice, ben"}]


@pytest.fixture(scope="module")
def tiny_app(tiny_dir):
    model, tok = load_hf(tiny_dir, dtype="float32")
    gen = HFGenerate(model, tok)
    return gen, make_app(gen, "tiny", max_new_tokens=12, max_context=4096)


@pytest.fixture(scope="module")
def url(tiny_app):
    with serving(tiny_app[1]) as u:
        yield u


@pytest.fixture
def client(url):
    return openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=30)


def _post(url, body: bytes | dict, path="/chat/completions"):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


BAD = {
    "no messages": {"model": "tiny", "messages": []},
    "messages not a list": {"model": "tiny", "messages": "hi"},
    "a message without content": {"model": "tiny", "messages": [{"role": "user"}]},
    "an image part": {"model": "tiny", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
    "max_tokens -1": {"model": "tiny", "messages": MSG, "max_tokens": -1},
    "max_tokens abc": {"model": "tiny", "messages": MSG, "max_tokens": "abc"},
    "max_completion_tokens 0": {"model": "tiny", "messages": MSG, "max_completion_tokens": 0},
    "temperature 3": {"model": "tiny", "messages": MSG, "temperature": 3},
    "n 0": {"model": "tiny", "messages": MSG, "n": 0},
    "n above the batch": {"model": "tiny", "messages": MSG, "n": 17},
    "top_logprobs without logprobs": {"model": "tiny", "messages": MSG, "top_logprobs": 2},
    "top_logprobs 21": {"model": "tiny", "messages": MSG, "logprobs": True, "top_logprobs": 21},
    "logprobs streamed": {"model": "tiny", "messages": MSG, "logprobs": True, "stream": True},
    "stream_options without stream": {"model": "tiny", "messages": MSG, "stream_options": {"include_usage": True}},
    "json_schema without its schema": {"model": "tiny", "messages": MSG, "response_format": {"type": "json_schema", "json_schema": {}}},
    "json_schema type without json_schema": {"model": "tiny", "messages": MSG, "response_format": {"type": "json_schema"}},
    "a response_format of another type": {"model": "tiny", "messages": MSG, "response_format": {"type": "xml"}},
    "five stops": {"model": "tiny", "messages": MSG, "stop": ["a", "b", "c", "d", "e"]},
    "an unknown field": {"model": "tiny", "messages": MSG, "best_of": 3},
    "seed 2**64": {"model": "tiny", "messages": MSG, "seed": 2**64},  # was an unhandled overflow in the server
    "seed -2**63 - 1": {"model": "tiny", "messages": MSG, "seed": -(2**63) - 1},
    "a regex that does not compile": {"model": "tiny", "messages": MSG, "structured_outputs": {"regex": "(yes|no"}},
    "a Lark grammar that does not compile": {"model": "tiny", "messages": MSG, "structured_outputs": {"grammar": "start: foo"}},
    "a JSON schema that is not an object": {"model": "tiny", "messages": MSG, "structured_outputs": {"json": "[1, 2"}},
    "two grammars": {"model": "tiny", "messages": MSG, "structured_outputs": {"regex": "a", "choice": ["a"]}},
    "no grammar": {"model": "tiny", "messages": MSG, "structured_outputs": {}},
    "an empty choice": {"model": "tiny", "messages": MSG, "structured_outputs": {"choice": []}},
    "an unknown grammar field": {"model": "tiny", "messages": MSG, "structured_outputs": {"ebnf": "x"}},
    "a grammar and a JSON response_format": {"model": "tiny", "messages": MSG, "structured_outputs": {"regex": "a"},
                                             "response_format": {"type": "json_object"}},
    # a JSON escape spells a lone surrogate, which no tokenizer or UTF-8 reply can carry (was a 500 from the tokenizer)
    "a lone surrogate in the content": {"model": "tiny", "messages": [{"role": "user", "content": "hi \ud800"}]},
    "a lone surrogate in a text part": {"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]},
    "a lone surrogate in a stop": {"model": "tiny", "messages": MSG, "stop": ["\ud800"]},
}


@pytest.mark.parametrize("case", BAD)
def test_bad_requests_get_a_400_with_a_message(url, case):
    code, body = _post(url, BAD[case])
    assert code == 400 and body["error"]["message"].startswith("bad request"), body


def test_every_other_failure_is_answered_too(url, client):
    assert _post(url, b"{not json")[0] == 400
    assert _post(url, {"model": "nope", "messages": MSG}) == (404, _post(url, {"model": "nope", "messages": MSG})[1])
    assert _post(url, {"model": "nope", "messages": MSG})[1]["error"]["code"] == "model_not_found"
    assert _post(url, {}, path="/nowhere")[0] == 404
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-x", messages=MSG)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=MSG, max_tokens=-1)
    assert client.models.retrieve("tiny").id == "tiny" and [m.id for m in client.models.list()] == ["tiny"]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other")


def test_a_decoding_error_is_a_500_not_a_dropped_connection(tiny_dir):
    class Broken:
        def prompt(self, messages):
            return "x"

        def count(self, text):
            return 1

        def __call__(self, jobs, admit):
            raise RuntimeError("out of memory")

    with serving(make_app(Broken(), "tiny")) as u:
        code, body = _post(u, {"model": "tiny", "messages": MSG})
    assert code == 500 and "out of memory" in body["error"]["message"]


def test_parameters_are_honoured(client, tiny_app):
    gen, _ = tiny_app
    parts = [{"type": "text", "text": "Turn 1/7. "}, {"type": "text", "text": "Here: alice, ben"}]
    greedy = client.chat.completions.create(model="tiny", messages=MSG, temperature=0, max_tokens=10)
    assert client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": parts}], temperature=0,
                                          max_tokens=10).choices[0].message.content == greedy.choices[0].message.content
    local = _local(gen, _job(gen, 10))
    assert greedy.choices[0].message.content == local.text and greedy.usage.completion_tokens == local.tokens_out
    for tiny in (1e-40, 1e-300):  # in range, and greedy in effect: the scaled logits overflowed the sampler (a 500)
        assert client.chat.completions.create(model="tiny", messages=MSG, temperature=tiny,
                                              max_tokens=10).choices[0].message.content == greedy.choices[0].message.content
    short = client.chat.completions.create(model="tiny", messages=MSG, temperature=0, max_completion_tokens=3)
    assert short.usage.completion_tokens <= 3 and greedy.choices[0].message.content.startswith(short.choices[0].message.content)
    text = greedy.choices[0].message.content
    stop = text[len(text) // 2 :][:2]
    stopped = client.chat.completions.create(model="tiny", messages=MSG, temperature=0, max_tokens=10, stop=[stop])
    assert stopped.choices[0].message.content == cut_at_stop(text, [stop])[0] and stopped.choices[0].finish_reason == "stop"
    sampled = [client.chat.completions.create(model="tiny", messages=MSG, temperature=1.0, seed=s, max_tokens=10)
               .choices[0].message.content for s in (1, 1, 2, 3, 4)]
    assert sampled[0] == sampled[1] and len(set(sampled)) > 1  # a seed fixes the sample; seeds differ
    # unseeded requests draw from the server's own stream: they differ, and torch's global generator is untouched
    import torch

    before = torch.get_rng_state()
    free = [client.chat.completions.create(model="tiny", messages=MSG, temperature=1.0, max_tokens=10).choices[0].message.content
            for _ in range(4)]
    assert len(set(free)) > 1 and torch.equal(torch.get_rng_state(), before)
    assert client.chat.completions.create(model="tiny", messages=MSG, temperature=1.0, seed=1,
                                          max_tokens=10).choices[0].message.content == sampled[0]  # seeded: still its seed's


def test_a_reply_grammar_is_decoded_under_it(client, tiny_app, specs):
    """``structured_outputs: {"regex": ...}`` as socialworld's openai: policies send it: the reply is
    the constrained decoder's under that grammar, batched with others like it; the policy parses it."""
    from concurrent.futures import ThreadPoolExecutor

    from socialworld.agents.lm.constrained import decode, program_from_regex, program_regex
    from socialworld.agents.lm.policy import program
    from socialworld.agents.lm.prompts import build_messages, parse_output
    from socialworld.world.engine import World
    from socialworld.world.visibility import observe

    gen, app = tiny_app
    obs = [observe(specs[sid], World(specs[sid], 3).pub) for sid in ("team_lunch-v1", "book_club-v1", "hackathon-v1")]
    progs = [program(o, 6) for o in obs]
    convs = [build_messages(o) for o in obs]

    together = threading.Barrier(3)

    def ask(i: int):
        together.wait()  # the three requests leave together
        return client.chat.completions.create(model="tiny", messages=convs[i], temperature=0, max_tokens=6,
                                              extra_body={"structured_outputs": {"regex": program_regex(progs[i])}})

    batches = app.state.batcher.stats.batches
    with ThreadPoolExecutor(3) as pool:
        replies = list(pool.map(ask, range(3)))
    local = decode(gen.model, gen.tokenizer, [gen.prompt(c) for c in convs],
                   [program_from_regex(program_regex(p), 6) for p in progs])
    assert [r.choices[0].message.content for r in replies] == [d.text for d in local]
    assert all(parse_output(r.choices[0].message.content, o)[2] is None for r, o in zip(replies, obs))  # parseable
    assert app.state.batcher.stats.batches - batches < 3  # requests that arrive together decode together


SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["answer", "n"], "additionalProperties": False}


def test_structured_outputs_in_full_greedy_or_sampled(client):
    """Any regex, a JSON schema, a choice list, a Lark grammar, OpenAI's response_format: greedy,
    seeded or not, each reply follows its grammar, and a seed still fixes the reply."""
    def ask(so=None, max_tokens=40, **kw):
        body = {"structured_outputs": so} if so is not None else {}
        return client.chat.completions.create(model="tiny", messages=MSG, max_tokens=max_tokens, extra_body=body, **kw)

    choices = ["alice's place", 'Ben "B" Ng', "café"]
    for sampling in ({"temperature": 0}, {"temperature": 1.0, "seed": 4}, {"temperature": 1.0}, {"temperature": 0.7, "top_p": 0.5}):
        r = ask({"regex": "(yes|no)"}, **sampling)
        assert r.choices[0].message.content in {"yes", "no"} and r.choices[0].finish_reason == "stop"
        assert ask({"choice": choices}, **sampling).choices[0].message.content in choices
        # JSON allows whitespace between tokens (as vLLM's grammars do): a sampled random model writes a lot of it
        data = json.loads(ask({"json": SCHEMA}, max_tokens=400, **sampling).choices[0].message.content)
        assert data["answer"] in ("yes", "no") and 0 <= data["n"] <= 9 and set(data) == {"answer", "n"}
        go = ask({"grammar": 'start: "go " DIR\nDIR: "left" | "right"'}, **sampling).choices[0].message.content
        assert go in {"go left", "go right"}
        fmt = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=400, **sampling,
                                             response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}})
        assert set(json.loads(fmt.choices[0].message.content)) == {"answer", "n"}
    seeded = [ask({"choice": choices}, temperature=1.0, seed=s, n=4).choices for s in (11, 11)]
    assert [c.message.content for c in seeded[0]] == [c.message.content for c in seeded[1]]
    assert all(c.message.content in choices for c in seeded[0])
    as_text = ask({"regex": "[a-c]{3}"}, temperature=0, logprobs=True)  # logprobs under a grammar: the model's own
    assert "".join(t.token for t in as_text.choices[0].logprobs.content) == as_text.choices[0].message.content
    obj = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=40, temperature=0, response_format={"type": "json_object"})
    text = obj.choices[0].message.content
    assert text.startswith("{") and (obj.choices[0].finish_reason == "length" or isinstance(json.loads(text), dict))


def test_the_later_turns_of_concurrent_clients_join_the_running_batch(url, tiny_app):
    """Four multi-turn clients (each turn's request sent when its last reply came back, so they
    arrive apart): their later requests join the batch that is decoding, and every reply is the one
    the same conversation gets when it runs alone."""
    _, app = tiny_app
    stats = app.state.batcher.stats

    def conversation(i, c, out):
        messages = [{"role": "user", "content": f"Turn 1/7. Here: {'alice' if i % 2 else 'ben'} {i}"}]
        for turn in range(3):
            # the first client's long replies keep a batch decoding while the others' next turns arrive
            r = c.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=80 if i == 0 else 6 + 2 * i + turn)
            out.append(r.choices[0].message.content)
            messages += [{"role": "assistant", "content": out[-1]}, {"role": "user", "content": f"Turn {turn + 2}/7."}]

    c = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)
    alone: list[list[str]] = [[] for _ in range(4)]
    for i in range(4):
        conversation(i, c, alone[i])
    joined_before = stats.joined
    together: list[list[str]] = [[] for _ in range(4)]
    threads = [threading.Thread(target=conversation, args=(i, openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60),
                                                           together[i])) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert together == alone
    assert stats.joined - joined_before >= 2


def test_n_samples_of_one_prompt_decode_in_one_batch(client, tiny_app):
    _, app = tiny_app
    before = app.state.batcher.stats.batches
    three = client.chat.completions.create(model="tiny", messages=MSG, temperature=1.0, seed=5, n=3, max_tokens=8)
    assert app.state.batcher.stats.batches - before == 1 and [c.index for c in three.choices] == [0, 1, 2]
    texts = [c.message.content for c in three.choices]
    assert len(set(texts)) > 1  # three samples, not one repeated
    again = client.chat.completions.create(model="tiny", messages=MSG, temperature=1.0, seed=5, n=3, max_tokens=8)
    assert [c.message.content for c in again.choices] == texts  # a seed fixes all n
    assert len(three.choices) == 3 and 0 < three.usage.completion_tokens <= 3 * 8
    greedy = client.chat.completions.create(model="tiny", messages=MSG, temperature=0, max_tokens=8)
    pair = client.chat.completions.create(model="tiny", messages=MSG, temperature=0, n=2, max_tokens=8)
    assert [c.message.content for c in pair.choices] == [greedy.choices[0].message.content] * 2
    assert pair.usage.prompt_tokens == greedy.usage.prompt_tokens
    assert pair.usage.completion_tokens == 2 * greedy.usage.completion_tokens


def test_logprobs_are_the_models_own(client, tiny_app):
    """Each reply token with its log-probability under the model's raw distribution: the same as a
    forward pass over prompt and reply; greedy picks the likeliest; the tokens spell the reply."""
    import torch

    gen, _ = tiny_app
    r = client.chat.completions.create(model="tiny", messages=MSG, temperature=0, max_tokens=8, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens and "".join(t.token for t in content) == r.choices[0].message.content
    assert all(len(t.top_logprobs) == 3 and t.logprob == pytest.approx(t.top_logprobs[0].logprob, abs=1e-6)
               and t.bytes == list(t.token.encode()) for t in content)
    ids = gen.tokenizer(gen.prompt(MSG), add_special_tokens=False, return_tensors="pt")["input_ids"]
    forward = []  # greedy steps of a plain forward pass (the reply's own tokens: its text may tokenize otherwise)
    with torch.no_grad():
        for _ in content:
            logp = torch.log_softmax(gen.model(ids).logits[0, -1].float(), -1)
            forward.append(float(logp.max()))
            ids = torch.cat([ids, logp.argmax().view(1, 1)], 1)
    assert [t.logprob for t in content] == pytest.approx(forward, abs=1e-4)
    sampled = client.chat.completions.create(model="tiny", messages=MSG, temperature=1.0, seed=3, max_tokens=8, logprobs=True)
    assert all(t.top_logprobs == [] and t.logprob <= 0 for t in sampled.choices[0].logprobs.content)
    assert client.chat.completions.create(model="tiny", messages=MSG, temperature=0, max_tokens=8).choices[0].logprobs is None
    text = r.choices[0].message.content
    stop = text[len(text) // 2 :][:2]
    cut = client.chat.completions.create(model="tiny", messages=MSG, temperature=0, max_tokens=8, stop=[stop], logprobs=True)
    assert cut_at_stop(text, [stop])[0].startswith("".join(t.token for t in cut.choices[0].logprobs.content))


def _streamed(client, **kw):
    chunks = list(client.chat.completions.create(model="tiny", messages=MSG, stream=True, **kw))
    texts: dict = {}
    finish: dict = {}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
            finish[ch.index] = ch.finish_reason or finish.get(ch.index)
    return chunks, texts, finish


def test_a_streamed_reply_is_the_same_reply_as_it_is_decoded(client):
    whole = client.chat.completions.create(model="tiny", messages=MSG, temperature=0, max_tokens=10)
    chunks, texts, finish = _streamed(client, temperature=0, max_tokens=10, stream_options={"include_usage": True})
    assert texts == {0: whole.choices[0].message.content} and finish == {0: whole.choices[0].finish_reason}
    assert sum(1 for c in chunks for ch in c.choices if ch.delta.content) > 2  # token by token, not one block at the end
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    text = whole.choices[0].message.content
    stop = text[len(text) // 2 :][:2]
    assert _streamed(client, temperature=0, max_tokens=10, stop=[stop])[1] == {0: cut_at_stop(text, [stop])[0]}  # never past a stop
    seeded = client.chat.completions.create(model="tiny", messages=MSG, temperature=1.0, seed=9, n=2, max_tokens=8)
    assert _streamed(client, temperature=1.0, seed=9, n=2, max_tokens=8)[1] == {c.index: c.message.content for c in seeded.choices}


def test_each_request_is_one_log_line(url, client, caplog):
    with caplog.at_level("INFO", logger="socialworld.serve"):
        r = client.chat.completions.create(model="tiny", messages=MSG, temperature=0, max_tokens=4, n=2)
        _post(url, {"model": "tiny", "messages": []})
        client.models.list()
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "socialworld.serve"]
    assert len(lines) == 3, lines
    assert lines[0].startswith(f"{r.id} 200 prompt={r.usage.prompt_tokens} completion={r.usage.completion_tokens} n=2 batch=2 ")
    assert lines[1].startswith("POST /v1/chat/completions 400 ") and lines[2].startswith("GET /v1/models 200 ")


def _local(gen, job):
    """The reply ``gen`` decodes for ``job`` alone."""
    got = []
    job.deliver = got.append
    gen([job], lambda: [])
    return got[0]


def _job(gen, n):
    from socialworld.agents.lm.server import Job, Sampling

    return Job(gen.prompt(MSG), n, (), Sampling(0.0, 1.0, None))


def test_concurrent_clients_are_batched(url, client, tiny_app):
    _, app = tiny_app
    before = app.state.batcher.stats.batches
    results: list = [None] * 8
    clients = [openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60) for _ in range(8)]
    together = threading.Barrier(8)

    def ask(i):
        together.wait()  # the eight requests leave together
        results[i] = clients[i].chat.completions.create(model="tiny", messages=[{"role": "user", "content": f"Turn {i}/7."}],
                                               temperature=0, max_tokens=8)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert all(r is not None and r.choices[0].message.content is not None for r in results)
    assert app.state.batcher.stats.largest_batch > 1 and app.state.batcher.stats.batches - before < 8


def test_a_bad_request_among_good_ones_fails_alone(url):
    """Four requests leave together, one of them with a seed out of int64: it gets its 400, the
    others their replies."""
    bodies = [{"model": "tiny", "messages": MSG, "temperature": 0, "max_tokens": 4} for _ in range(3)]
    bodies.insert(1, {"model": "tiny", "messages": MSG, "seed": 2**64, "max_tokens": 4})
    codes: list = [None] * 4
    together = threading.Barrier(4)

    def ask(i):
        together.wait()
        codes[i] = _post(url, bodies[i])[0]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert codes == [200, 400, 200, 200]


class Slow:
    """A decoder that takes 20 ms per token and stops when told (records what it was asked)."""

    def __init__(self):
        self.decoded: list[int] = []

    def prompt(self, messages):
        return messages[-1]["content"]

    def count(self, text):
        return 1

    def __call__(self, jobs, admit):
        n = 0
        while n < max(j.max_tokens for j in jobs) and not all(j.cancelled for j in jobs):
            time.sleep(0.02)
            n += 1
            for j in jobs:
                if j.emit is not None:
                    j.emit("x" * n)
        self.decoded.append(n)
        for j in jobs:
            j.deliver(Generated("x" * n, 1, n, "length"))


def test_a_client_that_goes_away_cancels_its_work():
    slow = Slow()
    app = make_app(slow, "slow")
    with serving(app) as u:
        host, port = u.removeprefix("http://").removesuffix("/v1").split(":")
        body = json.dumps({"model": "slow", "messages": MSG, "max_tokens": 500}).encode()  # 10 s of decoding
        with socket.create_connection((host, int(port))) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
            time.sleep(0.5)  # decoding has begun
        t0 = time.monotonic()
        code, reply = _post(u, {"model": "slow", "messages": MSG, "max_tokens": 5})
        assert code == 200 and reply["usage"]["completion_tokens"] == 5
        assert time.monotonic() - t0 < 5  # the abandoned request did not hold the decoder for its 10 s
    assert app.state.batcher.stats.cancelled == 1 and slow.decoded[0] < 500


def test_a_streaming_client_that_goes_away_cancels_its_work():
    slow = Slow()
    app = make_app(slow, "slow")
    with serving(app) as u:
        client = openai.OpenAI(base_url=u, api_key="none", max_retries=0, timeout=30)
        stream = client.chat.completions.create(model="slow", messages=MSG, max_tokens=500, stream=True)
        chunks = iter(stream)
        assert next(chunks).choices[0].delta.role == "assistant"
        assert next(chunks).choices[0].delta.content == "x"  # decoding has begun
        stream.close()
        deadline = time.monotonic() + 5
        while not slow.decoded and time.monotonic() < deadline:
            time.sleep(0.05)
    assert app.state.batcher.stats.cancelled == 1 and slow.decoded and slow.decoded[0] < 500
