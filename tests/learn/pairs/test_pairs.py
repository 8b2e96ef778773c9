"""The sleep phase's pairs (learn/pairs): counterfactual replay, each source, screening, gating, replay and the Parquet file."""

import json
from dataclasses import replace
from statistics import fmean

import pytest

from socialworld.agents.registry import make_policy
from socialworld.core import Action
from socialworld.learn.config import SleepConfig
from socialworld.learn.pairs.counterfactual import ReplayMismatch, recorded_action, replay, rollout_returns
from socialworld.learn.pairs.gating import GatingReport, add_replay, read_gating, screen_and_gate
from socialworld.learn.pairs.record import read_pairs, write_pairs
from socialworld.learn.pairs.sleep import candidate_pairs
from socialworld.learn.pairs.sources import (
    SleepInputs,
    Unit,
    action_pairs,
    dialogue_pairs,
    reference_pairs,
    utterance_pairs,
)
from socialworld.rollout.runner import EpisodeJob, run_episodes
from socialworld.testing import FixedPolicy
from socialworld.world.engine import World
from socialworld.world.visibility import observe


def turn_parts(text: str) -> tuple[str, str, str]:
    """A training turn's BELIEF line, action key and SAY words."""
    head, rest = text.split("\nACTION: ")
    key, words = rest.split("\nSAY: ")
    return head, key, words


@pytest.fixture(scope="module")
def lunch(specs):
    return specs["team_lunch-v1"]


@pytest.fixture(scope="module")
def random_eps(lunch):
    return run_episodes(make_policy("random", seed=3), [EpisodeJob(lunch, s) for s in (12, 1)])  # seeds with 4+ pairs each


def test_replay_reproduces_every_reward(lunch, random_eps):
    # unparseable and illegal outputs replay too
    odd = run_episodes(FixedPolicy(["garbage", "propose(nothing, x, all)", "inquire(alice, restaurant)"]),
                       [EpisodeJob(lunch, 5)])[0]
    assert {s.action.parse_status for s in odd.steps} >= {"unparseable", "illegal", "ok"}
    for ep in [*random_eps, odd]:
        assert sum(1 for _ in replay(lunch, ep)) == len(ep.steps)
    bad = random_eps[0].model_copy(update={"steps": [s.model_copy(update={"signals": s.signals.model_copy(
        update={"reward": s.signals.reward.model_copy(update={"value": 9.0})})}) for s in random_eps[0].steps]})
    with pytest.raises(ReplayMismatch):
        list(replay(lunch, bad))


def test_action_pairs_come_from_real_forks(lunch, random_eps):
    cfg = SleepConfig(rollouts=2, horizon=6, max_candidates=8)
    report = GatingReport()
    pairs = action_pairs(Unit(lunch, random_eps[0]), cfg, report)
    assert pairs and report.candidates == len(random_eps[0].steps)
    worlds = {s.setting.step: w.fork() for s, w in replay(lunch, random_eps[0])}
    for p in pairs[:4]:
        assert p.chosen_value - p.rejected_value >= cfg.margin
        assert p.provenance == "simulator_rollout(expert, M=2, horizon=6)"
        _, key, words = turn_parts(p.chosen[0]["content"])
        chosen = Action.parse(key)
        # re-scoring the chosen action from an independent copy of that state gives the same value
        from socialworld.learn.pairs.counterfactual import templated

        w = worlds[p.step]
        again = rollout_returns(w, templated(w, chosen), cfg, (p.scenario_id, p.seed, p.step))
        assert fmean(again) == pytest.approx(p.chosen_value)
        assert p.prompt[0]["role"] == "system" and p.chosen[0]["content"].startswith("BELIEF: ")
        assert words == templated(w, chosen).utterance  # the whole turn: the words it was scored with
        assert p.rejected[0]["content"] == random_eps[0].steps[p.step].action.raw.strip()  # what the policy wrote


