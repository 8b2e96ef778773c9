"""Foresee-and-Act: draft an action, foresee its consequence with a social world model, refine.

:class:`ForeseeAndAct` wraps any policy. At every step it

1. asks the wrapped policy for its draft decision;
2. picks up to ``alternatives`` other legal actions (:func:`alternatives`: the draft's own kind
   first, then the rest, in a seeded shuffle);
3. asks a :class:`WorldModel` to predict, for the draft and each alternative, the next timestep
   as an S3AP step (:class:`~socialworld.swm.s3ap.S3APStep`): each present NPC's ``<mental_state>``
   afterwards — mood bucket and stance on the decision the action is about;
4. scores every prediction with :func:`foresight_score`; with ``refine="harmful"`` (default) a
   draft foreseen to score 0 or more is kept, and with ``"argmax"`` any draft may be refined: it
   is replaced by the best alternative when that scores at least ``margin`` higher (acted with
   the expert's templated utterance, ``agent-utterances-v1``).

The draft's mental-state estimate is kept either way; a draft that is unparseable or illegal
is not refined (its penalty stands: refinement is not a repair of the output). The whole trace —
draft, each candidate's predicted S3AP step and score, the world model, the choice — is stored
in the step record's ``action.foresight``; a world model's token counts and latency are added to
the decision's.

World models:

* :class:`SimulatorWorldModel` — the simulator itself: forks the world (RNG position included)
  and steps it, so the prediction is exactly what would happen. It needs the world, so a policy
  using it is privileged (it receives :class:`~socialworld.core.HiddenView`\\ s with ``fork``):
  an exact-lookahead *upper bound*, never a fair arm.
* :class:`LMWorldModel` — a language model predicts the reactions from the public observation
  (``foresee-v1`` prompt); constrained to the reply grammar on local models, strictly parsed
  otherwise. An unparseable prediction is counted and leaves that candidate unscored.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol, Sequence

from pydantic import BaseModel, ConfigDict

from socialworld.core import MOOD_BUCKETS, Action, Decision, DescribedPolicy, HiddenView, Observation, mood_bucket
from socialworld.metrics.stats import Interval
from socialworld.records import Document
from socialworld.swm.config import ForeseeConfig
from socialworld.swm.s3ap import AGENT, S3APStep
from socialworld.text.templates import FORESEE_PROMPT_VERSION, FORESEE_SYSTEM, FORESEE_USER
from socialworld.world.rng import WorldRNG, derive_seed
from socialworld.world.visibility import legal_actions, observe, render

Stance = Literal["accepts", "rejects", "undecided", "leaves"]
STANCES: tuple[Stance, ...] = ("accepts", "rejects", "undecided", "leaves")
STANCE_WEIGHT = {"accepts": 1.0, "undecided": 0.0, "rejects": -1.0, "leaves": -2.0}
MOOD_WEIGHT = {"high": 0.5, "mid": 0.0, "low": -0.5}


class Reaction(BaseModel):
    """One NPC's predicted mental state after the action."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    mood: Literal["low", "mid", "high"]
    stance: Stance


class Foresight(BaseModel):
    """The prediction for one candidate action (``step`` None: the world model's output did not parse)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    action: str
    step: S3APStep | None
    error: str | None = None
    score: float | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    latency_s: float = 0.0


def reactions_to_step(timestep: int, state: str, action: Action, reactions: dict[str, Reaction]) -> S3APStep:
    """The predicted next timestep as S3AP: the agent observes the state, each NPC's observation
    is its ``<mental_state>`` (mood, stance) after the agent's action."""
    obs = {AGENT: "<same_as_state />"}
    for npc, r in reactions.items():
        obs[npc] = f"<mental_state>{json.dumps(r.model_dump(), sort_keys=True)}</mental_state>"
    return S3APStep(timestep=timestep, state=state, observations=obs, actions={AGENT: f"{action.key} | {action.utterance}"})


_MS = re.compile(r"^<mental_state>(.*)</mental_state>$", re.S)


def step_reactions(step: S3APStep) -> dict[str, Reaction]:
    """The NPC reactions stated in a predicted step (inverse of :func:`reactions_to_step`)."""
    out = {}
    for who, text in step.observations.items():
        m = _MS.match(text)
        if who != AGENT and m:
            out[who] = Reaction.model_validate_json(m.group(1))
    return out


