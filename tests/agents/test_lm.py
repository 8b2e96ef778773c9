"""Language-model policies on a tiny random model built in-process (never a download)."""

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from socialworld.agents.lm.backends import HFBackend, OpenAIBackend  # noqa: E402
from socialworld.agents.lm.constrained import Choice, Forced, Free, decode  # noqa: E402
from socialworld.agents.lm.policy import LMPolicy, program  # noqa: E402
from socialworld.agents.lm.prompts import build_messages, parse_output  # noqa: E402
from socialworld.agents.models import load_hf, parse_model_spec  # noqa: E402
from socialworld.agents.registry import make_policy  # noqa: E402
from socialworld.core import Action  # noqa: E402
from socialworld.learn.pairs.counterfactual import recorded_action  # noqa: E402
from socialworld.records import EpisodeRecord, record_from_json, record_json  # noqa: E402
from socialworld.rollout.runner import EpisodeJob, run_episodes  # noqa: E402
from socialworld.testing import drive, tiny_spec  # noqa: E402
from socialworld.text.templates import POLICY_PROMPT_VERSION  # noqa: E402
from socialworld.world.engine import World  # noqa: E402
from socialworld.world.visibility import legal_actions, observe  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    model, tok = load_hf(tiny_dir, dtype="float32")
    return model, tok


def _obs(specs, sid="team_lunch-v1", seed=1, steps=0, policy="expert"):
    spec = specs[sid]
    w = drive(World(spec, seed), make_policy(policy, seed=seed), steps=steps)
    return observe(spec, w.pub)


def test_model_specs():
    assert parse_model_spec("bundled").kind == "bundled"
    assert parse_model_spec("expert").kind == "scripted"
    m = parse_model_spec("openai:qwen@http://127.0.0.1:9/v1")
    assert (m.kind, m.name, m.base_url) == ("openai", "qwen", "http://127.0.0.1:9/v1")
    assert parse_model_spec("some/model").kind == "hf"
    with pytest.raises(ValueError, match="unknown policy"):
        parse_model_spec("nonsense")
    with pytest.raises(ValueError, match="openai:<model>@"):
        parse_model_spec("openai:nourl")


def test_parse_output_is_strict(specs):
    obs = _obs(specs)
    a, b, err = parse_output("BELIEF: alice restaurant=thai mood=high; ben time=t1200\nACTION: inquire(ben, time)\n"
                             "SAY: Ben, which lunch time suits you?", obs)
    assert err is None and a == Action("inquire", npc="ben", slot="time", utterance="Ben, which lunch time suits you?")
    assert b.preferences == {"alice": {"restaurant": "thai"}, "ben": {"time": "t1200"}} and b.moods == {"alice": "high"}
    # a malformed belief is dropped, not repaired; the action still stands
    a, b, err = parse_output("BELIEF: alice likes thai\nACTION: wait()\nSAY: hold on", obs)
    assert a.kind == "wait" and b is None and err is None
    for bad in ("ACTION: inquire(alice)", "I would ask Alice", "ACTION: dance(alice)", "ACTION: inquire(alice, restaurant) now"):
        a, b, err = parse_output(bad, obs)
        assert a is None and err


def test_prompts_are_short(specs, tiny):
    _, tok = tiny
    for sid in specs:
        msgs = build_messages(_obs(specs, sid))
        assert len(tok.apply_chat_template(msgs, tokenize=True)) < 1500


def test_prompt_shows_the_agents_own_last_actions(specs):
    obs = _obs(specs, steps=2)
    assert len(obs.moves) == 2
    assert build_messages(_obs(specs))[1]["content"].endswith("\nYou did: nothing yet")
    assert build_messages(obs, "policy-v5")[1]["content"].endswith("\nYou did: " + "; ".join(obs.moves))
    assert "You did" not in build_messages(_obs(specs, steps=2), "policy-v2")[1]["content"]  # kept as it was measured
    long = _obs(specs, "book_club-v1", seed=3, steps=9, policy="random")
    assert len(long.moves) == 9  # the observation keeps every move; policy-v5 showed the last three
    assert build_messages(long, "policy-v5")[1]["content"].endswith("\nYou did: " + "; ".join(long.moves[-3:]))


def test_prompt_tallies_every_earlier_move():
    """policy-v6: every distinct move once, first-made order, with its count, and the latest apart,
    so a cycle of repeated moves changes the prompt at every turn."""
    from socialworld.agents.lm.prompts import moves_text

    moves = ("propose(gift, book_bundle, all)", "inquire(raj, gift)", "inquire(raj, gift)", "approach(raj)",
             "inquire(raj, gift)", "approach(raj)")
    assert moves_text(moves, tally=True) == ("propose(gift, book_bundle, all); inquire(raj, gift) x3; approach(raj) x2"
                                             " (last: approach(raj))")
    assert moves_text(moves, tally=False) == "approach(raj); inquire(raj, gift); approach(raj)"
    assert moves_text((), tally=True) == moves_text((), tally=False) == "nothing yet"
    shown = {moves_text(moves[:n], tally=True) for n in range(1, len(moves) + 1)}
    assert len(shown) == len(moves)  # never the same text twice within an episode


def test_prompt_names_the_option_the_known_wants_favour(specs):
    """policy-v6: an open decision's line names ``favoured: <option>`` exactly when a present
    stakeholder's wish there is known; the option is one nobody present vetoed, within the budget,
    and no other such option scores higher (two per known preference, minus one per dislike)."""
    from socialworld.agents.beliefs import Beliefs
    from socialworld.agents.lm.prompts import favoured

    seen = set()
    for sid in ("team_lunch-v1", "birthday_budget-v1", "book_club-v1"):
        for seed, steps in ((seed, steps) for seed in range(1, 7) for steps in range(0, 8)):
            obs = _obs(specs, sid, seed=seed, steps=steps, policy="random")
            text = build_messages(obs, "policy-v6")[1]["content"]
            assert "favoured:" not in build_messages(obs, "policy-v5")[1]["content"]
            b = Beliefs().update(obs)
            for s in obs.slots:
                if s.status != "open":
                    continue
                line = next(x for x in text.splitlines() if x.startswith(f"{s.id}: open"))
                here = [h for h in s.stakeholders if obs.npc(h).present]
                rivals = [x.id for x in s.options if x.available and not any(x.id in b.vetoes.get(h, {}).get(s.id, ()) for h in here)
                          and (obs.budget_left is None or x.cost <= obs.budget_left)]

                def score(x, here=here, s=s):
                    return sum(2 * (b.prefers.get(h, {}).get(s.id) == x) - (x in b.dislikes.get(h, {}).get(s.id, ())) for h in here)

                fav = favoured(obs, b, s)
                assert (f"; favoured: {fav}" in line) == (fav is not None)
                known = any(s.id in b.prefers.get(h, {}) for h in here)
                assert (fav is not None) == (known and bool(rivals))
                seen.add(fav is not None)
                if fav is not None:
                    assert fav in rivals and score(fav) == max(score(x) for x in rivals)
    assert seen == {True, False}


