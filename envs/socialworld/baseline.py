"""Score a model on the social world's three tasks (tiers L0, L1, L2, easy to hard) through its OpenEnv
server, with the rule graders: pass (1/0) and the completion rate CR, each in [0, 1].

    # a server (here, or the Space), with the scripted baselines allowed:
    SOCIALWORLD_SCRIPTED=1 uvicorn server.app:app --port 8000          # or: socialworld env serve --scripted --port 8000
    # any OpenAI-compatible model (socialworld serve, vLLM, a hosted API):
    API_BASE_URL=http://localhost:8001/v1 MODEL_NAME=bundled python baseline.py --env-url http://localhost:8000
    # the expert and the oracle, through the same server:
    python baseline.py --policy expert --env-url http://localhost:8000

Each task is one episode (``reset(split=, index=)``); the model gets the observation's chat
(``observation.messages``) and its reply is the step, greedy (temperature 0) unless ``--temperature``.
``--constrained`` also sends the state's reply grammar (``observation.reply_regex``) as vLLM's
``structured_outputs`` (``socialworld serve`` and vLLM take it), so every reply parses.
A request that fails (refused, timed out, no choices) ends that episode as an endpoint failure: counted
apart, never scored as a bad reply. A reply that does not parse is the world's own penalised ``wait()``,
counted as unparseable. ``--json PATH`` writes the scores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field

from socialworld.rollout.openenv import ENV_NAME, GRADERS, TIERS, SocialAction, SocialWorldClient


@dataclass
class SplitScore:
    """One split's result: the graders' means over the episodes scored, and what could not be scored."""

    split: str
    episodes: int = 0
    """episodes played to the end and graded"""
    endpoint_failures: int = 0
    """episodes ended by a request to the model that failed (not graded)"""
    steps: int = 0
    unparseable: int = 0
    """steps whose reply did not parse (the world's penalised wait())"""
    grades: dict[str, list[float]] = field(default_factory=lambda: {g: [] for g in GRADERS})

    def mean(self, grader: str) -> float | None:
        values = self.grades[grader]
        return statistics.fmean(values) if values else None


class ModelReplies:
    """Replies from an OpenAI-compatible endpoint (the ``openai`` client): the observation's chat in, the
    first choice's text out."""

    def __init__(self, base_url: str, model: str, api_key: str, temperature: float, max_tokens: int, timeout_s: float,
                 constrained: bool = False):
        from openai import OpenAI

        self.client = OpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=0)
        self.model, self.temperature, self.max_tokens, self.constrained = model, temperature, max_tokens, constrained

    def __call__(self, messages: list[dict[str, str]], reply_regex: str = "") -> str:
        grammar = {"structured_outputs": {"regex": reply_regex}} if self.constrained and reply_regex else {}
        out = self.client.chat.completions.create(model=self.model, messages=messages,  # type: ignore[arg-type]
                                                  temperature=self.temperature, max_tokens=self.max_tokens, extra_body=grammar)
        if not out.choices or out.choices[0].message.content is None:
            raise RuntimeError("the endpoint answered without a reply")
        return out.choices[0].message.content


def num_tasks(env_url: str, split: str) -> int:
    """How many tasks ``split`` has: OpenEnv's Task API (``POST /socialworld/num_tasks``)."""
    req = urllib.request.Request(f"{env_url.rstrip('/')}/{ENV_NAME}/num_tasks", data=json.dumps({"split": split}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return int(json.load(r)["num_tasks"])


def score(env_url: str, policy: str, per_split: int | None, replies: ModelReplies | None = None) -> list[SplitScore]:
    """Play ``per_split`` tasks of each split (all of them when None) with ``policy`` (``model``: ``replies``;
    ``expert`` or ``oracle``: the server writes the reply) and grade each episode."""
    results = []
    with SocialWorldClient(base_url=env_url).sync() as env:
        for split in TIERS:
            res = SplitScore(split)
            count = min(per_split, num_tasks(env_url, split)) if per_split is not None else num_tasks(env_url, split)
            for index in range(count):
                step = env.reset(split=split, index=index)
                failed = False
                while not step.done:
                    if policy == "model":
                        assert replies is not None
                        try:
                            reply = replies(step.observation.messages, step.observation.reply_regex)
                        except Exception as e:  # noqa: BLE001 (any failure of the request is the endpoint's, counted apart)
                            print(f"{split}-{index}: the endpoint failed ({type(e).__name__}: {str(e)[:200]})", file=sys.stderr)
                            failed = True
                            break
                        step = env.step(SocialAction(reply=reply))
                    else:
                        step = env.step(SocialAction(reply="", scripted=policy))
                    res.steps += 1
                    res.unparseable += step.observation.metadata.get("parse_status") == "unparseable"
                if failed:
                    res.endpoint_failures += 1
                    continue
                res.episodes += 1
                for g in GRADERS:
                    res.grades[g].append(float(step.observation.metadata["outcome"][g]))
            results.append(res)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env-url", default=os.environ.get("ENV_URL", "http://localhost:8000"), help="the OpenEnv server")
    ap.add_argument("--policy", choices=("model", "expert", "oracle"), default="model",
                    help="model: API_BASE_URL and MODEL_NAME; expert, oracle: written by a server started with scripted replies")
    ap.add_argument("--per-split", type=int, default=None, help="tasks per split (default: all: 20, 30, 30)")
    ap.add_argument("--temperature", type=float, default=0.0, help="the model's sampling temperature (0: greedy)")
    ap.add_argument("--max-tokens", type=int, default=64, help="the longest reply")
    ap.add_argument("--constrained", action="store_true",
                    help="send each state's reply grammar as structured_outputs.regex (socialworld serve, vLLM)")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds a request to the model may take")
    ap.add_argument("--json", default=None, help="also write the scores here")
    args = ap.parse_args()
    if args.per_split is not None and args.per_split < 1:
        ap.error("--per-split must be at least 1")
    replies = None
    if args.policy == "model":
        base_url, model = os.environ.get("API_BASE_URL"), os.environ.get("MODEL_NAME")
        if not base_url or not model:
            ap.error("--policy model needs API_BASE_URL (e.g. http://localhost:8001/v1) and MODEL_NAME in the environment")
        replies = ModelReplies(base_url, model, os.environ.get("API_KEY", os.environ.get("OPENAI_API_KEY", "none")),
                               args.temperature, args.max_tokens, args.timeout, args.constrained)
    t0 = time.perf_counter()
    results = score(args.env_url, args.policy, args.per_split, replies)
    wall = time.perf_counter() - t0
    name = os.environ.get("MODEL_NAME", "model") if args.policy == "model" else args.policy
    name += " (constrained)" if args.constrained and args.policy == "model" else ""
    print(f"{name} on {args.env_url} ({wall:.0f} s)")
    print(f"{'task':<5} {'episodes':>8} {'pass':>6} {'CR':>6} {'unparseable':>12} {'endpoint failures':>18}")
    for r in results:
        p, cr = r.mean("pass"), r.mean("CR")
        print(f"{r.split:<5} {r.episodes:>8} {'-' if p is None else f'{p:.2f}':>6} {'-' if cr is None else f'{cr:.2f}':>6} "
              f"{r.unparseable / max(r.steps, 1):>12.2f} {r.endpoint_failures:>18}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"policy": name, "env_url": args.env_url, "wall_s": wall,
                       "splits": [{**asdict(r), "means": {g: r.mean(g) for g in GRADERS}} for r in results]}, f, indent=1)


if __name__ == "__main__":
    main()
