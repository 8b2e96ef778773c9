"""The OpenEnv environment with the real ``openenv`` package: OpenEnv's own validation of the running
server, the runner's rewards step for step through its client, determinism across sessions, 16
concurrent sessions, bad input, a client that goes away."""

import json
import math
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("openenv")

from socialworld.agents.lm.server import in_background  # noqa: E402
from socialworld.agents.scripted import ExpertPolicy  # noqa: E402
from socialworld.rollout.openenv import SocialAction, SocialWorldClient, make_app  # noqa: E402
from socialworld.rollout.runner import EpisodeJob, run_episodes  # noqa: E402
from socialworld.world.spec import capped  # noqa: E402


@pytest.fixture(scope="module")
def url():
    with in_background(make_app(max_sessions=16)) as u:
        yield u


def _client(url):
    return SocialWorldClient(base_url=url).sync()


def _replay(env, reset: dict, replies: list[str]):
    first = env.reset(**reset)
    steps = [env.step(SocialAction(reply=r)) for r in replies]
    return first, steps


def _expert(spec, seed):
    ep = run_episodes(ExpertPolicy(), [EpisodeJob(spec, seed)])[0]
    return ep, [f"ACTION: {s.action.executed}\nSAY: {s.dialogue.utterance}" for s in ep.steps]


def test_openenvs_own_validation_passes_on_the_running_server(url):
    out = subprocess.run([str(Path(sys.executable).parent / "openenv"), "validate", "--url", url, "--json"],
                         capture_output=True, text=True, timeout=120)
    report = json.loads(out.stdout)
    assert out.returncode == 0 and report["passed"] is True, out.stdout[-2000:]


def test_the_server_is_the_world_the_runner_drives(url, specs):
    """The expert's moves replayed through the client get the runner's rewards, step for step."""
    spec, seed = specs["book_club-v1"], 11
    ep, replies = _expert(spec, seed)
    with _client(url) as env:
        first, steps = _replay(env, {"seed": seed, "scenario": "book_club"}, replies)
        state = env.state()
    assert first.observation.text.startswith("Turn 1/") and first.reward is None and not first.done
    assert "end()" in first.observation.legal_actions and first.observation.messages[-1]["content"] == first.observation.text
    assert [s.reward for s in steps] == [s.signals.reward.value for s in ep.steps]
    assert all(s.observation.metadata["parse_status"] == "ok" for s in steps) and steps[-1].done
    assert steps[-1].observation.metadata["subgoals"] == ep.final.subgoals
    assert steps[-1].observation.metadata["outcome"]["CR"] == ep.metrics.CR.value  # the outcome, at the end only
    assert all("outcome" not in s.observation.metadata for s in steps[:-1])
    assert (state.scenario, state.seed, state.step_count, state.done) == ("book_club-v1", seed, len(ep.steps), True)


