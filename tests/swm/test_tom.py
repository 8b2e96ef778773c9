"""ToM stories: exact answers and reference S3AP, the parser with validation feedback, parser
quality, QA with and without S3AP (tiny model)."""

import json

import pytest

from socialworld.agents.lm.backends import Completion
from socialworld.swm.config import TomConfig
from socialworld.swm.s3ap import S3APDocument
from socialworld.swm.tom import (
    NOT_OBSERVED,
    SAME_AS_STATE,
    ScriptedS3APParser,
    StoryEvent,
    TomResult,
    answer_questions,
    evaluate_tom,
    generate_stories,
    generate_story,
    observation_accuracy,
    parse_s3ap,
    parser_quality,
    validate_s3ap,
    world_stories,
    world_story,
)


def test_stories_are_seeded_and_have_a_false_belief():
    a, b = generate_story(7), generate_story(7)
    assert a == b and a != generate_story(8)
    for s in generate_stories(0, 30):
        reality = next(q.answer for q in s.questions if q.kind == "reality")
        placer = s.events[len(s.agents)].agent
        assert s.events[len(s.agents)].kind == "place"
        # the placer left before the move: at that point its belief is false
        assert s.events[len(s.agents) + 2].kind == "move" and s.events[len(s.agents) + 1] == StoryEvent(kind="leave", agent=placer)
        firsts = {q.about[0]: q.answer for q in s.questions if q.kind == "first_order"}
        assert set(firsts) == set(s.agents) and all(ans in s.containers for ans in firsts.values())
        assert reality in s.containers
        assert len([q for q in s.questions if q.kind == "second_order"]) == len(s.agents) * (len(s.agents) - 1)


def test_answers_follow_who_saw_what():
    s = generate_story(1)
    present: set[str] = set()
    seen = {a: None for a in s.agents}
    for ev in s.events:  # an independent re-derivation of first-order beliefs
        if ev.kind == "enter":
            present.add(ev.agent)
        elif ev.kind == "leave":
            present.discard(ev.agent)
        else:
            for a in present:
                seen[a] = ev.dest
    assert {q.about[0]: q.answer for q in s.questions if q.kind == "first_order"} == seen
    # the reference S3AP: one timestep per sentence; absent agents observe nothing
    ref = s.reference
    assert len(ref.timesteps) == len(s.sentences)
    S3APDocument.model_validate_json(ref.model_dump_json())
    for ev, st in zip(s.events, ref.timesteps):
        assert st.observations[ev.agent] == SAME_AS_STATE and st.actions[ev.agent].startswith(ev.agent)
    assert any(o == NOT_OBSERVED for st in ref.timesteps for o in st.observations.values())


def test_json_schema_exports():
    schema = S3APDocument.model_json_schema()
    assert "timesteps" in schema["properties"] and schema["$defs"]["S3APStep"]["properties"]["observations"]


def test_scripted_parser_is_exact_and_quality_counts_cells():
    stories = generate_stories(3, 5)
    results = parse_s3ap(ScriptedS3APParser(), [s.text for s in stories])
    for r, s in zip(results, stories):
        assert r.attempts == 1 and parser_quality(r, s.reference) == {"structural": 1.0, "observation_accuracy": 1.0, "quality": 1.0}
    # one wrong cell out of n costs 0.7/n
    s, r = stories[0], results[0]
    steps = list(r.doc.timesteps)
    st = steps[0]
    agent = next(iter(st.observations))
    steps[0] = st.model_copy(update={"observations": {**st.observations, agent: "<same_as_state />" if st.observations[agent] != SAME_AS_STATE else "none"}})
    bad = r.doc.model_copy(update={"timesteps": steps})
    n = sum(len(t.observations) for t in s.reference.timesteps)
    assert observation_accuracy(bad, s.reference) == pytest.approx(1 - 1 / n)
    assert observation_accuracy(None, s.reference) == 0.0