def stance_before(obs: Observation, action: Action, npc: str) -> Stance:
    """An NPC's public stance on the action's decision before the action (``undecided`` for
    actions about no decision)."""
    if action.slot is None:
        return "undecided"
    sv = obs.slot(action.slot)
    return "accepts" if npc in sv.accepted_by else "rejects" if npc in sv.rejected_by else "undecided"


def foresight_score(before: Observation, action: Action, step: S3APStep) -> float:
    """Score of a predicted step: for every NPC, the change of its stance on the action's decision
    (accepts 1, undecided 0, rejects -1, leaves -2; before = its public stance) plus the weight of
    its predicted mood (high +0.5, mid 0, low -0.5):

    score = sum_i (STANCE_WEIGHT[stance_i'] - STANCE_WEIGHT[stance_i]) + MOOD_WEIGHT[mood_i']

    The mood term is absolute: every candidate at a state shares the same moods before, so only
    differences between candidates matter."""
    return sum(STANCE_WEIGHT[r.stance] - STANCE_WEIGHT[stance_before(before, action, npc)] + MOOD_WEIGHT[r.mood]
               for npc, r in step_reactions(step).items())


class WorldModel(Protocol):
    """Predicts the next S3AP step for (observation, action) pairs, batched."""

    name: str
    needs_world: bool
    """True: it reads the world through :attr:`HiddenView.fork` (privileged)"""

    def foresee(self, observations: Sequence[Observation], actions: Sequence[Action],
                hidden: Sequence[HiddenView] | None) -> list[Foresight]: ...


class SimulatorWorldModel:
    """Exact lookahead: fork the world and step it (see the module docstring: an upper bound)."""

    name = "simulator"
    needs_world = True

    def foresee(self, observations, actions, hidden) -> list[Foresight]:
        if hidden is None:
            raise ValueError("the simulator world model needs the world (hidden views with fork)")
        out = []
        for obs, a, hv in zip(observations, actions, hidden):
            if hv.fork is None:
                raise ValueError("this hidden view carries no world fork")
            w: Any = hv.fork()
            w.step(a)
            after = observe(w.spec, w.pub)
            reactions = {}
            for n in obs.npcs:
                if not n.present:
                    continue
                if not w.pub.present.get(n.id, False):
                    stance: Stance = "leaves"
                elif a.slot is not None and n.id in after.slot(a.slot).accepted_by:
                    stance = "accepts"
                elif a.slot is not None and n.id in after.slot(a.slot).rejected_by:
                    stance = "rejects"
                else:
                    stance = "undecided"
                reactions[n.id] = Reaction(mood=mood_bucket(w.hid[n.id].mood), stance=stance)
            step = reactions_to_step(obs.step + 1, render(after), a, reactions)
            out.append(Foresight(action=a.key, step=step, score=foresight_score(obs, a, step)))
        return out


_LINE = re.compile(r"^\s*([A-Za-z0-9_]+)\s*:\s*mood\s*=\s*(low|mid|high)\s+stance\s*=\s*(accepts|rejects|undecided|leaves)\s*$")


def parse_reactions(text: str, present: Sequence[str]) -> dict[str, Reaction]:
    """Strictly parse ``npc: mood=X stance=Y`` lines; every present NPC exactly once, nobody else.
    Raises ``ValueError`` naming what is wrong."""
    out: dict[str, Reaction] = {}
    for line in text.strip().split("\n"):  # "\n" (and "\r\n") only, as the policy's reply parser
        if not line.strip():
            continue
        m = _LINE.match(line)
        if not m:
            raise ValueError(f"not 'npc: mood=low|mid|high stance=accepts|rejects|undecided|leaves': {line.strip()!r}")
        npc, mood, stance = m.groups()
        if npc not in present:
            raise ValueError(f"{npc!r} is not present")
        if npc in out:
            raise ValueError(f"{npc!r} predicted twice")
        out[npc] = Reaction(mood=mood, stance=stance)  # type: ignore[arg-type]
    missing = [n for n in present if n not in out]
    if missing:
        raise ValueError(f"no prediction for {', '.join(missing)}")
    return out