def test_prompt_shows_what_each_stakeholder_wants(specs):
    seen = set()
    for sid in ("team_lunch-v1", "activity_debrief-v1"):
        for seed, steps in ((seed, steps) for seed in range(1, 9) for steps in range(0, 6)):
            obs = _obs(specs, sid, seed=seed, steps=steps, policy="random")  # random play inquires: every case occurs
            text = build_messages(obs, "policy-v6")[1]["content"]
            assert "wants:" not in build_messages(obs, "policy-v3")[1]["content"]
            for s in obs.slots:
                if s.status != "open":
                    continue
                line = next(x for x in text.splitlines() if x.startswith(f"{s.id}: open"))
                said = dict(kv.split("=") for kv in line.split("; wants: ")[1].split(";")[0].split())
                assert list(said) == list(s.stakeholders)
                for h in s.stakeholders:
                    facts = [f for f in obs.facts if f.npc == h and f.slot == s.id]
                    prefers = [f.option for f in facts if f.kind == "prefers"]
                    if not facts:
                        assert said[h] == "?"
                    elif prefers and not any(f.kind == "unsettled" for f in facts):
                        assert said[h] == prefers[-1]
                    elif not prefers:  # vague answers counted; a rejection alone tells no wish
                        n = sum(f.kind == 'vague' for f in facts)
                        assert said[h] == (f"vague{n}" if n else "?")
                    seen.add(said[h][:5] if said[h].startswith("vague") else "?" if said[h] == "?" else "known")
    assert seen >= {"?", "known", "vague"}  # every case was checked


def test_program_offers_exactly_the_legal_actions(specs):
    for sid, spec in specs.items():
        w = World(spec, 2)
        pol = make_policy("random", seed=1)
        pol.reset(["k"])
        while not w.done:
            obs = observe(spec, w.pub)
            (choice,) = [seg for seg in program(obs, 8) if isinstance(seg, Choice) and seg.name == "action"]
            assert {Action.parse(o.strip()) for o in choice.options} == set(legal_actions(obs)), sid
            w.step(pol.act(["k"], [obs])[0].action)


def test_batched_and_unbatched_greedy_agree(specs, tiny):
    model, tok = tiny
    obs = [_obs(specs, sid, steps=k) for k, sid in enumerate(specs)]
    convs = [build_messages(o) for o in obs]
    batched = HFBackend(model, tok, name="tiny", max_new_tokens=12, batch_size=8).complete(convs)
    single = HFBackend(model, tok, name="tiny", max_new_tokens=12, batch_size=1).complete(convs)
    assert [c.text for c in batched] == [c.text for c in single]
    progs = [program(o, 6) for o in obs]
    cb = HFBackend(model, tok, name="tiny", batch_size=8).constrained(convs, progs)
    cu = HFBackend(model, tok, name="tiny", batch_size=1).constrained(convs, progs)
    assert [c.text for c in cb] == [c.text for c in cu]
    assert [c.tokens_out for c in cb] == [c.tokens_out for c in cu]


def _full_logits(model, ids):
    import torch

    with torch.inference_mode():
        return model(torch.tensor([ids], device=model.device)).logits[0, -1].float()


def test_constrained_choices_are_the_full_forward_argmax(specs, tiny):
    """Shared prefix, mid-sequence padding and the preallocated cache change nothing: each
    choice is the argmax, among the allowed tokens, of a plain forward over prompt + text so far."""
    model, tok = tiny
    backend = HFBackend(model, tok, name="tiny", batch_size=8)
    convs = [build_messages(_obs(specs, sid, steps=k)) for k, sid in enumerate(specs)]
    opts = ("alpha", "beta", "gamma", "delta")
    prog = [Forced("ACTION:"), Choice("a", opts), Forced(" then"), Choice("b", opts)]
    rows = decode(model, tok, backend.prompts(convs), [prog] * len(convs), batch_size=8)
    ids = lambda t: tok(t, add_special_tokens=False)["input_ids"]  # noqa: E731
    for prompt, row in zip(backend.prompts(convs), rows):
        head = ids(prompt) + ids("ACTION:")
        first = {ids(o)[0] for o in opts}
        want = max(first, key=lambda t: _full_logits(model, head)[t].item())
        assert ids(row.values["a"])[0] == want
        head += ids(row.values["a"]) + ids(" then")
        want = max(first, key=lambda t: _full_logits(model, head)[t].item())
        assert ids(row.values["b"])[0] == want
        assert row.text == f"ACTION:{row.values['a']} then{row.values['b']}"


def test_constrained_prefix_options_free_text_and_cache_growth(specs, tiny, monkeypatch):
    import socialworld.agents.lm.constrained as constrained

    model, tok = tiny
    backend = HFBackend(model, tok, name="tiny", batch_size=4)
    prompts = backend.prompts([build_messages(_obs(specs, sid)) for sid in list(specs)[:4]])
    prog = [Forced("X:"), Choice("c", ("park", "park_b", "pa")), Forced(";"), Free("say", 5), Forced("|"),
            Choice("one", ("only",))]
    rows = decode(model, tok, prompts, [prog] * 4, batch_size=4)
    for r in rows:
        assert r.values["c"] in ("park", "park_b", "pa") and r.values["one"] == "only"
        assert r.text == f"X:{r.values['c']};{r.values['say']}" + ("\n" if "\n" in r.text else "") + "|only"
        assert "\n" not in r.values["say"] and 0 < r.choices
    # a cache that must grow (bound underestimated) gives the same result
    monkeypatch.setattr(constrained, "_completion_bound", lambda r: 0)
    assert [r.text for r in decode(model, tok, prompts, [prog] * 4, batch_size=4)] == [r.text for r in rows]
    with pytest.raises(ValueError, match="no options"):
        decode(model, tok, prompts[:1], [[Choice("x", ())]])


def test_sampled_decoding_draws_from_the_allowed_tokens_and_records_what_the_model_chose(specs, tiny):
    """With a generator each choice is drawn from the softmax over the allowed tokens: the same
    generator state draws the same turns, rows of one prompt draw different ones, and every
    completion token says whether the model chose it (with its log-probability) or the grammar
    forced it. The completion's tokens are the text."""
    import math

    import torch

    model, tok = tiny
    backend = HFBackend(model, tok, name="tiny", batch_size=8)
    obs = _obs(specs, "book_club-v1", steps=2)
    prompt = backend.prompts([build_messages(obs)])[0]
    prog = program(obs, 4)
    draw = lambda seed: decode(model, tok, [prompt] * 8, [prog] * 8, batch_size=8,  # noqa: E731
                               sample=torch.Generator().manual_seed(seed))
    rows = draw(0)
    assert [r.text for r in draw(0)] == [r.text for r in rows]
    assert len({r.values["action"] for r in rows}) > 1  # a random model's distribution is spread out
    legal = {" " + a.key for a in legal_actions(obs)}
    for r in rows:
        assert r.values["action"] in legal and parse_output(r.text, obs)[2] is None
        assert tok.decode(list(r.completion_ids)) == r.text
        assert len(r.completion_ids) == len(r.chosen_mask) == len(r.logprobs) == r.tokens_out
        assert sum(r.chosen_mask) == r.choices  # every branch the model took, and nothing forced
        assert all(lp <= 0 if m else lp == 0 for m, lp in zip(r.chosen_mask, r.logprobs))  # (one allowed token: 0)
        assert any(lp < 0 for lp in r.logprobs)
        assert tok.decode([t for t, m in zip(r.completion_ids, r.chosen_mask) if not m]).startswith("BELIEF:")
    # the first choice follows the same text in every row: a drawn token's log-probability is the same
    # wherever it was drawn, and the greedy row takes the most likely one
    first = {}
    for r in rows:
        i = r.chosen_mask.index(1)
        first.setdefault(r.completion_ids[i], []).append(r.logprobs[i])
    assert len(first) > 1 and all(lp == pytest.approx(lps[0], abs=1e-4) for lps in first.values() for lp in lps)
    greedy = decode(model, tok, [prompt], [prog])[0]
    g = greedy.chosen_mask.index(1)
    assert greedy.logprobs[g] == pytest.approx(max(lps[0] for lps in first.values()), abs=1e-4) \
        if greedy.completion_ids[g] in first else greedy.logprobs[g] > max(lps[0] for lps in first.values())
    assert math.fsum(math.exp(lps[0]) for lps in first.values()) <= 1 + 1e-4