def test_wake_pairs_with_the_continuation_policys_labels(lunch, random_eps):
    from socialworld.world.engine import World
    from socialworld.world.visibility import observe

    cfg = SleepConfig(rollouts=1, horizon=4, max_candidates=6, wake_chosen="label_by_margin")
    report = GatingReport()
    ep = random_eps[0]
    pairs = action_pairs(Unit(lunch, ep), cfg, report)
    assert pairs and all(p.chosen_by == "label" and "label" not in p.provenance for p in pairs)
    # the label is what the expert does when fed this episode's observations in order
    expert, w, labels = make_policy("expert"), World(lunch, ep.seed), {}
    expert.reset(["x"])
    for s in ep.steps:
        labels[s.setting.step] = expert.act(["x"], [observe(lunch, w.pub)])[0].action.key
        w.step(recorded_action(s), parse_error=s.action.error if s.action.parse_status == "unparseable" else None)
    for p in pairs:
        assert turn_parts(p.chosen[0]["content"])[1] == labels[p.step]
        assert p.chosen_value >= p.rejected_value + cfg.margin  # the rollouts favour the label too
    assert report.candidates == len(ep.steps) == len(pairs) + sum(report.excluded.values())
    with pytest.raises(ValueError, match="wake_chosen"):
        SleepConfig(wake_chosen="oracle")

    # plain DAgger: every label that differs from what the policy did, whatever the rollouts say
    loose, report2 = replace(cfg, wake_chosen="label"), GatingReport()
    every = action_pairs(Unit(lunch, ep), loose, report2)
    differs = {s.setting.step for s in ep.steps
               if not (s.action.parse_status == "ok" and recorded_action(s).key == labels[s.setting.step])}
    assert {p.step for p in every} == differs
    assert report2.excluded.get("action:below_margin", 0) == 0
    assert report2.excluded.get("action:label_agrees", 0) == len(ep.steps) - len(differs)
    assert any(p.chosen_value < p.rejected_value + cfg.margin for p in every)  # the margin would have dropped these
    same = {p.step: p for p in every}
    for p in pairs:  # where both keep a label, it is the same pair (the same rollouts)
        assert same[p.step].chosen_value == p.chosen_value and same[p.step].rejected_value == p.rejected_value
    # the quality threshold does not apply to a label under "label", and does under "label_by_margin"
    weak = [p for p in every if p.quality < loose.quality_threshold]
    assert weak
    assert {p.id for p in screen_and_gate(weak, replace(loose, template_cap=99), GatingReport())} == {p.id for p in weak}
    r3 = GatingReport()
    assert screen_and_gate(weak, replace(cfg, template_cap=99), r3) == [] and r3.excluded["action:low_quality"] == len(weak)
    with pytest.raises(TypeError, match="label_gate"):  # one field says how labels are kept (issue 41)
        SleepConfig(label_gate="disagree")  # type: ignore[call-arg]


