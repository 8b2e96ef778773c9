"""An OpenAI-compatible server for a local policy model (``socialworld serve``), on FastAPI and uvicorn.

Routes: ``GET /v1/models``, ``GET /v1/models/{id}`` and ``POST /v1/chat/completions`` (with
``stream: true``, server-sent events as the official ``openai`` client reads them).

* Every request is answered: 400 with a message for bad input (``messages`` empty or not a list of
  text messages, ``max_tokens`` not a positive integer, a field this server does not honour), 404
  for an unknown model or route, 500 for an internal error; errors have the OpenAI shape
  ``{"error": {"message", "type", "code"}}``.
* ``structured_outputs: {"regex": ...}`` (vLLM's field, what socialworld's ``openai:`` policies send
  for constrained decoding) decodes greedily under that grammar with this project's constrained
  decoder, when the pattern is in the language of :func:`~socialworld.agents.lm.constrained.program_regex`
  (a 400 says so otherwise, and for a sampled request).
* It honours ``temperature`` (the OpenAI default 1; 0, and anything below ``GREEDY_BELOW``, is greedy), ``top_p``, ``stop`` (up to four
  strings, cut from the reply), ``max_tokens`` / ``max_completion_tokens`` and ``seed`` (a seeded
  request samples alone, so the same seed gives the same reply); content is a string or a list
  of text parts.
* ``n`` samples of one prompt decode in one batch (up to ``max_batch``); ``logprobs`` (with
  ``top_logprobs`` up to 20) gives each reply token's log-probability under the model's own
  distribution (before temperature and top-p, as vLLM's default); ``stream`` sends the reply as it
  is decoded (held back where a ``stop`` string could still begin), ``stream_options.include_usage``
  a last chunk with the usage. ``logprobs`` is not served with ``stream`` or ``structured_outputs``
  (a 400 says so).
* Each request is one log line on the ``socialworld.serve`` logger (id, status, tokens, batch size,
  seconds); ``socialworld serve`` prints them to stderr.
* Requests that arrive together are decoded in one batch (:class:`Batcher`: those with the same
  sampling settings, up to ``max_batch``); a client that goes away cancels its request, whether
  it waits in the queue or is being decoded.

It serves one local model (with a trained run's adapters when its spec names them) on one
process; for throughput at scale, serve the model with vLLM (see ``docs/serving.md``).
"""


import asyncio
import itertools
import json
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, Iterator, Literal, Protocol, Sequence

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

Finish = Literal["stop", "length"]
log = logging.getLogger("socialworld.serve")


# ------------------------------------------------------------------ the request, as the server reads it


def _encodable(text: str) -> str:
    """Text the tokenizer and the reply can carry: a lone surrogate (U+D800-U+DFFF, which a JSON escape can
    spell) is refused as bad input, where it failed in the tokenizer as a 500."""
    for i, ch in enumerate(text):
        if "\ud800" <= ch <= "\udfff":
            raise ValueError(f"a lone surrogate (U+{ord(ch):04X}) at character {i}, which no UTF-8 text can carry")
    return text


Text = Annotated[str, AfterValidator(_encodable)]


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[TextPart]
    name: Text | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text"]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class StructuredOutputs(BaseModel):
    """vLLM's ``structured_outputs`` field as socialworld's ``openai:`` policies send it: the reply
    grammar as a regular expression (:func:`~socialworld.agents.lm.constrained.program_regex`)."""

    model_config = ConfigDict(extra="forbid")
    regex: Text


class ChatRequest(BaseModel):
    """The fields of a chat completion request this server honours; any other field is a 400."""

    model_config = ConfigDict(extra="forbid")
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1, strict=True)
    max_completion_tokens: int | None = Field(None, ge=1, strict=True)
    stop: Text | list[Text] | None = None
    seed: int | None = Field(None, strict=True, ge=-(2**63), le=2**63 - 1)  # int64, as OpenAI's API and torch's seed take
    n: int = Field(1, ge=1, strict=True)
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    frequency_penalty: Literal[0] = 0
    presence_penalty: Literal[0] = 0
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20, strict=True)
    user: Text | None = None
    structured_outputs: StructuredOutputs | None = None

    def stops(self) -> tuple[str, ...]:
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        if len(stops) > 4 or not all(stops):
            raise ValueError("stop: at most 4 non-empty strings")
        return stops


