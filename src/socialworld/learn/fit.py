"""Does a policy take the chosen action of the action-track pairs, at the pairs' own states?

A pair's ``snapshot`` is the world just before its step, so the state can be rebuilt exactly:
restore it, observe, let the policy act once (a fresh episode key: no memory of earlier steps),
and compare the action it takes with the chosen completion's action. On the pairs a policy was
trained on this is its *training fit*; a trained policy that still answers with one action at
every state has learned the marginal, not the state (see docs/design.md, "training fit").

Pure over its inputs: the numbers depend only on the pairs and the policy's decisions.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from socialworld.agents.lm.prompts import parse_output
from socialworld.core import Action, Policy, PrivilegedPolicy
from socialworld.learn.pairs.record import Pair
from socialworld.records import EpisodeRecord
from socialworld.text.reply import ACTION, split_turn
from socialworld.world.engine import World
from socialworld.world.spec import ScenarioSpec
from socialworld.world.visibility import observe


@dataclass(frozen=True)
class ActionFit:
    pairs: int
    """action pairs with a snapshot, all of them scored"""
    exact: int
    """the policy took exactly the chosen action"""
    same_verb: int
    """the policy took an action of the chosen action's kind (``inquire``, ``propose``, ...)"""
    unparsed: int
    """the policy's reply had no parseable action (counted, never repaired)"""
    confusion: dict[str, dict[str, int]] = field(default_factory=dict)
    """chosen verb -> taken verb (``unparsed`` when there was none) -> count"""

    @property
    def exact_rate(self) -> float:
        """exact / pairs"""
        return self.exact / self.pairs if self.pairs else float("nan")

    @property
    def verb_rate(self) -> float:
        """same_verb / pairs"""
        return self.same_verb / self.pairs if self.pairs else float("nan")

    def as_dict(self) -> dict:
        return {"pairs": self.pairs, "exact": self.exact, "same_verb": self.same_verb, "unparsed": self.unparsed,
                "exact_rate": self.exact_rate, "verb_rate": self.verb_rate, "confusion": self.confusion}


def action_fit(policy: Policy, pairs: Sequence[Pair], specs: Mapping[str, ScenarioSpec], batch: int = 16) -> ActionFit:
    """Score ``policy`` on the action-track ``pairs``:
    exact = #{pairs : a_policy(s) = a_chosen}, same_verb = #{pairs : kind(a_policy(s)) = kind(a_chosen)},
    with s the pair's restored state. Pairs of the dialogue track or without a snapshot are refused."""
    bad = [p.id for p in pairs if p.track != "action" or p.snapshot is None]
    if bad:
        raise ValueError(f"action_fit needs action-track pairs with snapshots; {len(bad)} are not (first: {bad[0]})")
    observations, chosen = [], []
    for p in pairs:
        if p.scenario_id not in specs:
            raise ValueError(f"pair {p.id}: scenario {p.scenario_id!r} is not among the given specs")
        world = World.restore(p.snapshot, specs[p.scenario_id])  # type: ignore[arg-type]
        obs = observe(world.spec, world.pub)
        action, _, error = parse_output(p.chosen[-1]["content"], obs)
        if action is None:
            raise ValueError(f"pair {p.id}: its chosen completion does not parse at its own state ({error})")
        observations.append(obs)
        chosen.append(action)
    keys = [f"fit/{p.id}/{i}" for i, p in enumerate(pairs)]
    taken: list[Action | None] = []
    for start in range(0, len(pairs), batch):
        ks = keys[start : start + batch]
        policy.reset(ks)
        taken += [d.action for d in policy.act(ks, observations[start : start + batch])]
    confusion: dict[str, Counter] = {}
    for want, got in zip(chosen, taken):
        confusion.setdefault(want.kind, Counter())[got.kind if got is not None else "unparsed"] += 1
    return ActionFit(
        pairs=len(pairs), exact=sum(g is not None and w.key == g.key for w, g in zip(chosen, taken)),
        same_verb=sum(g is not None and w.kind == g.kind for w, g in zip(chosen, taken)),
        unparsed=sum(g is None for g in taken),
        confusion={k: dict(v.most_common()) for k, v in sorted(confusion.items())},
    )