def test_free_mode_counts_unparseable_output(specs, tiny):
    model, tok = tiny
    pol = LMPolicy(HFBackend(model, tok, name="tiny", max_new_tokens=16), decoding="free")
    ep = run_episodes(pol, [EpisodeJob(tiny_spec(), 0)])[0]
    statuses = {s.action.parse_status for s in ep.steps}
    assert "unparseable" in statuses  # a random model cannot follow the format
    for s in ep.steps:
        if s.action.parse_status == "unparseable":
            assert s.action.executed == "wait()" and s.signals.penalty.value == pytest.approx(0.2)
            assert s.action.raw is not None and s.action.error
        assert s.policy.tokens_in > 0 and s.policy.decoding["mode"] == "free"
    assert ep.metrics.U.source == "degraded"


def test_a_backend_without_a_grammar_decodes_free_only():
    from socialworld.agents.lm.backends import Completion, ConstrainedBackend

    class FreeOnly:  # a Backend, not a ConstrainedBackend
        name, decoding, local = "free-only", {}, False

        def complete(self, conversations):
            return [Completion("ACTION: wait()") for _ in conversations]

    assert not isinstance(FreeOnly(), ConstrainedBackend)
    with pytest.raises(ValueError, match="cannot decode under a grammar"):
        LMPolicy(FreeOnly(), decoding="constrained")
    ep = run_episodes(LMPolicy(FreeOnly(), decoding="free"), [EpisodeJob(tiny_spec(), 0)])[0]
    assert ep.steps[0].action.executed == "wait()" and ep.steps[0].policy.decoding["mode"] == "free"


def test_constrained_mode_is_parseable_by_construction(specs, tiny):
    model, tok = tiny
    pol = LMPolicy(HFBackend(model, tok, name="tiny", batch_size=4), decoding="constrained", say_tokens=6)
    jobs = [EpisodeJob(specs[sid], 1) for sid in ("team_lunch-v1", "book_club-v1", "weather_picnic-v1")]
    eps = run_episodes(pol, jobs, batch_size=3)
    for ep in eps:
        assert all(s.action.parse_status == "ok" for s in ep.steps)
        assert all(s.mental_state.stated is not None for s in ep.steps)  # the belief line always parses
        assert ep.steps[0].policy.decoding["mode"] == "constrained" and ep.metrics.U.source == "direct"
        assert all(s.policy.tokens_out > 0 for s in ep.steps)


def test_records_keep_the_exact_prompt_of_every_decision(specs, tiny):
    model, tok = tiny
    pol = LMPolicy(HFBackend(model, tok, name="tiny", batch_size=4), decoding="constrained", say_tokens=4)
    ep = run_episodes(pol, [EpisodeJob(specs["team_lunch-v1"], 2)])[0]
    w = World(specs["team_lunch-v1"], 2)
    for s in ep.steps:  # replayed: the prompt of each step is rebuilt from the world's observation there
        sent = build_messages(observe(w.spec, w.pub))
        assert s.policy.prompt.version == POLICY_PROMPT_VERSION
        assert [m.model_dump() for m in s.policy.prompt.messages] == sent
        assert s.policy.tokens_in == len(tok.apply_chat_template(sent, tokenize=True, add_generation_prompt=True)["input_ids"])
        w.step(recorded_action(s))
    back = record_from_json(EpisodeRecord, record_json(ep))
    assert back.steps[0].policy.prompt == ep.steps[0].policy.prompt


# ------------------------------------------------------------------ the server path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_dir):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "socialworld.cli.main", "serve", "--model", str(tiny_dir), "--port", str(port),
                             "--max-new-tokens", "12", "--dtype", "float32"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url + "/models", timeout=2) as r:
                if json.loads(r.read())["data"]:
                    break
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(proc.stdout.read()) from None
            time.sleep(0.3)
    else:
        proc.kill()
        raise RuntimeError("server did not start")
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def test_openai_backend_against_real_server(specs, server, tiny, tiny_dir):
    model, tok = tiny
    convs = [build_messages(_obs(specs))]
    remote = OpenAIBackend(str(tiny_dir), server, max_new_tokens=12).complete(convs)[0]
    local = HFBackend(model, tok, name="tiny", max_new_tokens=12).complete(convs)[0]
    assert remote.error is None and remote.text == local.text
    assert remote.tokens_in == local.tokens_in and remote.tokens_out == local.tokens_out


def test_eval_through_server(server, tiny_dir):
    pol = make_policy(f"openai:{tiny_dir}@{server}", max_new_tokens=12, batch_size=4)
    ep = run_episodes(pol, [EpisodeJob(tiny_spec(), 0)])[0]
    assert ep.policy_id.startswith(f"openai:{tiny_dir}@") and ep.steps
    assert all(s.policy.tokens_in > 0 for s in ep.steps)
    # auto: our own server decodes under the grammar, so every reply parses, as the local model's would
    assert pol.decoding == "constrained" and all(s.action.parse_status == "ok" for s in ep.steps)


def test_dead_server_gives_counted_errors_fast(monkeypatch):
    import socialworld.agents.lm.backends as backends

    monkeypatch.setattr(backends.time, "sleep", lambda s: None)  # the retries' backoff (tested apart)
    port = _free_port()  # nothing listens here
    t0 = time.time()
    pol = make_policy(f"openai:x@http://127.0.0.1:{port}/v1", max_new_tokens=8)
    ep = run_episodes(pol, [EpisodeJob(tiny_spec(), 0)])[0]
    assert time.time() - t0 < 30
    assert all(s.action.parse_status == "unparseable" and "cannot reach" in s.action.error for s in ep.steps)
    assert all(s.action.failure == "endpoint" for s in ep.steps)  # no reply at all: not a bad reply
    assert ep.final.end_reason == "turn_budget"
    from socialworld.metrics.core import aggregate

    agg = aggregate([ep])
    assert agg.endpoint_failure_rate == 1.0 and agg.parse_failure_rate == 0.0