# ------------------------------------------------------------------ decoding in batches


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


@dataclass
class Job:
    """One request waiting for (or being given) its reply."""

    prompt: str
    max_tokens: int
    stops: tuple[str, ...]
    sampling: Sampling
    program: tuple | None = None
    """the reply grammar (constrained greedy decoding), from ``structured_outputs``"""
    logprobs: int | None = None
    """``None``: no log-probabilities; ``k``: each reply token's, with the ``k`` likeliest beside it"""
    emit: Callable[[str], None] | None = None
    """called (from the decoding thread) with the reply so far after each decoded token: streaming"""
    request: int = 0
    """the request this job is one of ``n`` samples of (a seeded request's samples decode together)"""
    batch: int = 0
    """the size of the batch it was decoded in"""
    cancelled: bool = False
    future: asyncio.Future | None = None


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


class Generate(Protocol):
    """Decode ``jobs`` (all with the same sampling) in one batch; stop early once ``should_stop()``."""

    def __call__(self, jobs: Sequence[Job], should_stop: Callable[[], bool]) -> list[Generated]: ...


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """``text`` up to the first of ``stops`` (which is left out), and whether one was found."""
    at = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:at], True) if at >= 0 else (text, False)


class HFGenerate:
    """:class:`Generate` for a transformers causal LM (left-padded batches, the model's own sampling)."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        import threading

        self.model, self.tokenizer = model, tokenizer
        self._stream: Any = None
        """the server's own sampling stream (CPU RNG state) for unseeded requests: drawn from the OS's
        entropy at the first one and carried from request to request, so unseeded samples differ while
        torch's global generator is left as it was (a seeded request samples from its seed alone)"""
        from socialworld.agents.lm.constrained import MergedAdapters

        self._merged = MergedAdapters()
        """a served PEFT model's adapters merged for constrained decoding, kept between requests"""
        self._tok_lock = threading.Lock()
        """a fast tokenizer is not safe across threads ("Already borrowed"): the event loop counts
        prompts while the worker thread encodes and decodes a batch"""

    def prompt(self, messages: list[dict[str, str]]) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def count(self, text: str) -> int:
        with self._tok_lock:
            return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def __call__(self, jobs: Sequence[Job], should_stop: Callable[[], bool]) -> list[Generated]:
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        tok, s = self.tokenizer, jobs[0].sampling
        if jobs[0].program is not None:
            return self._constrained(jobs)
        with self._tok_lock:
            enc = tok([j.prompt for j in jobs], return_tensors="pt", padding=True, add_special_tokens=False).to(self.model.device)
        width = enc["input_ids"].shape[1]
        text_of = self._text

        class Step(StoppingCriteria):
            """After each token: the streamed jobs get their reply so far; all stop once ``should_stop()``."""

            def __call__(self, input_ids, scores, **kwargs):  # type: ignore[no-untyped-def]
                for i, job in enumerate(jobs):
                    if job.emit is not None:
                        job.emit(text_of(input_ids[i, width:].tolist())[0])
                return torch.full((input_ids.shape[0],), should_stop(), dtype=torch.bool, device=input_ids.device)

        scored = any(j.logprobs is not None for j in jobs)
        sample = {"do_sample": True, "temperature": s.temperature, "top_p": s.top_p} if not s.greedy else \
            {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
        with torch.inference_mode(), torch.random.fork_rng(devices=[]):
            if s.seed is not None:
                torch.manual_seed(s.seed)
            elif self._stream is None:
                torch.seed()
            else:
                torch.set_rng_state(self._stream)
            out = self.model.generate(**enc, max_new_tokens=max(j.max_tokens for j in jobs), pad_token_id=tok.pad_token_id,
                                      eos_token_id=tok.eos_token_id, stopping_criteria=StoppingCriteriaList([Step()]),
                                      **sample, **({"output_logits": True, "return_dict_in_generate": True} if scored else {}))
            if s.seed is None:
                self._stream = torch.get_rng_state()
        seqs = out.sequences if scored else out
        results = []
        for i, job in enumerate(jobs):
            whole, ids, ended = self._text(seqs[i, width:].tolist()[: job.max_tokens])
            text, stopped = cut_at_stop(whole, job.stops)
            n_out = self.count(text) if stopped else len(ids)
            logprobs = None
            if job.logprobs is not None:
                kept = self._inside(ids, text) if stopped else len(ids)
                logprobs = self._logprobs(torch.stack([step[i] for step in out.logits[:kept]]) if kept else None,
                                          ids[:kept], job.logprobs)
            results.append(Generated(text, int(enc["attention_mask"][i].sum()), n_out,
                                     "stop" if ended or stopped else "length", logprobs))
        return results

    def _text(self, ids: list[int]) -> tuple[str, list[int], bool]:
        """A reply's text (decoded without special tokens), its ids up to the end token, and whether it ended."""
        eos = self.tokenizer.eos_token_id
        ended = eos in ids
        ids = ids[: ids.index(eos)] if ended else ids
        with self._tok_lock:
            return self.tokenizer.decode(ids, skip_special_tokens=True), ids, ended

    def _inside(self, ids: list[int], text: str) -> int:
        """How many of ``ids`` decode to text that lies inside ``text`` (a reply cut at a stop string)."""
        k = 0
        with self._tok_lock:
            while k < len(ids) and len(self.tokenizer.decode(ids[: k + 1], skip_special_tokens=True)) <= len(text):
                k += 1
        return k

    def _logprobs(self, logits: Any, ids: list[int], top: int) -> tuple[TokenLogprob, ...]:
        """Each token's log-probability under the model's raw logits (one row per token), with the
        ``top`` likeliest tokens beside it."""
        import torch

        if logits is None:
            return ()
        lp = torch.log_softmax(logits.float(), dim=-1)
        chosen = lp.gather(1, torch.tensor(ids, device=lp.device)[:, None])[:, 0].tolist()
        best = lp.topk(top, dim=-1) if top else None
        with self._tok_lock:
            piece = lambda t: self.tokenizer.decode([t])  # noqa: E731
            return tuple(TokenLogprob(piece(t), c, tuple((piece(int(b)), float(v)) for b, v in zip(best.indices[k], best.values[k]))
                                      if best is not None else ()) for k, (t, c) in enumerate(zip(ids, chosen)))


    def _constrained(self, jobs: Sequence[Job]) -> list[Generated]:
        """Greedy decoding under each job's grammar (:mod:`socialworld.agents.lm.constrained`): a
        reply the grammar allows, by construction."""
        from socialworld.agents.lm.constrained import decode

        with self._tok_lock:
            rows = decode(self.model, self.tokenizer, [j.prompt for j in jobs], [list(j.program or ()) for j in jobs],
                          batch_size=len(jobs), merged=self._merged)
        out = []
        for job, r in zip(jobs, rows):
            text, _ = cut_at_stop(r.text, job.stops)
            out.append(Generated(text, r.tokens_in, r.tokens_out, "stop"))
        return out


@dataclass
class BatchStats:
    requests: int = 0
    batches: int = 0
    largest_batch: int = 0
    cancelled: int = 0
    """requests whose client went away before their reply"""


@dataclass
class Batcher:
    """Collects the requests that arrive within ``wait_s`` of each other and decodes those with the
    same sampling settings together, up to ``max_batch`` at a time (greedy requests always batch;
    a seeded request's ``n`` samples decode alone, so they depend on its seed only). One batch at a time runs,
    in a worker thread; cancelled jobs are dropped before their batch, and a batch whose clients
    have all gone stops decoding."""

    generate: Generate
    max_batch: int = 16
    wait_s: float = 0.01
    stats: BatchStats = field(default_factory=BatchStats)
    _queue: asyncio.Queue | None = None

    async def submit(self, job: Job) -> asyncio.Future:
        if self._queue is None:
            raise RuntimeError("the batcher is not running")
        job.future = asyncio.get_running_loop().create_future()
        self.stats.requests += 1
        await self._queue.put(job)
        return job.future

    async def run(self) -> None:
        self._queue = asyncio.Queue()
        while True:
            jobs = [await self._queue.get()]
            await asyncio.sleep(self.wait_s)
            while not self._queue.empty():
                jobs.append(self._queue.get_nowait())
            for group in self._groups([j for j in jobs if not j.cancelled]):
                await self._decode(group)

    def _groups(self, jobs: list[Job]) -> list[list[Job]]:
        groups: dict[Any, list[Job]] = {}
        for j in jobs:
            key = ("constrained",) if j.program is not None else ("greedy",) if j.sampling.greedy else \
                ("seeded", j.request) if j.sampling.seed is not None else (j.sampling.temperature, j.sampling.top_p)
            groups.setdefault(key, []).append(j)
        return [g[i : i + self.max_batch] for g in groups.values() for i in range(0, len(g), self.max_batch)]

    async def _decode(self, group: list[Job]) -> None:
        self.stats.batches += 1
        self.stats.largest_batch = max(self.stats.largest_batch, len(group))
        for j in group:
            j.batch = len(group)
        try:
            results = await asyncio.to_thread(self.generate, group, lambda: all(j.cancelled for j in group))
        except Exception as err:  # noqa: BLE001 - each waiting request gets it as its 500
            for j in group:
                if j.future is not None and not j.future.done():
                    j.future.set_exception(err)
            return
        for j, r in zip(group, results):
            if j.future is not None and not j.future.done():
                j.future.set_result(r)


# ------------------------------------------------------------------ the app


def _error(code: int, message: str, kind: str = "invalid_request_error", what: str | None = None):
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": what or str(code)}},
                        status_code=code)


