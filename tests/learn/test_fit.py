from collections import Counter

import pytest

from socialworld.agents.registry import make_policy
from socialworld.core import Action, Decision
from socialworld.learn.config import SleepConfig
from socialworld.learn.fit import action_fit
from socialworld.learn.pairs.gating import GatingReport
from socialworld.learn.pairs.sources import Unit, action_pairs
from socialworld.rollout.runner import EpisodeJob, run_episodes


@pytest.fixture(scope="module")
def lunch(specs):
    return specs["team_lunch-v1"]


@pytest.fixture(scope="module")
def labels(lunch):
    """Plain-DAgger pairs at one random episode's states: chosen = the expert's label, rejected =
    what the random policy did (they differ at every kept step)."""
    ep = run_episodes(make_policy("random", seed=3), [EpisodeJob(lunch, 11)])[0]
    cfg = SleepConfig(rollouts=1, horizon=4, max_candidates=6, wake_chosen="label")
    pairs = action_pairs(Unit(lunch, ep), cfg, GatingReport())
    assert len(pairs) >= 5 and len({p.step for p in pairs}) == len(pairs)
    return ep, pairs


class ByStep:
    """Answers from a table keyed by the observation's step: proves the state was restored."""

    policy_id = "by-step"

    def __init__(self, table: dict[int, str]):
        self.table = table

    def reset(self, keys):
        pass

    def act(self, keys, observations):
        out = []
        for o in observations:
            text = self.table[o.step]
            try:
                out.append(Decision(Action.parse(text), None, raw=text))
            except ValueError as err:
                out.append(Decision(None, None, raw=text, parse_error=str(err)))
        return out


def _action(p, side):
    """The completion's action text (a scripted policy's raw reply is the action itself)."""
    text = getattr(p, side)[-1]["content"]
    return text.split("ACTION: ", 1)[1].split("\n")[0] if "ACTION: " in text else text


def _kind(text):
    """The action's kind, or None when the text does not parse."""
    try:
        return Action.parse(text).kind
    except ValueError:
        return None


def test_action_fit_scores_the_policy_at_each_pairs_own_state(lunch, labels):
    _, pairs = labels
    specs = {lunch.id: lunch}
    n = len(pairs)
    chosen = action_fit(ByStep({p.step: _action(p, "chosen") for p in pairs}), pairs, specs, batch=3)
    assert (chosen.pairs, chosen.exact, chosen.same_verb, chosen.unparsed) == (n, n, n, 0)
    assert chosen.exact_rate == 1.0
    kinds = Counter(_kind(_action(p, "chosen")) for p in pairs)
    assert chosen.confusion == {k: {k: c} for k, c in kinds.items()}
    # the random policy's own actions: never the label under disagree
    taken = action_fit(ByStep({p.step: _action(p, "rejected") for p in pairs}), pairs, specs)
    assert taken.exact == 0 and taken.unparsed == sum(_kind(_action(p, "rejected")) is None for p in pairs)
    assert taken.same_verb == sum(_kind(_action(p, "chosen")) == _kind(_action(p, "rejected")) for p in pairs)
    assert sum(sum(row.values()) for row in taken.confusion.values()) == n
    # an unparseable reply is counted, never repaired
    garbage = action_fit(ByStep({p.step: "garbage" for p in pairs}), pairs, specs)
    assert (garbage.exact, garbage.same_verb, garbage.unparsed) == (0, 0, n)
    assert all(set(row) == {"unparsed"} for row in garbage.confusion.values())
    # the expert from a fresh memory mostly repeats its own labels; the random policy does not
    expert, rnd = action_fit(make_policy("expert"), pairs, specs), action_fit(make_policy("random", seed=5), pairs, specs)
    assert expert.exact > rnd.exact and expert.exact_rate >= 0.8


def test_action_fit_refuses_what_it_cannot_score(lunch, labels):
    _, pairs = labels
    with pytest.raises(ValueError, match="snapshot"):
        action_fit(make_policy("expert"), [pairs[0].model_copy(update={"snapshot": None})], {lunch.id: lunch})
    with pytest.raises(ValueError, match="not among the given specs"):
        action_fit(make_policy("expert"), pairs[:1], {})
    with pytest.raises(ValueError, match="action-track"):
        action_fit(make_policy("expert"), [pairs[0].model_copy(update={"track": "dialogue"})], {lunch.id: lunch})