def test_eval_against_a_dead_endpoint_ends_with_an_error_not_scores(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import socialworld.agents.lm.backends as backends

    monkeypatch.setattr(backends.time, "sleep", lambda s: None)  # the retries' backoff (tested apart)
    from socialworld.cli.main import app

    spec = f"openai:x@http://127.0.0.1:{_free_port()}/v1"
    r = CliRunner().invoke(app, ["eval", "--policy", spec, "--scenario", "team_lunch", "--episodes", "1", "--out", str(tmp_path / "e")])
    text = " ".join(r.output.split())
    assert r.exit_code == 2 and "gave no reply on 100% of the steps" in text and "cannot reach" in text and "after 3 attempts" in text
    assert (tmp_path / "e" / "episodes.jsonl").exists() and not (tmp_path / "e" / "metrics.json").exists()  # records kept, no scores
    (tmp_path / "e" / "judge.jsonl").write_text("an earlier evaluation's judgement\n")  # --overwrite: not these records'
    r = CliRunner().invoke(app, ["eval", "--policy", spec, "--scenario", "team_lunch", "--episodes", "1", "--out", str(tmp_path / "e"),
                                 "--overwrite"])
    assert r.exit_code == 2 and not (tmp_path / "e" / "judge.jsonl").exists() and not (tmp_path / "e" / "metrics.json").exists()


REPLIES = {
    "number": b'{"choices": [{"message": {"content": 5}}]}',
    "parts": b'{"choices": [{"message": {"content": [{"type": "text", "text": "ACTION: "}, {"type": "text", "text": "end()"}]}}],'
             b' "usage": {"prompt_tokens": null, "completion_tokens": 3}}',
    "null_usage": b'{"choices": [{"message": {"content": "ACTION: wait()"}}], "usage": {"prompt_tokens": null}}',
    "surrogate": b'{"choices": [{"message": {"content": "ACTION: end()\\nSAY: \\ud800"}}]}',
    "deep_body": b'{"choices": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
    "deep_content": b'{"choices": [{"message": {"content": ' + b"[" * 200_000 + b"]" * 200_000 + b"}}]}",
}


@pytest.mark.parametrize("mode", ["500", "empty", "garbage", "slow", "drip", "drip_status", "dropped", "truncated", "huge", *REPLIES])
def test_misbehaving_server(mode, tmp_path):
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if mode == "slow":
                time.sleep(3)
            if mode == "dropped":  # the connection closed without a word
                self.close_connection = True
                return
            if mode in ("drip", "drip_status"):  # each read is quick, the whole reply is not
                head = b"HTTP/1.0 200 OK\r\nContent-Length: 60\r\n\r\n"
                try:
                    for i in range(60 + len(head)):
                        if mode == "drip_status" or i >= len(head):
                            time.sleep(0.1)
                        self.wfile.write((head + b" " * 60)[i:i + 1])
                        self.wfile.flush()
                except OSError:  # the client hung up
                    pass
                return
            code, body = (500, b"oops") if mode == "500" else (200, REPLIES.get(mode, b"<html>" if mode == "garbage" else b'{"choices": []}'))
            try:
                self.send_response(code)
                self.send_header("Content-Length", str(10**12 if mode == "huge" else len(body) + (100 if mode == "truncated" else 0)))
                self.end_headers()
                self.wfile.write(body)
            except BrokenPipeError:  # the client already gave up (the "slow" case)
                pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()  # shutdown waits one poll
    try:
        b = OpenAIBackend("x", f"http://127.0.0.1:{srv.server_address[1]}/v1", timeout_s=1.0, retries=0)  # retries: tested apart
        t0 = time.perf_counter()
        c = b.complete([[{"role": "user", "content": "hi"}]])[0]
        assert time.perf_counter() - t0 < 1.5  # no request past its timeout
        if mode in ("parts", "null_usage", "surrogate"):  # valid replies: kept, whatever their usage or text
            assert c.error is None and c.text == {"parts": "ACTION: end()", "null_usage": "ACTION: wait()",
                                                  "surrogate": "ACTION: end()\nSAY: \ud800"}[mode]
            assert c.tokens_in == 0 and c.tokens_out == (3 if mode == "parts" else 0)
            if mode == "surrogate":  # a whole episode with such a reply keeps its records
                from socialworld.records import read_jsonl, write_jsonl

                pol = make_policy(f"openai:x@http://127.0.0.1:{srv.server_address[1]}/v1", max_new_tokens=8)
                ep = run_episodes(pol, [EpisodeJob(tiny_spec(), 0)])[0]
                write_jsonl(tmp_path / "e.jsonl", [ep])
                assert read_jsonl(tmp_path / "e.jsonl")[0].steps[0].action.raw == "ACTION: end()\nSAY: \ud800"
        else:
            want = {"500": "HTTP 500", "empty": "malformed response", "garbage": "malformed response", "slow": "cannot reach",
                    "drip": "no complete reply within 1 s", "drip_status": "no complete reply within 1 s",
                    "dropped": "broken response", "truncated": "broken response", "number": "content is int, not text",
                    "huge": "broken response", "deep_body": "JSON nested too deeply", "deep_content": "JSON nested too deeply"}[mode]
            assert c.text == "" and want in c.error, c.error
    finally:
        srv.shutdown()
        srv.server_close()


def test_belief_focus_and_running_estimate(specs):
    from socialworld.agents.lm.policy import focus, merge
    from socialworld.core import MentalState

    obs = _obs(specs, steps=3)
    (npc,) = [seg.text.strip() for seg in program(obs, 4)[1:2]]
    assert npc == focus(obs) and any(n.id == npc and n.present for n in obs.npcs)
    old = MentalState({"alice": {"restaurant": "thai", "time": "t1200"}}, {"alice": "low"})
    new = MentalState({"alice": {"time": "t1230"}, "ben": {"time": "t1200"}}, {"alice": "high"})
    got = merge(old, new)
    assert got.preferences == {"alice": {"restaurant": "thai", "time": "t1230"}, "ben": {"time": "t1200"}}
    assert got.moods == {"alice": "high"} and merge(old, None) is old and merge(None, new) is new


def test_mixed_adapter_batches(specs, tiny_dir, tmp_path):
    """Each row decodes its choice under one LoRA adapter and its free text under another, in
    one batch; with the same adapter everywhere it equals that adapter set as the active one."""
    import torch

    peft = pytest.importorskip("peft")
    cfg = peft.LoraConfig(r=4, lora_alpha=512, target_modules=["q_proj", "v_proj", "o_proj"], init_lora_weights=False)
    for name, seed in (("a", 1), ("b", 2)):
        torch.manual_seed(seed)
        peft.get_peft_model(load_hf(tiny_dir, dtype="float32")[0], cfg).save_pretrained(tmp_path / name)
    base, tok = load_hf(tiny_dir, dtype="float32")
    model = peft.PeftModel.from_pretrained(base, str(tmp_path / "a"), adapter_name="a")
    model.load_adapter(str(tmp_path / "b"), adapter_name="b")
    model.eval()
    prompts = HFBackend(model, tok, name="t").prompts([build_messages(_obs(specs, sid)) for sid in list(specs)[:4]])

    def prog(x, y):
        return [Forced("X:"), Choice("c", ("alpha", "beta", "gamma"), adapter=x), Forced(" say:"), Free("s", 6, adapter=y)]

    mixed = decode(model, tok, prompts, [prog("a", "b")] * 4, batch_size=4)
    assert [r.text for r in mixed] == [r.text for r in decode(model, tok, prompts, [prog("a", "b")] * 4, batch_size=1)]
    same = decode(model, tok, prompts, [prog("a", "a")] * 4, batch_size=4)
    model.set_adapter("a")
    assert [r.text for r in same] == [r.text for r in decode(model, tok, prompts, [prog(None, None)] * 4, batch_size=4)]
    assert [r.values["c"] for r in mixed] == [r.values["c"] for r in same]  # the choice ran under "a" in both
    assert [r.values["s"] for r in mixed] != [r.values["s"] for r in same]  # the free text under "b" differs


def _act_and_talk(tiny_dir, tmp_path):
    """The tiny model (fp32) with two random LoRA adapters loaded for inference: ``act``, activated by
    the assistant header (PEFT's aLoRA), and ``talk``, a plain one. Returns (model, tokenizer)."""
    import torch

    peft = pytest.importorskip("peft")
    from socialworld.learn.trainers.common import assistant_header

    base, tok = load_hf(tiny_dir, dtype="float32")
    for name, seed, inv in (("act", 1, assistant_header(tok)), ("talk", 2, None)):
        torch.manual_seed(seed)
        cfg = peft.LoraConfig(r=4, lora_alpha=512, target_modules=["q_proj", "v_proj", "o_proj"], init_lora_weights=False,
                              alora_invocation_tokens=inv, task_type="CAUSAL_LM")
        peft.get_peft_model(load_hf(tiny_dir, dtype="float32")[0], cfg).save_pretrained(tmp_path / name)
    model = peft.PeftModel.from_pretrained(base, str(tmp_path / "act"), adapter_name="act")
    model.load_adapter(str(tmp_path / "talk"), adapter_name="talk")
    model.eval()
    return model, tok


def test_an_activated_adapter_decodes_as_peft_runs_it(specs, tiny_dir, tmp_path):
    """An activated adapter (PEFT's aLoRA, invoked by the assistant header) beside a plain one:
    each constrained choice is the argmax of PEFT's own forward over prompt + text so far (the
    prompt before the header under the base model), alone or batched, with the system prefix cached."""
    import torch

    model, tok = _act_and_talk(tiny_dir, tmp_path)
    backend = HFBackend(model, tok, name="t")
    convs = [build_messages(_obs(specs, sid, steps=k)) for k, sid in enumerate(list(specs)[:4])]
    prompts = backend.prompts(convs)
    opts = ("alpha", "beta", "gamma", "delta")
    prog = [Forced("X:"), Choice("a", opts, adapter="act"), Forced(" then"), Choice("b", opts, adapter="act"),
            Forced(" say:"), Free("s", 4, adapter="talk")]
    system = [tok.apply_chat_template(c[:1], tokenize=False) for c in convs]
    rows = decode(model, tok, prompts, [prog] * 4, batch_size=4, prefixes=system)
    assert [r.text for r in rows] == [r.text for r in decode(model, tok, prompts, [prog] * 4, batch_size=1)]
    ids = lambda t: tok(t, add_special_tokens=False)["input_ids"]  # noqa: E731
    first = {ids(o)[0] for o in opts}

    def peft_argmax(head: list[int]) -> int:
        model.set_adapter("act")
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([head])).logits[0, -1]
        return max(first, key=lambda t: logits[t].item())

    plain = []
    for prompt, row in zip(prompts, rows):
        head = ids(prompt) + ids("X:")
        assert ids(row.values["a"])[0] == peft_argmax(head)
        head += ids(row.values["a"]) + ids(" then")
        assert ids(row.values["b"])[0] == peft_argmax(head)
        with model.disable_adapter(), torch.inference_mode():  # what the adapter changes
            plain.append(max(first, key=lambda t: model(input_ids=torch.tensor([head])).logits[0, -1, t].item()))
    assert [ids(r.values["b"])[0] for r in rows] != plain or [ids(r.values["a"])[0] for r in rows] != plain
    # segments that name no adapter run under the active one, activated alike (a served policy)
    model.set_adapter("act")
    unnamed = [Forced("X:"), Choice("a", opts), Forced(" then"), Choice("b", opts)]
    alone = decode(model, tok, prompts, [unnamed] * 4, batch_size=4, prefixes=system)
    assert [(r.values["a"], r.values["b"]) for r in alone] == [(r.values["a"], r.values["b"]) for r in rows]


