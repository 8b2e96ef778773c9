"""The social world through OpenEnv's server: steps per second with 1 and with 16 sessions, and through
the MCP tools (``act`` over JSON-RPC on ``/mcp``), against the same replies played on the in-process
world, in one run.

Run: ``python benchmarks/openenv_speed.py`` (``--episodes N`` per session, default 4). Needs
``pip install -e '.[openenv]'``.

Each session plays the expert's moves (computed beforehand with the runner, so the expert's own
time is not measured) as reply text: in-process through :class:`socialworld.rollout.textenv.TextEpisode`,
then through :class:`socialworld.rollout.openenv.SocialWorldClient` over the WebSocket to a local
server, with 1 session and with 16 sessions at once (one thread each), and through the MCP tools in one
session (``start`` and ``act`` over HTTP JSON-RPC, one request a step). Prints the CPU and steps per
second of each, and the ratios.
"""

from __future__ import annotations

import argparse
import threading
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=4, help="episodes per session")
    args = ap.parse_args()

    from socialworld.agents.models import cpu_description
    from socialworld.agents.scripted import ExpertPolicy
    from socialworld.rollout.openenv import SocialAction, SocialWorldClient, make_app
    from socialworld.rollout.runner import EpisodeJob, run_episodes
    from socialworld.rollout.textenv import TextEpisode
    from socialworld.testing import serving
    from socialworld.world.spec import load_builtin_scenarios

    specs = list(load_builtin_scenarios().values())
    jobs = [EpisodeJob(specs[i % len(specs)], i) for i in range(16 * args.episodes)]
    plays = [[f"ACTION: {s.action.executed}\nSAY: {s.dialogue.utterance}" for s in ep.steps]
             for ep in run_episodes(ExpertPolicy(), jobs)]

    t0 = time.perf_counter()
    steps = 0
    for job, replies in zip(jobs, plays):
        episode = TextEpisode(job.spec, job.seed)
        for r in replies:
            episode.step(r)
            steps += 1
    local = steps / (time.perf_counter() - t0)

    def session(k: int, sessions: int, url: str, counted: list[int]) -> None:
        with SocialWorldClient(base_url=url).sync() as env:
            for i in range(k, len(jobs), sessions):
                env.reset(seed=jobs[i].seed, scenario=jobs[i].spec.id)
                for r in plays[i]:
                    env.step(SocialAction(reply=r))
                    counted[k] += 1

    rates = {}
    with serving(make_app(max_sessions=16)) as u:
        url = u.removesuffix("/v1")
        for sessions in (1, 16):
            counted = [0] * sessions
            threads = [threading.Thread(target=session, args=(k, sessions, url, counted)) for k in range(sessions)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            rates[sessions] = sum(counted) / (time.perf_counter() - t0)
        import httpx

        with httpx.Client(base_url=url, timeout=60) as http:
            def rpc(method: str, **params: object) -> dict:
                return http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).json()

            sid = rpc("openenv/session/create")["result"]["session_id"]
            t0, counted_mcp = time.perf_counter(), 0
            for job, replies in zip(jobs, plays):
                rpc("tools/call", session_id=sid, name="start", arguments={"scenario": job.spec.id, "seed": job.seed})
                for r in replies:
                    assert "result" in rpc("tools/call", session_id=sid, name="act", arguments={"reply": r})
                    counted_mcp += 1
            mcp = counted_mcp / (time.perf_counter() - t0)
            rpc("openenv/session/close", session_id=sid)

    print(f"CPU: {cpu_description()}, {len(jobs)} episodes, {steps} steps each way")
    print(f"in-process world:        {local:9.0f} steps/s")
    for sessions, rate in rates.items():
        print(f"OpenEnv server, {sessions:2d} session{'s' if sessions > 1 else ' '}: {rate:9.0f} steps/s "
              f"({local / rate:.0f}x slower than in-process)")
    print(f"16 sessions / 1 session: {rates[16] / rates[1]:.2f}x")
    print(f"MCP tools, 1 session:    {mcp:9.0f} steps/s ({rates[1] / mcp:.2f}x slower than reset/step over the WebSocket)")


if __name__ == "__main__":
    main()
