"""Train a language model by interaction through socialworld's OpenEnv server with TRL's GRPO: whole
episodes played over OpenEnv's WebSocket client, the reward the world's. Only the public OpenEnv API
of ``socialworld.rollout.openenv`` is used (``SocialWorldClient``, ``SocialAction``).

Each GRPO group is ``--generations`` episodes of one (scenario, seed; the seeds in turn), played through a
``socialworld env serve`` server (started here on a free port unless ``--url`` names one). TRL's
``rollout_func`` plays them: at every turn the model's reply is ``ACTION: <action>``, the action
sampled from the model's own distribution restricted to the legal actions the observation lists
(their token trie), so every reply parses and a group's episodes differ. Unconstrained, the
bundled model wrote no ACTION line in 48 tokens: every reward was the parse penalty, every group's
rewards were equal, and GRPO had no gradient. The completion is the whole episode; only the tokens
where the model chose among legal ones are trained (``env_mask`` 1), the observations and forced
tokens are context. The reward is the episode's return, the sum of the world's step rewards.

``--warm-episodes N`` first clones N of the expert's episodes (TRL's SFT, one row per episode: the
tokens this example makes of the episode, the replies' ``ACTION: <action>`` the completion mask, so
every turn is trained in one sequence; the same conversation the server's observations make), and
GRPO then trains that adapter on: the untrained bundled model's episodes make no progress, so its
groups' returns tell nothing about the task.

Why ``rollout_func``, not TRL's ``environment_factory``: that drives an environment through tool
calls the model writes unconstrained, and the bundled model writes none (its chat template has no
tools; under TRL's Qwen2.5 template, 0 of 8 sampled replies to the task were a tool call). This
example needs ``rollout_func`` because it samples each move from the legal actions only (the token
trie) and marks which tokens the model chose (``env_mask``). For a model trained for tool calls
(Qwen2.5, Qwen3, Llama 3.1, ...), or one warm-started on calls with TRL's SFT (``toolenv.compact_tool_chat``
gives a ChatML tokenizer a short tool template; a slow test trains the tiny test model that way),
``socialworld.rollout.toolenv.ToolEnv`` is the ``environment_factory`` class: one tool per move kind, the
world's reward as ``get_reward()``.

    python examples/grpo_openenv.py                          # the bundled SmolLM2, team lunch's 7 turns, 8 expert episodes cloned, 10 GRPO steps
    python examples/grpo_openenv.py --max-turns 3 --warm-episodes 0   # 3 turns, from the untrained model
    python examples/grpo_openenv.py --url http://127.0.0.1:8001 --scenario book_club --max-turns 6
"""

from __future__ import annotations

import argparse
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Iterator


@contextmanager
def env_server(max_turns: int) -> Iterator[str]:
    """``socialworld env serve`` in a background thread on a free port (every episode capped at
    ``max_turns``); yields its base URL."""
    from socialworld.agents.lm.server import in_background
    from socialworld.rollout.openenv import make_app

    with in_background(make_app(max_turns=max_turns)) as url:
        yield url


def sample_action(model: Any, tok: Any, context: list[int], legal: list[str], gen: Any,
                  temperature: float = 1.0) -> tuple[list[int], list[float], list[int]]:
    """Tokens of ``" <action>"`` for one legal action sampled from ``model`` after ``context``: at each
    token, the softmax at ``temperature`` over the children the legal actions' token trie allows
    there (a forced token where there is one; the most likely child where ``gen`` is None: greedy);
    each token's log-probability under that distribution; and 1 where the model chose among several
    tokens, 0 where the trie forced one."""
    import torch

    keys = [tok(" " + k, add_special_tokens=False)["input_ids"] for k in legal]
    out: list[int] = []
    logps: list[float] = []
    chose: list[int] = []
    with torch.no_grad():
        res = model(input_ids=torch.tensor([context]), use_cache=True)
        while out not in keys:
            allowed = sorted({k[len(out)] for k in keys if len(k) > len(out) and k[: len(out)] == out})
            if len(allowed) == 1:
                t, lp = allowed[0], 0.0
            else:
                scores = torch.log_softmax(res.logits[0, -1, allowed].float() / temperature, -1)
                i = int(scores.argmax()) if gen is None else int(torch.multinomial(scores.exp(), 1, generator=gen))
                t, lp = allowed[i], float(scores[i])
            out.append(t)
            logps.append(lp)
            chose.append(int(len(allowed) > 1))
            res = model(input_ids=torch.tensor([[t]]), past_key_values=res.past_key_values, use_cache=True)
    return out, logps, chose