def _grammar_text(obs, choose) -> str:
    """The BELIEF and ACTION lines :func:`program` lets a decoder write, ``choose(choice)`` picking each option."""
    out = []
    for seg in program(obs, 4):
        if isinstance(seg, Free):
            break
        out.append(seg.text if isinstance(seg, Forced) else choose(seg))
    return "".join(out).removesuffix("\nSAY:")


def test_belief_target_is_what_the_observation_supports(specs):
    """The trained BELIEF line is a function of the prompt (the expert's inference, a fixed rule
    for the unknown), in the decoding grammar."""
    from socialworld.agents.beliefs import Beliefs
    from socialworld.agents.lm.policy import belief_target, focus, target_turn
    from socialworld.agents.lm.prompts import parse_belief
    from socialworld.agents.scripted import ExpertPolicy, say
    from socialworld.world.visibility import legal_actions

    cases = set()
    for sid in ("team_lunch-v1", "book_club-v1", "weather_picnic-v1"):
        for seed, steps in ((seed, steps) for seed in range(1, 6) for steps in range(0, 8, 2)):
            w = drive(World(specs[sid], seed), make_policy("random", seed=seed), steps)
            obs = observe(specs[sid], w.pub)
            target = belief_target(obs)
            npc = focus(obs)
            if npc is None:
                assert target == "BELIEF:"
                continue
            # exactly what the grammar decodes when each choice takes the target's option
            items = dict(kv.split("=") for kv in target.split()[2:])  # slot=option ... mood=bucket

            def pick(c: Choice) -> str:
                return c.options[0] if c.name == "action" else items["mood" if c.name.startswith("mood:") else c.name.split(":")[-1]]

            assert _grammar_text(obs, pick).startswith(target + "\nACTION:")
            # the whole training turn parses back at its state to its action and words
            a = say(obs, legal_actions(obs)[seed % len(legal_actions(obs))])
            action, _, error = parse_output(target_turn(obs, a.key, a.utterance), obs)
            assert error is None and (action.key, action.utterance) == (a.key, a.utterance)
            assert target_turn(obs, a.key, "").endswith(f"\nACTION: {a.key}\nSAY:")
            stated = parse_belief(target.removeprefix("BELIEF:"), obs)
            known = ExpertPolicy.stated(obs, Beliefs().update(obs)).preferences.get(npc, {})
            for s in obs.slots:
                if npc in s.stakeholders:
                    want = known.get(s.id) or s.proposal or s.options[0].id
                    assert stated.preferences[npc][s.id] == want
                    cases.add("known" if s.id in known else "proposal" if s.proposal else "default")
    assert cases >= {"known", "default"}


def test_prompt_says_when_everyone_here_agrees(specs):
    """policy-v5: "everyone here agrees" exactly when every present stakeholder accepted the
    open decision's proposal (the expert's moment to finalize); older versions never say it."""
    from socialworld.text.templates import POLICY_ALL_AGREE

    seen = set()
    for sid in ("team_lunch-v1", "book_club-v1", "hackathon-v1"):
        for seed, steps in ((seed, steps) for seed in range(1, 5) for steps in range(0, 10)):
            obs = _obs(specs, sid, seed=seed, steps=steps)
            assert POLICY_ALL_AGREE not in build_messages(obs, "policy-v4")[1]["content"]
            here = {n.id for n in obs.npcs if n.present}
            for version, opening in (("policy-v6", ": open"), ("policy-v8", ":"), ("policy-v9", ":"), ("policy-v10", ":")):
                text = build_messages(obs, version)[1]["content"]
                for s in obs.slots:
                    if s.status != "open":
                        continue
                    line = next(x for x in text.splitlines() if x.startswith(f"{s.id}{opening}"))
                    agreed = s.proposal is not None and all(h in s.accepted_by for h in s.stakeholders if h in here)
                    assert (POLICY_ALL_AGREE in line) == agreed, version
                    seen.add(agreed)
    assert seen == {True, False}