class FlakyParser:
    """Invalid JSON first, then a schema error, then the scripted parse: exercises the retry loop."""

    name = "flaky"
    local = False

    def __init__(self):
        self.seen: list[list[dict]] = []

    def complete(self, conversations):
        out = []
        for c in conversations:
            self.seen.append(c)
            turns = sum(m["role"] == "assistant" for m in c)
            if turns == 0:
                out.append(Completion("{not json}"))
            elif turns == 1:
                out.append(Completion(json.dumps({"version": "s3ap-v1", "scenario_id": "x", "seed": 0, "agents": ["A"],
                                                  "timesteps": [{"timestep": 0, "state": "", "observations": {"B": "none"}, "actions": {}}]})))
            else:
                out.append(ScriptedS3APParser().complete([c[:2]])[0])
        return out


def test_parser_feeds_errors_back_and_counts_attempts():
    s = generate_story(2)
    r = parse_s3ap(FlakyParser(), [s.text], max_retries=2)[0]
    assert r.doc is not None and r.attempts == 3 and len(r.errors) == 2
    assert "invalid JSON" in r.errors[0][0] and "unknown agents ['B']" in r.errors[1][0]
    flaky = FlakyParser()
    r = parse_s3ap(flaky, [s.text], max_retries=1)[0]
    assert r.doc is None and r.attempts == 2 and parser_quality(r, s.reference)["quality"] == 0.0
    assert "unknown agents" not in flaky.seen[-1][-1]["content"] and "invalid JSON" in flaky.seen[-1][-1]["content"]
    assert validate_s3ap("no braces")[1] == ["no JSON object found"]
    assert parse_s3ap(FlakyParser(), [s.text], max_retries=0)[0].attempts == 1


class ErrorBackend:
    name = "down"
    local = False

    def complete(self, conversations):
        return [Completion("", error="connection refused") for _ in conversations]


def test_backend_errors_count_as_failed_attempts_and_unanswered():
    s = generate_story(4)
    r = parse_s3ap(ErrorBackend(), [s.text], max_retries=1)[0]
    assert r.doc is None and r.attempts == 2 and r.errors[0] == ["backend error: connection refused"]
    assert answer_questions(ErrorBackend(), [(s, s.questions[0], None)]) == [None]


@pytest.fixture(scope="module")
def tiny_backend(tiny_dir, tmp_path_factory):
    pytest.importorskip("torch")
    from socialworld.agents.lm.backends import HFBackend
    from socialworld.agents.models import load_hf

    model, tok = load_hf(tiny_dir, dtype="float32")
    return HFBackend(model, tok, name="tiny", max_new_tokens=16, batch_size=8)


def test_tom_evaluation_with_a_tiny_model(tiny_backend, tmp_path):
    cfg = TomConfig(stories=3, seed=5, max_retries=1, world_stories=2, out=str(tmp_path / "tom"))
    doc = evaluate_tom(cfg, backend=tiny_backend)
    assert TomResult.model_validate_json((tmp_path / "tom" / "tom.json").read_text()) == doc  # the file is the result
    n = doc.questions
    assert n == sum(len(s.questions) for s in generate_stories(5, 3))
    # the scripted parser is exact; a random tiny model never produces valid S3AP in 16 tokens
    assert doc.parser["scripted"].quality.mean == 1.0
    assert doc.parser["model"].valid == 0 and doc.parser["model"].attempts == 6
    for source in ("none", "reference", "parsed"):
        q = doc.qa[source]
        assert q.unanswered == 0 and 0 <= q.all.lo <= q.all.mean <= q.all.hi <= 1
    rows = [json.loads(line) for line in (tmp_path / "tom" / "answers.jsonl").read_text().splitlines()]
    world = doc.world
    assert world is not None and world.stories == 2 and world.parser["scripted"].quality.mean == 1.0
    assert len(rows) == 3 * (n + world.questions)
    stories = {s.id: s for s in [*generate_stories(5, 3), *world_stories(5, 2)]}
    assert all(r["given"] in stories[r["story"]].containers for r in rows)  # constrained: always a container
    # accuracy in the document is recomputed from the rows
    none = [r for r in rows if r["source"] == "none" and r["story"].startswith("tom-")]
    assert doc.qa["none"].all.mean == pytest.approx(sum(r["given"] == r["answer"] for r in none) / len(none))


