"""An OpenAI-compatible server for a local policy model (``socialworld serve``), on FastAPI and uvicorn.

Routes: ``GET /v1/models``, ``GET /v1/models/{id}`` and ``POST /v1/chat/completions`` (with
``stream: true``, server-sent events as the official ``openai`` client reads them).

* Every request is answered: 400 with a message for bad input (``messages`` empty or not a list of
  text messages, ``max_tokens`` not a positive integer, a field this server does not honour), 404
  for an unknown model or route, 500 for an internal error; errors have the OpenAI shape
  ``{"error": {"message", "type", "code"}}``.
* Structured outputs as vLLM takes them: ``structured_outputs`` with exactly one of ``regex`` (the
  whole reply matches it), ``json`` (a JSON schema), ``choice`` (a list of strings), ``grammar`` (Lark)
  or ``json_object``; or OpenAI's ``response_format`` ``json_object`` / ``json_schema``. Greedy or
  sampled, each reply follows its grammar, through llguidance
  (:func:`~socialworld.agents.lm.batching.grammar`); a grammar that does not compile is a 400 with
  llguidance's message. A greedy regex in the language of
  :func:`~socialworld.agents.lm.constrained.program_regex` (what socialworld's ``openai:`` policies
  send) decodes with the project's own constrained decoder instead, which feeds the forced text
  without a forward pass per token (faster; ``benchmarks/serve_batching.py --grammar``).
* It honours ``temperature`` (the OpenAI default 1; 0, and anything below ``GREEDY_BELOW``, is greedy), ``top_p``, ``stop`` (up to four
  strings, cut from the reply), ``max_tokens`` / ``max_completion_tokens`` and ``seed`` (a seeded
  request samples alone, so the same seed gives the same reply); content is a string or a list
  of text parts.
* ``n`` samples of one prompt decode in one batch (up to ``max_batch``); ``logprobs`` (with
  ``top_logprobs`` up to 20) gives each reply token's log-probability under the model's own
  distribution (before temperature and top-p, as vLLM's default); ``stream`` sends the reply as it
  is decoded (held back where a ``stop`` string could still begin), ``stream_options.include_usage``
  a last chunk with the usage. ``logprobs`` is not served with ``stream`` (a 400 says so).
* Each request is one log line on the ``socialworld.serve`` logger (id, status, tokens, batch size,
  seconds); ``socialworld serve`` prints them to stderr.
* Continuous batching (:class:`Batcher`, :class:`~socialworld.agents.lm.batching.ContinuousDecoder`):
  requests that arrive together start a batch, and a request that arrives while it decodes joins
  it at the next step (up to ``max_batch`` rows), so the later turns of concurrent multi-turn clients
  decode together too; a client that goes away cancels its request, whether it waits in the queue
  or is being decoded.

It serves one local model (with a trained run's adapters when its spec names them) on one
process; for throughput at scale, serve the model with vLLM (see ``docs/serving.md``).
"""


import asyncio
import itertools
import json
import logging
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, Iterator, Literal, Protocol, Sequence

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from socialworld.agents.lm.batching import GREEDY_BELOW, Generated, GrammarKind, Job, Sampling, cut_at_stop, grammar

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