def test_reference_pairs_cover_the_reference_episode_states(lunch):
    ref = run_episodes(make_policy("expert"), [EpisodeJob(lunch, 11)])[0]
    cfg = SleepConfig(rollouts=2, horizon=6, max_candidates=8, sources=("action", "reference", "dialogue", "utterance", "judge"))
    report = GatingReport()
    pairs = reference_pairs(Unit(lunch, ref), cfg, report)
    assert report.candidates == len(ref.steps) and len(pairs) + sum(report.excluded.values()) == len(ref.steps)
    worlds = {s.setting.step: w.fork() for s, w in replay(lunch, ref)}
    assert len({p.step for p in pairs}) == len(pairs) and {p.step for p in pairs} <= set(worlds)
    from socialworld.learn.pairs.counterfactual import templated

    for p in pairs:
        assert p.episode_id == ref.episode_id and p.chosen_value - p.rejected_value >= cfg.margin
        belief_c, act_c, said_c = turn_parts(p.chosen[0]["content"])
        belief_r, act_r, said_r = turn_parts(p.rejected[0]["content"])
        assert belief_c == belief_r and act_c != act_r  # the pair differs only in the action (and its words)
        w = worlds[p.step]
        key = (p.scenario_id, p.seed, p.step, "reference")
        for act, said, value in ((act_c, said_c, p.chosen_value), (act_r, said_r, p.rejected_value)):  # both values from real forks
            assert said == templated(w, Action.parse(act)).utterance
            assert fmean(rollout_returns(w, templated(w, Action.parse(act)), cfg, key)) == pytest.approx(value)
    # the reference's own action is always scored: the chosen one is at least as good
    for p in pairs:
        taken = recorded_action(ref.steps[p.step])
        w = worlds[p.step]
        assert p.chosen_value >= fmean(rollout_returns(w, templated(w, taken), cfg, (p.scenario_id, p.seed, p.step, "reference"))) - 1e-12
    # candidate_pairs adds them only when asked, at every reference episode: the wake's seeds and further ones
    wake = run_episodes(make_policy("random", seed=3), [EpisodeJob(lunch, 11)])
    specs = {lunch.id: lunch}
    extra = run_episodes(make_policy("expert"), [EpisodeJob(lunch, 12)])[0]
    refs = {(lunch.id, 11): ref, (lunch.id, 12): extra}
    off = candidate_pairs(SleepInputs(specs, wake, refs), SleepConfig(rollouts=2, horizon=6, max_candidates=8), GatingReport())
    on = candidate_pairs(SleepInputs(specs, wake, refs), cfg, GatingReport())
    assert {p.id for p in on} - {p.id for p in off} == {p.id for p in pairs + reference_pairs(Unit(lunch, extra), cfg, GatingReport())}
    assert {p.seed for p in on if p.id not in {q.id for q in off}} == {11, 12}
    # "own": chosen is the reference's own action at every kept step
    own = reference_pairs(Unit(lunch, ref), replace(cfg, reference_chosen="own"), GatingReport())
    assert own
    # every belief target is what the pair's own prompt supports, never the step's hidden truth
    from socialworld.agents.lm.policy import belief_target

    truth_differs = 0
    for p in own + pairs:
        obs = observe(lunch, World.restore(p.snapshot, lunch).pub)
        assert turn_parts(p.chosen[0]["content"])[0] == belief_target(obs)
        truth = ref.steps[p.step].mental_state.truth
        npc = belief_target(obs).split()[1]
        truth_differs += any(truth["preferences"].get(npc, {}).get(k) != v for k, v in
                             (kv.split("=") for kv in belief_target(obs).split()[2:-1]))
    assert truth_differs > 0  # the old hindsight targets would have differed here
    for p in own:
        own_action = recorded_action(ref.steps[p.step])
        assert turn_parts(p.chosen[0]["content"])[1:] == (own_action.key, templated(worlds[p.step], own_action).utterance)
        assert p.chosen_value - p.rejected_value >= cfg.margin


def test_gating_excludes_weak_evidence_and_counts_reasons(lunch, random_eps):
    cfg = SleepConfig(rollouts=1, horizon=4, max_candidates=6, template_cap=100)
    report = GatingReport()
    pairs = action_pairs(Unit(lunch, random_eps[0]), cfg, report)
    assert len(pairs) >= 4
    a, b, c, d, *rest = pairs
    forged = [
        a.model_copy(update={"evidence": {**a.evidence, "U": "degraded"}}),
        b.model_copy(update={"evidence": {**b.evidence, "S_npc": "proxy"}}),
        c.model_copy(update={"evidence": {**c.evidence, "D": "missing"}}),
        d.model_copy(update={"quality": 0.0}),
        *rest, rest[0] if rest else a,
    ]
    kept = screen_and_gate(forged, cfg, report)
    assert {p.id for p in kept}.isdisjoint({a.id, b.id, c.id, d.id})
    ex = report.excluded
    assert ex["action:degraded_evidence"] == 1 and ex["action:proxy_evidence"] == 1
    assert ex["action:missing_evidence"] == 1 and ex["action:low_quality"] == 1 and ex["action:duplicate"] == 1
    # gating off (E2) admits exactly what strict gating excluded for its evidence; screening (the
    # quality threshold too) still applies
    strict_report, off_report = GatingReport(), GatingReport()
    assert screen_and_gate(forged, cfg, strict_report) == kept
    off = screen_and_gate(forged, SleepConfig(gating="off", template_cap=100), off_report)
    assert [p.id for p in off] == [p.id for p in forged[:-1] if p.id in {q.id for q in kept} | {a.id, b.id, c.id}]
    assert off_report.excluded == {k: v for k, v in strict_report.excluded.items() if not k.endswith("_evidence")}
    capped = screen_and_gate(pairs, SleepConfig(template_cap=1), GatingReport())
    assert len(capped) == len({p.template_key for p in pairs})