class Transcript:
    """An episode as the tokens GRPO trains on: the first observation's chat as the prompt, then per
    turn the reply ``ACTION: <action>`` closed as the chat template closes a turn, then the next
    observation as the template opens a user turn and the assistant's reply. ``mask`` is GRPO's
    ``env_mask`` (1 where the model chose among several tokens: the only ones trained; the
    ``ACTION:`` header, a token the trie forced, the template's tokens and the observations have
    probability 1 under the sampling policy or are not the model's), ``logps`` their sampling
    log-probabilities (0 for the others), ``replied`` 1 on each reply's header and action (what the
    warm start clones)."""

    def __init__(self, tok: Any, messages: list[dict[str, str]]) -> None:
        self.tok = tok
        self.chat = list(messages)
        self.prompt_ids = self._render(self.chat, True)
        self.head = tok("ACTION:", add_special_tokens=False)["input_ids"]
        probe = tok("x", add_special_tokens=False)["input_ids"]
        # e.g. <|im_end|>\n
        self.close = self._after(self._after(self._render(self.chat + [{"role": "assistant", "content": "x"}], False),
                                             self.prompt_ids), probe)
        self.ids: list[int] = []
        self.mask: list[int] = []
        self.logps: list[float] = []
        self.replied: list[int] = []
        self.replies: list[str] = []

    def _render(self, messages: list[dict[str, str]], prompt: bool) -> list[int]:
        text = self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
        return self.tok(text, add_special_tokens=False)["input_ids"]

    @staticmethod
    def _after(longer: list[int], shorter: list[int]) -> list[int]:
        if longer[: len(shorter)] != shorter:
            raise ValueError("the chat template renders a conversation's turns as other tokens than its start: use another model")
        return longer[len(shorter):]

    def context(self) -> list[int]:
        """The tokens the model reads before it writes the next action: everything so far and the header."""
        return self.prompt_ids + self.ids + self.head

    def reply(self, action: list[int], logps: list[float], chose: list[int]) -> str:
        """Append the reply whose action is the tokens ``action`` (``logps``, ``chose``: as
        :func:`sample_action` gives them); returns its text."""
        reply = "ACTION:" + self.tok.decode(action)
        n = len(self.head)
        self.ids += self.head + action + self.close
        self.mask += [0] * n + chose + [0] * len(self.close)
        self.logps += [0.0] * n + [lp * c for lp, c in zip(logps, chose)] + [0.0] * len(self.close)
        self.replied += [1] * (n + len(action)) + [0] * len(self.close)
        self.chat.append({"role": "assistant", "content": reply})
        self.replies.append(reply)
        return reply

    def observe(self, text: str) -> None:
        """Append the next observation as the world's user turn."""
        so_far = self._render(self.chat, False)
        self.chat.append({"role": "user", "content": text})
        obs = self._after(self._render(self.chat, True), so_far)
        self.ids += obs
        self.mask += [0] * len(obs)
        self.logps += [0.0] * len(obs)
        self.replied += [0] * len(obs)


Chooser = Callable[[list[int], list[str]], tuple[list[int], list[float], list[int]]]
"""``choose(context, legal)``: an action's tokens, their log-probabilities and where they were chosen (as :func:`sample_action`)"""