def test_parsing_is_linear_in_the_reply_length(specs):
    """A reply full of whitespace (free decoding, a fixed policy, GRPO's samples) parses at once:
    the old patterns backtracked cubically (28 s for ``propose(`` and 4,000 spaces). 200,000
    characters must take well under the 10 s allowed here (a cubic pattern would take days)."""
    from socialworld.core import ActionParseError

    obs = _obs(specs)
    texts = ["propose(" + " " * 200_000, "ACTION: propose(" + " " * 200_000 + "x", "ACTION: x" + " " * 200_000 + "y",
             "ACTION:" + " " * 200_000 + "end()" + " " * 200_000]
    done = []

    def work():
        for t in texts:
            done.append(parse_output(t, obs))
        with pytest.raises(ActionParseError):
            Action.parse(texts[0])
        done.append(Action.parse("  end( " + " " * 100_000 + ")  "))

    th = threading.Thread(target=work, daemon=True)
    th.start()
    th.join(10)
    assert len(done) == 5, "parsing a long reply did not finish in 10 s"
    assert done[0][2] == "no ACTION line" and done[1][0] is None and done[3][0] == Action("end") and done[4] == Action("end")


def test_the_client_retries_429_and_5xx_and_keeps_the_servers_message():
    calls = []
    script = [(429, {"Retry-After": "0"}, b'{"error": {"message": "slow down"}}'), (503, {}, b"busy"),
              (200, {}, b'{"choices": [{"message": {"content": "ACTION: end()"}}]}')]

    from socialworld.testing import stub_endpoint

    def reply(req, headers):
        code, extra, body = (401, {}, b'{"error": {"message": "bad key"}}') if headers.get("Authorization") == "Bearer wrong" \
            else script[len(calls)]
        calls.append(code)
        return code, extra, body

    with stub_endpoint(reply) as url:
        c = OpenAIBackend("x", url, backoff_s=0.01).complete([[{"role": "user", "content": "hi"}]])[0]
        assert c.error is None and c.text == "ACTION: end()" and calls == [429, 503, 200]
        calls.clear()
        c = OpenAIBackend("x", url, api_key="wrong", backoff_s=0.01).complete([[{"role": "user", "content": "hi"}]])[0]
        assert calls == [401] and c.error == f"HTTP 401 from {url}: bad key"  # not retried: the key will not get better
        calls.clear()
        script[:] = [(500, {}, b'{"error": {"message": "it broke"}}')] * 3
        c = OpenAIBackend("x", url, backoff_s=0.01).complete([[{"role": "user", "content": "hi"}]])[0]
        assert calls == [500] * 3 and c.error == f"HTTP 500 from {url}: it broke (after 3 attempts)"


# ------------------------------------------------------------------ trained policies: base + a run's adapters


def _loop_layout(root, tiny_dir):
    """A loop run's adapters: cycle 1 trains both tracks, cycle 2 only the action track, cycle 3 nothing."""
    from socialworld.testing import random_adapter

    for c, tracks in ((1, ("action", "dialogue")), (2, ("action",)), (3, ())):
        (root / f"cycle-{c}" / "train").mkdir(parents=True)
        for i, t in enumerate(tracks):
            random_adapter(tiny_dir, root / f"cycle-{c}" / "train" / t / "adapter", seed=10 * c + i)
    return root


def test_find_adapters_reads_runs_cycles_and_adapter_folders(tiny_dir, tmp_path):
    from socialworld.agents.models import find_adapters
    from socialworld.testing import random_adapter

    loop = _loop_layout(tmp_path / "bench" / "loop", tiny_dir)
    newest = {"action": loop / "cycle-2/train/action/adapter", "dialogue": loop / "cycle-1/train/dialogue/adapter"}
    assert find_adapters(loop) == newest  # a track with no pairs keeps its previous adapter
    assert find_adapters(tmp_path / "bench") == newest  # a bench run: its loop
    assert find_adapters(loop / "cycle-3") == newest
    assert find_adapters(loop / "cycle-1") == {t: loop / f"cycle-1/train/{t}/adapter" for t in ("action", "dialogue")}
    assert find_adapters(loop / "cycle-2/train/action/adapter") == {"action": loop / "cycle-2/train/action/adapter"}
    merged = random_adapter(tiny_dir, tmp_path / "merged" / "adapter")
    assert find_adapters(merged) == {"action": merged, "dialogue": merged}  # one adapter serves both tracks
    (tmp_path / "empty").mkdir()
    for bad in (tmp_path / "empty", tmp_path / "absent", loop / "cycle-3" / "train"):
        with pytest.raises(ValueError, match="adapters"):
            find_adapters(bad)


def test_adapters_name_their_base_portably(tiny_dir, tmp_path, monkeypatch):
    from socialworld.agents.models import adapter_base, find_adapters, portable_base
    from socialworld.testing import random_adapter

    monkeypatch.setenv("SOCIALWORLD_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache" / "smollm2-135m-instruct").mkdir(parents=True)
    assert portable_base(tmp_path / "cache" / "smollm2-135m-instruct") == "bundled"
    assert portable_base(tiny_dir) == str(tiny_dir)
    a = random_adapter(tiny_dir, tmp_path / "a", base_name="bundled")
    assert adapter_base(find_adapters(a), a) == "bundled"
    assert parse_model_spec(str(a)) == parse_model_spec(f"bundled+{a}")  # resolves from the adapter alone
    gone = random_adapter(tiny_dir, tmp_path / "gone", base_name="/elsewhere/models/smollm2")
    with pytest.raises(ValueError, match="not on this machine.*--policy bundled --adapters"):
        parse_model_spec(str(gone))
    assert parse_model_spec(f"bundled+{gone}").adapters == str(gone)  # a named base needs no lookup
    for bad in (f"expert+{a}", f"bundled+{tmp_path / 'absent'}"):
        with pytest.raises(ValueError):
            parse_model_spec(bad)


def test_a_trained_policy_spec_deploys_its_adapters(tiny_dir, tmp_path, specs):
    loop = _loop_layout(tmp_path / "run", tiny_dir)
    spec = parse_model_spec(str(loop))
    assert (spec.kind, spec.name, spec.adapters) == ("hf", str(tiny_dir), str(loop))
    job = [EpisodeJob(specs["team_lunch-v1"], 3)]
    plain = run_episodes(make_policy(str(tiny_dir), max_new_tokens=8), job)[0]
    trained = run_episodes(make_policy(str(loop), max_new_tokens=8), job)[0]
    assert trained.steps[0].policy.adapter_hash and plain.steps[0].policy.adapter_hash is None
    assert trained.steps[0].policy.base_model == plain.steps[0].policy.base_model == str(tiny_dir)
    assert [s.action.raw for s in trained.steps] != [s.action.raw for s in plain.steps]
    again = run_episodes(make_policy(f"{tiny_dir}+{loop / 'cycle-2'}", max_new_tokens=8), job)[0]
    assert [s.action.raw for s in again.steps] == [s.action.raw for s in trained.steps]  # cycle 2 deploys the run's last adapters
    assert again.steps[0].policy.adapter_hash == trained.steps[0].policy.adapter_hash
    with pytest.raises(ValueError, match="names its adapters"):
        make_policy(str(loop), adapters={"action": str(loop)})


