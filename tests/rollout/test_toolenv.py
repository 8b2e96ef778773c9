"""The world as tools for TRL's ``environment_factory``: the tools' schemas as TRL reads them, the
expert's moves as tool calls giving the runner's episode, the world's own penalties for illegal
moves, and TRL's GRPO trainer taking the class."""

import functools
import json

import pytest

from socialworld.agents.scripted import ExpertPolicy
from socialworld.rollout.runner import EpisodeJob, run_episodes
from socialworld.rollout.toolenv import TOOLS, ToolEnv, expert_conversation
from socialworld.text import templates
from socialworld.world.spec import capped


def _schemas(env):
    from transformers.utils import get_json_schema

    return [get_json_schema(getattr(env, name)) for name in TOOLS]


def test_every_move_kind_is_a_tool_with_a_schema_and_nothing_else_is():
    """TRL offers an environment's public methods (all but reset and get_reward) as tools, their schema from
    the signature and the docstring: exactly the move kinds, each argument described."""
    import inspect

    from socialworld.core import ACTION_ARGS

    public = {n for n, _ in inspect.getmembers(ToolEnv, predicate=inspect.isfunction) if not n.startswith("_")}
    assert public - {"reset", "get_reward"} == set(TOOLS) == set(ACTION_ARGS)
    for schema in _schemas(ToolEnv()):
        f = schema["function"]
        assert f["description"] and all(p["description"] for p in f["parameters"].get("properties", {}).values())
    propose = next(s["function"] for s in _schemas(ToolEnv()) if s["function"]["name"] == "propose")
    assert propose["parameters"]["required"] == ["decision", "option"]  # to (default all) and say are optional


@pytest.mark.parametrize("name", ["team_lunch-v1", "hackathon-v1", "weather_picnic-v1"])
def test_the_experts_tool_calls_play_the_runners_episode(specs, name):
    """The expert's moves as tool calls: the same return (the world's step rewards) and outcome as the
    runner's expert episode from that seed, and the last answer says how it ended."""
    seed = 4
    ep = run_episodes(ExpertPolicy(), [EpisodeJob(specs[name], seed)])[0]
    messages = expert_conversation(specs[name], seed)
    env = ToolEnv(specs)
    assert env.reset(name, seed) == messages[0]["content"]
    for m, answer in zip(messages, messages[1:]):
        if m["role"] == "assistant":
            call = m["tool_calls"][0]["function"]
            assert getattr(env, call["name"])(**call["arguments"]) == answer["content"]  # the same answers as recorded
    assert env.get_reward() == pytest.approx(sum(s.signals.reward.value for s in ep.steps))
    assert env.outcome is not None and env.outcome["pass"] == ep.metrics.passed
    assert [m["tool_calls"][0]["function"]["name"] for m in messages if m["role"] == "assistant"] == [s.action.executed.split("(")[0] for s in ep.steps]
    assert ("The meeting is over: passed" in messages[-1]["content"]) == bool(ep.metrics.passed)


def test_a_move_the_world_does_not_take_is_its_penalised_wait_and_bad_calls_are_errors(specs):
    env = ToolEnv(specs)
    task = env.reset("team_lunch", 0)
    assert task.startswith("You organise a group decision") and "People: alice, ben, chloe" in task and "Turn 1/" in task
    answer = env.inquire("zed", "time")  # no such person: the world's illegal move, a penalised wait()
    assert answer.startswith(templates.TOOL_REFUSED.format(error="unknown npc 'zed'")) and "Turn 2/" in answer
    assert env.get_reward() < 0
    with pytest.raises(TypeError):
        env.propose(decision="time", option="t1200", person="alice")  # an argument the tool does not take
    with pytest.raises(TypeError):
        env.inquire(person=3, decision="time")  # not text
    assert "Turn 3/" in env.wait()  # nothing of the bad calls was played: this wait() was turn 2
    env.end()
    assert env.outcome is not None and env.outcome["pass"] == 0.0
    with pytest.raises(RuntimeError, match="over"):
        env.wait()
    with pytest.raises(ValueError, match="scenario and seed"):
        ToolEnv(specs).reset(prompt=[])
    with pytest.raises(ValueError, match="unknown scenario"):
        ToolEnv(specs).reset("nope", 0)
    with pytest.raises(RuntimeError, match="reset"):
        ToolEnv(specs).wait()


def test_trls_response_parser_reads_the_calls_the_chat_template_writes(specs, tiny_dir):
    """A model that writes the expert's calls in the chat template's format plays the world through TRL:
    the Qwen2.5 template TRL ships (ChatML, as the bundled model's) renders each call, TRL's response
    parser reads back the same call, and playing it gives the expert's answers."""
    pytest.importorskip("trl")
    from transformers import AutoTokenizer
    from trl.chat_template_utils import add_response_schema, qwen2_5_chat_template, supports_tool_calling

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    tok.chat_template = qwen2_5_chat_template
    assert supports_tool_calling(tok)
    add_response_schema(tok)
    messages = expert_conversation(capped(specs["book_club-v1"], 4), 2)
    env = ToolEnv({"book_club-v1": capped(specs["book_club-v1"], 4)})
    env.reset("book_club", 2)
    tools = _schemas(env)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = tok.apply_chat_template(messages[:i], tools=tools, tokenize=False, add_generation_prompt=True)
        after = tok.apply_chat_template(messages[: i + 1], tools=tools, tokenize=False)
        assert after.startswith(before)
        parsed = tok.parse_response(after[len(before):], prefix=before)
        call = parsed["tool_calls"][0]["function"]
        assert call == m["tool_calls"][0]["function"]
        assert getattr(env, call["name"])(**call["arguments"]) == messages[i + 1]["content"]