def chosen_action_logprobs(model, tokenizer, pairs: Sequence[Pair]) -> list[float]:
    """Per action pair, teacher-forced: log P(chosen action | prompt, chosen BELIEF line, ``ACTION:``),
    the sum of the log-probabilities of the tokens that spell the chosen action's key (as the
    constrained decoder scores an action option). Training on a pair should raise it."""
    import torch

    out = []
    for p in pairs:
        head, key = split_turn(p.chosen[-1]["content"])  # the turn's words follow the action
        prefix = tokenizer.apply_chat_template(p.prompt, tokenize=False, add_generation_prompt=True) + head + f"\n{ACTION}"
        pre = tokenizer(prefix, add_special_tokens=False)["input_ids"]
        ids = tokenizer(key, add_special_tokens=False)["input_ids"]
        with torch.inference_mode():
            logits = model(torch.tensor([pre + ids], device=model.device)).logits[0, len(pre) - 1 : -1].float()
        out.append(float(torch.log_softmax(logits, -1).gather(1, torch.tensor(ids, device=logits.device)[:, None]).sum()))
    return out


def run_folder_of(path: str | Path) -> Path | None:
    """The loop run folder a file lies in (the nearest parent with ``config.yaml`` and ``manifest.json``)."""
    for d in Path(path).resolve().parents:
        if (d / "config.yaml").is_file() and (d / "manifest.json").is_file():
            return d
    return None


def specs_near(path: str | Path, ids: set[str], scenarios: Sequence[str] = ()) -> dict[str, ScenarioSpec]:
    """The scenarios ``ids`` that a file at ``path`` names: the YAML files in ``scenarios`` first, then, for
    a file inside a run folder, the user scenarios that run stored (at the run's turn cap), then the
    shipped ones."""
    import yaml

    from socialworld.learn.scenarios import specs_for

    run = run_folder_of(path)
    max_turns = int((yaml.safe_load((run / "config.yaml").read_text()) or {}).get("max_turns", 0)) if run else 0
    return specs_for(ids, run_dir=run, files=scenarios, max_turns=max_turns)


def fit_file(pairs: str | Path, policy: str = "bundled", adapter: str | Path | None = None, batch: int = 16,
             scenarios: Sequence[str] = ()) -> ActionFit:
    """:func:`action_fit` of a policy spec (``expert``, ``bundled``, a model path; with
    ``adapter``, that LoRA adapter deployed on the action track) on an action pairs Parquet file
    (e.g. a loop run's ``cycle-c/sleep/pairs-action.parquet``); the pairs' scenarios as :func:`specs_near` finds them."""
    from socialworld.agents.models import SCRIPTED
    from socialworld.agents.registry import make_policy
    from socialworld.learn.pairs.record import read_pairs

    if not Path(pairs).is_file():
        raise ValueError(f"{pairs}: no such pairs file")
    if policy in SCRIPTED and adapter is not None:
        raise ValueError(f"{policy} is a scripted policy: it takes no adapter")
    rows = read_pairs(pairs)
    specs = specs_near(pairs, {p.scenario_id for p in rows}, scenarios)
    built = make_policy(policy, batch_size=batch, adapters={"action": str(adapter)} if adapter else None)
    if isinstance(built, PrivilegedPolicy):
        raise ValueError(f"{policy} reads the hidden state: the fit scores a policy that acts on what it observes")
    return action_fit(built, rows, specs, batch=batch)


@dataclass(frozen=True)
class Agreement:
    """How often an agent's move was its teacher's at the agent's own states (one tier, or all)."""

    steps: int
    """the agent's decisions, every one scored"""
    same: int
    """the agent's move was exactly the teacher's"""
    same_kind: int
    """the agent's move was of the teacher's move's kind"""
    confusion: dict[str, dict[str, int]] = field(default_factory=dict)
    """the teacher's kind -> the agent's kind (``unparsed`` where it had no move) -> count, disagreements only"""

    @property
    def rate(self) -> float:
        """same / steps"""
        return self.same / self.steps if self.steps else float("nan")

    def as_dict(self) -> dict:
        return {"steps": self.steps, "same": self.same, "same_kind": self.same_kind, "rate": self.rate,
                "confusion": self.confusion}