class OneLineEach:
    """ASGI middleware: one log line per request (method, path, status, seconds), except those that
    log their own (a completion's, with its tokens, sets ``request.state.logged``). Plain ASGI, not
    Starlette's ``BaseHTTPMiddleware``, which hides a client's disconnect from the route."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0, status = time.perf_counter(), [0]

        async def sending(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            if not scope.get("state", {}).get("logged"):
                log.info("%s %s %d %.2fs", scope["method"], scope["path"], status[0] or 500, time.perf_counter() - t0)


def make_app(generate: HFGenerate | Any, model_id: str, max_new_tokens: int = 64, max_context: int | None = None,
             max_batch: int = 16) -> Any:
    """The FastAPI app serving ``generate`` (an :class:`HFGenerate`, or anything with its
    ``prompt``, ``count`` and call) as model ``model_id``; ``max_new_tokens`` is a request's default
    ``max_tokens``; ``max_context`` (prompt plus reply tokens) bounds a request when given."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    batcher = Batcher(generate, max_batch=max_batch)
    requests = itertools.count()

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # type: ignore[no-untyped-def]
        task = asyncio.create_task(batcher.run())
        try:
            yield
        finally:
            task.cancel()

    app = FastAPI(title="socialworld serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.batcher = batcher
    card = {"id": model_id, "object": "model", "created": int(time.time()), "owned_by": "socialworld"}

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, err: RequestValidationError):  # type: ignore[no-untyped-def]
        problems = "; ".join(f"{'.'.join(str(x) for x in e.get('loc', ()) if x != 'body') or 'body'}: {e.get('msg')}"
                             for e in err.errors())
        return _error(400, f"bad request: {problems}")

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException):  # type: ignore[no-untyped-def]
        return _error(err.status_code, str(err.detail) if err.status_code != 404 else f"no route {request.url.path}")

    @app.exception_handler(Exception)
    async def internal(request: Request, err: Exception):  # type: ignore[no-untyped-def]
        return _error(500, f"internal error: {err!r}", kind="server_error")

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [card]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str):  # type: ignore[no-untyped-def]
        return card if name == model_id else _error(404, f"the model {name!r} does not exist; this server has {model_id!r}",
                                                  what="model_not_found")

    app.add_middleware(OneLineEach)

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest, request: Request):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        if req.model != model_id:
            return _error(404, f"the model {req.model!r} does not exist; this server has {model_id!r}", what="model_not_found")
        try:
            stops = req.stops()
        except ValueError as err:
            return _error(400, f"bad request: {err}")
        for bad, why in ((req.n > max_batch, f"n: at most {max_batch} on this server (its --max-batch)"),
                         (req.top_logprobs is not None and not req.logprobs, "top_logprobs: needs logprobs: true"),
                         (req.logprobs and req.stream, "logprobs: not served with stream on this server"),
                         (req.logprobs and req.structured_outputs is not None,
                          "logprobs: not served with structured_outputs on this server"),
                         (req.stream_options is not None and not req.stream, "stream_options: needs stream: true")):
            if bad:
                return _error(400, f"bad request: {why}")
        prompt = generate.prompt([{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                                  for m in req.messages])
        limit = req.max_completion_tokens or req.max_tokens or max_new_tokens
        if max_context is not None and (n := generate.count(prompt)) + limit > max_context:
            return _error(400, f"bad request: {n} prompt tokens plus max_tokens {limit} exceed the model's {max_context}")
        program = None
        if req.structured_outputs is not None:
            from socialworld.agents.lm.constrained import program_from_regex

            if req.temperature >= GREEDY_BELOW:
                return _error(400, "bad request: structured_outputs decodes greedily on this server: send temperature 0")
            try:
                program = tuple(program_from_regex(req.structured_outputs.regex, limit))
            except ValueError as err:
                return _error(400, f"bad request: structured_outputs.regex: {err}")
        rid, number = f"chatcmpl-{time.time_ns()}", next(requests)
        jobs = [Job(prompt, limit, stops, Sampling(req.temperature, req.top_p, req.seed), program,
                    logprobs=(req.top_logprobs or 0) if req.logprobs else None, request=number) for _ in range(req.n)]
        request.state.logged = True
        head = {"id": rid, "created": int(time.time()), "model": model_id, "system_fingerprint": None}

        def done(code: int, results: Sequence[Generated] = ()) -> None:
            log.info("%s %d prompt=%d completion=%d n=%d batch=%d %.2fs%s", rid, code, results[0].tokens_in if results else 0,
                     sum(g.tokens_out for g in results), req.n, max(j.batch for j in jobs), time.perf_counter() - t0,
                     " stream" if req.stream else "")

        def usage(results: Sequence[Generated]) -> dict:
            out = sum(g.tokens_out for g in results)
            return {"prompt_tokens": results[0].tokens_in, "completion_tokens": out, "total_tokens": results[0].tokens_in + out}

        def cancel() -> None:
            for j in jobs:
                if j.future is not None and not j.future.done() and not j.cancelled:
                    j.cancelled = True
                    batcher.stats.cancelled += 1

        if req.stream:
            return stream(jobs, head, stops, req.stream_options is not None and req.stream_options.include_usage,
                          usage, done, cancel)
        futures = [await batcher.submit(j) for j in jobs]
        while not all(f.done() for f in futures):
            await asyncio.wait(futures, timeout=0.05)
            if not all(f.done() for f in futures) and await request.is_disconnected():
                cancel()
                done(499)
                return _error(499, "the client closed the request")
        try:
            results: list[Generated] = [f.result() for f in futures]  # a decoding error is raised here: the 500 above
        except Exception:
            done(500)
            raise
        done(200, results)
        return {
            **head, "object": "chat.completion",
            "choices": [{"index": i, "message": {"role": "assistant", "content": g.text},
                         "logprobs": None if g.logprobs is None else {"content": [t.openai() for t in g.logprobs], "refusal": None},
                         "finish_reason": g.finish_reason} for i, g in enumerate(results)],
            "usage": usage(results),
        }

    def stream(jobs: list[Job], head: dict, stops: tuple[str, ...], with_usage: bool, usage: Callable, done: Callable,
               cancel: Callable) -> Any:
        """The reply as server-sent events: a first chunk with the role, then each choice's text as it
        is decoded (less what could still be the start of a stop string), its finish, the usage when
        asked, and ``[DONE]``; an error after the first chunk is an ``error`` event. A client that
        goes away cancels the jobs."""
        from fastapi.responses import StreamingResponse

        held = max((len(x) for x in stops), default=1) - 1
        loop, arrived = asyncio.get_running_loop(), asyncio.Queue()  # type: ignore[var-annotated]
        def emitter(i: int) -> Callable[[str], None]:
            def emit(text: str) -> None:
                loop.call_soon_threadsafe(arrived.put_nowait, (i, text))
            return emit

        for i, j in enumerate(jobs):
            j.emit = emitter(i)

        def event(choices: list, **more: Any) -> str:
            return f"data: {json.dumps({**head, 'object': 'chat.completion.chunk', 'choices': choices, **more})}\n\n"

        def delta(i: int, text: str, finish: str | None = None) -> dict:
            return {"index": i, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}

        async def events():  # type: ignore[no-untyped-def]
            futures = [await batcher.submit(j) for j in jobs]
            sent = [""] * len(jobs)
            try:
                yield event([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None} for i in range(len(jobs))])
                while not (all(f.done() for f in futures) and arrived.empty()):
                    try:
                        i, text = await asyncio.wait_for(arrived.get(), timeout=0.05)
                    except TimeoutError:
                        continue
                    text = cut_at_stop(text, stops)[0].rstrip("\ufffd")  # a character still being decoded waits too
                    safe = text[: max(len(text) - held, 0)]
                    if len(safe) > len(sent[i]) and safe.startswith(sent[i]):
                        yield event([delta(i, safe[len(sent[i]) :])])
                        sent[i] = safe
                try:
                    results: list[Generated] = [f.result() for f in futures]
                except Exception as err:  # noqa: BLE001 - the status line has gone: the error travels as an event
                    done(500)
                    yield f"data: {json.dumps({'error': {'message': f'internal error: {err!r}', 'type': 'server_error', 'code': '500'}})}\n\n"
                    return
                for i, g in enumerate(results):
                    yield event([delta(i, g.text[len(sent[i]) :] if g.text.startswith(sent[i]) else "", g.finish_reason)])
                if with_usage:
                    yield event([], usage=usage(results))
                yield "data: [DONE]\n\n"
                done(200, results)
            finally:
                if not all(f.done() for f in futures):  # the client went away
                    cancel()
                    done(499)

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def bind(host: str, port: int) -> Any:
    """A listening socket on ``host:port`` (port 0: any free one); raises ``OSError`` (in use) now."""
    import socket

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(128)
    return sock


