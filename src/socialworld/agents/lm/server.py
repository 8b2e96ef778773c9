"""An OpenAI-compatible server for a local policy model (``socialworld serve``), on FastAPI and uvicorn.

Routes: ``GET /v1/models``, ``GET /v1/models/{id}`` and non-streaming ``POST /v1/chat/completions``.

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
* Requests that arrive together are decoded in one batch (:class:`Batcher`: those with the same
  sampling settings, up to ``max_batch``); a client that goes away cancels its request, whether
  it waits in the queue or is being decoded.

It serves one local model (with a trained run's adapters when its spec names them) on one
process; for throughput at scale, serve the model with vLLM (see ``docs/serving.md``).
"""


import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Protocol, Sequence

from pydantic import BaseModel, ConfigDict, Field

Finish = Literal["stop", "length"]


# ------------------------------------------------------------------ the request, as the server reads it


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text"]


class StructuredOutputs(BaseModel):
    """vLLM's ``structured_outputs`` field as socialworld's ``openai:`` policies send it: the reply
    grammar as a regular expression (:func:`~socialworld.agents.lm.constrained.program_regex`)."""

    model_config = ConfigDict(extra="forbid")
    regex: str


class ChatRequest(BaseModel):
    """The fields of a chat completion request this server honours; any other field is a 400."""

    model_config = ConfigDict(extra="forbid")
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1, strict=True)
    max_completion_tokens: int | None = Field(None, ge=1, strict=True)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, strict=True, ge=-(2**63), le=2**63 - 1)  # int64, as OpenAI's API and torch's seed take
    n: Literal[1] = 1
    stream: Literal[False] = False
    response_format: ResponseFormat | None = None
    frequency_penalty: Literal[0] = 0
    presence_penalty: Literal[0] = 0
    logprobs: Literal[False] = False
    user: str | None = None
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
    cancelled: bool = False
    future: asyncio.Future | None = None


@dataclass(frozen=True)
class Generated:
    text: str
    tokens_in: int
    tokens_out: int
    finish_reason: Finish


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

        class Cancelled(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):  # type: ignore[no-untyped-def]
                return torch.full((input_ids.shape[0],), should_stop(), dtype=torch.bool, device=input_ids.device)

        tok, s = self.tokenizer, jobs[0].sampling
        if jobs[0].program is not None:
            return self._constrained(jobs)
        with self._tok_lock:
            enc = tok([j.prompt for j in jobs], return_tensors="pt", padding=True, add_special_tokens=False).to(self.model.device)
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
                                      eos_token_id=tok.eos_token_id, stopping_criteria=StoppingCriteriaList([Cancelled()]),
                                      **sample)
            if s.seed is None:
                self._stream = torch.get_rng_state()
        width = enc["input_ids"].shape[1]
        results = []
        for i, job in enumerate(jobs):
            ids = out[i, width:].tolist()[: job.max_tokens]
            ended = tok.eos_token_id in ids
            ids = ids[: ids.index(tok.eos_token_id)] if ended else ids
            with self._tok_lock:
                text, stopped = cut_at_stop(tok.decode(ids, skip_special_tokens=True), job.stops)
            n_out = self.count(text) if stopped else len(ids)
            results.append(Generated(text, int(enc["attention_mask"][i].sum()), n_out,
                                     "stop" if ended or stopped else "length"))
        return results


    def _constrained(self, jobs: Sequence[Job]) -> list[Generated]:
        """Greedy decoding under each job's grammar (:mod:`socialworld.agents.lm.constrained`): a
        reply the grammar allows, by construction."""
        from socialworld.agents.lm.constrained import decode

        with self._tok_lock:
            rows = decode(self.model, self.tokenizer, [j.prompt for j in jobs], [list(j.program or ()) for j in jobs],
                          batch_size=len(jobs))
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
    a seeded one decodes alone, so its reply depends on its seed only). One batch at a time runs,
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
                (id(j),) if j.sampling.seed is not None else (j.sampling.temperature, j.sampling.top_p)
            groups.setdefault(key, []).append(j)
        return [g[i : i + self.max_batch] for g in groups.values() for i in range(0, len(g), self.max_batch)]

    async def _decode(self, group: list[Job]) -> None:
        self.stats.batches += 1
        self.stats.largest_batch = max(self.stats.largest_batch, len(group))
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

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest, request: Request):  # type: ignore[no-untyped-def]
        if req.model != model_id:
            return _error(404, f"the model {req.model!r} does not exist; this server has {model_id!r}", what="model_not_found")
        try:
            stops = req.stops()
        except ValueError as err:
            return _error(400, f"bad request: {err}")
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
        job = Job(prompt, limit, stops, Sampling(req.temperature, req.top_p, req.seed), program)
        future = await batcher.submit(job)
        while not future.done():
            await asyncio.wait({future}, timeout=0.05)
            if not future.done() and await request.is_disconnected():
                job.cancelled = True
                batcher.stats.cancelled += 1
                return _error(499, "the client closed the request")
        g: Generated = future.result()  # a decoding error is raised here: the 500 above
        return {
            "id": f"chatcmpl-{time.time_ns()}", "object": "chat.completion", "created": int(time.time()), "model": model_id,
            "system_fingerprint": None,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": g.text}, "logprobs": None,
                         "finish_reason": g.finish_reason}],
            "usage": {"prompt_tokens": g.tokens_in, "completion_tokens": g.tokens_out, "total_tokens": g.tokens_in + g.tokens_out},
        }

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
    print(f"serving {model} on http://{host}:{sock.getsockname()[1]}/v1", flush=True)
    server_for(app, sock).run(sockets=[sock])