def test_a_gating_report_reads_back_typed(lunch, random_eps, tmp_path):
    report = GatingReport()
    kept = screen_and_gate(action_pairs(Unit(lunch, random_eps[0]), SleepConfig(rollouts=1, horizon=4, max_candidates=6), report),
                           SleepConfig(), report)
    report.kept = {"action": len(kept)}
    report.replayed = {"action": 2}
    path = tmp_path / "gating.json"
    path.write_text(json.dumps(report.as_dict(), indent=1, sort_keys=True))  # as files were written before gating-v1
    back = read_gating(path)
    assert back == report.document() and back.schema_version == "gating-v1"
    assert back.model_dump(exclude_none=True, exclude={"schema_version"}) == report.as_dict()
    assert back.kept == {"action": len(kept)} and back.excluded == dict(report.excluded) and back.replayed == {"action": 2}
    path.write_text(json.dumps({**report.as_dict(), "kept": "all"}))
    with pytest.raises(ValueError, match="gating.json: not a Gating document"):
        read_gating(path)


def test_replay_adds_earlier_pairs_seeded_capped_and_deduplicated(lunch, random_eps):
    cfg = SleepConfig(rollouts=1, horizon=4, max_candidates=6, template_cap=100, replay=0.5)
    now, before = (action_pairs(Unit(lunch, e), cfg, GatingReport()) for e in random_eps)
    assert len(now) >= 4 and len(before) >= 4
    earlier = before + before[:2] + now[:1]  # cycles may repeat one another; one equals a pair kept now
    report = GatingReport()
    out = add_replay(now, earlier, cfg, report, key=(2,))
    added = out[len(now):]
    assert out[: len(now)] == now and len(added) == min(len(before), int(0.5 * len(now))) == report.replayed["action"]
    assert {p.id for p in added} <= {p.id for p in before} and len({p.id for p in added}) == len(added)
    assert report.excluded["action:replay_duplicate"] == 1 and report.replayed["dialogue"] == 0
    assert add_replay(now, earlier, cfg, GatingReport(), key=(2,)) == out  # seeded
    drawn = {tuple(p.id for p in add_replay(now, earlier, cfg, GatingReport(), key=(k,))[len(now):]) for k in range(2, 10)}
    assert len(drawn) > 1  # the draw depends on the cycle
    assert add_replay(now, earlier, replace(cfg, replay=0.0), GatingReport(), key=(2,)) == now
    assert len(add_replay(now, earlier, replace(cfg, replay=100.0), GatingReport(), key=(2,))) == len(now) + len(before)
    with pytest.raises(ValueError, match="replay"):
        SleepConfig(replay=-1)


def test_dialogue_pairs_and_parquet_round_trip(lunch, tmp_path):
    expert = run_episodes(make_policy("expert"), [EpisodeJob(lunch, 21)])[0]
    # the same actions with worse words: a scripted replay of the expert's keys, no utterances
    keys = [recorded_action(s).key for s in expert.steps]
    mute = run_episodes(FixedPolicy(keys), [EpisodeJob(lunch, 21)])[0]
    report = GatingReport()
    pairs = dialogue_pairs(Unit(lunch, mute, expert), SleepConfig(), report)
    assert pairs and all(p.quality >= 0.05 and p.track == "dialogue" for p in pairs)
    for p in pairs:  # one assistant turn, as the policy decodes it: the same head, then different words
        assert p.prompt[-1]["role"] == "user"
        head_c, said_c = p.chosen[0]["content"].split("\nSAY:")
        head_r, said_r = p.rejected[0]["content"].split("\nSAY:")
        assert head_c == head_r and head_c.startswith("BELIEF") and said_c != said_r
    path = tmp_path / "pairs.parquet"
    write_pairs(path, pairs)
    assert read_pairs(path) == pairs
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset("parquet", data_files=str(path), split="train")
    assert ds[0]["chosen"][0]["role"] == "assistant" and ds[0]["prompt"][0]["role"] == "system"


