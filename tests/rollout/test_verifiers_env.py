"""The world as a verifiers environment (``socialworld.rollout.verifiers_env``): loaded by its id as
verifiers loads any, and ``vf-eval`` against an endpoint gives the episodes ``socialworld eval``
gives against the same endpoint.

verifiers 0.4 pins ``mcp==2.0.0`` and OpenEnv (the ``[test]`` extra) needs ``mcp<2``, so these run
in their own environment (``pip install -e '.[verifiers]' pytest``; ``.ci/run`` makes one and sets
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
        import socialworld_env  # noqa: F401


@needs_verifiers
def test_verifiers_loads_the_environment_by_its_id(specs):
    import verifiers.v1 as vf

    import socialworld_env
    from socialworld.rollout.verifiers_env import SocialWorldEnv, SocialWorldTaskset

    env = vf.load_environment(vf.resolve_env_config({"taskset": {"id": "socialworld-env", "scenarios": ["team_lunch", "hackathon-v1"],
                                                                 "episodes": 2, "seed": 7}}))
    assert type(env) is SocialWorldEnv and type(env.taskset) is SocialWorldTaskset
    assert socialworld_env.SocialWorldEnv is SocialWorldEnv
    tasks = [t.data for t in env.taskset]
    want = [(sid, s) for sid in ("team_lunch-v1", "hackathon-v1") for s in episode_seeds(7, sid, 2)]
    assert [(d.scenario, d.seed) for d in tasks] == want
    first = build_messages(observe(specs["team_lunch-v1"], World(specs["team_lunch-v1"], want[0][1]).pub))
    assert (tasks[0].system_prompt, tasks[0].prompt) == (first[0]["content"], first[1]["content"])
    everything = vf.load_environment(vf.resolve_env_config({"taskset": {"id": "socialworld-env", "episodes": 1}}))
    assert sorted(t.data.scenario for t in everything.taskset) == sorted(specs)
    for bad, says in (({"scenarios": ["no_such_place"]}, "unknown scenario 'no_such_place'"),
                      ({"episodes": 0}, "episodes must be at least 1")):
        env = vf.load_environment(vf.resolve_env_config({"taskset": {"id": "socialworld-env", **bad}}))
        with pytest.raises(ValueError, match=says):
            list(env.taskset)


@needs_verifiers
def test_vf_eval_plays_the_episodes_socialworld_eval_plays(tmp_path):
    """Against one endpoint whose reply depends on the state alone (so a growing conversation and
    a fresh prompt per state act alike), ``vf-eval socialworld-env`` and ``socialworld eval`` play the
    same episodes: the same steps and the same PassRate, CR and D, recorded as named rewards."""
    bin_dir = Path(sys.executable).parent
    if shutil.which("uv", path=str(bin_dir)) is None and shutil.which("uv") is None:
        pytest.fail("vf-eval's chat program runs under uv: pip install uv") if REQUIRED else pytest.skip("needs uv")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "STUB_KEY": "x"}
    scenarios = ["team_lunch", "hackathon"]
    with stub_endpoint(chat_stub(reading_reply)) as url:
        vf_run = subprocess.run([str(bin_dir / "vf-eval"), "socialworld-env", "-m", "stub", "-n", "4", "-r", "1",
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
