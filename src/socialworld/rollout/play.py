"""Play one episode and print it readably (the five dimensions per step)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape as e
from rich.panel import Panel

from socialworld.agents.registry import NPC_VOICE_TEMPLATE, make_policy, make_voice
from socialworld.records import EpisodeRecord
from socialworld.rollout.runner import EpisodeJob, run_episodes
from socialworld.world.spec import ScenarioSpec


def play_episode(spec: ScenarioSpec, policy: str, seed: int, console: Console, npc_voice: str = NPC_VOICE_TEMPLATE) -> EpisodeRecord:
    """Play and print one episode. Every text that comes from a model, a scenario file or the
    world is printed literally (``e``: rich markup escaped), so a reply such as ``SAY: [/]``
    shows as written. Under a voice (``npc_voice``) each voiced line shows the template line it
    replaced beneath it, and a line the check refused says why."""
    ep = run_episodes(make_policy(policy, seed=seed), [EpisodeJob(spec, seed)], voice=make_voice(npc_voice))[0]
    console.print(Panel(e(f"{spec.name} ({spec.tier}) seed {seed}, policy {policy}\n{spec.setting}\nGoal: {spec.goal}"),
                        title=e(spec.id)))
    for st in ep.steps:
        sig = st.signals
        console.rule(f"step {st.setting.step}")
        console.print(f"[bold]observation[/bold] (turns left {st.observation.structured['turns_left']})")
        for s in st.observation.structured["slots"]:
            console.print(e(f"  {s['id']}: {s['status']}" + (f", proposal {s['proposal']} accepted by {s['accepted_by']}" if s["proposal"] else "")))
        stated = st.mental_state.stated or {}
        truth = st.mental_state.truth
        console.print("[bold]mental state[/bold] stated vs true:")
        for npc, slots in truth["preferences"].items():
            said = stated.get("preferences", {}).get(npc, {})
            pairs = ", ".join(f"{k}: {said.get(k, '?')}/{v}" for k, v in slots.items())
            console.print(e(f"  {npc}: {pairs}; mood {stated.get('moods', {}).get(npc, '?')}/{truth['moods'].get(npc)}"))
        console.print("[bold]action[/bold] " + e(f"{st.action.executed} [{st.action.parse_status}]"
                                                 + (f" ({st.action.error})" if st.action.error else "")))
        console.print("[bold]dialogue[/bold] " + e(f"agent: {st.dialogue.utterance!r}"))
        for r in st.dialogue.replies:
            console.print(e(f"  {r.speaker}: {r.text}"))
            if r.voice is not None and r.voice.status in ("voiced", "cut"):
                console.print("    [dim]template:[/dim] " + e(r.voice.template))
            elif r.voice is not None:
                console.print(f"    [dim]template line: the voice's was {r.voice.status}[/dim]" + e(f" {r.voice.detail}".rstrip()))
        for a in st.dialogue.announcements:
            console.print("  [yellow]news:[/yellow] " + e(a))
        q = "-" if sig.q.value is None else f"{sig.q.value:.2f}"
        console.print(
            f"[bold]signals[/bold] align={sig.align.value:.2f} ({sig.align.source}) r={sig.reward.value:+.2f} "
            + e(f"c={sig.penalty.value:.2f} {sig.penalty_reasons or ''} q={q} ({sig.q.detail}) phi={sig.phi:.2f}")
        )
    m = ep.metrics
    assert m is not None
    console.rule("episode")
    console.print(e(f"sub-goals: {ep.final.subgoals}; ended by {ep.final.end_reason}"))
    console.print(e(
        f"U={m.U.value:.2f} ({m.U.source}) A_e={m.A_e.value:.2f} S_npc={m.S_npc.value:.2f} D={m.D.value:.2f} "
        f"CR={m.CR.value:.2f} pass={m.passed} solved={m.solved} guards broken={m.guards_broken or 'none'} ({m.contract})"
    ))
    if ep.diagnostics and ep.diagnostics.attribution:
        console.print(e(f"failure attribution: {ep.diagnostics.attribution}"))
    return ep