def test_utterance_pairs_compare_words_for_the_same_action_from_real_forks(lunch):
    from socialworld.learn.pairs.counterfactual import templated

    expert = run_episodes(make_policy("expert"), [EpisodeJob(lunch, 21)])[0]
    keys = [recorded_action(s).key for s in expert.steps]
    # the expert's actions with the policy's own (poor) words, and one garbage step that never ran
    words = [f"{k} | hmm" for k in keys[:-1]]
    mute = run_episodes(FixedPolicy(["garbage", *words]), [EpisodeJob(lunch, 21)])[0]
    cfg = SleepConfig(rollouts=2, horizon=6)
    report = GatingReport()
    pairs = utterance_pairs(Unit(lunch, mute), cfg, report)
    assert report.candidates == len(mute.steps)
    assert report.excluded["dialogue:not_executed"] == sum(s.action.parse_status != "ok" for s in mute.steps) >= 1
    assert len(pairs) + sum(report.excluded.values()) == len(mute.steps)
    assert pairs and all(p.track == "dialogue" and p.quality >= cfg.q_margin for p in pairs)
    worlds = {s.setting.step: w.fork() for s, w in replay(lunch, mute)}
    for p in pairs:
        w, step = worlds[p.step], mute.steps[p.step]
        taken = recorded_action(step)
        said = {"policy": taken, "template": templated(w, taken)}
        chosen_said = p.chosen[0]["content"].split("\nSAY: ", 1)[1]
        rejected_said = p.rejected[0]["content"].split("\nSAY: ", 1)[1]
        assert {chosen_said, rejected_said} == {a.utterance for a in said.values()}
        by_words = {a.utterance: a for a in said.values()}
        # q_t and values come from real forks of that state: re-stepping them gives the same numbers
        qc, qr = (w.fork().step(by_words[x]).q for x in (chosen_said, rejected_said))
        assert qc - qr == pytest.approx(p.quality) and qc > qr
        key = (p.scenario_id, p.seed, p.step, "utterance")
        assert fmean(rollout_returns(w, by_words[chosen_said], cfg, key)) == pytest.approx(p.chosen_value)
        assert p.chosen_value >= p.rejected_value
        assert p.provenance.startswith("counterfactual_utterance(") and cfg.provenance in p.provenance
    # "hmm" never beats the expert's addressed, option-naming words
    assert all(p.chosen[0]["content"].endswith(templated(worlds[p.step], recorded_action(mute.steps[p.step])).utterance) for p in pairs)
    # candidate_pairs adds them only when asked
    specs = {lunch.id: lunch}
    on = candidate_pairs(SleepInputs(specs, [mute], {(lunch.id, 21): expert}), cfg, GatingReport())
    off = candidate_pairs(SleepInputs(specs, [mute], {(lunch.id, 21): expert}), replace(cfg, sources=("action", "dialogue", "judge")), GatingReport())
    assert {p.id for p in on} - {p.id for p in off} == {p.id for p in pairs}


def test_pairs_replace_and_count_lone_surrogates(lunch, tmp_path):
    """Parquet strings are UTF-8: a lone surrogate a model wrote becomes U+FFFD in the pairs, counted."""
    expert = run_episodes(make_policy("expert"), [EpisodeJob(lunch, 21)])[0]
    keys = [recorded_action(s).key for s in expert.steps]
    odd = run_episodes(FixedPolicy([f"{k} | ok \ud800 then" for k in keys]), [EpisodeJob(lunch, 21)])[0]
    assert odd.steps[0].dialogue.utterance == "ok \ud800 then"  # the record keeps it exactly
    pairs = dialogue_pairs(Unit(lunch, odd, expert), SleepConfig(), GatingReport())
    assert pairs and any("\ud800" in p.rejected[0]["content"] for p in pairs)
    path = tmp_path / "pairs.parquet"
    replaced = write_pairs(path, pairs)
    back = read_pairs(path)
    raw = [json.dumps(p.model_dump(), ensure_ascii=False) for p in pairs]
    assert replaced == sum(r.count("\ud800") for r in raw) > 0
    assert all("\ud800" not in json.dumps(p.model_dump(), ensure_ascii=False) for p in back) and any("ok \ufffd then" in p.rejected[0]["content"] for p in back)


