"""A small OpenAI-compatible server for a policy model (``socialworld serve``).

Endpoints: ``GET /v1/models`` and non-streaming ``POST /v1/chat/completions``. One model, one
request at a time (a lock); for throughput use vLLM's server. Built on the standard library so
serving needs nothing beyond the model stack.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .backends import HFBackend


def make_server(backend: HFBackend, host: str = "127.0.0.1", port: int = 8000, model_id: str | None = None) -> ThreadingHTTPServer:
    lock = threading.Lock()
    name = model_id or backend.name

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _send(self, code: int, payload: dict) -> None:
            body = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _error(self, code: int, message: str) -> None:
            self._send(code, {"error": {"message": message, "type": "invalid_request_error", "code": code}})

        def do_GET(self) -> None:  # noqa: N802
            if self.path.rstrip("/") == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "socialworld"}]})
            else:
                self._error(404, f"no route {self.path}")

        def do_POST(self) -> None:  # noqa: N802
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._error(404, f"no route {self.path}")
                return
            try:
                req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                messages = req["messages"]
                if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m and "content" in m for m in messages):
                    raise ValueError("messages must be a list of {role, content}")
            except (ValueError, KeyError, TypeError) as err:
                self._error(400, f"bad request: {err}")
                return
            if req.get("stream"):
                self._error(400, "streaming is not supported")
                return
            max_tokens = int(req.get("max_tokens") or backend.max_new_tokens)
            with lock:
                c = backend.generate(backend.prompts([messages]), max_tokens)[0]
            self._send(200, {
                "id": f"chatcmpl-{time.time_ns()}", "object": "chat.completion", "created": int(time.time()), "model": name,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": c.text},
                             "finish_reason": "stop" if c.tokens_out < max_tokens else "length"}],
                "usage": {"prompt_tokens": c.tokens_in, "completion_tokens": c.tokens_out,
                          "total_tokens": c.tokens_in + c.tokens_out},
            })

    return ThreadingHTTPServer((host, port), Handler)


def serve(model: str, host: str = "127.0.0.1", port: int = 8000, max_new_tokens: int = 64, dtype: str = "auto") -> None:
    """Load ``model`` (a model spec: ``bundled``, a path or hub id, with ``+<adapters>`` for a trained
    policy, whose action adapter answers) and serve it until interrupted, as model id ``model``."""
    from . import make_backend
    from .models import parse_model_spec

    ms = parse_model_spec(model)
    if ms.kind not in ("bundled", "hf"):
        raise ValueError(f"can only serve a local model, not {model!r}")
    backend = make_backend(model, max_new_tokens=max_new_tokens, batch_size=1, dtype=dtype)
    server = make_server(backend, host, port, model_id=model)
    print(f"serving {model} on http://{host}:{port}/v1", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