def _agreement(pairs: Sequence[tuple[Action, Action | None]]) -> Agreement:
    confusion: dict[str, Counter] = {}
    for want, got in pairs:
        if got is None or got.key != want.key:
            confusion.setdefault(want.kind, Counter())[got.kind if got is not None else "unparsed"] += 1
    return Agreement(steps=len(pairs), same=sum(g is not None and g.key == w.key for w, g in pairs),
                     same_kind=sum(g is not None and g.kind == w.kind for w, g in pairs),
                     confusion={k: dict(v.most_common()) for k, v in sorted(confusion.items())})


def teacher_agreement(teacher: Policy, episodes: Sequence[EpisodeRecord], specs: Mapping[str, ScenarioSpec]) -> dict[str, Agreement]:
    """Replay each recorded episode from its seed and ask ``teacher`` for its move at every state the
    agent met (the teacher remembers the agent's moves, as a DAgger label does):
    rate = #{steps : a_agent(s) = a_teacher(s)} / #steps, by tier and over ``"all"``. The replay must give
    the recorded episode: a step whose executed move differs from the record's, or an episode that does
    not end where the record does, is an error (a chained episode, which starts from a carried-over
    world, cannot be replayed and is refused)."""
    by_tier: dict[str, list[tuple[Action, Action | None]]] = {}
    for ep in episodes:
        if ep.lineage.chain is not None:
            raise ValueError(f"episode {ep.episode_id} is part of a chain: it starts from a carried-over world and cannot be replayed")
        if ep.scenario_id not in specs:
            raise ValueError(f"episode {ep.episode_id}: scenario {ep.scenario_id!r} is not among the given specs")
        world, key = World(specs[ep.scenario_id], ep.seed), f"agreement/{ep.episode_id}"
        teacher.reset([key])
        for i, s in enumerate(ep.steps):
            if world.done:
                raise ValueError(f"episode {ep.episode_id} does not replay: the world ended before step {i}")
            obs = observe(world.spec, world.pub)
            want = teacher.act([key], [obs])[0].action
            fields = {k: v for k, v in (s.action.structured or {}).items() if v is not None}
            got = Action(**fields, utterance=s.dialogue.utterance or "") if s.action.structured else None  # type: ignore[arg-type]
            done = world.step(got, parse_error=s.action.error if got is None else None)
            if done.executed.key != s.action.executed:
                raise ValueError(f"episode {ep.episode_id} does not replay: step {i} executed {done.executed.key}, "
                                 f"the record says {s.action.executed}")
            if want is not None:
                by_tier.setdefault(ep.tier, []).append((want, got))
        if not world.done:
            raise ValueError(f"episode {ep.episode_id} does not replay: the world goes on after its {len(ep.steps)} recorded steps")
    out = {tier: _agreement(p) for tier, p in sorted(by_tier.items())}
    out["all"] = _agreement([x for p in by_tier.values() for x in p])
    return out


def agreement_file(episodes: str | Path, scenarios: Sequence[str] = ()) -> dict[str, Agreement]:
    """:func:`teacher_agreement` of the expert over an episodes JSONL file (e.g. a
    loop run's ``cycle-c/eval/episodes.jsonl`` or a bench arm's); the episodes' scenarios as :func:`specs_near` finds them."""
    from socialworld.agents.registry import make_policy
    from socialworld.records import read_jsonl

    if not Path(episodes).is_file():
        raise ValueError(f"{episodes}: no such episodes file")
    eps = read_jsonl(episodes)
    specs = specs_near(episodes, {e.scenario_id for e in eps}, scenarios)
    built = make_policy("expert")
    assert not isinstance(built, PrivilegedPolicy)  # the expert observes only
    return teacher_agreement(built, eps, specs)
