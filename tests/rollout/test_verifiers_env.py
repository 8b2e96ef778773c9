"""The world as a verifiers environment (``socialworld.rollout.verifiers_env``): loaded by its id as
verifiers loads any, and ``vf-eval`` against an endpoint gives the episodes ``socialworld eval``
gives against the same endpoint.

verifiers 0.4 pins ``mcp==2.0.0`` and OpenEnv (the ``[test]`` extra) needs ``mcp<2``, so these run
in their own environment (``pip install -e '.[verifiers]' -e envs/socialworld-verifiers pytest``; ``.ci/run`` makes one and sets
``SOCIALWORLD_REQUIRE_VERIFIERS=1`` so that they cannot skip there). ``vf-eval``'s chat program
runs under ``uv``, which fetches its few packages from PyPI the first time."""

import json
import os
import shutil
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from socialworld.agents.lm.prompts import build_messages
from socialworld.rollout.evaluate import episode_seeds
from socialworld.testing import chat_stub, reading_reply, stub_endpoint
from socialworld.world.engine import World
from socialworld.world.visibility import observe

HAVE = find_spec("verifiers") is not None
REQUIRED = os.environ.get("SOCIALWORLD_REQUIRE_VERIFIERS") == "1"
needs_verifiers = pytest.mark.skipif(not HAVE and not REQUIRED, reason="needs the verifiers extra (its own environment)")


@pytest.mark.skipif(HAVE, reason="verifiers is installed here")
def test_without_verifiers_the_environment_says_what_it_needs():
    import socialworld  # noqa: F401  (the package itself never needs verifiers)

    with pytest.raises(ModuleNotFoundError, match=r"pip install -e '\.\[verifiers\]' in a venv of its own"):
        import socialworld.rollout.verifiers_env  # noqa: F401


@needs_verifiers
def test_verifiers_loads_the_environment_by_its_id(specs):
    import socialworld_verifiers
    import verifiers.v1 as vf

    from socialworld.rollout.verifiers_env import SocialWorldEnv, SocialWorldTaskset

    env = vf.load_environment(vf.resolve_env_config({"taskset": {"id": "socialworld-verifiers", "scenarios": ["team_lunch", "hackathon-v1"],
                                                                 "episodes": 2, "seed": 7}}))
    assert type(env) is SocialWorldEnv and type(env.taskset) is SocialWorldTaskset
    assert socialworld_verifiers.SocialWorldEnv is SocialWorldEnv
    tasks = [t.data for t in env.taskset]
    want = [(sid, s) for sid in ("team_lunch-v1", "hackathon-v1") for s in episode_seeds(7, sid, 2)]
    assert [(d.scenario, d.seed) for d in tasks] == want
    first = build_messages(observe(specs["team_lunch-v1"], World(specs["team_lunch-v1"], want[0][1]).pub))
    assert (tasks[0].system_prompt, tasks[0].prompt) == (first[0]["content"], first[1]["content"])
    everything = vf.load_environment(vf.resolve_env_config({"taskset": {"id": "socialworld-verifiers", "episodes": 1}}))
    assert sorted(t.data.scenario for t in everything.taskset) == sorted(specs)
    for bad, says in (({"scenarios": ["no_such_place"]}, "unknown scenario 'no_such_place'"),
                      ({"episodes": 0}, "episodes must be at least 1")):
        env = vf.load_environment(vf.resolve_env_config({"taskset": {"id": "socialworld-verifiers", **bad}}))
        with pytest.raises(ValueError, match=says):
            list(env.taskset)