class JsonSchema(BaseModel):
    """``response_format.json_schema`` as OpenAI's API takes it."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: Text
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None
    description: Text | None = None


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format``: plain text, any JSON object, or JSON following a schema."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> "ResponseFormat":
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is given with type json_schema, and only then")
        return self


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class StructuredOutputs(BaseModel):
    """vLLM's ``structured_outputs``: exactly one of a regular expression the whole reply matches, a
    JSON schema, a list of choices, a Lark grammar (llguidance's dialect) or ``json_object: true``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    regex: Text | None = None
    json_: dict[str, Any] | Text | None = Field(None, alias="json")
    choice: list[Text] | None = None
    grammar: Text | None = None
    json_object: Literal[True] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> "StructuredOutputs":
        if len(self.model_fields_set) != 1:
            raise ValueError("exactly one of regex, json, choice, grammar, json_object")
        return self

    def spec(self) -> tuple[GrammarKind, Any]:
        """(kind, its value), as :func:`~socialworld.agents.lm.batching.grammar` takes them."""
        name = next(iter(self.model_fields_set))
        kind: GrammarKind = "json" if name == "json_" else name  # type: ignore[assignment]
        return kind, getattr(self, name)


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

    def structure(self) -> tuple[GrammarKind, Any] | None:
        """The grammar the reply must follow, as (kind, value): ``structured_outputs``, or a JSON
        ``response_format``; ``ValueError`` when both are given."""
        fmt = self.response_format
        from_format: tuple[GrammarKind, Any] | None = None if fmt is None or fmt.type == "text" else ("json_object", True) if fmt.type == "json_object" else \
            ("json", fmt.json_schema.schema_ if fmt.json_schema is not None else None)
        if from_format is not None and self.structured_outputs is not None:
            raise ValueError("structured_outputs and a JSON response_format: give one")
        return self.structured_outputs.spec() if self.structured_outputs is not None else from_format

    def stops(self) -> tuple[str, ...]:
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        if len(stops) > 4 or not all(stops):
            raise ValueError("stop: at most 4 non-empty strings")
        return stops


# ------------------------------------------------------------------ decoding in batches


class Generate(Protocol):
    """What the server decodes with: ``prompt`` (the chat template), ``count`` (tokens in a text) and
    a call that decodes ``jobs`` and those ``admit()`` hands over between its steps, calling each
    job's ``deliver`` with its reply as it ends (a job whose ``cancelled`` is set may be dropped
    without one), and returns when none is left. ``matcher(grammar_text)``, where a decoder has it,
    compiles a grammar (:func:`~socialworld.agents.lm.batching.grammar`) for ``Job.grammar``."""

    def prompt(self, messages: list[dict[str, str]]) -> str: ...

    def count(self, text: str) -> int: ...

    def __call__(self, jobs: Sequence[Job], admit: Callable[[], list[Job]]) -> None: ...


class HFGenerate:
    """:class:`Generate` for a transformers causal LM: continuous batching
    (:class:`~socialworld.agents.lm.batching.ContinuousDecoder`), and the project's reply grammar
    through its own constrained decoder (:mod:`~socialworld.agents.lm.constrained`)."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        import torch

        from socialworld.agents.lm.batching import ContinuousDecoder
        from socialworld.agents.lm.constrained import MergedAdapters

        self.model, self.tokenizer = model, tokenizer
        self._merged = MergedAdapters()
        """a served PEFT model's adapters merged for constrained decoding, kept between requests"""
        self._tok_lock = threading.Lock()
        """a fast tokenizer is not safe across threads ("Already borrowed"): the event loop counts
        prompts while the worker thread encodes and decodes a batch"""
        stream = torch.Generator()
        stream.seed()
        self.decoder = ContinuousDecoder(model, tokenizer, self._tok_lock, stream)
        """unseeded requests sample from the server's own stream (seeded from the OS's entropy), so
        they differ while torch's global generator is left as it was; a seeded request from its seed"""

    def prompt(self, messages: list[dict[str, str]]) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def count(self, text: str) -> int:
        with self._tok_lock:
            return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def matcher(self, grammar_text: str) -> Any:
        return self.decoder.matcher(grammar_text)

    def __call__(self, jobs: Sequence[Job], admit: Callable[[], list[Job]]) -> None:
        if jobs[0].program is None:
            return self.decoder.run(jobs, admit)
        from socialworld.agents.lm.constrained import decode

        with self._tok_lock:
            rows = decode(self.model, self.tokenizer, [j.prompt for j in jobs], [list(j.program or ()) for j in jobs],
                          batch_size=len(jobs), merged=self._merged)
        for job, r in zip(jobs, rows):
            if job.deliver is not None:
                job.deliver(Generated(cut_at_stop(r.text, job.stops)[0], r.tokens_in, r.tokens_out, "stop"))


@dataclass
class BatchStats:
    requests: int = 0
    batches: int = 0
    """decoding runs started (each goes on while jobs join it)"""
    joined: int = 0
    """jobs that joined a batch while it decoded"""
    largest_batch: int = 0
    cancelled: int = 0
    """requests whose client went away before their reply"""


def _settle(future: asyncio.Future, result: Any) -> None:
    if not future.done():
        future.set_exception(result) if isinstance(result, BaseException) else future.set_result(result)


@dataclass
class Batcher:
    """Hands waiting jobs to the decoder: the jobs that arrive within ``wait_s`` of each other start
    a batch, and while it decodes, the decoder takes in (``admit``) the jobs of its lane that arrive,
    up to ``max_batch`` at a time (continuous batching; :attr:`Job.lane`: the project's grammar and a
    seeded request's samples decode on their own). One batch runs at a time, in a worker thread;
    cancelled jobs are dropped before they start, and the decoder drops those it holds."""

    generate: Generate
    max_batch: int = 16
    wait_s: float = 0.01
    stats: BatchStats = field(default_factory=BatchStats)
    _waiting: list[Job] = field(default_factory=list)
    _live: list[Job] = field(default_factory=list)
    """the running batch's jobs"""
    _lock: Any = field(default_factory=threading.Lock)
    _wake: asyncio.Event | None = None

    async def submit(self, job: Job) -> asyncio.Future:
        if self._wake is None:
            raise RuntimeError("the batcher is not running")
        loop = asyncio.get_running_loop()
        future = job.future = loop.create_future()

        def deliver(result: Generated) -> None:
            job.finished = True
            loop.call_soon_threadsafe(_settle, future, result)

        job.deliver = deliver
        self.stats.requests += 1
        with self._lock:
            self._waiting.append(job)
        self._wake.set()
        return future

    async def run(self) -> None:
        self._wake = asyncio.Event()
        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(self.wait_s)
            while batch := self._take(None):
                await self._decode(batch)

    def _take(self, lane: tuple | None) -> list[Job]:
        """Waiting jobs of ``lane`` (that of the oldest waiting job when ``None``), as many as the
        running batch has room for; they join it. None join while the oldest waiting job is of
        another lane: the batch then drains and that job's turn comes (no lane waits forever)."""
        with self._lock:
            self._waiting = [j for j in self._waiting if not j.cancelled]
            self._live = [j for j in self._live if not (j.finished or j.cancelled)]
            if not self._waiting or (lane is not None and self._waiting[0].lane != lane):
                return []
            lane = lane or self._waiting[0].lane
            room = self.max_batch - len(self._live)
            taken = [j for j in self._waiting if j.lane == lane][: max(room, 0)]
            chosen = {id(j) for j in taken}
            self._waiting = [j for j in self._waiting if id(j) not in chosen]
            self._live += taken
            for j in self._live:
                j.batch = max(j.batch, len(self._live))
            self.stats.largest_batch = max(self.stats.largest_batch, len(self._live))
            return taken

    async def _decode(self, batch: list[Job]) -> None:
        self.stats.batches += 1
        lane = batch[0].lane

        def admit() -> list[Job]:
            if lane != ("shared",):
                return []
            joined = self._take(lane)
            self.stats.joined += len(joined)
            return joined

        error: BaseException | None = None
        try:
            await asyncio.to_thread(self.generate, batch, admit)
        except Exception as err:  # noqa: BLE001 - each waiting request gets it as its 500
            error = err
        with self._lock:
            left, self._live = [j for j in self._live if not j.finished and not j.cancelled], []
        for j in left:
            if j.future is not None:
                _settle(j.future, error or RuntimeError("the decoder returned without this job's reply"))


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


class Rejected(Exception):
    """A request answered with an error instead of a reply: its status, message and code."""

    def __init__(self, status: int, message: str, what: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.what = status, message, what

    def response(self) -> Any:
        return _error(self.status, self.message, what=self.what)


@dataclass
class Completion:
    """One accepted chat completion: its jobs (one per ``n``) and what its answer and log line need."""

    id: str
    req: ChatRequest
    jobs: list[Job]
    stops: tuple[str, ...]
    head: dict
    t0: float
    stats: BatchStats

    def log(self, code: int, results: Sequence[Generated] = ()) -> None:
        log.info("%s %d prompt=%d completion=%d n=%d batch=%d %.2fs%s", self.id, code, results[0].tokens_in if results else 0,
                 sum(g.tokens_out for g in results), self.req.n, max(j.batch for j in self.jobs), time.perf_counter() - self.t0,
                 " stream" if self.req.stream else "")

    @staticmethod
    def usage(results: Sequence[Generated]) -> dict:
        out = sum(g.tokens_out for g in results)
        return {"prompt_tokens": results[0].tokens_in, "completion_tokens": out, "total_tokens": results[0].tokens_in + out}

    def cancel(self) -> None:
        for j in self.jobs:
            if j.future is not None and not j.future.done() and not j.cancelled:
                j.cancelled = True
                self.stats.cancelled += 1

    def answer(self, results: Sequence[Generated]) -> dict:
        return {
            **self.head, "object": "chat.completion",
            "choices": [{"index": i, "message": {"role": "assistant", "content": g.text},
                         "logprobs": None if g.logprobs is None else {"content": [t.openai() for t in g.logprobs], "refusal": None},
                         "finish_reason": g.finish_reason} for i, g in enumerate(results)],
            "usage": self.usage(results),
        }


class ChatService:
    """What ``POST /v1/chat/completions`` does: read a request into jobs (:meth:`accept`: every
    check, the grammar compiled), hand them to the :class:`Batcher`, and answer whole
    (:meth:`reply`) or as server-sent events (:meth:`stream`); a client that goes away cancels its
    jobs. ``max_new_tokens`` is a request's default ``max_tokens``; ``max_context`` (prompt plus reply
    tokens) bounds a request when given."""

    def __init__(self, generate: Generate, model_id: str, max_new_tokens: int = 64, max_context: int | None = None,
                 max_batch: int = 16) -> None:
        self.generate, self.model_id, self.max_new_tokens, self.max_context = generate, model_id, max_new_tokens, max_context
        self.batcher = Batcher(generate, max_batch=max_batch)
        self._numbers = itertools.count()
        self.card = {"id": model_id, "object": "model", "created": int(time.time()), "owned_by": "socialworld"}

    def unknown(self, name: str) -> Rejected:
        return Rejected(404, f"the model {name!r} does not exist; this server has {self.model_id!r}", "model_not_found")

    async def complete(self, req: ChatRequest, request: Any) -> Any:
        t0 = time.perf_counter()
        try:
            c = await self.accept(req, t0)
        except Rejected as r:
            return r.response()
        request.state.logged = True
        return self.stream(c) if req.stream else await self.reply(c, request)

    async def accept(self, req: ChatRequest, t0: float) -> Completion:
        """The request's jobs, or :class:`Rejected` with the reason."""
        if req.model != self.model_id:
            raise self.unknown(req.model)
        try:
            stops, structure = req.stops(), req.structure()
        except ValueError as err:
            raise Rejected(400, f"bad request: {err}") from None
        max_batch = self.batcher.max_batch
        for bad, why in ((req.n > max_batch, f"n: at most {max_batch} on this server (its --max-batch)"),
                         (req.top_logprobs is not None and not req.logprobs, "top_logprobs: needs logprobs: true"),
                         (req.logprobs and req.stream, "logprobs: not served with stream on this server"),
                         (req.stream_options is not None and not req.stream, "stream_options: needs stream: true")):
            if bad:
                raise Rejected(400, f"bad request: {why}")
        prompt = self.generate.prompt([{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                                       for m in req.messages])
        limit = req.max_completion_tokens or req.max_tokens or self.max_new_tokens
        if self.max_context is not None and (n := self.generate.count(prompt)) + limit > self.max_context:
            raise Rejected(400, f"bad request: {n} prompt tokens plus max_tokens {limit} exceed the model's {self.max_context}")
        program, matchers = await self._grammar(req, structure, limit)
        number = next(self._numbers)
        jobs = [Job(prompt, limit, stops, Sampling(req.temperature, req.top_p, req.seed), program, grammar=m,
                    logprobs=(req.top_logprobs or 0) if req.logprobs else None, request=number) for m in matchers]
        rid = f"chatcmpl-{time.time_ns()}"
        head = {"id": rid, "created": int(time.time()), "model": self.model_id, "system_fingerprint": None}
        return Completion(rid, req, jobs, stops, head, t0, self.batcher.stats)

    async def _grammar(self, req: ChatRequest, structure: tuple[GrammarKind, Any] | None, limit: int) -> tuple[tuple | None, list]:
        """The project's reply program (a greedy regex in its language: its own constrained decoder), or
        one llguidance matcher per sample, or neither."""
        if structure is None:
            return None, [None] * req.n
        kind, spec = structure
        if kind == "regex" and req.temperature < GREEDY_BELOW and not req.logprobs:
            from socialworld.agents.lm.constrained import program_from_regex

            try:
                return tuple(program_from_regex(spec, limit)), [None] * req.n
            except ValueError:
                pass  # any other regex: llguidance
        where = "response_format" if req.structured_outputs is None else f"structured_outputs.{kind}"
        compile_ = getattr(self.generate, "matcher", None)
        if compile_ is None:
            raise Rejected(400, f"bad request: {where}: this server's decoder takes no grammar")
        try:
            first = await asyncio.to_thread(compile_, grammar(kind, spec))
        except ValueError as err:
            raise Rejected(400, f"bad request: {where}: {err}") from None
        return None, [first] + [first.deep_copy() for _ in range(req.n - 1)]

    async def reply(self, c: Completion, request: Any) -> Any:
        """The whole answer once every job has its reply; 499 when the client goes away first."""
        futures = [await self.batcher.submit(j) for j in c.jobs]
        while not all(f.done() for f in futures):
            await asyncio.wait(futures, timeout=0.05)
            if not all(f.done() for f in futures) and await request.is_disconnected():
                c.cancel()
                c.log(499)
                return _error(499, "the client closed the request")
        try:
            results: list[Generated] = [f.result() for f in futures]  # a decoding error is raised here: the app's 500
        except Exception:
            c.log(500)
            raise
        c.log(200, results)
        return c.answer(results)

    def stream(self, c: Completion) -> Any:
        """The reply as server-sent events: a first chunk with the role, then each choice's text as it
        is decoded (less what could still be the start of a stop string), its finish, the usage when
        asked, and ``[DONE]``; an error after the first chunk is an ``error`` event. A client that
        goes away cancels the jobs."""
        from fastapi.responses import StreamingResponse

        held = max((len(x) for x in c.stops), default=1) - 1
        with_usage = c.req.stream_options is not None and c.req.stream_options.include_usage
        loop, arrived = asyncio.get_running_loop(), asyncio.Queue()  # type: ignore[var-annotated]

        def emitter(i: int) -> Callable[[str], None]:
            def emit(text: str) -> None:
                loop.call_soon_threadsafe(arrived.put_nowait, (i, text))
            return emit

        for i, j in enumerate(c.jobs):
            j.emit = emitter(i)

        def event(choices: list, **more: Any) -> str:
            return f"data: {json.dumps({**c.head, 'object': 'chat.completion.chunk', 'choices': choices, **more})}\n\n"

        def delta(i: int, text: str, finish: str | None = None) -> dict:
            return {"index": i, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}

        async def events():  # type: ignore[no-untyped-def]
            futures = [await self.batcher.submit(j) for j in c.jobs]
            sent = [""] * len(c.jobs)
            try:
                yield event([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None} for i in range(len(c.jobs))])
                while not (all(f.done() for f in futures) and arrived.empty()):
                    try:
                        i, text = await asyncio.wait_for(arrived.get(), timeout=0.05)
                    except TimeoutError:
                        continue
                    text = cut_at_stop(text, c.stops)[0].rstrip("\ufffd")  # a character still being decoded waits too
                    safe = text[: max(len(text) - held, 0)]
                    if len(safe) > len(sent[i]) and safe.startswith(sent[i]):
                        yield event([delta(i, safe[len(sent[i]) :])])
                        sent[i] = safe
                try:
                    results: list[Generated] = [f.result() for f in futures]
                except Exception as err:  # noqa: BLE001 - the status line has gone: the error travels as an event
                    c.log(500)
                    yield f"data: {json.dumps({'error': {'message': f'internal error: {err!r}', 'type': 'server_error', 'code': '500'}})}\n\n"
                    return
                for i, g in enumerate(results):
                    yield event([delta(i, g.text[len(sent[i]) :] if g.text.startswith(sent[i]) else "", g.finish_reason)])
                if with_usage:
                    yield event([], usage=c.usage(results))
                yield "data: [DONE]\n\n"
                c.log(200, results)
            finally:
                if not all(f.done() for f in futures):  # the client went away
                    c.cancel()
                    c.log(499)

        return StreamingResponse(events(), media_type="text/event-stream")


def make_app(generate: Generate, model_id: str, max_new_tokens: int = 64, max_context: int | None = None,
             max_batch: int = 16) -> Any:
    """The FastAPI app serving ``generate`` (an :class:`HFGenerate`, or any :class:`Generate`) as model
    ``model_id``: routes and error handlers around a :class:`ChatService` (``app.state.service``; its
    batcher also ``app.state.batcher``)."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    service = ChatService(generate, model_id, max_new_tokens, max_context, max_batch)

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # type: ignore[no-untyped-def]
        task = asyncio.create_task(service.batcher.run())
        try:
            yield
        finally:
            task.cancel()

    app = FastAPI(title="socialworld serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.service, app.state.batcher = service, service.batcher

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
        return {"object": "list", "data": [service.card]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str):  # type: ignore[no-untyped-def]
        return service.card if name == model_id else service.unknown(name).response()

    app.add_middleware(OneLineEach)

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest, request: Request):  # type: ignore[no-untyped-def]
        return await service.complete(req, request)

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
        import llguidance  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ValueError("serve needs FastAPI, uvicorn and llguidance: pip install 'socialworld[serve]'") from None
    from socialworld.agents.models import check_loads, parse_model_spec
    from socialworld.agents.registry import make_backend

    ms = parse_model_spec(model)
    if ms.kind not in ("bundled", "hf"):
        raise ValueError(f"can only serve a local model, not {model!r}")
    check_loads(model, "--model")  # a missing extra or unknown model is named whatever the port's state
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
