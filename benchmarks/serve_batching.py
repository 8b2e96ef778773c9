"""`socialworld serve` throughput: concurrent clients batched against one request at a time, in one run.

Run: ``python benchmarks/serve_batching.py`` (the bundled model, 8 clients, each sending the
policy's real prompts: the first evaluation observations of the eight scenarios, greedy, 48 new
tokens), ``--model <spec>``, ``--clients N``, ``--requests N`` (per client).

Both passes go through the same server and the official ``openai`` client; only the server's
``max_batch`` differs (1: one request at a time, as ``serve`` answered before batching; N: the
requests that arrive together are decoded together). Prints the CPU, requests per second,
generated tokens per second, the mean latency, and the ratio.
"""

from __future__ import annotations

import argparse
import threading
import time


def _prompts() -> list[list[dict[str, str]]]:
    from socialworld.agents.lm.prompts import build_messages
    from socialworld.world.engine import World
    from socialworld.world.spec import load_builtin_scenarios
    from socialworld.world.visibility import observe

    return [build_messages(observe(s, World(s, seed=0).pub)) for s in load_builtin_scenarios().values()]


def _pass(url: str, model_id: str, convs, clients: int, requests: int, max_tokens: int) -> tuple[float, int, float]:
    import openai

    done: list[tuple[int, float]] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        c = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
        for k in range(requests):
            t0 = time.perf_counter()
            r = c.chat.completions.create(model=model_id, messages=convs[(i + k) % len(convs)], temperature=0,
                                          max_tokens=max_tokens)
            with lock:
                done.append((r.usage.completion_tokens, time.perf_counter() - t0))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return wall, sum(n for n, _ in done), sum(s for _, s in done) / len(done)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="bundled", help="model spec to serve")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=2, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()

    from socialworld.agents.lm.server import HFGenerate, make_app
    from socialworld.agents.models import cpu_description
    from socialworld.agents.registry import make_backend
    from socialworld.testing import serving

    backend = make_backend(args.model, max_new_tokens=args.max_tokens)
    gen = HFGenerate(backend.model, backend.tokenizer)
    convs = _prompts()
    print(f"CPU: {cpu_description()}; model {args.model} ({backend.decoding['dtype']}); {args.clients} clients x {args.requests} "
          f"requests, {args.max_tokens} new tokens each, greedy")
    n = args.clients * args.requests
    rates = {}
    for label, max_batch in (("one at a time", 1), ("batched", args.clients)):
        app = make_app(gen, args.model, args.max_tokens, max_batch=max_batch)
        with serving(app) as url:
            _pass(url, args.model, convs, 1, 1, 4)  # warm-up
            wall, tokens, latency = _pass(url, args.model, convs, args.clients, args.requests, args.max_tokens)
        stats = app.state.batcher.stats
        rates[label] = n / wall
        print(f"{label:>14}: {n} requests in {wall:.1f} s = {n / wall:.2f} req/s, {tokens / wall:.1f} generated tok/s, "
              f"mean latency {latency:.1f} s, {stats.batches} batches (largest {stats.largest_batch})")
    print(f"batched / one at a time: {rates['batched'] / rates['one at a time']:.2f}x requests per second")


if __name__ == "__main__":
    main()