@needs_verifiers
def test_vf_eval_plays_the_episodes_socialworld_eval_plays(tmp_path):
    """Against one endpoint whose reply depends on the state alone (so a growing conversation and
    a fresh prompt per state act alike), ``vf-eval socialworld-verifiers`` and ``socialworld eval`` play the
    same episodes: the same steps and the same PassRate, CR and D, recorded as named rewards."""
    bin_dir = Path(sys.executable).parent
    if shutil.which("uv", path=str(bin_dir)) is None and shutil.which("uv") is None:
        pytest.fail("vf-eval's chat program runs under uv: pip install uv") if REQUIRED else pytest.skip("needs uv")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "STUB_KEY": "x"}
    scenarios = ["team_lunch", "hackathon"]
    with stub_endpoint(chat_stub(reading_reply)) as url:
        vf_run = subprocess.run([str(bin_dir / "vf-eval"), "socialworld-verifiers", "-m", "stub", "-n", "4", "-r", "1",
                                 "--client.base-url", url, "--client.api-key-var", "STUB_KEY", "--no-push", "--no-rich",
                                 "-o", str(tmp_path / "vf"), "--env.taskset.episodes", "2",
                                 "--env.taskset.scenarios", json.dumps(scenarios)],
                                capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
        assert vf_run.returncode == 0, vf_run.stderr[-3000:]
        sw_run = subprocess.run([str(bin_dir / "socialworld"), "eval", "--policy", f"openai:stub@{url}", "--decoding", "free",
                                 "--episodes", "2", *[a for s in scenarios for a in ("--scenarios", s)], "--out", str(tmp_path / "sw")],
                                capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
        assert sw_run.returncode == 0, sw_run.stderr[-3000:]
    (traces,) = (tmp_path / "vf").glob("*/traces.jsonl")
    got = {}
    for line in traces.read_text().splitlines():
        episode = json.loads(line)
        assert episode["ok"], episode["errors"]
        (trace,) = episode["traces"]
        data = episode["task"]["data"]
        got[(data["scenario"], data["seed"])] = ({k: v["score"] for k, v in trace["rewards"].items()},
                                                 {k: v["weight"] for k, v in trace["rewards"].items()}, trace["metrics"])
    records = [json.loads(line) for line in (tmp_path / "sw" / "episodes.jsonl").read_text().splitlines()]
    assert sorted(got) == sorted((r["scenario_id"], r["seed"]) for r in records) and len(records) == 4
    for r in records:
        scores, weights, metrics = got[(r["scenario_id"], r["seed"])]
        m = r["metrics"]
        assert weights == {"PassRate": 1.0, "CR": 0.0, "D": 0.0}
        assert scores["PassRate"] == float(m["passed"])
        assert scores["CR"] == pytest.approx(m["CR"]["value"]) and scores["D"] == pytest.approx(m["D"]["value"])
        assert metrics["SolveRate"] == float(m["solved"])
        assert metrics["steps"] == len(r["steps"]) and metrics["finished"] == 1.0
        assert metrics["parse_failures"] == sum(s["action"]["parse_status"] != "ok" for s in r["steps"])


def _state_reply(messages: list[dict]) -> str:
    """``reading_reply`` at the state a conversation's last user message shows: the policy prompt
    itself (socialworld's taskset), or verifiers' OpenEnv taskset's JSON payload, whose observation
    carries the same prompt (``messages``)."""
    try:
        payload = json.loads(messages[-1]["content"])
    except (json.JSONDecodeError, TypeError):
        return reading_reply(messages)
    return reading_reply(payload["observation"]["messages"])


@needs_verifiers
def test_verifiers_own_openenv_taskset_against_env_serve_gives_the_tasksets_rewards(tmp_path):
    """verifiers' built-in ``openenv`` taskset, pointed at ``socialworld env serve``, and socialworld's own
    taskset, against one endpoint whose reply depends on the state alone: the same episodes, so the
    OpenEnv taskset's ``openenv_reward`` (the sum of the server's step rewards) is socialworld's ``return``
    on every seed. The server runs from a venv with the openenv extra (``SOCIALWORLD_OPENENV_SERVE``: its
    ``socialworld``), as OpenEnv 0.10 and verifiers 0.4 cannot share one; the client side needs
    ``openenv-core`` 0.3 here, the last OpenEnv client that installs beside verifiers' mcp 2 pin."""
    import socket
    import time
    import urllib.request

    serve = os.environ.get("SOCIALWORLD_OPENENV_SERVE")
    if not serve or find_spec("openenv") is None:
        why = "needs SOCIALWORLD_OPENENV_SERVE (a socialworld with the openenv extra) and openenv-core here"
        pytest.fail(why) if REQUIRED else pytest.skip(why)
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "STUB_KEY": "x"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pairs = [(sid, seed) for sid in ("team_lunch-v1", "hackathon-v1") for seed in episode_seeds(0, sid, 2)]
    server = subprocess.Popen([serve, "env", "serve", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        common = ["-m", "stub", "-r", "1", "--client.api-key-var", "STUB_KEY", "--no-push", "--no-rich"]
        with stub_endpoint(chat_stub(_state_reply)) as url:
            # the taskset's fields in a config file (the OpenEnv taskset validates before flags apply); the player a plain
            # chat program run locally, as socialworld's taskset's (verifiers' default harness wants a Prime tunnel)
            config = tmp_path / "openenv.toml"
            config.write_text('[env.taskset]\nid = "openenv"\nbase_url = "http://127.0.0.1:%d"\nresets = [%s]\n'
                              '[env.player]\nharness = { id = "null" }\nruntime = { type = "subprocess" }\n' % (
                                  port, ", ".join('{ scenario = "%s", seed = %d }' % pair for pair in pairs)))
            runs = {"openenv": ["@", str(config), "-n", str(len(pairs))],
                    "socialworld": ["socialworld-verifiers", "-n", str(len(pairs)), "--env.taskset.episodes", "2",
                                    "--env.taskset.scenarios", json.dumps(["team_lunch", "hackathon"])]}
            for name, args in runs.items():
                done = subprocess.run([str(bin_dir / "vf-eval"), *args, *common, "--client.base-url", url, "-o", str(tmp_path / name)],
                                      capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
                assert done.returncode == 0, done.stderr[-3000:]
    finally:
        server.terminate()
        server.wait(timeout=30)

    def traces(name):
        (path,) = (tmp_path / name).glob("*/traces.jsonl")
        return [json.loads(line) for line in path.read_text().splitlines()]

    ours = {}
    for episode in traces("socialworld"):
        (trace,) = episode["traces"]
        ours[(episode["task"]["data"]["scenario"], episode["task"]["data"]["seed"])] = trace["metrics"]
    theirs = {}
    for episode in traces("openenv"):
        assert episode["ok"], episode["errors"]
        (trace,) = episode["traces"]
        reset = episode["task"]["data"]["reset"]
        theirs[(reset["scenario"], reset["seed"])] = trace["rewards"]["openenv_reward"]["score"]
    assert sorted(ours) == sorted(theirs) == sorted(pairs)
    for key, metrics in ours.items():
        assert theirs[key] == pytest.approx(metrics["return"]) and metrics["steps"] > 1
    assert len({round(r, 6) for r in theirs.values()}) > 1  # the episodes differ: not one constant reward