def _judged(ep, goal, judge="openai:j@http://x/v1"):
    from socialworld.records import JudgeRec, Signal

    sig = lambda v: Signal(value=v, source="proxy", confidence=1.0, detail=f"llm_judge:{judge}")  # noqa: E731
    return JudgeRec(episode_id=ep.episode_id, judge=judge, prompt_version="judge-v1", raw="",
                    scores={"goal": sig(goal), "believability": sig(5.0)})


def test_judge_ranked_pairs_are_kept_out_of_the_action_track_by_strict_gating(lunch, random_eps):
    """An LM judge's ranking is proxy evidence: its pairs reach the dialogue track (relaxed gating)
    and never the action track, unless gating is off (the ablation)."""
    from socialworld.learn.pairs.sources import judge_pairs

    wake = random_eps[0]
    expert = run_episodes(make_policy("expert"), [EpisodeJob(lunch, wake.seed)])[0]
    mute = run_episodes(FixedPolicy([recorded_action(s).key for s in expert.steps]), [EpisodeJob(lunch, wake.seed)])[0]
    report = GatingReport()
    (act,) = judge_pairs(Unit(lunch, wake, expert, (_judged(wake, 2.0), _judged(expert, 9.0))), SleepConfig(), report)
    assert act.track == "action" and act.episode_id == expert.episode_id and act.evidence["ranking"] == "proxy"
    assert act.provenance.startswith("llm_judge:openai:j@") and (act.chosen_value, act.rejected_value) == (9.0, 2.0)
    from socialworld.agents.lm.prompts import build_messages

    seen = [build_messages(observe(lunch, w.pub)) for _, w in replay(lunch, wake)][act.step]
    assert act.prompt == seen and act.chosen != act.rejected  # the lower-judged side saw the same prompt
    (say,) = judge_pairs(Unit(lunch, mute, expert, (_judged(mute, 3.0), _judged(expert, 8.0))), SleepConfig(), report)
    assert say.track == "dialogue" and say.chosen[0]["content"].split("\nSAY:")[0] == say.rejected[0]["content"].split("\nSAY:")[0]
    assert judge_pairs(Unit(lunch, mute, expert, (_judged(mute, 7.0), _judged(expert, 8.0))), SleepConfig(), report) == []
    assert report.excluded["judge:below_margin"] == 1

    strict = GatingReport()
    kept = screen_and_gate([act, say], SleepConfig(), strict)
    assert kept == [say] and strict.excluded["action:proxy_evidence"] == 1  # the gating report says why
    assert screen_and_gate([act, say], replace(SleepConfig(), gating="off"), GatingReport()) == [act, say]
    # simulator-ranked pairs say so, and pass
    (ours,) = action_pairs(Unit(lunch, wake), SleepConfig(), GatingReport())[:1]
    assert ours.evidence["ranking"] == "direct"