def foresee_messages(obs: Observation, action: Action) -> list[dict[str, str]]:
    from socialworld.agents.lm.prompts import brief, compact

    return [{"role": "system", "content": FORESEE_SYSTEM.format(brief=brief(obs))},
            {"role": "user", "content": FORESEE_USER.format(obs=compact(obs), action=action.key)}]


class LMWorldModel:
    """A language model as the social world model (``foresee-v1``). Local models decode under
    the reply grammar (one mood and one stance choice per present NPC); servers write free text
    that is parsed strictly. Either way the text goes through :func:`parse_reactions`."""

    needs_world = False

    def __init__(self, backend: Any):
        self.backend = backend
        self.name = f"lm:{backend.name}"
        self.prompt_version = FORESEE_PROMPT_VERSION

    def foresee(self, observations, actions, hidden=None) -> list[Foresight]:
        from socialworld.agents.lm.constrained import Choice, Forced

        convs = [foresee_messages(o, a) for o, a in zip(observations, actions)]
        presents = [[n.id for n in o.npcs if n.present] for o in observations]
        if self.backend.local:
            progs = []
            for o, a, present in zip(observations, actions, presents):
                stances = STANCES if a.slot is not None else ("undecided", "leaves")
                segs: list = []
                for i, n in enumerate(present):
                    segs += [Forced(("\n" if i else "") + f"{n}: mood="), Choice(f"mood:{n}", MOOD_BUCKETS),
                             Forced(" stance="), Choice(f"stance:{n}", stances)]
                progs.append(segs or [Forced("")])
            comps = self.backend.constrained(convs, progs)
        else:
            comps = self.backend.complete(convs)
        out = []
        for o, a, present, c in zip(observations, actions, presents, comps):
            cost = {"tokens_in": c.tokens_in, "tokens_out": c.tokens_out, "latency_s": c.latency_s}
            if c.error is not None:
                out.append(Foresight(action=a.key, step=None, error=c.error, **cost))
                continue
            try:
                reactions = parse_reactions(c.text, present)
            except ValueError as err:
                out.append(Foresight(action=a.key, step=None, error=str(err), **cost))
                continue
            step = reactions_to_step(o.step + 1, f"predicted by {self.name} ({self.prompt_version})", a, reactions)
            out.append(Foresight(action=a.key, step=step, score=foresight_score(o, a, step), **cost))
        return out


def alternatives(obs: Observation, draft: Action, k: int, key: Sequence[int | str]) -> list[Action]:
    """Up to ``k`` legal actions other than the draft: those of the draft's kind first, then the
    others, each group in a deterministic shuffle seeded by ``key``."""
    legal = [a for a in legal_actions(obs) if a.key != draft.key]
    rng = WorldRNG(derive_seed(*key, "foresee"))
    same = rng.shuffled([a for a in legal if a.kind == draft.kind])
    rest = rng.shuffled([a for a in legal if a.kind != draft.kind])
    return (same + rest)[:k]