def test_eval_and_serve_take_a_runs_adapters(tiny_dir, tmp_path):
    from typer.testing import CliRunner

    from socialworld.agents.lm.server import HFGenerate, make_app
    from socialworld.agents.registry import make_backend
    from socialworld.cli.main import app
    from socialworld.testing import serving

    loop = _loop_layout(tmp_path / "run", tiny_dir)
    runner = CliRunner()
    res = runner.invoke(app, ["eval", "--policy", str(tiny_dir), "--adapters", str(loop), "--scenario", "team_lunch-v1",
                              "--episodes", "1", "--max-new-tokens", "8", "--out", str(tmp_path / "ev"), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["policy"] == f"{tiny_dir}+{loop}"
    ep = record_from_json(EpisodeRecord, (tmp_path / "ev" / "episodes.jsonl").read_text().splitlines()[0])
    assert ep.steps[0].policy.adapter_hash
    t0 = time.time()
    for argv in (["eval", "--policy", "expert", "--adapters", str(loop)],
                 ["eval", "--policy", str(tiny_dir), "--adapters", str(tmp_path / "absent")],
                 ["serve", "--model", f"{tiny_dir}+{loop}", "--adapters", str(loop)]):
        res = runner.invoke(app, argv)
        assert res.exit_code == 2 and "error:" in res.output, argv
    assert time.time() - t0 < 10  # before any model is loaded

    spec = f"{tiny_dir}+{loop}"
    backend = make_backend(spec, max_new_tokens=8, batch_size=1, dtype="float32")
    with serving(make_app(HFGenerate(backend.model, backend.tokenizer), spec)) as url:
        conv = [{"role": "user", "content": "Turn 1/7."}]
        served = OpenAIBackend(spec, url, max_new_tokens=8).complete([conv])[0]
        assert served.error is None
        base = make_backend(str(tiny_dir), max_new_tokens=8, batch_size=1, dtype="float32").complete([conv])[0]
        assert served.text == backend.complete([conv])[0].text != base.text  # the action adapter answers


# ------------------------------------------------------------------ vLLM: the reply grammar as a regular expression


def test_the_reply_grammar_as_a_regex_matches_exactly_the_grammar(specs):
    import random
    import re

    from socialworld.agents.lm.constrained import program_regex

    rng = random.Random(0)
    for sid in specs:
        obs = _obs(specs, sid, steps=2)
        prog = program(obs, 8)
        pattern = re.compile(program_regex(prog))
        for _ in range(5):
            text = _grammar_text(obs, lambda seg: rng.choice(seg.options)) + "\nSAY: Hello there, all."
            assert pattern.fullmatch(text), (sid, text)
            action, belief, error = parse_output(text, obs)
            assert error is None and belief is not None
        legal = {a.key for a in legal_actions(obs)}
        good = _grammar_text(obs, lambda seg: seg.options[0])
        assert not pattern.fullmatch(good.replace("\nACTION:", "\nACTION: shout()|") + "\nSAY: x")
        assert not pattern.fullmatch(good + "\nSAY: one\ntwo")  # the SAY line is one line
        assert "shout()" not in legal


def test_a_reply_grammar_regex_reads_back_as_its_program(specs):
    """:func:`program_from_regex` inverts :func:`program_regex` (what a socialworld server decodes
    ``structured_outputs`` by); a pattern outside that language is refused by name."""
    from socialworld.agents.lm.constrained import program_from_regex, program_regex

    for sid in specs:
        prog = program(_obs(specs, sid, steps=2), 8)
        back = program_from_regex(program_regex(prog), 8)
        assert program_regex(back) == program_regex(prog)
        assert [o for seg in back if isinstance(seg, Choice) for o in seg.options] == \
            [o for seg in prog if isinstance(seg, Choice) for o in seg.options]
        assert [seg.stop for seg in back if isinstance(seg, Free)] == ["\n"]
    for bad in ("a+", "(?:a|b", "[a-z]*", "x.y", "(a)", "ab\\", "[^ab]*"):
        with pytest.raises(ValueError):
            program_from_regex(bad, 4)


def _first_match(pattern: str) -> str:
    """The text :func:`program_regex`'s ``pattern`` matches with the first option of every choice and "Hi" as free text."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("(?:", i):  # a choice: its first option, up to an unescaped | or )
            i += 3
            options = [[]]
            while pattern[i] != ")":
                if pattern[i] == "|":
                    options.append([])
                    i += 1
                    continue
                step = 2 if pattern[i] == "\\" else 1
                options[-1].append(pattern[i + step - 1])
                i += step
            out += options[0]
            i += 1
        elif pattern.startswith("[^", i):  # free text
            i = pattern.index("]*", i) + 2
            out.append("Hi")
        elif pattern[i] == "\\":
            out.append(pattern[i + 1])
            i += 2
        else:
            out.append(pattern[i])
            i += 1
    return "".join(out)


def test_constrained_decoding_on_an_endpoint_sends_the_grammar_to_the_server(specs):
    """``--decoding constrained`` with an ``openai:`` endpoint: each request carries its step's grammar
    in vLLM's ``structured_outputs`` field; a fake server answers with a reply the pattern allows."""
    import re

    from socialworld.testing import stub_endpoint

    seen: list[dict] = []

    def reply(req, headers):
        seen.append(req)
        text = _first_match(req["structured_outputs"]["regex"])  # a reply vLLM could return under the pattern
        assert re.fullmatch(req["structured_outputs"]["regex"], text), text
        return 200, {}, {"choices": [{"message": {"content": text}}], "usage": {"prompt_tokens": 5, "completion_tokens": 9}}

    with stub_endpoint(reply) as url:
        pol = make_policy(f"openai:m@{url}", decoding="constrained", max_new_tokens=16)
        ep = run_episodes(pol, [EpisodeJob(specs["team_lunch-v1"], 0)])[0]
        assert ep.steps and all(s.action.parse_status == "ok" for s in ep.steps)
        assert ep.steps[0].policy.decoding["mode"] == "constrained" and len(seen) == len(ep.steps)
        assert make_policy(f"openai:m@{url}").decoding == "constrained"  # auto: this server decodes under the field


@pytest.mark.parametrize("server", ["rejects", "ignores", "dead"])
def test_auto_decoding_on_an_endpoint_asks_the_server_once(server, capfd):
    """``--decoding auto`` with an ``openai:`` endpoint: one probe request; a server that rejects the
    field, ignores it or cannot be reached gets free decoding, and the line on stderr says why."""
    from socialworld.testing import stub_endpoint

    seen: list[dict] = []

    def reply(req, headers):
        seen.append(req)
        if server == "rejects":
            return 400, {}, {"error": {"message": "extra fields not permitted: structured_outputs"}}
        return 200, {}, {"choices": [{"message": {"content": "Sure."}}]}

    if server == "dead":
        pol = make_policy(f"openai:m@http://127.0.0.1:{_free_port()}/v1")
    else:
        with stub_endpoint(reply) as url:
            pol = make_policy(f"openai:m@{url}")
    assert pol.decoding == "free" and len(seen) == (0 if server == "dead" else 1)
    err = capfd.readouterr().err
    assert "decodes free" in err and {"rejects": "HTTP 400", "ignores": "ignored structured_outputs",
                                      "dead": "cannot reach"}[server] in err


def test_export_merges_the_action_adapter_into_a_plain_model_folder(tiny_dir, tmp_path):
    from typer.testing import CliRunner

    from socialworld.agents.registry import make_backend
    from socialworld.cli.main import app

    loop = _loop_layout(tmp_path / "run", tiny_dir)
    res = CliRunner().invoke(app, ["export", "--policy", str(tiny_dir), "--adapters", str(loop), "--out", str(tmp_path / "m")])
    assert res.exit_code == 0, res.output
    conv = [[{"role": "user", "content": "Turn 1/7."}]]
    trained = make_backend(f"{tiny_dir}+{loop}", max_new_tokens=8, dtype="float32").complete(conv)[0]
    exported = make_backend(str(tmp_path / "m"), max_new_tokens=8, dtype="float32").complete(conv)[0]
    assert exported.text == trained.text and not (tmp_path / "m" / "adapter_config.json").exists()
    res = CliRunner().invoke(app, ["export", "--policy", f"{tiny_dir}+{loop}", "--out", str(tmp_path / "m")])
    assert res.exit_code == 2 and "exists" in res.output
    # an activated adapter (aLoRA) has no merged equal: said before anything is written
    from socialworld.agents.models import find_adapters

    config = find_adapters(loop)["action"] / "adapter_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "alora_invocation_tokens": [1, 2]}))
    res = CliRunner().invoke(app, ["export", "--policy", f"{tiny_dir}+{loop}", "--out", str(tmp_path / "m2")])
    assert res.exit_code == 2 and "activated" in res.output and not (tmp_path / "m2").exists()


def test_model_spec_edge_cases(tiny_dir, tmp_path):
    from socialworld.agents.models import ModelSpec, with_adapters
    from socialworld.testing import random_adapter

    plus = tmp_path / "my+model"
    plus.symlink_to(tiny_dir, target_is_directory=True)
    assert parse_model_spec(str(plus)) == ModelSpec("hf", str(plus))  # a folder, "+" in its name or not
    a = random_adapter(tiny_dir, tmp_path / "a")
    for bad in ("bundled+", f"+{a}"):
        with pytest.raises(ValueError, match="both parts"):
            parse_model_spec(bad)
    with pytest.raises(ValueError, match="endpoint"):
        with_adapters("openai:m@http://127.0.0.1:9/v1", str(a))
    assert parse_model_spec("HuggingFaceTB/SmolLM2-135M-Instruct").kind == "hf"


def test_adapters_trained_before_portable_bases_still_name_the_bundled_model(tiny_dir, tmp_path, monkeypatch):
    from socialworld.agents.models import adapter_base, find_adapters
    from socialworld.testing import random_adapter

    monkeypatch.setenv("SOCIALWORLD_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache" / "smollm2-135m-instruct").mkdir(parents=True)
    run = tmp_path / "run"
    random_adapter(tiny_dir, run / "cycle-1/train/action/adapter", base_name=str(tmp_path / "cache" / "smollm2-135m-instruct"))
    random_adapter(tiny_dir, run / "cycle-2/train/dialogue/adapter", base_name="bundled")
    assert adapter_base(find_adapters(run), run) == "bundled"


def test_a_trained_world_model_is_not_shared_with_a_trained_policy(tiny_dir, tmp_path):
    from socialworld.swm.foresee import make_world_model

    loop = _loop_layout(tmp_path / "run", tiny_dir)
    trained = make_policy(f"{tiny_dir}+{loop}", max_new_tokens=8)
    plain = make_policy(str(tiny_dir), max_new_tokens=8)
    assert make_world_model(str(tiny_dir), trained).backend is not trained.backend  # the base, not the trained model
    assert make_world_model(str(tiny_dir), plain).backend is plain.backend  # the same model: loaded once


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_decoding_on_the_gpu_writes_the_cpus_tokens(specs, tiny_dir):
    """load_hf puts a model on the GPU where there is one; both decoders build their tensors on the
    model's device and give, in fp32, the tokens the CPU gives."""
    model, tok = load_hf(tiny_dir, dtype="float32")
    assert model.device.type == "cuda"
    obs = [_obs(specs, sid, steps=k) for k, sid in enumerate(specs)]
    convs, progs = [build_messages(o) for o in obs], [program(o, 6) for o in obs]
    gpu = HFBackend(model, tok, name="tiny", max_new_tokens=12, batch_size=8)
    on_gpu = [c.text for c in gpu.complete(convs)], [c.text for c in gpu.constrained(convs, progs)]
    cpu = HFBackend(model.to("cpu"), tok, name="tiny", max_new_tokens=12, batch_size=8)
    on_cpu = [c.text for c in cpu.complete(convs)], [c.text for c in cpu.constrained(convs, progs)]
    assert on_gpu == on_cpu


@pytest.mark.slow
def test_the_first_use_of_the_bundled_model_says_what_it_does(tmp_path, monkeypatch, capfd):
    """Converting the bundled GGUF (once per cache) is one line on stderr, naming the size and the
    folder; the converter's own progress bar stays off the terminal; the second use is silent."""
    from socialworld.agents.models import bundled_gguf, bundled_path

    try:
        bundled_gguf()
    except FileNotFoundError as e:  # the package is the main job's install, not the tests'
        if os.environ.get("SOCIALWORLD_REQUIRE_BUNDLED"):
            pytest.fail(f"SOCIALWORLD_REQUIRE_BUNDLED is set but {e}")
        pytest.skip(str(e))
    monkeypatch.setenv("SOCIALWORLD_CACHE", str(tmp_path / "cache"))
    path = bundled_path()
    err = capfd.readouterr().err
    assert (path / "config.json").exists() and "GGUF" not in err.replace(" MB GGUF)", "")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "converting the bundled model" in lines[0] and str(path) in lines[0] and " MB " in lines[0]
    assert bundled_path() == path and capfd.readouterr().err == ""


def test_merged_adapters_decode_as_the_mixed_forward(specs, tiny_dir, tmp_path):
    """Merged weights (the decoder's default) write what PEFT's mixed-adapter forward writes (fp32:
    the same tokens); the base weights are back afterwards, and an in-place change of an adapter's
    weights is merged again at the next decode."""
    import torch

    peft = pytest.importorskip("peft")
    from socialworld.agents.lm.constrained import MergedAdapters

    model, tok = _act_and_talk(tiny_dir, tmp_path)
    convs = [build_messages(_obs(specs, sid, steps=k)) for k, sid in enumerate(list(specs)[:4])]
    prompts = HFBackend(model, tok, name="t").prompts(convs)
    opts = ("alpha", "beta", "gamma", "delta")
    prog = [Forced("X:"), Choice("a", opts, adapter="act"), Forced(" say:"), Free("s", 6, adapter="talk")]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    lora = [m for m in model.modules() if isinstance(m, peft.tuners.lora.LoraLayer)]
    assert lora and not any(m.disable_adapters for m in lora)
    merged = MergedAdapters()
    assert merged.supports(model) and not merged.supports(load_hf(tiny_dir, dtype="float32")[0])
    fast = decode(model, tok, prompts, [prog] * 4, batch_size=4, merged=merged)
    said = [r.values["s"] for r in fast]
    slow = decode(model, tok, prompts, [prog] * 4, batch_size=4, merge=False)
    assert [r.text for r in fast] == [r.text for r in slow]
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # nothing left swapped in
    assert not any(m.disable_adapters for m in lora)  # the adapters are enabled again
    with torch.no_grad():  # an optimizer step's in-place change: merged again, as the mixed forward sees it
        for n, p in model.named_parameters():
            if "lora_B.talk" in n:
                p.mul_(-3)
    fast = decode(model, tok, prompts, [prog] * 4, batch_size=4, merged=merged)
    slow = decode(model, tok, prompts, [prog] * 4, batch_size=4, merge=False)
    assert [r.text for r in fast] == [r.text for r in slow] and [r.values["s"] for r in fast] != said