def play(client: Any, model: Any, tok: Any, scenario: str, seed: int, gen: Any, temperature: float = 1.0,
         choose: Chooser | None = None) -> dict[str, Any]:
    """One episode through ``client`` as a :class:`Transcript`: the prompt's tokens, the completion's,
    ``env_mask``, the sampling log-probabilities, the episode's return, its replies and outcome.
    Each action is :func:`sample_action`'s from ``model``, or ``choose(context, legal)``'s where given
    (the same triple: tokens, log-probabilities, chose)."""
    from socialworld.rollout.openenv import SocialAction

    r = client.reset(seed=seed, scenario=scenario)
    t = Transcript(tok, r.observation.messages)
    total = 0.0
    while not r.done:
        legal = r.observation.legal_actions
        picked = choose(t.context(), legal) if choose is not None else sample_action(model, tok, t.context(), legal, gen, temperature)
        r = client.step(SocialAction(reply=t.reply(*picked)))
        total += float(r.reward or 0.0)
        if not r.done:
            t.observe(r.observation.text)
    return {"prompt_ids": t.prompt_ids, "completion_ids": t.ids, "env_mask": t.mask, "logprobs": t.logps, "episode_return": total,
            "replies": t.replies, "outcome": r.observation.metadata["outcome"]}


def expert_episodes(tok: Any, scenario: str, seeds: list[int], max_turns: int) -> list[dict[str, Any]]:
    """Warm-start rows: the expert's episodes on ``seeds``, one row per episode, exactly the tokens
    :func:`play` makes of an episode with the expert's moves (``input_ids``: prompt and completion),
    with ``completion_mask`` 1 on each reply's ``ACTION:`` header and action (every turn of the
    episode trained in one sequence: one row per turn re-read the growing conversation once per
    turn, 46 s a step of four on the bundled model). Played on the Gymnasium env with
    ``chat="episode"``, which builds the conversation the server's observations make, and its
    text-level expert (``expert_reply``; its ACTION line only)."""
    from socialworld.rollout.gym import SocialWorldEnv

    env = SocialWorldEnv(scenario, max_turns=max_turns, chat="episode")
    rows: list[dict[str, Any]] = []
    for seed in seeds:
        _, info = env.reset(seed=seed)
        t = Transcript(tok, info["messages"])
        done = False
        while not done:
            action = next(line for line in env.expert_reply().splitlines() if line.startswith("ACTION:")).removeprefix("ACTION:")
            ids = tok(action, add_special_tokens=False)["input_ids"]
            _, _, done, _, info = env.step(t.reply(ids, [0.0] * len(ids), [0] * len(ids)))
            if not done:
                t.observe(info["messages"][-1]["content"])
            if t.chat != info["messages"][: len(t.chat)]:  # at the end the env adds the last observation
                raise ValueError(f"{scenario} seed {seed}: the Gymnasium env's conversation is not the one this example builds")
        rows.append({"input_ids": t.prompt_ids + t.ids, "completion_mask": [0] * len(t.prompt_ids) + t.replied})
    return rows


def evaluate(client: Any, model: Any, tok: Any, scenario: str, seeds: list[int]) -> dict[str, float]:
    """The policy's greedy episodes (the most likely legal action at every turn) on held-out
    ``seeds``: mean return, pass rate and CR."""
    with inference(model):
        eps = [play(client, model, tok, scenario, s, None) for s in seeds]
    n = len(eps)
    return {"return": sum(e["episode_return"] for e in eps) / n,
            "pass": sum(bool(e["outcome"]["pass"]) for e in eps) / n,
            "CR": sum(float(e["outcome"]["CR"]) for e in eps) / n}


@contextmanager
def inference(model: Any) -> Iterator[None]:
    """``model`` in eval mode, put back in the mode it was in after."""
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)


WARM_EPISODES = 8
"""expert episodes the warm start clones by default (0: none). Without one the bundled model's
greedy episodes made no progress (held-out return -0.70), and GRPO from there learned to end at once
(docs/experiments/2026-11-27-grpo-openenv-budget.md)"""
WARM_EPOCHS = 4.0
"""passes over the warm start's rows: one pass at 2e-4 (over rows of one turn each) left the greedy
policy where it was; four at 1e-3 fitted it (held-out return -0.70 -> +0.40,
docs/experiments/2026-11-28-grpo-warm-start-fits.md)"""
WARM_LEARNING_RATE = 1e-3
"""the warm start's SFT learning rate (the loop's own LoRA rate: docs/design.md, "The learning recipe")"""
WARM_BATCH_SIZE = 2
"""expert episodes per warm-start step"""