def test_tom_command_on_a_local_model_folder(tiny_dir, tmp_path):
    pytest.importorskip("torch")
    from typer.testing import CliRunner

    from socialworld.cli.main import app

    folder = tiny_dir
    r = CliRunner().invoke(app, ["tom", "--model", str(folder), "--stories", "2", "--parse-tokens", "8", "--max-retries", "0",
                                 "--world-stories", "1", "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert "QA accuracy" in r.output and "scripted" in r.output and "world episodes" in r.output
    doc = json.loads((tmp_path / "out" / "tom.json").read_text())
    assert doc["parser"]["model"]["attempts"] == 2 and doc["config"]["stories"] == 2


def test_world_episodes_as_stories():
    from socialworld.agents.scripted import ExpertPolicy
    from socialworld.rollout.runner import EpisodeJob, run_episodes
    from socialworld.world.spec import load_builtin_scenarios

    spec = load_builtin_scenarios()["hackathon-v1"]
    eps = run_episodes(ExpertPolicy(), [EpisodeJob(spec, s) for s in range(6)])
    stories = [s for s in (world_story(e) for e in eps) if s is not None]
    assert stories and all(s.version == "world-story-v1" for s in stories)
    for ep, s in ((e, world_story(e)) for e in eps):
        if s is None:
            assert not any(st.action.executed.startswith("propose(") for st in ep.steps)
            continue
        proposals = [st.action.executed for st in ep.steps if st.action.executed.startswith("propose(")]
        assert sum(e.kind == "propose" for e in s.events) == len(proposals)
        S3APDocument.model_validate_json(s.reference.model_dump_json())
        # reality: the last proposal of each decision
        last = {}
        for a in proposals:
            slot, option, _ = [x.strip() for x in a[len("propose("):-1].split(",")]
            last[slot] = option
        assert {q.text.split()[1]: q.answer for q in s.questions if q.kind == "reality"} == last
    # the late arrival never heard the proposals made before it came in: a false (empty) belief
    late = [q for s in stories for q in s.questions if q.kind == "first_order" and q.answer == "nothing"]
    assert late and all(q.answer in s.containers for s in stories for q in s.questions)
    results = parse_s3ap(ScriptedS3APParser(), [s.text for s in stories])
    assert all(parser_quality(r, s.reference)["quality"] == 1.0 for r, s in zip(results, stories))


def test_tom_world_stories_from_a_user_scenario_file(my_lunch, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from socialworld.cli.main import app
    from socialworld.swm import tom as tom_mod
    from socialworld.world.spec import load_spec

    mine = load_spec(my_lunch)
    real = tom_mod.evaluate_tom  # the command with a backend that answers nothing: only the stories matter here
    monkeypatch.setattr(tom_mod, "evaluate_tom", lambda cfg, progress=None: real(cfg, backend=ErrorBackend(), progress=progress))
    r = CliRunner().invoke(app, ["tom", "--stories", "1", "--max-retries", "0", "--world-stories", "1",
                                 "--scenario", str(my_lunch), "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "out" / "tom.json").read_text())
    assert doc["world"]["stories"] == 1 and doc["world"]["scenarios"] == {"my_lunch-v1": mine.content_hash}
    assert doc["world"]["parser"]["scripted"]["quality"]["mean"] == 1.0
    rows = [json.loads(line) for line in (tmp_path / "out" / "answers.jsonl").read_text().splitlines()]
    world = {r["story"] for r in rows if r["story"].startswith("world-")}
    assert world == {s.id for s in world_stories(0, 1, specs=[mine])} and len(world) == 1
    assert all(w.startswith("world-my_lunch-v1-") for w in world)