@pytest.mark.slow
def test_trls_grpo_trains_through_the_tools(specs, tiny_dir, tmp_path):
    """GRPOTrainer(environment_factory=...) takes the class: every move kind a tool, the world's reward
    its reward column (no reward_funcs), and a step runs on the tiny model (which writes no tool call:
    its rollouts' reward is the untouched episode's 0)."""
    pytest.importorskip("trl")
    import os

    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen2_5_chat_template

    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    tok.chat_template = qwen2_5_chat_template
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    rows = Dataset.from_list([{"prompt": [{"role": "user", "content": ""}], "scenario": "team_lunch", "seed": s} for s in range(2)])
    trainer = GRPOTrainer(model=model, processing_class=tok, train_dataset=rows,
                          environment_factory=functools.partial(ToolEnv, specs, 2),
                          args=GRPOConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=2, num_generations=2,
                                          max_completion_length=16, report_to=[], use_cpu=True, save_strategy="no", seed=0))
    assert sorted(t.__name__ for t in trainer.tools) == sorted(TOOLS)
    assert trainer.reward_func_names == ["ToolEnv"]
    trainer.train()
    logged = trainer.state.log_history[0]
    assert logged["rewards/ToolEnv/mean"] == 0.0 and "tools/call_frequency" in logged


@pytest.mark.slow
def test_grpo_through_the_tools_raises_the_reward_of_the_tiny_models_calls(specs, tiny_dir, tmp_path):
    """Learning through ``environment_factory``: TRL's SFT warm-starts the tiny model on one call,
    ``propose(restaurant, X)`` with X each of the four restaurants alike (the rows TRL's GRPO will prompt it
    with: the compact tool template, the task ``reset`` returns); then TRL's GRPO over one-turn episodes of
    team lunch, scored only by the world's reward (0.5 for the two restaurants the first replies favour, 1/3
    for the two others, 0 for no call, a penalty for an illegal one), moves the model's choice towards the
    better restaurants: the expected reward of its choice among the four calls and their share rise, and so
    does the reward its rollouts got."""
    pytest.importorskip("trl")
    import math
    import os

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import get_json_schema
    from trl import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

    from socialworld.core import Action
    from socialworld.rollout.toolenv import compact_tool_chat, tool_call

    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    tok = compact_tool_chat(AutoTokenizer.from_pretrained(tiny_dir))
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    env = ToolEnv(specs, 1)
    task = [{"role": "user", "content": env.reset("team_lunch", 0)}]
    tools = [get_json_schema(getattr(env, name)) for name in sorted(TOOLS)]  # the order TRL offers the methods in
    options = [o.id for o in specs["team_lunch-v1"].slot("restaurant").options]
    calls = {o: [{"role": "assistant", "content": "", "tool_calls": [tool_call(Action("propose", slot="restaurant", option=o, npc="all"))]}]
             for o in options}
    reward = {}
    for o in options:
        e = ToolEnv(specs, 1)
        e.reset("team_lunch", 0)
        e.propose(**calls[o][0]["tool_calls"][0]["function"]["arguments"])
        reward[o] = e.get_reward()
    best = {o for o in options if reward[o] == max(reward.values())}
    assert 0 < len(best) < len(options)  # the choice matters

    def choice():  # the model's probabilities of the four calls, renormalised among them
        prefix = len(tok(tok.apply_chat_template(task, tools=tools, add_generation_prompt=True, tokenize=False))["input_ids"])
        logp = {}
        with torch.no_grad():
            for o in options:
                ids = torch.tensor([tok(tok.apply_chat_template(task + calls[o], tools=tools, tokenize=False))["input_ids"]])
                lp = model(ids).logits[0, :-1].float().log_softmax(-1).gather(1, ids[0, 1:, None])[prefix - 1:, 0]
                logp[o] = lp.sum().item()
        top = max(logp.values())
        z = sum(math.exp(v - top) for v in logp.values())
        return {o: math.exp(v - top) / z for o, v in logp.items()}

    warm = Dataset.from_list([{"prompt": task, "completion": calls[o], "tools": json.dumps(tools)} for o in options] * 8)
    SFTTrainer(model=model, processing_class=tok, train_dataset=warm,
               args=SFTConfig(output_dir=str(tmp_path / "sft"), max_steps=150, per_device_train_batch_size=8, learning_rate=1e-2,
                              max_length=None, report_to=[], use_cpu=True, save_strategy="no", seed=0)).train()
    before = choice()
    rows = Dataset.from_list([{"prompt": [{"role": "user", "content": ""}], "scenario": "team_lunch", "seed": 0}] * 320)
    grpo = GRPOTrainer(model=model, processing_class=tok, train_dataset=rows, environment_factory=functools.partial(ToolEnv, specs, 1),
                       args=GRPOConfig(output_dir=str(tmp_path / "grpo"), max_steps=40, per_device_train_batch_size=8, num_generations=8,
                                       learning_rate=3e-4, temperature=0.7, max_completion_length=96, max_tool_calling_iterations=1,
                                       report_to=[], use_cpu=True, save_strategy="no", seed=0, logging_steps=1))
    assert [t.__name__ for t in grpo.tools] == sorted(TOOLS)
    grpo.train()
    after = choice()
    expected = {name: sum(p[o] * reward[o] for o in options) for name, p in (("before", before), ("after", after))}
    assert expected["after"] > expected["before"] + 0.03, (before, after)
    assert sum(after[o] for o in best) > sum(before[o] for o in best) + 0.2, (before, after)
    got = [h["rewards/ToolEnv/mean"] for h in grpo.state.log_history if "rewards/ToolEnv/mean" in h]
    assert len(got) == 40 and sum(got[-10:]) > sum(got[:10]), got
