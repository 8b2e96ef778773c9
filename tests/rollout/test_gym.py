"""The Gymnasium environment: Gymnasium's own checker on every shipped scenario, and the env equal
to the world the runner drives."""

import warnings

import pytest

gymnasium = pytest.importorskip("gymnasium")

from gymnasium.utils.env_checker import check_env  # noqa: E402

import socialworld.rollout.gym as sg  # noqa: E402
from socialworld.agents.scripted import ExpertPolicy  # noqa: E402
from socialworld.rollout.runner import EpisodeJob, decide, run_episodes  # noqa: E402
from socialworld.world.spec import load_builtin_scenarios  # noqa: E402
from socialworld.world.visibility import observe  # noqa: E402


@pytest.mark.parametrize("scenario_id", list(load_builtin_scenarios()))
def test_check_env_passes_for_every_scenario(scenario_id):
    env = gymnasium.make(sg.env_id(scenario_id), chat="episode" if scenario_id.startswith("team") else "state")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Gymnasium's checker warns where it does not fail: none may remain
        check_env(env.unwrapped)


def _expert_reply(env, policy):
    w = env.unwrapped.world
    d = decide(policy, ["k"], [w], [observe(w.spec, w.pub)])[0]
    return f"BELIEF: -\nACTION: {d.action.key}\nSAY: {d.action.utterance}"


def test_the_env_is_the_world_the_runner_drives(specs):
    """The expert played through the env's text interface gets the runner's rewards step for step."""
    spec, seed = specs["book_club-v1"], 11
    ep = run_episodes(ExpertPolicy(), [EpisodeJob(spec, seed)])[0]
    env = gymnasium.make(sg.env_id(spec.id))
    obs, info = env.reset(seed=seed)
    assert obs.startswith("Turn 1/") and info["messages"][-1]["content"] == obs
    assert "book" in {s["id"] for s in info["observation"]["slots"]} and "end()" in info["legal_actions"]
    pol = ExpertPolicy()
    pol.reset(["k"])
    rewards, terminated = [], False
    while not terminated:
        obs, r, terminated, truncated, info = env.step(_expert_reply(env, pol))
        assert truncated is False and info["parse_status"] == "ok"
        rewards.append(r)
    assert rewards == [s.signals.reward.value for s in ep.steps]
    assert info["subgoals"] == ep.final.subgoals
    assert info["outcome"]["CR"] == ep.metrics.CR.value and info["outcome"]["solve"] == float(ep.metrics.solved)
    assert [s.signals.reward.value for s in env.unwrapped.record().steps] == rewards  # the runner's five-dimensional record
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("ACTION: wait()")


def test_bad_text_is_the_worlds_own_case_and_any_text_fits_the_spaces(specs):
    env = sg.SocialWorldEnv("team_lunch", observation="render", render_mode="ansi")
    obs, _ = env.reset(seed=3)
    assert obs == env.render() and obs.startswith("Team lunch (L0), turn 0/")
    _, r, _, _, info = env.step("propose the thai place please")
    assert info["parse_status"] == "unparseable" and info["executed"] == "wait()" and info["penalty"] == pytest.approx(0.2)
    assert info["align"] is None
    said = "SAY: ¿Qué tal el \u2028 sushi? 🍣"
    obs, _, _, _, info = env.step(f"BELIEF: alice restaurant=sushi mood=mid\nACTION: propose(restaurant, sushi, all)\n{said}")
    assert info["parse_status"] == "ok" and 0 <= info["align"] <= 1
    assert env.observation_space.contains(obs) and env.action_space.contains(said)


def test_reset_seed_decides_the_episode_and_snapshots_restore_it():
    env = sg.SocialWorldEnv("weather_picnic")
    first = env.reset(seed=5)
    truth = env.unwrapped.world.truth()
    assert env.reset(seed=5) == first and env.unwrapped.world.truth() == truth
    env.reset(seed=6)
    assert env.unwrapped.world.truth() != truth  # the seed draws the hidden preferences
    env.reset(seed=5)
    snap = env.snapshot()
    a = env.step("ACTION: inquire(" + first[1]["legal_actions"][8].split("(", 1)[1])
    env.restore(snap)
    assert env.step("ACTION: inquire(" + first[1]["legal_actions"][8].split("(", 1)[1]) == a
    fork = env.unwrapped.world.fork()  # lookahead on the live world leaves the episode alone
    fork.step(None, parse_error="probe")
    assert env.unwrapped.world.t == 1 and fork.t == 2


def test_user_scenarios_and_bad_options(my_lunch):
    env = sg.SocialWorldEnv(str(my_lunch), max_turns=3)
    assert env.scenario.turn_budget == 3 and env.reset(seed=0)[0].startswith("Turn 1/3")
    with pytest.raises(ValueError, match="observation must be prompt or render"):
        sg.SocialWorldEnv("team_lunch", observation="json")
    with pytest.raises(RuntimeError, match="reset"):
        sg.SocialWorldEnv("team_lunch").step("ACTION: wait()")


@pytest.mark.slow
def test_the_grpo_example_trains_on_the_env(tiny_dir, tmp_path):
    """examples/grpo_gymnasium.py: TRL's GRPO on a socialworld env, two steps on a tiny model."""
    pytest.importorskip("trl")
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "grpo_gymnasium.py"
    spec = importlib.util.spec_from_file_location("grpo_gymnasium", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    rows = example.states("socialworld/team_lunch-v1", seeds=2, depth=2)
    assert len(rows) == 4 and rows[0]["prompt"][0]["role"] == "system"
    reward = example.world_reward("socialworld/team_lunch-v1")
    good, bad = reward(None, [[{"role": "assistant", "content": "ACTION: wait()"}], "gibberish"], [rows[0]["snapshot"]] * 2)
    assert bad == pytest.approx(-0.2) and bad < good  # unparseable: the world's penalty (0.2), more than a wasted wait()
    out = example.main(["--model", str(tiny_dir), "--seeds", "2", "--depth", "2", "--steps", "2", "--generations", "2",
                        "--max-completion-length", "8", "--out", str(tmp_path / "grpo")])
    assert len(out["rewards"]) == 2 and (tmp_path / "grpo" / "adapter_config.json").exists()
    assert len(out["frac_reward_zero_std"]) == 2 and out["stopped"] is None  # patience 5: two steps never stop
    # a random tiny model writes no parseable reply: every group's rewards are the same penalty, no gradient
    flat = example.main(["--model", str(tiny_dir), "--seeds", "2", "--depth", "2", "--steps", "4", "--generations", "2",
                         "--max-completion-length", "8", "--flat-reward-patience", "1", "--out", str(tmp_path / "flat")])
    assert flat["frac_reward_zero_std"] == [1.0] and len(flat["rewards"]) == 1
    assert flat["stopped"].startswith("GRPO stopped at step 1: every group's rewards were equal for 1 steps")