@dataclass
class ForeseeAndAct:
    """Wrap ``inner`` with Foresee-and-Act (see the module docstring)."""

    inner: Any
    world_model: WorldModel
    alternatives: int = 4
    margin: float = 1.0
    seed: int = 0
    refine: Literal["harmful", "argmax"] = "harmful"
    """harmful: replace the draft only when its foresight scores below 0 (someone turns against
    it, leaves, or ends low); argmax: whenever an alternative scores ``margin`` higher"""
    policy_id: str = field(init=False)
    privileged: bool = field(init=False)

    def __post_init__(self) -> None:
        if self.alternatives < 1:
            raise ValueError("alternatives must be at least 1")
        if self.refine not in ("harmful", "argmax"):
            raise ValueError(f"refine must be 'harmful' or 'argmax', not {self.refine!r}")
        self.policy_id = f"{self.inner.policy_id}+foresee[{self.world_model.name}]"
        self.privileged = bool(self.world_model.needs_world or getattr(self.inner, "privileged", False) is True)

    def info(self):
        from socialworld.records import PolicyRec

        base = self.inner.info() if isinstance(self.inner, DescribedPolicy) else PolicyRec(policy_id=self.inner.policy_id)
        return base.model_copy(update={"policy_id": self.policy_id, "decoding": {
            **base.decoding, "foresee": {"world_model": self.world_model.name, "alternatives": self.alternatives,
                                         "margin": self.margin, "refine": self.refine, "prompt": FORESEE_PROMPT_VERSION}}})

    def reset(self, episode_keys: Sequence[str]) -> None:
        self.inner.reset(episode_keys)

    def act(self, episode_keys: Sequence[str], observations: Sequence[Observation],
            hidden: Sequence[HiddenView] | None = None) -> list[Decision]:
        from socialworld.agents.scripted import say

        if getattr(self.inner, "privileged", False) is True:
            drafts = self.inner.act(episode_keys, observations, hidden)
        else:
            drafts = self.inner.act(episode_keys, observations)
        jobs: list[tuple[int, Action]] = []
        for i, (key, obs, d) in enumerate(zip(episode_keys, observations, drafts)):
            if d.action is None or d.action.key not in {a.key for a in legal_actions(obs)}:
                continue
            jobs.append((i, d.action))
            jobs += [(i, say(obs, a)) for a in alternatives(obs, d.action, self.alternatives, (self.seed, key, obs.step))]
        preds = self.world_model.foresee([observations[i] for i, _ in jobs], [a for _, a in jobs],
                                         None if hidden is None else [hidden[i] for i, _ in jobs]) if jobs else []
        by_episode: dict[int, list[tuple[Action, Foresight]]] = {}
        for (i, a), f in zip(jobs, preds):
            by_episode.setdefault(i, []).append((a, f))
        out = []
        for i, d in enumerate(drafts):
            cands = by_episode.get(i)
            if cands is None:
                out.append(Decision(d.action, d.mental_state, d.raw, d.parse_error, d.tokens_in, d.tokens_out, d.latency_s,
                                    foresight={"world_model": self.world_model.name, "refined": False,
                                               "skipped": "unparseable" if d.action is None else "illegal"}, prompt=d.prompt,
                                    failure=d.failure))
                continue
            draft_score = cands[0][1].score
            scored = [(a, f) for a, f in cands if f.score is not None]
            best = max(scored, key=lambda af: af[1].score or 0.0, default=None)  # first on ties: the draft (every score here is set)
            may_refine = self.refine == "argmax" or draft_score is None or draft_score < 0
            replace = may_refine and best is not None and best[0] is not cands[0][0] and (
                draft_score is None or best[1].score >= draft_score + self.margin)  # type: ignore[operator]
            action = best[0] if replace and best is not None else d.action
            trace = {"world_model": self.world_model.name, "draft": d.action.key if d.action else None,
                     "refined": bool(replace), "chosen": action.key if action else None,
                     "candidates": [f.model_dump(mode="json") for _, f in cands],
                     "unparsed": sum(f.step is None for _, f in cands)}
            out.append(Decision(action, d.mental_state, d.raw, d.parse_error,
                                d.tokens_in + sum(f.tokens_in for _, f in cands),
                                d.tokens_out + sum(f.tokens_out for _, f in cands), d.latency_s, foresight=trace,
                                prompt=d.prompt))
        return out


# ------------------------------------------------------------------ evaluation: plain vs Foresee-and-Act


def make_world_model(spec: str, policy: Any = None, batch_size: int = 12) -> WorldModel:
    """``simulator`` or a model spec; a language model already loaded by ``policy`` (the same
    spec) is shared, not loaded twice."""
    if spec == "simulator":
        return SimulatorWorldModel()
    from socialworld.agents.models import parse_model_spec
    from socialworld.agents.registry import make_backend

    backend = getattr(policy, "backend", None)
    ms = parse_model_spec(spec)
    same = (getattr(policy, "policy_id", None) == ms.display and not ms.adapters
            and getattr(policy, "adapter_hash", None) is None)  # a trained policy's model is not the base
    if backend is None or not same:
        backend = make_backend(spec, batch_size=batch_size)
    return LMWorldModel(backend)


FORESEE_RESULT_SCHEMA: Final = "foresee-result-v1"


class Refinement(Document):
    """How Foresee-and-Act changed the drafts."""

    steps: int
    refined: int
    """steps whose draft an alternative replaced"""
    skipped: int
    """steps not foreseen (an unparseable or illegal draft)"""
    predictions: int
    unparsed: int
    """predictions the world model's reply did not parse"""
    tokens_in: dict[str, int]
    """prompt tokens per side (plain, foresee)"""