def test_candidate_pairs_take_judged_episodes_and_count_failed_judgements(lunch, random_eps):
    wake = random_eps[:2]
    refs = {(e.scenario_id, e.seed): e for e in run_episodes(make_policy("expert"), [EpisodeJob(lunch, e.seed) for e in wake])}
    judged = {e.episode_id: _judged(e, 1.0) for e in wake} | {r.episode_id: _judged(r, 9.0) for r in refs.values()}
    judged[wake[1].episode_id] = judged[wake[1].episode_id].model_copy(update={"failure": "unparseable", "scores": {}})
    report = GatingReport()
    pairs = candidate_pairs(SleepInputs({lunch.id: lunch}, wake, refs, judged=judged), SleepConfig(sources=("action", "dialogue", "judge")), report)
    ranked = [p for p in pairs if p.evidence["ranking"] == "proxy"]
    assert len(ranked) == 1 and ranked[0].seed == wake[0].seed and report.excluded["judge:failed"] == 1
    # the one judged couple is counted in the judge's agreement with the world (the expert's return is higher)
    from socialworld.rollout.judge import episode_return

    ref0 = refs[(wake[0].scenario_id, wake[0].seed)]
    assert episode_return(ref0) > episode_return(wake[0])
    assert report.as_dict()["judge_agreement"] == {"agree": 1, "disagree": 0, "judge_ties": 0, "world_ties": 0,
                                                   "compared": 1, "agreement": 1.0}
    assert "judge_agreement" not in GatingReport().as_dict()  # a run without a judge writes what it always did


