from collections import Counter

import pytest

from socialworld.core import Action, Decision
from socialworld.fit import action_fit
from socialworld.policies import make_policy
from socialworld.runner import EpisodeJob, run_episodes
from socialworld.sleep import GatingReport, SleepConfig, action_pairs


@pytest.fixture(scope="module")
def lunch(specs):
    return specs["team_lunch-v1"]


@pytest.fixture(scope="module")
def labels(lunch):
    """Plain-DAgger pairs at one random episode's states: chosen = the expert's label, rejected =
    what the random policy did (they differ at every kept step)."""
    ep = run_episodes(make_policy("random", seed=3), [EpisodeJob(lunch, 11)])[0]
    cfg = SleepConfig(rollouts=1, horizon=4, max_candidates=6, wake_chosen="continuation", label_gate="disagree")
    pairs = action_pairs(lunch, ep, cfg, GatingReport())
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

    from socialworld.cli import app
    from socialworld.sleep import write_pairs

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