def test_fit_command_reads_a_pairs_file(lunch, labels, tmp_path):
    import json

    from typer.testing import CliRunner

    from socialworld.cli.main import app
    from socialworld.learn.pairs.record import write_pairs

    _, pairs = labels
    path = tmp_path / "pairs-action.parquet"
    write_pairs(path, pairs)
    r = CliRunner().invoke(app, ["fit", str(path), "--model", "expert", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == action_fit(make_policy("expert"), pairs, {lunch.id: lunch}).as_dict()
    r = CliRunner().invoke(app, ["fit", str(path), "--model", "expert"])
    assert r.exit_code == 0 and f"/{len(pairs)}" in r.output and "chosen / taken" in r.output
    r = CliRunner().invoke(app, ["fit", str(path), "--model", "expert", "--adapter", str(tmp_path)])
    assert r.exit_code == 2 and "takes no adapter" in r.output
    r = CliRunner().invoke(app, ["fit", str(tmp_path / "none.parquet"), "--model", "expert"])
    assert r.exit_code == 2 and "no such pairs file" in " ".join(r.output.split())
    r = CliRunner().invoke(app, ["fit", str(path), "--model", "oracle"])  # acts on the hidden state: nothing to fit
    assert r.exit_code == 2 and "reads the hidden state" in " ".join(r.output.split())


def test_fit_finds_a_user_scenario_in_its_run_or_given_file(my_lunch, tmp_path):
    import json

    import yaml
    from typer.testing import CliRunner

    from socialworld.cli.main import app
    from socialworld.learn.pairs.record import write_pairs
    from socialworld.world.spec import capped, load_spec, spec_yaml

    mine = capped(load_spec(my_lunch), 6)  # as in a run with max_turns 6: its snapshots need the capped spec
    ep = run_episodes(make_policy("random", seed=3), [EpisodeJob(mine, 11)])[0]
    cfg = SleepConfig(rollouts=1, horizon=2, max_candidates=4, wake_chosen="label")
    pairs = action_pairs(Unit(mine, ep), cfg, GatingReport())
    assert pairs and {p.scenario_id for p in pairs} == {"my_lunch-v1"}
    want = action_fit(make_policy("expert"), pairs, {mine.id: mine}).as_dict()
    # inside a run folder: the run's stored copy at the run's turn cap, no file needed
    run = tmp_path / "run"
    (run / "scenarios").mkdir(parents=True)
    (run / "scenarios" / "my_lunch-v1.yaml").write_text(spec_yaml(load_spec(my_lunch)))
    (run / "config.yaml").write_text(yaml.safe_dump({"max_turns": 6, "user_scenarios": {"my_lunch-v1": load_spec(my_lunch).content_hash}}))
    (run / "manifest.json").write_text("{}")
    (run / "cycle-1" / "sleep").mkdir(parents=True)
    inside = run / "cycle-1" / "sleep" / "pairs-action.parquet"
    write_pairs(inside, pairs)
    my_lunch.unlink()  # the user's file is gone
    r = CliRunner().invoke(app, ["fit", str(inside), "--model", "expert", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == want
    # outside a run: the file must be given
    outside = tmp_path / "pairs-action.parquet"
    write_pairs(outside, pairs)
    r = CliRunner().invoke(app, ["fit", str(outside), "--model", "expert", "--json"])
    assert r.exit_code == 2 and "unknown scenario 'my_lunch-v1'" in r.output
    again = tmp_path / "again.yaml"
    again.write_text(spec_yaml(mine))
    r = CliRunner().invoke(app, ["fit", str(outside), "--model", "expert", "--json", "--scenario", str(again)])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == want


def test_teacher_agreement_replays_each_episode_and_asks_the_expert_at_its_states(specs, tmp_path):
    """The expert agrees with itself at every state; another policy's episodes replay from their records
    (the same executed moves) and agree where its moves were the expert's; a record the world does not
    give again, and a chained episode, are refused."""
    import json

    from typer.testing import CliRunner

    from socialworld.cli.main import app
    from socialworld.learn.fit import teacher_agreement
    from socialworld.records import to_jsonl

    names = ("team_lunch-v1", "birthday_budget-v1", "community_market-v1")
    jobs = [EpisodeJob(specs[n], s) for n in names for s in (1, 2)]
    mine = {n: specs[n] for n in names}
    expert = teacher_agreement(make_policy("expert"), run_episodes(make_policy("expert"), jobs), mine)
    assert set(expert) == {"L0", "L1", "L2", "all"}
    assert all(a.same == a.same_kind == a.steps > 0 and a.confusion == {} for a in expert.values())
    eps = run_episodes(make_policy("random", seed=3), jobs)
    random = teacher_agreement(make_policy("expert"), eps, mine)
    assert random["all"].steps == sum(len(e.steps) for e in eps) == sum(a.steps for t, a in random.items() if t != "all")
    assert random["all"].same < random["all"].steps
    for a in random.values():
        assert sum(n for row in a.confusion.values() for n in row.values()) == a.steps - a.same
    path = tmp_path / "episodes.jsonl"
    path.write_text(to_jsonl(eps))
    r = CliRunner().invoke(app, ["agreement", str(path), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {t: a.as_dict() for t, a in random.items()}
    first = eps[0]
    step = first.steps[1]
    moved = step.model_copy(update={"action": step.action.model_copy(update={"executed": "end()"})})
    with pytest.raises(ValueError, match="does not replay: step 1"):
        teacher_agreement(make_policy("expert"), [first.model_copy(update={"steps": [first.steps[0], moved, *first.steps[2:]]})], mine)
    with pytest.raises(ValueError, match="goes on after"):
        teacher_agreement(make_policy("expert"), [first.model_copy(update={"steps": first.steps[:1]})], mine)
    chained = first.model_copy(update={"lineage": first.lineage.model_copy(update={"chain": {"chain_id": "c"}})})
    with pytest.raises(ValueError, match="chain"):
        teacher_agreement(make_policy("expert"), [chained], mine)
    r = CliRunner().invoke(app, ["agreement", str(tmp_path / "none.jsonl")])
    assert r.exit_code == 2 and "no such episodes file" in " ".join(r.output.split())
