"""Episode runner: many episodes advance in lockstep; one batched policy call per step.

The runner is the only place that holds both a :class:`~socialworld.world.engine.World` and a
policy. It hands a policy observations — and hidden views only to a
:class:`~socialworld.core.PrivilegedPolicy`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Sequence

from socialworld import __version__
from socialworld.core import Decision, DescribedPolicy, Memory, Policy, PrivilegedPolicy
from socialworld.metrics.core import align, episode_metrics
from socialworld.records import (
    ActionRec,
    DialogueRec,
    EpisodeRecord,
    FinalState,
    Lineage,
    MentalStateRec,
    Message,
    ObservationRec,
    PolicyRec,
    PromptRec,
    Reply,
    ReplyVoice,
    Setting,
    Signal,
    StepRecord,
    StepSignals,
    VoiceInfo,
)
from socialworld.text.templates import (
    AGENT_UTTERANCES_VERSION,
    CUES_VERSION,
    NPC_REPLIES_VERSION,
    NPC_VOICE_VERSION,
    OBSERVATION_TEXT_VERSION,
)
from socialworld.world.dialogue import DIALOGUE_SOURCE
from socialworld.world.engine import SNAPSHOT_VERSION, World
from socialworld.world.spec import ScenarioSpec
from socialworld.world.visibility import OBSERVATION_PROVENANCE, observe, render, to_plain
from socialworld.world.voice import Voice, check_line, line_requests

TEMPLATES = {
    "npc_replies": NPC_REPLIES_VERSION,
    "cues": CUES_VERSION,
    "agent_utterances": AGENT_UTTERANCES_VERSION,
    "observation_text": OBSERVATION_TEXT_VERSION,
}


@dataclass(frozen=True)
class EpisodeJob:
    spec: ScenarioSpec
    seed: int
    tag: str = ""
    """distinguishes episodes of the same (scenario, seed) run side by side (chain variants)"""
    setup: Callable[[World], dict] | None = None
    """applied to the fresh world before the first step (a chain's carry-over); what it returns
    is recorded as the episode's ``lineage.chain``"""
    memory: Memory | None = None
    """handed to the policy in every observation of the episode (a chain's memory)"""

    @property
    def key(self) -> str:
        return f"{self.spec.id}/{self.seed}" + (f"/{self.tag}" if self.tag else "")

    def world(self) -> tuple[World, dict | None]:
        w = World(self.spec, self.seed)
        return w, (self.setup(w) if self.setup is not None else None)


def turn_budget(jobs: Sequence[EpisodeJob]) -> int:
    """The most decision steps ``jobs`` can take (what :func:`run_episodes`' ``on_steps`` counts to)."""
    return sum(j.spec.turn_budget for j in jobs)


def per_turn(tick: Callable[[object], None]) -> Callable[[int], None]:
    """An ``on_steps`` callback from a per-item progress callback: ``tick`` once per turn used up."""
    def on_steps(n: int) -> None:
        for _ in range(n):
            tick(None)
    return on_steps


def is_privileged(policy: object) -> bool:
    return getattr(policy, "privileged", False) is True


def decide(policy: Policy | PrivilegedPolicy, keys: list[str], worlds: list[World], obs: list) -> list[Decision]:
    """One batched policy call; only a privileged policy is handed the worlds' hidden views."""
    if is_privileged(policy):
        return policy.act(keys, obs, [w.hidden_view() for w in worlds])  # type: ignore[call-arg]
    return policy.act(keys, obs)  # type: ignore[call-arg]


def run_episodes(
    policy: Policy | PrivilegedPolicy,
    jobs: Sequence[EpisodeJob],
    *,
    batch_size: int = 64,
    policy_info: PolicyRec | None = None,
    on_episode: Callable[[EpisodeRecord], None] | None = None,
    run_seed: int | None = None,
    on_steps: Callable[[int], None] | None = None,
    voice: Voice | None = None,
) -> list[EpisodeRecord]:
    """Run ``jobs`` in lockstep batches of ``batch_size``; return scored episode records in
    job order. ``on_episode(record)`` as each episode is scored; ``on_steps(n)`` after each
    lockstep step with the turns it used up: one per episode that stepped, plus the unused turn
    budget of each episode that just ended, so the counts add up to :func:`turn_budget` of the
    jobs (a progress bar whose ETA holds while episodes in a lockstep batch finish together).
    ``voice``: NPC lines in a model's words (:func:`voice_step` after each lockstep step; None: the templates)."""
    info = policy_info or (policy.info() if isinstance(policy, DescribedPolicy) else PolicyRec(policy_id=policy.policy_id))
    out: list[EpisodeRecord] = []
    for start in range(0, len(jobs), batch_size):
        batch = list(jobs[start : start + batch_size])
        made = [j.world() for j in batch]
        worlds = [w for w, _ in made]
        keys = [j.key for j in batch]
        policy.reset(keys)
        steps: list[list[StepRecord]] = [[] for _ in batch]
        phi0 = [w.progress() for w in worlds]
        while True:
            active = [i for i, w in enumerate(worlds) if not w.done]
            if not active:
                break
            obs = [observe(worlds[i].spec, worlds[i].pub) for i in active]
            obs = [o if batch[i].memory is None else dataclasses.replace(o, memory=batch[i].memory) for i, o in zip(active, obs)]
            decisions = decide(policy, [keys[i] for i in active], [worlds[i] for i in active], obs)
            for i, o, d in zip(active, obs, decisions):
                steps[i].append(step_record(worlds[i], o, d, info))
            if voice is not None:
                voice_step(voice, [worlds[i] for i in active], [steps[i] for i in active])
            if on_steps:
                on_steps(sum(1 + (worlds[i].spec.turn_budget - len(steps[i]) if worlds[i].done else 0) for i in active))
        for j, (w, chain), st, p0 in zip(batch, made, steps, phi0):
            ep = episode_record(j, w, st, p0, info.policy_id, run_seed, chain, voice_info(voice))
            out.append(ep)
            if on_episode:
                on_episode(ep)
    return out


def voice_info(voice: Voice | None) -> VoiceInfo | None:
    """The lineage entry of episodes voiced by ``voice`` (None: the templates)."""
    return None if voice is None else VoiceInfo(model=voice.voice_id, prompt_version=NPC_VOICE_VERSION, decoding=dict(voice.decoding))


def voice_step(voice: Voice, worlds: Sequence[World], steps: Sequence[list[StepRecord]]) -> None:
    """The NPC replies of each world's last step (the last record of its ``steps``) in ``voice``'s words,
    one call for all of them: each line checked (:func:`~socialworld.world.voice.check_line`), the worlds'
    transcripts and the step records given the line the agent hears, each voiced reply recording how it
    was voiced (the world's own lines keep their words and have no voice)."""
    asked = [line_requests(w, len(st[-1].dialogue.replies)) for w, st in zip(worlds, steps)]
    flat = [(w, r) for w, rs in zip(worlds, asked) for r in rs if r is not None]
    if not flat:
        return
    heard = iter([check_line(w.spec, r, rep) for (w, r), rep in zip(flat, voice.speak([r for _, r in flat]), strict=True)])
    for w, st, rs in zip(worlds, steps, asked):
        if not any(r is not None for r in rs):
            continue
        last = st[-1]
        replies = []
        for reply, r in zip(last.dialogue.replies, rs):
            if r is None:
                replies.append(reply)
                continue
            ln = next(heard)
            replies.append(Reply(speaker=reply.speaker, text=ln.text, voice=ReplyVoice(
                status=ln.status, template=ln.template, prompt_hash=ln.prompt_hash, detail=ln.detail)))
        w.revoice([r.text for r in replies])
        st[-1] = last.model_copy(update={"dialogue": last.dialogue.model_copy(update={"replies": replies})})


def _prompt(d: Decision) -> PromptRec | None:
    if d.prompt is None:
        return None
    version, messages = d.prompt
    return PromptRec(version=version, messages=[Message(role=r, content=c) for r, c in messages])


def step_record(w: World, obs, d: Decision, info: PolicyRec) -> StepRecord:
    """Play decision ``d`` on ``w`` (at observation ``obs``) and record the step in five dimensions."""
    truth = w.truth()
    a_t = align(d.mental_state, truth)
    setting = Setting(scenario_id=w.spec.id, tier=w.spec.tier, seed=w.seed, step=w.t, turn_budget=w.spec.turn_budget)
    obs_rec = ObservationRec(structured=to_plain(obs), text=render(obs), provenance=OBSERVATION_PROVENANCE)  # type: ignore[arg-type]
    res = w.step(d.action, parse_error=d.parse_error)
    moods = {k: Signal(value=v, source="direct", confidence=1.0, detail="hidden state") for k, v in w.moods().items()}
    q = (
        Signal(value=res.q, source="direct", confidence=0.8, detail=DIALOGUE_SOURCE)
        if res.q is not None
        else Signal(value=None, source="missing", confidence=0.0, detail=f"no assessable utterance ({res.parse_status})")
    )
    return StepRecord(
        setting=setting,
        observation=obs_rec,
        mental_state=MentalStateRec(stated=None if d.mental_state is None else d.mental_state.to_dict(), truth=truth.to_dict()),
        action=ActionRec(
            structured=None if d.action is None else d.action.to_dict(),
            raw=d.raw,
            parse_status=res.parse_status,
            error=res.error,
            executed=res.executed.key,
            **({"foresight": dict(d.foresight)} if d.foresight is not None else {}),
            failure=d.failure,
        ),
        dialogue=DialogueRec(
            utterance=res.executed.utterance if d.action is not None else "",
            replies=[Reply(speaker=x.speaker, text=x.text) for x in res.replies],
            announcements=list(res.announcements),
        ),
        signals=StepSignals(
            align=Signal(value=a_t, source="direct" if d.mental_state is not None else "missing", confidence=1.0,
                         detail="stated vs true mental state"),
            reward=Signal(value=res.reward, source="direct", confidence=1.0, detail="Phi_{t+1} - Phi_t - c_t"),
            penalty=Signal(value=res.penalty, source="direct", confidence=1.0, detail=",".join(res.penalty_reasons)),
            q=q,
            moods=moods,
            phi=res.phi_after,
            penalty_reasons=list(res.penalty_reasons),
            q_features=res.q_features,
            leaked=list(res.leaked),
        ),
        policy=info.model_copy(update={"tokens_in": d.tokens_in, "tokens_out": d.tokens_out, "latency_s": d.latency_s,
                                       "prompt": _prompt(d)}),
    )


def episode_record(job: EpisodeJob, w: World, steps: list[StepRecord], phi0: float, policy_id: str, run_seed: int | None,
                   chain: dict | None = None, voice: VoiceInfo | None = None) -> EpisodeRecord:
    """The scored record (metrics and diagnostics) of ``job``'s episode, played on ``w`` as ``steps``
    from progress ``phi0`` (``voice``: the NPC voice that spoke, None under the templates)."""
    from socialworld.metrics.diagnostics import diagnose

    ep = _unscored(job, w, steps, phi0, policy_id, run_seed, chain, voice)
    ep = ep.model_copy(update={"metrics": episode_metrics(ep)})
    return ep.model_copy(update={"diagnostics": diagnose(ep)})


def _unscored(job: EpisodeJob, w: World, steps: list[StepRecord], phi0: float, policy_id: str, run_seed: int | None,
              chain: dict | None = None, voice: VoiceInfo | None = None) -> EpisodeRecord:
    return EpisodeRecord(
        episode_id=f"{job.spec.id}/{job.seed}/{policy_id}" + (f"/{job.tag}" if job.tag else ""),
        scenario_id=job.spec.id,
        tier=job.spec.tier,
        seed=job.seed,
        policy_id=policy_id,
        steps=steps,
        final=FinalState(
            subgoals=w.subgoals(),
            moods=w.moods(),
            present=dict(w.pub.present),
            phi_0=phi0,
            phi_T=w.progress(),
            steps=len(steps),
            t_ref=job.spec.t_ref,
            end_reason=w.pub.end_reason or "unknown",
            commitments=[dataclasses.asdict(c) for c in w.pub.commitments],
            leaks=w.pub.leaks,
        ),
        lineage=Lineage(
            framework_version=__version__,
            spec_hash=job.spec.content_hash,
            world_snapshot_version=SNAPSHOT_VERSION,
            templates=TEMPLATES,
            run_seed=run_seed,
            **({"chain": chain} if chain is not None else {}),
            voice=voice,
        ),
    )