def test_pairs_written_before_the_ranking_evidence_read_as_simulator_ranked(lunch, random_eps, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pairs = action_pairs(Unit(lunch, random_eps[0]), SleepConfig(), GatingReport())[:2]
    write_pairs(tmp_path / "new.parquet", pairs)
    t = pq.read_table(tmp_path / "new.parquet")
    old_evidence = pa.array([{k: v for k, v in e.items() if k != "ranking"} for e in t.column("evidence").to_pylist()],
                            type=pa.struct([(k, pa.string()) for k in ("U", "A_e", "S_npc", "D")]))
    pq.write_table(t.set_column(t.schema.get_field_index("evidence"), "evidence", old_evidence), tmp_path / "old.parquet")
    assert read_pairs(tmp_path / "old.parquet") == pairs  # the ranking they did not record was the simulator's
    with pytest.raises(ValueError, match="judge_margin"):
        SleepConfig(judge_margin=0.0)


def test_pairs_of_earlier_formats_read_back_without_chosen_by(lunch, random_eps, tmp_path):
    """A pair-v2 file did not record what chose its chosen side: its pairs read back with
    ``chosen_by`` None; a pair-v3 pair must record it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from socialworld.learn.pairs.record import PAIR_SCHEMA, Pair

    pairs = action_pairs(Unit(lunch, random_eps[0]), SleepConfig(), GatingReport())[:2]
    assert PAIR_SCHEMA == "pair-v4" and {p.chosen_by for p in pairs} == {"rollouts"}
    write_pairs(tmp_path / "new.parquet", pairs)
    t = pq.read_table(tmp_path / "new.parquet").drop_columns(["chosen_by"])
    t = t.set_column(0, "schema_version", pa.array(["pair-v2"] * len(pairs)))
    pq.write_table(t, tmp_path / "v2.parquet")
    back = read_pairs(tmp_path / "v2.parquet")
    assert back == [p.model_copy(update={"schema_version": "pair-v2", "chosen_by": None}) for p in pairs]
    with pytest.raises(ValueError, match="a pair-v4 pair lacks chosen_by"):
        Pair(**(pairs[0].model_dump() | {"chosen_by": None}))


def test_values_of_every_candidate_recorded_with_provenance_and_reproducible(lunch, random_eps, tmp_path):
    """``values``: each action pair carries every scored candidate's value (the label's and the
    taken action's among them) and the legal set (without values, the legal set alone); the same seed gives the same numbers; pair-v4
    files round-trip them, and the values are real rollouts from the pair's state."""
    ref = run_episodes(make_policy("expert"), [EpisodeJob(lunch, 11)])[0]
    cfg = SleepConfig(rollouts=3, horizon=6, max_candidates=6, sources=("action", "reference", "dialogue", "utterance", "judge"), reference_chosen="own",
                      values="imagined", discount=0.9, wake_chosen="label")
    pairs = reference_pairs(Unit(lunch, ref), cfg, GatingReport()) + action_pairs(Unit(lunch, random_eps[0]), cfg, GatingReport())
    assert pairs and all(p.candidates and p.legal for p in pairs)
    assert all("imagined" in p.provenance and "gamma=0.9" in p.provenance for p in pairs)
    again = reference_pairs(Unit(lunch, ref), cfg, GatingReport()) + action_pairs(Unit(lunch, random_eps[0]), cfg, GatingReport())
    assert again == pairs
    worlds = {(p.episode_id, s.setting.step): w.fork() for p in pairs for s, w in replay(lunch, ref if p.episode_id == ref.episode_id else random_eps[0])
              if s.setting.step == p.step}
    from socialworld.learn.pairs.counterfactual import templated

    for p in pairs:
        keys = [c.key for c in p.candidates]
        _, chosen, _ = turn_parts(p.chosen[0]["content"])
        assert chosen in keys and set(keys) <= set(p.legal)
        assert next(c.value for c in p.candidates if c.key == chosen) == pytest.approx(p.chosen_value)
        w = worlds[(p.episode_id, p.step)]
        key = (p.scenario_id, p.seed, p.step) + (("reference",) if p.chosen_by == "reference" else ())
        c = p.candidates[-1]
        assert fmean(rollout_returns(w, templated(w, Action.parse(c.key)), cfg, key)) == pytest.approx(c.value)
    write_pairs(tmp_path / "v4.parquet", pairs)
    assert read_pairs(tmp_path / "v4.parquet") == pairs
    plain = reference_pairs(Unit(lunch, ref), replace(cfg, values="off"), GatingReport())
    # without values every action pair still names the legal set (the listwise decision trains on it)
    assert plain and all(p.candidates is None and p.legal == q.legal for p, q in zip(plain, pairs))


def test_every_source_is_registered_by_name_with_one_signature(lunch, random_eps):
    import inspect
    import typing

    from socialworld.learn.config import PairSource
    from socialworld.learn.pairs.sources import SOURCES

    assert tuple(SOURCES) == typing.get_args(PairSource)
    for s in SOURCES.values():
        assert list(inspect.signature(s.build).parameters) == ["unit", "cfg", "report"], s.name
    # the recipe's list chooses the sources; the order they are built in is the registry's
    expert = run_episodes(make_policy("expert"), [EpisodeJob(lunch, e.seed) for e in random_eps])
    inputs = SleepInputs({lunch.id: lunch}, random_eps, {(e.scenario_id, e.seed): e for e in expert})
    cfg = SleepConfig(rollouts=1, horizon=3, max_candidates=4)
    one = candidate_pairs(inputs, replace(cfg, sources=("action", "utterance")), GatingReport())
    other = candidate_pairs(inputs, replace(cfg, sources=("utterance", "action")), GatingReport())
    assert one == other and {p.track for p in one} == {"action", "dialogue"}
    assert candidate_pairs(inputs, replace(cfg, sources=("utterance",)), GatingReport()) == [p for p in one if p.track == "dialogue"]
    with pytest.raises(ValueError, match="sources: must name each pair source once"):
        SleepConfig(sources=("action", "action"))


def test_a_pair_trains_on_the_prompt_its_step_recorded(lunch, random_eps):
    from socialworld.records import Message, PromptRec

    ep = random_eps[0]
    cfg = SleepConfig(rollouts=1, horizon=3, max_candidates=4)
    rendered = action_pairs(Unit(lunch, ep), cfg, GatingReport())
    assert rendered and all(p.prompt[0]["role"] == "system" for p in rendered)  # a scripted wake recorded none: rendered
    steps = [s.model_copy(update={"policy": s.policy.model_copy(update={"prompt": PromptRec(version="test", messages=[
        Message(role="system", content="what the model was sent"), Message(role="user", content=f"turn {s.setting.step}")])})})
             for s in ep.steps]
    recorded = action_pairs(Unit(lunch, ep.model_copy(update={"steps": steps})), cfg, GatingReport())
    assert [p.id for p in recorded] == [p.id for p in rendered]
    for p in recorded:
        assert p.prompt == [{"role": "system", "content": "what the model was sent"}, {"role": "user", "content": f"turn {p.step}"}]
