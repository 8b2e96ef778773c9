"""`socialworld serve` throughput: concurrent clients, one request at a time against batched, in one run.

Run: ``python benchmarks/serve_batching.py`` (the bundled model, 8 clients, greedy, 48 new tokens):

* ``--turns 1`` (single requests): each client sends the policy's real prompts (the first
  observations of the eight scenarios), ``--requests`` of them;
* ``--turns N`` (multi-turn clients, the default 4): each client plays an episode of its own
  scenario through :class:`~socialworld.rollout.textenv.TextEpisode`, sending the next turn's
  prompt when its last reply came back, so requests arrive apart, as an agent's do.

Three passes go through the same server and the official ``openai`` client: ``max_batch`` 1 (one
request at a time), batched without joining (the requests that arrive within the 10 ms window start
a batch; later ones wait for it to end, as ``serve`` batched before continuous batching), and
continuous batching (a request joins the running batch at its next step). Prints the CPU, requests
per second, generated tokens per second, the mean latency, the batches and joins, and the ratios.
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any


def _first_prompts() -> list[list[dict[str, str]]]:
    from socialworld.agents.lm.prompts import build_messages
    from socialworld.world.engine import World
    from socialworld.world.spec import load_builtin_scenarios
    from socialworld.world.visibility import observe

    return [build_messages(observe(s, World(s, seed=0).pub)) for s in load_builtin_scenarios().values()]


def _pass(url: str, model_id: str, clients: int, requests: int, turns: int, max_tokens: int) -> tuple[float, int, float, int]:
    import openai

    from socialworld.rollout.textenv import TextEpisode
    from socialworld.world.spec import load_builtin_scenarios

    specs = list(load_builtin_scenarios().values())
    firsts = _first_prompts()
    done: list[tuple[int, float]] = []
    lock = threading.Lock()

    def ask(c: Any, messages: list[dict[str, str]]) -> str:
        t0 = time.perf_counter()
        r = c.chat.completions.create(model=model_id, messages=messages, temperature=0, max_tokens=max_tokens)
        with lock:
            done.append((r.usage.completion_tokens, time.perf_counter() - t0))
        return r.choices[0].message.content or ""

    def client(i: int) -> None:
        c = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
        if turns == 1:
            for k in range(requests):
                ask(c, firsts[(i + k) % len(firsts)])
            return
        episode = TextEpisode(specs[i % len(specs)], seed=i)
        for _ in range(turns):
            _, info = episode.observe()
            _, over, _ = episode.step(ask(c, info["messages"]))
            if over:
                break

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return wall, sum(n for n, _ in done), sum(s for _, s in done) / len(done), len(done)


class _NoJoining:
    """The decoder as ``serve`` batched before continuous batching: a batch takes no newcomers."""

    def __init__(self, gen: Any) -> None:
        self.gen = gen

    def prompt(self, messages: list[dict[str, str]]) -> str:
        return self.gen.prompt(messages)

    def count(self, text: str) -> int:
        return self.gen.count(text)

    def __call__(self, jobs: Any, admit: Any) -> None:
        self.gen(jobs, lambda: [])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="bundled", help="model spec to serve")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4, help="turns per client's episode (1: single requests)")
    ap.add_argument("--requests", type=int, default=2, help="requests per client, with --turns 1")
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()

    from socialworld.agents.lm.server import HFGenerate, make_app
    from socialworld.agents.models import cpu_description
    from socialworld.agents.registry import make_backend
    from socialworld.testing import serving

    backend = make_backend(args.model, max_new_tokens=args.max_tokens)
    gen = HFGenerate(backend.model, backend.tokenizer)
    what = f"{args.turns}-turn episodes" if args.turns > 1 else f"{args.requests} requests each"
    print(f"CPU: {cpu_description()}; model {args.model} ({backend.decoding['dtype']}); {args.clients} clients, {what}, "
          f"{args.max_tokens} new tokens at most, greedy")
    rates = {}
    for label, decoder, max_batch in (("one at a time", gen, 1), ("no joining", _NoJoining(gen), args.clients),
                                      ("continuous", gen, args.clients)):
        app = make_app(decoder, args.model, args.max_tokens, max_batch=max_batch)
        with serving(app) as url:
            _pass(url, args.model, 1, 1, 1, 4)  # warm-up
            wall, tokens, latency, n = _pass(url, args.model, args.clients, args.requests, args.turns, args.max_tokens)
        stats = app.state.batcher.stats
        rates[label] = n / wall
        print(f"{label:>14}: {n} requests in {wall:.1f} s = {n / wall:.2f} req/s, {tokens / wall:.1f} generated tok/s, "
              f"mean latency {latency:.1f} s, {stats.batches} batches (largest {stats.largest_batch}), {stats.joined} joined")
    for label in ("no joining", "continuous"):
        print(f"{label} / one at a time: {rates[label] / rates['one at a time']:.2f}x requests per second")
    print(f"continuous / no joining: {rates['continuous'] / rates['no joining']:.2f}x requests per second")


if __name__ == "__main__":
    main()
