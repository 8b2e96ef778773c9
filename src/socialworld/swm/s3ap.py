"""S3AP export/import of episode records (structured social state per timestep).

A document has, per timestep: ``state`` (the rendered public state), per-agent
``observations`` (the agent's view with its stated ``<mental_state>…</mental_state>``; NPCs
who were addressed observe ``<same_as_last_action_agent />``, others ``<same_as_state />``),
and per-agent ``actions`` (the agent's executed action and utterance, NPC replies).
"""

from __future__ import annotations

import json
import re

from pydantic import BaseModel, ConfigDict

from socialworld.records import EpisodeRecord

S3AP_VERSION = "s3ap-v1"
AGENT = "agent"
_MS = re.compile(r"<mental_state>(.*?)</mental_state>", re.S)


class S3APStep(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    timestep: int
    state: str
    observations: dict[str, str]
    actions: dict[str, str]


class S3APDocument(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    version: str = S3AP_VERSION
    scenario_id: str
    seed: int
    agents: list[str]
    timesteps: list[S3APStep]


def to_s3ap(ep: EpisodeRecord) -> S3APDocument:
    npcs = [n["id"] for n in ep.steps[0].observation.structured["npcs"]] if ep.steps else []
    steps = []
    for st in ep.steps:
        addressed = {r.speaker for r in st.dialogue.replies}
        ms = "" if st.mental_state.stated is None else f"<mental_state>{json.dumps(st.mental_state.stated, sort_keys=True)}</mental_state>"
        observations = {AGENT: st.observation.text + ("\n" + ms if ms else "")}
        for n in npcs:
            observations[n] = "<same_as_last_action_agent />" if n in addressed else "<same_as_state />"
        actions = {AGENT: f"{st.action.executed} | {st.dialogue.utterance}"}
        for r in st.dialogue.replies:
            if r.speaker in npcs:
                actions[r.speaker] = (actions[r.speaker] + " " if r.speaker in actions else "") + r.text
        steps.append(S3APStep(timestep=st.setting.step, state=st.observation.text, observations=observations, actions=actions))
    return S3APDocument(scenario_id=ep.scenario_id, seed=ep.seed, agents=[AGENT, *npcs], timesteps=steps)


def from_s3ap(text: str | dict) -> S3APDocument:
    """Parse and validate an S3AP document (JSON text or mapping)."""
    if isinstance(text, str):
        return S3APDocument.model_validate_json(text)
    return S3APDocument.model_validate(text)


def agent_trace(doc: S3APDocument) -> list[dict]:
    """Per timestep: the agent's executed action key, utterance and stated mental state."""
    out = []
    for st in doc.timesteps:
        action, _, utterance = st.actions[AGENT].partition(" | ")
        m = _MS.search(st.observations[AGENT])
        out.append({"timestep": st.timestep, "action": action, "utterance": utterance,
                    "mental_state": json.loads(m.group(1)) if m else None})
    return out