def test_sixteen_concurrent_sessions_give_the_sequential_results(url, specs):
    jobs = [(sid, seed) for sid in ("team_lunch-v1", "hackathon-v1") for seed in range(8)]
    plays = {job: _expert(specs[job[0]], job[1])[1] for job in jobs}

    def play(job):
        with _client(url) as env:
            first, steps = _replay(env, {"seed": job[1], "scenario": job[0]}, plays[job])
        return first.observation.text, [(s.reward, s.observation.text) for s in steps]

    sequential = {job: play(job) for job in jobs}
    together, barrier = {}, threading.Barrier(len(jobs))

    def run(job):
        barrier.wait()
        together[job] = play(job)

    threads = [threading.Thread(target=run, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert together == sequential


def test_bad_input_is_an_error_from_the_call_and_the_session_stays(url):
    with _client(url) as env:
        with pytest.raises(RuntimeError, match="no episode: call reset"):
            env.step(SocialAction(reply="ACTION: wait()"))
        with pytest.raises(RuntimeError, match="unknown scenario 'nowhere'; this server has"):
            env.reset(seed=0, scenario="nowhere")
        for bad in (-1, 2**63, "7", 1.5):
            with pytest.raises(RuntimeError, match="seed must be an integer"):
                env.reset(seed=bad, scenario="team_lunch")
        with pytest.raises(RuntimeError, match="reset takes seed, episode_id and scenario, or split and index, not colour"):
            env.reset(seed=0, colour="red")
        env.reset(seed=3, scenario="team_lunch")
        r = env.step(SocialAction(reply="propose the thai place please"))  # the world's own case, not an error
        assert r.observation.metadata["parse_status"] == "unparseable" and r.observation.metadata["executed"] == "wait()"
        assert r.reward is not None and r.observation.metadata["penalty"] == pytest.approx(0.2)
        drawn = env.reset(scenario="team_lunch")  # no seed: one is drawn, and kept
        seed = env.state().seed
        assert isinstance(seed, int) and env.reset(seed=seed, scenario="team_lunch").observation == drawn.observation


def test_the_tiers_are_task_splits_and_a_task_is_its_scenario_and_seed(url, specs):
    """OpenEnv's Task API: the splits L0, L1, L2; each task an episode of one of the tier's scenarios from
    the seeds eval draws; reset(split=, index=) is reset(scenario=, seed=) of that task."""
    import httpx

    from socialworld.rollout.evaluate import episode_seeds
    from socialworld.rollout.openenv import TASK_SEEDS

    assert [s["name"] for s in httpx.get(f"{url}/socialworld/splits").json()] == ["L0", "L1", "L2"]
    for tier in ("L0", "L1", "L2"):
        ids = sorted(s.id for s in specs.values() if s.tier == tier)
        got = httpx.post(f"{url}/socialworld/tasks", json={"split": tier}).json()["tasks"]
        assert [(t["scenario"], t["seed"]) for t in got] == [(i, seed) for i in ids for seed in episode_seeds(0, i, TASK_SEEDS)]
        assert httpx.post(f"{url}/socialworld/num_tasks", json={"split": tier}).json()["num_tasks"] == len(got)
        assert all(t["graders"] == ["pass", "CR"] and t["id"] == f"{tier}-{t['index']}" for t in got)
    task = httpx.post(f"{url}/socialworld/task", json={"split": "L2", "index": 7}).json()["task"]
    with _client(url) as env:
        by_task, by_seed = env.reset(split="L2", index=7), env.reset(scenario=task["scenario"], seed=task["seed"])
        assert by_task.observation == by_seed.observation
        with pytest.raises(RuntimeError, match="unknown split 'L3'"):
            env.reset(split="L3", index=0)
        with pytest.raises(RuntimeError, match="not both"):
            env.reset(split="L1", index=0, seed=1)
    r = httpx.post(f"{url}/socialworld/task", json={"split": "L1", "index": 10_000})
    assert r.status_code == 400


def test_scripted_replies_only_where_the_server_allows_them_and_they_score_as_the_runner(url, specs):
    """A server made with scripted=True writes the expert's or the oracle's reply; played at every state it
    gives each task the runner's pass and CR (the baselines through the same server as a model). A plain
    server refuses it, and the session stays."""
    from socialworld.agents.scripted import OraclePolicy
    from socialworld.rollout.openenv import SocialWorldEnvironment
    from socialworld.rollout.textenv import outcome

    with _client(url) as env:
        env.reset(split="L0", index=0)
        with pytest.raises(RuntimeError, match="does not write scripted replies"):
            env.step(SocialAction(reply="", scripted="expert"))
        assert env.step(SocialAction(reply="ACTION: wait()")).observation.metadata["parse_status"] == "ok"
    with in_background(make_app(max_sessions=2, scripted=True)) as scripted_url, _client(scripted_url) as env:
        for split, index, policy in (("L1", 0, ExpertPolicy), ("L1", 3, ExpertPolicy), ("L2", 5, OraclePolicy), ("L2", 0, ExpertPolicy)):
            task = SocialWorldEnvironment().get_task(split, index)
            ref = run_episodes(policy(), [EpisodeJob(specs[task.scenario], task.seed)])[0]
            step = env.reset(split=split, index=index)
            while not step.done:
                step = env.step(SocialAction(reply="", scripted=policy.policy_id))
            got, want = step.observation.metadata["outcome"], outcome(ref)
            assert (got["pass"], got["CR"]) == (want["pass"], want["CR"]), (split, index, policy.policy_id)
        env.reset(split="L0", index=0)
        with pytest.raises(RuntimeError, match="takes an empty reply"):
            env.step(SocialAction(reply="ACTION: wait()", scripted="oracle"))


def test_the_mcp_tools_play_the_episode_the_websocket_plays(url, specs):
    """OpenEnv's /mcp: in a session, start/act/observe give the WebSocket's observations and rewards for the
    same replies; a bad call is a JSON-RPC error naming what is wrong, and the session stays usable."""
    import httpx

    from socialworld.rollout.openenv import TOOLS

    spec, seed = specs["hackathon-v1"], 4
    _, replies = _expert(spec, seed)
    with _client(url) as env:
        first, steps = _replay(env, {"seed": seed, "scenario": "hackathon"}, replies)
    ids = iter(range(1, 10_000))

    def rpc(method, **params):
        r = httpx.post(f"{url}/mcp", json={"jsonrpc": "2.0", "id": next(ids), "method": method, "params": params}, timeout=30)
        assert r.status_code == 200
        return r.json()

    sid = rpc("openenv/session/create")["result"]["session_id"]
    assert [t["name"] for t in rpc("tools/list", session_id=sid)["result"]["tools"]] == list(TOOLS)
    call = lambda name, **args: rpc("tools/call", session_id=sid, name=name, arguments=args)  # noqa: E731
    assert "no episode" in call("observe")["error"]["message"]
    got = call("start", scenario="hackathon", seed=seed)["result"]
    assert got["text"] == first.observation.text and got["legal_actions"] == first.observation.legal_actions
    for reply, want in zip(replies, steps):
        got = call("act", reply=reply)["result"]
        assert (got["text"], got["reward"], got["done"]) == (want.observation.text, want.reward, want.done)
    assert got["metadata"]["outcome"] == steps[-1].observation.metadata["outcome"]
    assert call("observe")["result"]["text"] == steps[-1].observation.text
    assert "unexpected keyword argument 'colour'" in call("act", colour="red")["error"]["message"]
    assert "unknown split 'L9'" in call("start", split="L9", index=0)["error"]["message"]
    assert call("start", split="L0", index=1)["result"]["done"] is False  # the session stays
    assert rpc("openenv/session/close", session_id=sid)["result"]["closed"] is True


def test_every_http_door_answers_bad_input_with_a_4xx_and_a_message():
    """OpenEnv's HTTP routes: a bad reset is a 400 or 422 naming what is wrong; the stateless step, which
    can never play an episode here, a 400 saying to use the WebSocket; never a 500."""
    from fastapi.testclient import TestClient

    c = TestClient(make_app(), raise_server_exceptions=False)
    cases = {"seed 2**64": ({"seed": 2**64}, 400, "seed must be an integer"),
             "unknown scenario": ({"scenario": "nowhere"}, 400, "unknown scenario 'nowhere'"),
             "unknown argument": ({"colour": "red"}, 400, "not colour"),
             "a seed that is text": ({"seed": "x"}, 422, "valid integer")}
    for name, (body, code, says) in cases.items():
        r = c.post("/reset", json=body)
        assert r.status_code == code and says in r.text, (name, r.status_code, r.text)
    for raw, code, says in ((b'{"scenario": "team\\ud800"}', 400, "unknown scenario"), (b'{"episode_id": "\\ud800"}', 422, "episode_id"),
                            (b'{"seed": "\\ud800"}', 422, "seed"), (b'{"seed": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", 400, "")):
        r = c.post("/reset", content=raw, headers={"content-type": "application/json"})  # JSON escapes: the text a client may send
        assert r.status_code == code and says in r.text, (raw[:40], r.status_code, r.text[:200])
    r = c.post("/step", json={"action": {"reply": "ACTION: wait()"}})
    assert r.status_code == 400 and "use the WebSocket" not in r.text and "play over the WebSocket (/ws" in r.text
    assert c.post("/reset", json={"seed": 1, "scenario": "team_lunch"}).status_code == 200


def test_the_websocket_refuses_what_it_cannot_answer_and_the_session_stays():
    """A binary frame is read as its UTF-8 text; one that is not UTF-8, a message holding a lone surrogate
    (the turn would be played and its answer could not be sent) or one nested too deeply is refused
    with a message before the world sees it; the session then plays on."""
    from fastapi.testclient import TestClient

    with TestClient(make_app()).websocket_connect("/ws") as ws:
        ws.send_bytes(b'{"type": "reset", "data": {"seed": 1, "scenario": "team_lunch"}}')
        assert json.loads(ws.receive_text())["type"] == "observation"
        for frame, says in ((b"\xff\xfe", "not UTF-8"), ('{"type": "step", "data": {"reply": "ACTION: wait()\\ud800"}}', "lone surrogate"),
                            ("[" * 100_000 + "]" * 100_000, "nested too deeply")):
            ws.send_bytes(frame) if isinstance(frame, bytes) else ws.send_text(frame)
            answer = json.loads(ws.receive_text())
            assert answer["type"] == "error" and says in answer["data"]["message"], answer
        ws.send_text('{"type": "step", "data": {"reply": "ACTION: wait()"}}')
        answer = json.loads(ws.receive_text())
        assert answer["type"] == "observation" and answer["data"]["observation"]["metadata"]["executed"] == "wait()"
        ws.send_text('{"type": "state"}')
        assert json.loads(ws.receive_text())["data"]["step_count"] == 1  # the refused messages played nothing


def test_fuzzed_doors_never_fail_the_server():
    """Hypothesis over OpenEnv's doors: any JSON body to /reset and /step, and any message on a WebSocket
    session, is answered (a 4xx or an error message at worst), and the session stays usable."""
    from fastapi.testclient import TestClient
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    app = make_app()
    http = TestClient(app, raise_server_exceptions=False)
    leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20)
    values = st.recursive(leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                          max_leaves=10)
    keys = st.sampled_from(["seed", "scenario", "episode_id", "reply", "action", "type", "data", "colour"])
    bodies = st.dictionaries(keys, values, max_size=4)

    @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
    @given(reset=bodies, step=bodies)
    def http_doors(reset, step):
        for path, body in (("/reset", reset), ("/step", step)):
            r = http.post(path, json=body)
            assert r.status_code < 500, (path, body, r.status_code, r.text)

    http_doors()
    messages = st.fixed_dictionaries({"type": st.sampled_from(["reset", "step", "state", "close", "nope"]), "data": bodies})
    with TestClient(app).websocket_connect("/ws") as ws:
        @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
        @given(msg=messages)
        def ws_door(msg):
            if msg["type"] == "close":
                return  # closing is a client's right, not bad input
            ws.send_text(json.dumps(msg))
            assert json.loads(ws.receive_text())["type"] in ("observation", "state", "error")

        ws_door()
        ws.send_text('{"type": "reset", "data": {"seed": 2, "scenario": "book_club"}}')
        assert json.loads(ws.receive_text())["type"] == "observation"


def test_a_client_that_goes_away_frees_its_session():
    with in_background(make_app(max_sessions=1)) as url:
        for _ in range(3):  # one session at a time: each closes, the next one gets the place
            with _client(url) as env:
                assert env.reset(seed=0).observation.text.startswith("Turn 1/")
        with _client(url) as env:
            env.reset(seed=0)
            with pytest.raises(Exception, match="(?i)capacity"), _client(url) as other:
                other.reset(seed=0)


def test_env_serve_starts_the_server_from_the_command_line(tmp_path):
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "socialworld.cli.main", "env", "serve", "--port", str(port),
                             "--scenario", "team_lunch", "--max-turns", "3"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, url = time.monotonic() + 60, f"http://127.0.0.1:{port}"
        while True:
            try:
                with _client(url) as env:
                    first = env.reset(seed=1)
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        assert first.observation.text.startswith("Turn 1/3")
        with _client(url) as env, pytest.raises(RuntimeError, match="unknown scenario 'hackathon'; this server has team_lunch-v1"):
            env.reset(seed=1, scenario="hackathon")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _example(name: str):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_grpo_examples_warm_start_rows_are_the_episodes_it_plays_through_the_server(specs, tiny_dir):
    """examples/grpo_openenv.py's warm start: one row per expert episode, exactly the tokens ``play``
    makes of that episode through the server when it takes the expert's moves, the replies' header
    and action (and nothing else) marked for the loss; the moves are the runner's expert's, legal
    and executed as written."""
    from transformers import AutoTokenizer

    example = _example("grpo_openenv")
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    row = example.expert_episodes(tok, "team_lunch", [5], 3)[0]
    ep = run_episodes(ExpertPolicy(), [EpisodeJob(capped(specs["team_lunch-v1"], 3), 5)])[0]
    moves = [s.action.executed for s in ep.steps]
    ids, mask = row["input_ids"], row["completion_mask"]
    marked = tok.decode([t for t, m in zip(ids, mask) if m])
    assert marked == "".join(f"ACTION: {m}" for m in moves)
    turns = iter(moves)

    def expert(context, legal):
        key = next(turns)
        assert key in legal
        action = tok(" " + key, add_special_tokens=False)["input_ids"]
        return action, [0.0] * len(action), [0] * len(action)

    with example.env_server(max_turns=3) as url, _client(url) as env:
        played = example.play(env, None, tok, "team_lunch", 5, None, choose=expert)
    assert played["prompt_ids"] + played["completion_ids"] == ids
    assert played["replies"] == [f"ACTION: {m}" for m in moves]


@pytest.mark.slow
def test_the_grpo_example_trains_by_interaction_through_the_server(tiny_dir, tmp_path):
    """examples/grpo_openenv.py: TRL's GRPO whose rollouts are whole episodes played over OpenEnv's
    client; every sampled reply is a legal action, so a group's returns differ and GRPO has a gradient."""
    pytest.importorskip("trl")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    example = _example("grpo_openenv")
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    with example.env_server(max_turns=3) as url, _client(url) as env:
        ep = example.play(env, model, tok, "team_lunch", 5, torch.Generator().manual_seed(0))
        # the episode again through the runner's world: the sampled replies are legal, the return the world's
        text = tok.decode(ep["completion_ids"], skip_special_tokens=True)
        assert [line for line in text.splitlines() if line.startswith("ACTION:")] == ep["replies"]
        assert len(ep["replies"]) == 3 or ep["replies"][-1] == "ACTION: end()"  # the turn budget, or an end() sampled
        _, again = _replay(env, {"seed": 5, "scenario": "team_lunch"}, ep["replies"])
        assert sum(r.reward for r in again) == pytest.approx(ep["episode_return"]) and again[-1].done
        assert all(r.observation.metadata["parse_status"] == "ok" for r in again)
    n = len(ep["completion_ids"])
    assert len(ep["env_mask"]) == len(ep["logprobs"]) == n and 0 < sum(ep["env_mask"]) < n
    assert all(lp == 0.0 for lp, m in zip(ep["logprobs"], ep["env_mask"]) if m == 0)
    assert all(lp < 0.0 for lp, m in zip(ep["logprobs"], ep["env_mask"]) if m == 1)  # trained: a choice among several
    head = tok("ACTION:", add_special_tokens=False)["input_ids"]
    assert ep["completion_ids"][: len(head)] == head and ep["env_mask"][: len(head)] == [0] * len(head)
    # the temperature divides the logits over the trie's children: far above 1 each choice is uniform
    legal = ["wait()", "end()"]
    first = [tok(" " + k, add_special_tokens=False)["input_ids"][0] for k in legal]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([head])).logits[0, -1, first].float()
    for t, want in ((1e6, None), (2.0, torch.log_softmax(logits / 2.0, -1)), (1.0, torch.log_softmax(logits, -1))):
        ids, lps, chose = example.sample_action(model, tok, head, legal, torch.Generator().manual_seed(0), t)
        assert chose[0] == 1
        assert lps[0] == pytest.approx(-math.log(2) if want is None else float(want[first.index(ids[0])]), abs=1e-5)
    out = example.main(["--model", str(tiny_dir), "--seeds", "2", "--steps", "2", "--generations", "2", "--max-turns", "2",
                        "--eval-seeds", "2", "--temperature", "2", "--warm-episodes", "0", "--out", str(tmp_path / "grpo")])
    assert len(out["rewards"]) == 2 and (tmp_path / "grpo" / "adapter_config.json").exists()
    assert out["warm"] == {} and out["warm_losses"] == []
    assert min(out["frac_reward_zero_std"]) < 1.0 and out["stopped"] is None
    assert out["seeds"] == [1000, 1001]  # one seed per group, in turn
    for ev in (out["before"], out["after"]):  # greedy on the held-out seeds, scored by the world's outcome
        assert set(ev) == {"return", "pass", "CR"} and 0.0 <= ev["CR"] <= 1.0 and -1.0 <= ev["return"] <= 1.0
    # with the warm start: the expert's episodes cloned by SFT, then GRPO trains that adapter on
    warm = example.main(["--model", str(tiny_dir), "--seeds", "1", "--steps", "1", "--generations", "2", "--max-turns", "2",
                         "--eval-seeds", "1", "--temperature", "2", "--warm-episodes", "2", "--out", str(tmp_path / "warm")])
    assert set(warm["warm"]) == {"return", "pass", "CR"} and len(warm["rewards"]) == 1
    assert len(warm["warm_losses"]) == 4  # one row per episode, two a step, four passes (the defaults)
    assert (tmp_path / "warm" / "adapter_config.json").exists()
