import json

from socialworld.agents.registry import make_policy
from socialworld.records import read_jsonl, read_parquet, write_jsonl, write_parquet
from socialworld.rollout.runner import EpisodeJob, run_episodes
from socialworld.swm.s3ap import agent_trace, from_s3ap, to_s3ap
from socialworld.testing import FixedPolicy, tiny_spec


def _episodes(specs):
    return run_episodes(make_policy("expert"), [EpisodeJob(s, 3) for s in list(specs.values())[:3]])


def test_jsonl_and_parquet_round_trip_exactly(tmp_path, specs):
    eps = _episodes(specs)
    write_jsonl(tmp_path / "e.jsonl", eps)
    write_parquet(tmp_path / "e.parquet", eps)
    assert read_jsonl(tmp_path / "e.jsonl") == eps
    assert read_parquet(tmp_path / "e.parquet") == eps
    import pyarrow.parquet as pq

    t = pq.read_table(tmp_path / "e.parquet")
    assert t.column("scenario_id").to_pylist() == [e.scenario_id for e in eps]
    assert not list(tmp_path.glob(".*tmp"))  # atomic writes leave no temp files


def test_records_are_versioned_and_carry_provenance(specs):
    ep = _episodes(specs)[0]
    st = ep.steps[0]
    assert ep.schema_version == "episode-v1" and st.schema_version == "step-v1"
    assert st.observation.provenance["npcs.cue"] == "proxy"
    assert st.signals.q.detail == "rule:dialogue-v1"
    assert ep.lineage.spec_hash == specs[ep.scenario_id].content_hash
    assert ep.metrics is not None and ep.diagnostics is not None


def test_unparseable_output_is_recorded_raw_and_penalised():
    spec = tiny_spec()
    ep = run_episodes(FixedPolicy(["I think we should watch something", "propose(film, drama, all) | Everyone, Drama?"]),
                      [EpisodeJob(spec, 0)])[0]
    s0 = ep.steps[0]
    assert s0.action.parse_status == "unparseable" and s0.action.raw == "I think we should watch something"
    assert s0.action.executed == "wait()" and s0.signals.penalty.value == 0.2
    assert s0.signals.q.source == "missing"
    assert ep.steps[1].action.parse_status == "ok"


def test_s3ap_export_import_round_trip(specs):
    ep = _episodes(specs)[0]
    doc = to_s3ap(ep)
    back = from_s3ap(json.dumps(doc.model_dump()))
    assert back == doc
    trace = agent_trace(back)
    assert [t["action"] for t in trace] == [s.action.executed for s in ep.steps]
    assert [t["mental_state"] for t in trace] == [s.mental_state.stated for s in ep.steps]
    assert back.timesteps[0].observations["agent"].count("<mental_state>") == 1
    assert set(back.agents) == {"agent", *specs[ep.scenario_id].npc_ids}


_NASTY = ["\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\r", "\r\n", "\n", "\ud800", "\udfff",
          "\ud83d", "\x00", "\"", "\\", "é", "😀", "\ufeff", " "]


def _fuzz(rng, n=12):
    """Random text with the characters above; a high surrogate followed by a low one is one
    character in UTF-16 (and in JSON), so such a pair is joined here as any decoder would."""
    text = "".join(rng.choice(_NASTY) if rng.random() < 0.4 else rng.choice("abc xyz,.!") for _ in range(n))
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "surrogatepass")


def test_any_model_text_round_trips_through_records(tmp_path):
    """Fuzzed utterances and unparseable replies (line separators, lone surrogates, NUL, quotes)
    write and read back exactly, in JSONL and Parquet, and each record stays one line."""
    import random

    rng = random.Random(7)
    spec = tiny_spec()
    for trial in range(24):
        script = [f"propose(film, drama, all) | {_fuzz(rng)}", _fuzz(rng, 30), f"inquire(ann, film) | {_fuzz(rng)}"]
        eps = run_episodes(FixedPolicy(script), [EpisodeJob(spec, trial)])
        assert eps[0].steps[1].action.raw == script[1]  # unparseable output kept as written
        write_jsonl(tmp_path / "e.jsonl", eps)
        write_parquet(tmp_path / "e.parquet", eps)
        assert read_jsonl(tmp_path / "e.jsonl") == eps and read_parquet(tmp_path / "e.parquet") == eps
        assert (tmp_path / "e.jsonl").read_bytes().count(b"\n") == len(eps)
        assert len((tmp_path / "e.jsonl").read_text(encoding="utf-8").splitlines()) == len(eps)  # any line reader agrees


def test_reply_parser_breaks_lines_at_newline_only():
    from socialworld.agents.lm.prompts import parse_output
    from socialworld.world.engine import World
    from socialworld.world.visibility import observe

    obs = observe(tiny_spec(), World(tiny_spec(), 0).pub)
    for sep in ("\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c", "\r"):
        action, _, error = parse_output(f"SAY: hi{sep}ACTION: end()", obs)
        assert action is None and error == "no ACTION line"
    for sep in ("\n", "\r\n"):
        action, _, error = parse_output(f"SAY: hi{sep}ACTION: end()", obs)
        assert action is not None and action.kind == "end" and error is None


def test_artifacts_take_the_umasks_mode(tmp_path, specs):
    """Atomic writes go through a mode-600 temporary file; the result has the mode any open() would."""
    import os
    import stat

    from socialworld.records import atomic_write_text, umask
    from socialworld.rundir import RunDir

    old = os.umask(0o027)
    umask.cache_clear()
    try:
        atomic_write_text(tmp_path / "a.txt", "x")
        write_parquet(tmp_path / "e.parquet", _episodes(specs)[:1])
        run = RunDir(tmp_path / "run")
        run.write_config({"cycles": 1})
        run.produce("m/f.txt", "t", lambda p: atomic_write_text(p, "y"))
        for f in (tmp_path / "a.txt", tmp_path / "e.parquet", tmp_path / "run" / "m" / "f.txt", tmp_path / "run" / "manifest.json"):
            assert stat.S_IMODE(f.stat().st_mode) == 0o640, f
    finally:
        os.umask(old)
        umask.cache_clear()