def server_for(app: Any, sock: Any) -> Any:
    """A uvicorn server for ``app`` (quiet: warnings and errors only); ``.run(sockets=[sock])`` serves."""
    import uvicorn

    host, port = sock.getsockname()[:2]
    return uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                                         timeout_graceful_shutdown=1))


@contextmanager
def in_background(app: Any, timeout_s: float = 30) -> Iterator[str]:
    """Serve an ASGI ``app`` (this module's :func:`make_app`, OpenEnv's) with uvicorn on a free local
    port in a background thread; yields its ``http://127.0.0.1:<port>`` address and stops it after."""
    import threading

    sock = bind("127.0.0.1", 0)
    server = server_for(app, sock)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def serve(model: str, host: str = "127.0.0.1", port: int = 8000, max_new_tokens: int = 64, dtype: str = "auto",
          max_batch: int = 16) -> None:
    """Load ``model`` (a model spec: ``bundled``, a path or hub id, with ``+<adapters>`` for a trained
    policy, whose action adapter answers) and serve it as model id ``model`` until interrupted."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ValueError("serve needs FastAPI and uvicorn: pip install 'socialworld[serve]'") from None
    from socialworld.agents.models import parse_model_spec
    from socialworld.agents.registry import make_backend

    ms = parse_model_spec(model)
    if ms.kind not in ("bundled", "hf"):
        raise ValueError(f"can only serve a local model, not {model!r}")
    sock = bind(host, port)  # before the model loads: a port in use fails at once
    backend = make_backend(model, max_new_tokens=max_new_tokens, batch_size=max_batch, dtype=dtype)
    context = getattr(backend.model.config, "max_position_embeddings", None)
    app = make_app(HFGenerate(backend.model, backend.tokenizer), model, max_new_tokens, context, max_batch)
    if not log.handlers:  # one line per request on stderr
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    print(f"serving {model} on http://{host}:{sock.getsockname()[1]}/v1", flush=True)
    server_for(app, sock).run(sockets=[sock])