class ForeseeResult(Document):
    """``foresee.json``: the plain policy and Foresee-and-Act on the same episodes."""

    schema_version: Literal["foresee-result-v1"] = FORESEE_RESULT_SCHEMA
    metrics_contract: str
    policy: str
    world_model: str
    prompt_version: str
    config: ForeseeConfig
    episodes: int
    metrics: dict[str, dict[str, Interval]]
    """side (plain, foresee) -> metric -> mean with its 95% bootstrap interval"""
    difference: dict[str, Interval]
    """foresee minus plain per metric, paired bootstrap"""
    refinement: Refinement


def evaluate_foresee(cfg: ForeseeConfig, progress=None) -> ForeseeResult:
    """Run ``cfg.policy`` plain and wrapped in :class:`ForeseeAndAct` on the same episodes; write
    both sides' records and ``foresee.json``: per side the mean of every core metric and the pass
    rate with 95% bootstrap intervals, the paired difference (Foresee-and-Act minus plain), and
    the refinement counts (steps, refined, unparsed predictions, world-model tokens).
    ``progress(what, total)`` may return a per-episode callback (the CLI's bars)."""
    from pathlib import Path

    from socialworld.agents.models import SCRIPTED
    from socialworld.agents.registry import make_policy
    from socialworld.metric_registry import KEYS
    from socialworld.metrics.core import METRICS_CONTRACT
    from socialworld.metrics.stats import metric_interval, paired_difference
    from socialworld.records import atomic_write_text, write_jsonl
    from socialworld.rollout.evaluate import episode_seeds
    from socialworld.rollout.runner import EpisodeJob, run_episodes
    from socialworld.world.spec import resolve_scenarios

    specs = resolve_scenarios(cfg.scenarios, cfg.tiers)
    if not specs:
        raise ValueError("no scenario matches the chosen scenarios and tiers")
    jobs = [EpisodeJob(s, seed) for s in specs for seed in episode_seeds(cfg.seed, s.id, cfg.episodes)]
    lm = {} if cfg.policy in SCRIPTED else {"batch_size": cfg.lm_batch_size}
    plain_policy = make_policy(cfg.policy, seed=cfg.seed, **lm)
    wm = make_world_model(cfg.world_model, plain_policy, cfg.lm_batch_size)
    wrapped = ForeseeAndAct(plain_policy, wm, cfg.alternatives, cfg.margin, cfg.seed, cfg.refine)  # type: ignore[arg-type]
    out = Path(cfg.out)
    sides = {}
    for name, pol in (("plain", plain_policy), ("foresee", wrapped)):
        on_episode = progress(name, len(jobs)) if progress else None
        eps = run_episodes(pol, jobs, batch_size=max(1, len(jobs)), on_episode=on_episode, run_seed=cfg.seed)
        write_jsonl(out / name / "episodes.jsonl", eps)
        sides[name] = eps
    traces = [s.action.foresight for e in sides["foresee"] for s in e.steps if s.action.foresight]
    doc = ForeseeResult(
        metrics_contract=METRICS_CONTRACT, policy=cfg.policy, world_model=wrapped.world_model.name,
        prompt_version=FORESEE_PROMPT_VERSION, config=cfg, episodes=len(jobs),
        metrics={name: {k: metric_interval(eps, k, seed=cfg.seed) for k in KEYS} for name, eps in sides.items()},
        difference={k: paired_difference(sides["plain"], sides["foresee"], k, seed=cfg.seed) for k in KEYS},
        refinement=Refinement(
            steps=sum(len(e.steps) for e in sides["foresee"]),
            refined=sum(bool(t.get("refined")) for t in traces),
            skipped=sum("skipped" in t for t in traces),
            predictions=sum(len(t.get("candidates", [])) for t in traces),
            unparsed=sum(t.get("unparsed", 0) for t in traces),
            tokens_in={n: sum(s.policy.tokens_in for e in eps for s in e.steps) for n, eps in sides.items()},
        ),
    )
    atomic_write_text(out / "foresee.json", doc.to_json())
    return doc