def episode_return(prompts: list, completions: list, episode_return: list[float], **_: Any) -> list[float]:
    """GRPO reward function: each completion's episode return (from ``rollout_func``)."""
    return [float(x) for x in episode_return]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="bundled", help="bundled, or a local model folder")
    ap.add_argument("--url", default=None, help="a running `socialworld env serve` (default: start one here)")
    ap.add_argument("--scenario", default="team_lunch", help="scenario id or short name")
    ap.add_argument("--max-turns", type=int, default=0,
                    help="cap on each episode's turns (the server started here caps it; 0: the scenario's own budget)")
    ap.add_argument("--seeds", type=int, default=8, help="episodes (seeds) GRPO's groups start from")
    ap.add_argument("--steps", type=int, default=10, help="GRPO optimizer steps")
    ap.add_argument("--generations", type=int, default=4, help="episodes per seed (GRPO's group)")
    ap.add_argument("--eval-seeds", type=int, default=8,
                    help="held-out seeds the policy plays greedily before and after training (0: no evaluation)")
    ap.add_argument("--learning-rate", type=float, default=1e-4)
    ap.add_argument("--temperature", type=float, default=1.0,
                    help="sampling temperature of the episodes GRPO learns from (TRL's logprobs use the same)")
    ap.add_argument("--out", default="runs/grpo-openenv", help="folder for the LoRA adapter")
    ap.add_argument("--flat-reward-patience", type=int, default=5,
                    help="stop once every group's rewards were equal for this many steps in a row (0: never)")
    ap.add_argument("--warm-episodes", type=int, default=WARM_EPISODES,
                    help="expert episodes (their own seeds) the model is cloned on with TRL's SFT before GRPO (0: no warm start)")
    ap.add_argument("--warm-epochs", type=float, default=WARM_EPOCHS, help="passes over the warm start's rows (one per episode)")
    ap.add_argument("--warm-batch-size", type=int, default=WARM_BATCH_SIZE, help="expert episodes per warm-start SFT step")
    ap.add_argument("--warm-learning-rate", type=float, default=WARM_LEARNING_RATE, help="the warm start's SFT learning rate")
    args = ap.parse_args(argv)
    if args.temperature <= 0:
        ap.error(f"--temperature must be above 0, got {args.temperature}")
    if args.warm_episodes < 0:
        ap.error(f"--warm-episodes must be 0 or more, got {args.warm_episodes}")
    if args.warm_batch_size <= 0:
        ap.error(f"--warm-batch-size must be above 0, got {args.warm_batch_size}")
    if args.warm_learning_rate <= 0:
        ap.error(f"--warm-learning-rate must be above 0, got {args.warm_learning_rate}")
    if args.warm_epochs <= 0:
        ap.error(f"--warm-epochs must be above 0, got {args.warm_epochs}")

    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

    from socialworld.agents.models import auto_dtype
    from socialworld.learn.trainers.grpo import flat_reward_stop
    from socialworld.rollout.openenv import SocialWorldClient

    if args.model == "bundled":
        from socialworld.agents.models import bundled_path

        args.model = str(bundled_path())
    tok = AutoTokenizer.from_pretrained(args.model)
    with (env_server(args.max_turns) if args.url is None else nullcontext(args.url)) as url, \
            SocialWorldClient(base_url=url).sync() as client:
        # a scenario's first observation is the same for every seed: the seed of each group is counted, not read
        first = client.reset(seed=0, scenario=args.scenario).observation.messages
        seeds = [1000 + s for s in range(args.seeds)]
        rows = [{"prompt": first} for _ in seeds]
        played: list[int] = []
        gen = torch.Generator().manual_seed(0)

        def rollout(prompts: list, trainer: Any) -> dict[str, list]:
            out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "env_mask": [], "logprobs": [], "episode_return": []}
            # TRL's sampler repeats each prompt num_generations times in a row: one group, one seed, one episode each
            with inference(trainer.model):
                for i in range(len(prompts)):
                    if i % trainer.num_generations == 0:
                        played.append(seeds[len(played) % len(seeds)])
                    ep = play(client, trainer.model, tok, args.scenario, played[-1], gen, args.temperature)
                    for k in out:
                        out[k].append(ep[k])
            return out

        held_out = [2000 + s for s in range(args.eval_seeds)]
        lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
        # bf16 only where native: TRL's default autocast emulates it on an AVX2-only CPU (a GRPO step 209 s against 12)
        bf16 = auto_dtype() == "bfloat16"
        model = AutoModelForCausalLM.from_pretrained(args.model)
        before = evaluate(client, model, tok, args.scenario, held_out) if held_out else {}
        warm: dict[str, float] = {}
        warm_losses: list[float] = []
        if args.warm_episodes:
            # the expert's episodes, cloned: GRPO then starts from a policy whose episodes make progress
            warm_rows = expert_episodes(tok, args.scenario, [3000 + s for s in range(args.warm_episodes)], args.max_turns)
            opening = Transcript(tok, first).prompt_ids
            if warm_rows[0]["input_ids"][: len(opening)] != opening:
                raise ValueError(f"the server at {url} opens {args.scenario} with another conversation than this "
                                 "socialworld's: the warm start would teach another prompt")
            sft = SFTTrainer(model=model, processing_class=tok, train_dataset=Dataset.from_list(warm_rows), peft_config=lora,
                             args=SFTConfig(output_dir=args.out, num_train_epochs=args.warm_epochs,
                                            per_device_train_batch_size=args.warm_batch_size,
                                            learning_rate=args.warm_learning_rate, max_length=None, logging_steps=1,
                                            completion_only_loss=True,  # the replies' tokens (completion_mask), not the observations
                                            save_strategy="no", report_to=[], use_cpu=True, bf16=bf16, seed=0))
            sft.train()
            model = sft.model
            fit = [h for h in sft.state.log_history if "mean_token_accuracy" in h]
            warm_losses = [float(h["loss"]) for h in fit]
            if fit:
                print(f"warm start: {sft.state.global_step} SFT steps on {len(warm_rows)} expert episodes, last step's loss "
                      f"{fit[-1]['loss']:.3f}, token accuracy on the replies {fit[-1]['mean_token_accuracy']:.2f}")
            warm = evaluate(client, model, tok, args.scenario, held_out) if held_out else {}
        trainer = GRPOTrainer(
            model=model, processing_class=tok, reward_funcs=[episode_return],
            train_dataset=Dataset.from_list(rows), rollout_func=rollout,
            peft_config=None if args.warm_episodes else lora,  # the warm start's adapter trains on
            args=GRPOConfig(output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=args.generations,
                            num_generations=args.generations, learning_rate=args.learning_rate, logging_steps=1,
                            temperature=args.temperature,
                            save_strategy="no", report_to=[], use_cpu=True, bf16=bf16, seed=0))
        watchdog = flat_reward_stop(args.flat_reward_patience)
        trainer.add_callback(watchdog)
        trainer.train()
        after = evaluate(client, trainer.model, tok, args.scenario, held_out) if held_out else {}
    if watchdog.stopped:
        print(watchdog.stopped)
    trainer.save_model(args.out)
    history = trainer.state.log_history
    rewards = [h["rewards/episode_return/mean"] for h in history if "rewards/episode_return/mean" in h]
    flat = [h["frac_reward_zero_std"] for h in history if "frac_reward_zero_std" in h]
    budget = f"{args.max_turns} turns" if args.max_turns else "its own turn budget"
    print(f"{args.scenario}, {budget}, {args.generations} episodes a group; mean episode return per step: "
          f"{', '.join(f'{r:+.3f}' for r in rewards)}; adapter in {args.out}")
    print(f"share of groups with equal rewards (no gradient) per step: {', '.join(f'{f:.2f}' for f in flat)}")
    for name, ev in (("before", before), ("after the warm start, before GRPO", warm), ("after", after)):
        if ev:
            print(f"{name} training, greedy on {len(held_out)} held-out seeds: return {ev['return']:+.3f}, "
                  f"pass {ev['pass']:.2f}, CR {ev['CR']:.2f}")
    return {"rewards": rewards, "frac_reward_zero_std": flat, "stopped": watchdog.stopped, "seeds": played, "out": args.out,
            "before": before, "warm": warm, "warm_losses": warm_losses, "after": after}


if __name__ == "__main__":
    main()
