"""Theory-of-mind evaluation: Sally-Anne-style location-tracking stories with exact
answers and an exact reference S3AP, an S3AP parser over any model backend, and the
parser-quality score.

* **Stories** — :func:`generate_story` draws, from one seeded RNG, a cast, an object and
  containers, then a sequence of ``enter``/``leave``/``place``/``move`` events in which someone
  is always out of the room during a move (so some belief is false). The generator tracks the
  truth, each agent's belief (the last placement it saw) and each agent's belief about each other
  agent's belief (updated only by moves both of them saw), so every question has an exact answer.
* **Reference S3AP** — one timestep per sentence: ``state`` is the full world state, and the
  ``observations`` say who saw the event: the actor ``<same_as_state />``, the others in the room
  ``<same_as_last_action_ACTOR />``, those outside ``none``; ``actions`` hold the actor's sentence.
* **Parser** — :func:`parse_s3ap` asks a backend for S3AP JSON, validates it (JSON, schema, agents,
  timesteps), and on failure sends the validation errors back, at most ``max_retries`` times; every
  attempt is counted. :class:`ScriptedS3APParser` is a reference backend that parses the story
  sentences with the templates' own patterns (exact on generated stories).
* **Parser quality** = 0.3 x structural validity + 0.7 x observation accuracy, where observation
  accuracy is the share of (timestep, agent) observation tags equal to the reference's
  (deterministic: the references are structured, no judge).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Final, Literal, Sequence

from pydantic import BaseModel, ConfigDict, ValidationError

from socialworld.metrics.stats import Interval
from socialworld.records import Document
from socialworld.swm.config import TomConfig
from socialworld.swm.s3ap import S3AP_VERSION, S3APDocument, S3APStep
from socialworld.text.templates import (
    TOM_PARSE_RETRY,
    TOM_PARSE_SYSTEM,
    TOM_PROMPT_VERSION,
    TOM_QA_S3AP,
    TOM_QA_SYSTEM,
    TOM_QA_USER,
    TOM_QUESTIONS,
    TOM_SENTENCES,
    TOM_STORY_VERSION,
    WORLD_NOTHING,
    WORLD_ORGANISER,
    WORLD_QA_SYSTEM,
    WORLD_QUESTIONS,
    WORLD_SENTENCES,
    WORLD_STORY_VERSION,
)
from socialworld.world.rng import WorldRNG, derive_seed
from socialworld.world.spec import ScenarioSpec

NAMES = ("Sally", "Anne", "Tom", "Mia", "Omar", "Lena", "Ravi", "Yuki")
OBJECTS = ("ball", "key", "apple", "book", "marble", "scarf")
CONTAINERS = ("basket", "box", "drawer", "cupboard", "bag", "jar")
ROOM = "room"
SAME_AS_STATE = "<same_as_state />"
NOT_OBSERVED = "none"
QuestionKind = Literal["reality", "first_order", "second_order"]


def same_as_last_action(actor: str) -> str:
    return f"<same_as_last_action_{actor} />"


class StoryEvent(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["enter", "leave", "place", "move", "propose"]
    agent: str
    dest: str | None = None
    obj: str | None = None
    """world stories: the decision a proposal is about"""


class Question(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: QuestionKind
    text: str
    answer: str
    about: list[str]
    """the agents the question is about (outer first)"""


class Story(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    version: Literal["tom-story-v1", "world-story-v1"] = TOM_STORY_VERSION
    id: str
    seed: int
    agents: list[str]
    obj: str
    containers: list[str]
    events: list[StoryEvent]
    sentences: list[str]
    questions: list[Question]
    reference: S3APDocument

    @property
    def text(self) -> str:
        return " ".join(self.sentences)


@dataclass
class _Tracker:
    """Truth and nested beliefs of one story, event by event."""

    agents: list[str]
    present: set[str] = field(default_factory=set)
    loc: str | None = None
    belief: dict[str, str] = field(default_factory=dict)
    belief2: dict[tuple[str, str], str] = field(default_factory=dict)
    """(a, b) -> where a thinks b thinks the object is"""

    def apply(self, ev: StoryEvent) -> None:
        if ev.kind == "enter":
            self.present.add(ev.agent)
        elif ev.kind == "leave":
            self.present.discard(ev.agent)
        else:
            assert ev.agent in self.present and ev.dest is not None
            self.loc = ev.dest
            for a in self.present:
                self.belief[a] = ev.dest
                for b in self.present:
                    self.belief2[(a, b)] = ev.dest

    def state(self, obj: str) -> str:
        who = ", ".join(a for a in self.agents if a in self.present) or "nobody"
        where = f"the {obj} is in the {self.loc}" if self.loc else f"the {obj} is nowhere yet"
        return f"In the {ROOM}: {who}; {where}."


def _sentence(ev: StoryEvent, obj: str) -> str:
    return TOM_SENTENCES[ev.kind].format(agent=ev.agent, room=ROOM, obj=obj, dest=ev.dest)


def generate_story(seed: int, n_agents: int = 3, n_extra: int = 3) -> Story:
    """A location-tracking story: everyone enters, one agent places the object, someone leaves,
    someone else moves the object (a false belief), then ``n_extra`` random enter/leave/move events."""
    if not 2 <= n_agents <= len(NAMES):
        raise ValueError(f"n_agents must be in 2..{len(NAMES)}")
    rng = WorldRNG(derive_seed(seed, "tom-story"))
    agents = rng.shuffled(NAMES)[:n_agents]
    obj = rng.choice(OBJECTS)
    containers = rng.shuffled(CONTAINERS)[:3]
    events = [StoryEvent(kind="enter", agent=a) for a in agents]
    events.append(StoryEvent(kind="place", agent=agents[0], dest=containers[0]))
    events.append(StoryEvent(kind="leave", agent=agents[0]))
    events.append(StoryEvent(kind="move", agent=agents[1], dest=containers[1]))
    tr = _Tracker(agents)
    for ev in events:
        tr.apply(ev)
    for _ in range(n_extra):
        options = [StoryEvent(kind="enter", agent=a) for a in agents if a not in tr.present]
        options += [StoryEvent(kind="leave", agent=a) for a in agents if a in tr.present and len(tr.present) > 1]
        options += [StoryEvent(kind="move", agent=a, dest=c) for a in agents if a in tr.present for c in containers if c != tr.loc]
        ev = rng.choice(options)
        events.append(ev)
        tr.apply(ev)
    tr = _Tracker(agents)
    steps = []
    for t, ev in enumerate(events):
        before = set(tr.present)
        tr.apply(ev)
        saw = before | tr.present  # the leaver sees itself leave, the one entering sees itself enter
        observations = {a: SAME_AS_STATE if a == ev.agent else same_as_last_action(ev.agent) if a in saw else NOT_OBSERVED
                        for a in agents}
        steps.append(S3APStep(timestep=t, state=tr.state(obj), observations=observations,
                              actions={a: (_sentence(ev, obj) if a == ev.agent else NOT_OBSERVED) for a in agents}))
    questions = [Question(kind="reality", text=TOM_QUESTIONS["reality"].format(obj=obj), answer=tr.loc or "", about=[])]
    questions += [Question(kind="first_order", text=TOM_QUESTIONS["first_order"].format(a=a, obj=obj), answer=tr.belief[a],
                           about=[a]) for a in agents]
    questions += [Question(kind="second_order", text=TOM_QUESTIONS["second_order"].format(a=a, b=b, obj=obj),
                           answer=tr.belief2[(a, b)], about=[a, b]) for a in agents for b in agents if a != b]
    sid = f"tom-{seed}"
    return Story(id=sid, seed=seed, agents=agents, obj=obj, containers=containers, events=events,
                 sentences=[_sentence(ev, obj) for ev in events], questions=questions,
                 reference=S3APDocument(scenario_id=sid, seed=seed, agents=agents, timesteps=steps))


def generate_stories(seed: int, n: int, **kw) -> list[Story]:
    return [generate_story(derive_seed(seed, "tom", i), **kw) for i in range(n)]


# ------------------------------------------------------------------ world episodes as stories


@dataclass
class _WorldTracker:
    """Who is in the room and, per decision, the last proposal: the truth, what each agent heard
    last, and what each agent can assume another heard (the last proposal both were there for)."""

    agents: list[str]
    present: set[str] = field(default_factory=set)
    loc: dict[str, str] = field(default_factory=dict)
    belief: dict[tuple[str, str], str] = field(default_factory=dict)
    belief2: dict[tuple[str, str, str], str] = field(default_factory=dict)

    def apply(self, ev: StoryEvent) -> None:
        if ev.kind == "enter":
            self.present.add(ev.agent)
        elif ev.kind == "leave":
            self.present.discard(ev.agent)
        elif ev.kind == "propose":
            assert ev.obj is not None and ev.dest is not None
            self.loc[ev.obj] = ev.dest
            for a in self.present:
                self.belief[(a, ev.obj)] = ev.dest
                for b in self.present:
                    self.belief2[(a, b, ev.obj)] = ev.dest
        else:
            raise ValueError(f"a world story has no {ev.kind!r} events")

    def state(self) -> str:
        who = ", ".join(a for a in self.agents if a in self.present) or "nobody"
        proposed = ", ".join(f"{k}={v}" for k, v in sorted(self.loc.items())) or "nothing"
        return f"In the {ROOM}: {who}; proposed: {proposed}."


def _world_sentence(ev: StoryEvent) -> str:
    if ev.kind == "propose":
        return WORLD_SENTENCES["propose"].format(agent=ev.agent, obj=ev.obj, dest=ev.dest)
    return _sentence(ev, "")


def _world_reference(sid: str, seed: int, agents: list[str], events: Sequence[StoryEvent]) -> tuple[S3APDocument, _WorldTracker]:
    tr, steps = _WorldTracker(agents), []
    for t, ev in enumerate(events):
        before = set(tr.present)
        tr.apply(ev)
        saw = before | tr.present
        steps.append(S3APStep(
            timestep=t, state=tr.state(),
            observations={a: SAME_AS_STATE if a == ev.agent else same_as_last_action(ev.agent) if a in saw else NOT_OBSERVED
                          for a in agents},
            actions={a: (_world_sentence(ev) if a == ev.agent else NOT_OBSERVED) for a in agents}))
    return S3APDocument(scenario_id=sid, seed=seed, agents=agents, timesteps=steps), tr


def world_story(ep) -> Story | None:
    """One of our world's episodes as a location-tracking story (``world-story-v1``): the
    organiser and the NPCs enter and leave as they did, and every executed proposal is told as
    "Organiser proposes the OPTION for the DECISION." Questions ask which option was proposed last
    (reality), which one each NPC heard last (first order: they only hear proposals made while
    they are in the room), and which one an NPC can assume another heard (second order). Exact
    answers and reference S3AP come from the record; None when the episode has no proposal."""
    if not ep.steps:
        return None
    first = ep.steps[0].observation.structured
    names = {n["id"]: n["name"] for n in first["npcs"]}
    options = {s["id"]: [o["id"] for o in s["options"]] for s in first["slots"]}
    agents = [WORLD_ORGANISER, *names.values()]
    events = [StoryEvent(kind="enter", agent=WORLD_ORGANISER)]
    here: set[str] = set()

    def presence(now: dict[str, bool]) -> None:
        for nid, name in names.items():
            if now.get(nid) and name not in here:
                here.add(name)
                events.append(StoryEvent(kind="enter", agent=name))
            elif not now.get(nid) and name in here:
                here.discard(name)
                events.append(StoryEvent(kind="leave", agent=name))

    for st in ep.steps:
        presence({n["id"]: n["present"] for n in st.observation.structured["npcs"]})
        a = st.action.executed
        if a.startswith("propose("):
            slot, option, _ = [x.strip() for x in a[len("propose("):-1].split(",")]
            events.append(StoryEvent(kind="propose", agent=WORLD_ORGANISER, obj=slot, dest=option))
    presence(ep.final.present)
    proposed = list(dict.fromkeys(e.obj for e in events if e.kind == "propose" and e.obj is not None))
    if not proposed:
        return None
    sid = f"world-{ep.scenario_id}-{ep.seed}"
    reference, tr = _world_reference(sid, ep.seed, agents, events)
    npcs = list(names.values())
    questions = []
    for obj in proposed:
        questions.append(Question(kind="reality", text=WORLD_QUESTIONS["reality"].format(obj=obj), answer=tr.loc[obj], about=[]))
        questions += [Question(kind="first_order", text=WORLD_QUESTIONS["first_order"].format(a=a, obj=obj),
                               answer=tr.belief.get((a, obj), WORLD_NOTHING), about=[a]) for a in npcs]
        questions += [Question(kind="second_order", text=WORLD_QUESTIONS["second_order"].format(a=a, b=b, obj=obj),
                               answer=tr.belief2.get((a, b, obj), WORLD_NOTHING), about=[a, b])
                      for a in npcs for b in npcs if a != b]
    containers = [o for obj in proposed for o in options[obj]] + [WORLD_NOTHING]
    return Story(version=WORLD_STORY_VERSION, id=sid, seed=ep.seed, agents=agents, obj=", ".join(proposed),
                 containers=list(dict.fromkeys(containers)), events=events,
                 sentences=[_world_sentence(e) for e in events], questions=questions, reference=reference)


def world_stories(seed: int, n: int, policy: str = "expert", specs: Sequence[ScenarioSpec] | None = None) -> list[Story]:
    """``n`` stories from episodes of ``policy`` over ``specs`` (default: the shipped scenarios)
    in turn (episodes without a proposal are skipped; at most ``4 n`` episodes are tried)."""
    from socialworld.agents.registry import make_policy
    from socialworld.rollout.runner import EpisodeJob, run_episodes
    from socialworld.world.spec import load_builtin_scenarios

    specs = sorted(specs or load_builtin_scenarios().values(), key=lambda s: (s.tier, s.id))
    jobs = [EpisodeJob(specs[i % len(specs)], derive_seed(seed, "tom-world", i)) for i in range(4 * n)]
    out: list[Story] = []
    for ep in run_episodes(make_policy(policy, seed=seed), jobs):
        story = world_story(ep)
        if story is not None and len(out) < n:
            out.append(story)
    return out


# ------------------------------------------------------------------ S3AP parsing


def validate_s3ap(text: str) -> tuple[S3APDocument | None, list[str]]:
    """Parse model output as an S3AP document: the first JSON object in ``text``, the schema, then
    consistency (observations and actions only for listed agents, timesteps 0..T-1 in order)."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        return None, ["no JSON object found"]
    try:
        doc = S3APDocument.model_validate(json.loads(text[start:end + 1]))
    except json.JSONDecodeError as err:
        return None, [f"invalid JSON: {err.msg} at character {err.pos}"]
    except ValidationError as err:
        return None, [f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in err.errors()[:8]]
    errors = []
    if doc.version != S3AP_VERSION:
        errors.append(f"version must be {S3AP_VERSION}")
    for i, st in enumerate(doc.timesteps):
        if st.timestep != i:
            errors.append(f"timesteps[{i}].timestep is {st.timestep}, expected {i}")
        for part in ("observations", "actions"):
            unknown = sorted(set(getattr(st, part)) - set(doc.agents))
            if unknown:
                errors.append(f"timesteps[{i}].{part}: unknown agents {unknown}")
    return (None, errors) if errors else (doc, [])


@dataclass(frozen=True)
class ParseResult:
    doc: S3APDocument | None
    attempts: int
    errors: list[list[str]]
    """validation errors of each failed attempt"""


def parse_messages(story_text: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": TOM_PARSE_SYSTEM}, {"role": "user", "content": story_text}]


Tick = Callable[[Any], None]
Progress = Callable[[str, int], Tick]
"""``progress(what, total)`` -> a callback ticked once per item done (the CLI draws bars with it)"""


def _in_chunks(call: Callable[[list], list], items: Sequence, tick: Tick | None, chunk: int) -> list:
    """``call(items)``, made ``chunk`` items at a time when ``tick`` is given (a multiple of the
    backend's batch size: its batches, and so its output, stay those of one call), ``tick`` once
    per item done."""
    if tick is None:
        return call(list(items))
    out: list = []
    for start in range(0, len(items), chunk):
        part = list(items[start : start + chunk])
        out += call(part)
        for item in part:
            tick(item)
    return out


def _chunk(backend) -> int:
    """Items per backend call under a progress bar: four of its batches (or 32)."""
    return 4 * getattr(backend, "batch_size", 8)


def parse_s3ap(backend, texts: Sequence[str], max_retries: int = 2, progress: Progress | None = None) -> list[ParseResult]:
    """S3AP documents for narratives from any backend with ``complete(conversations)``; an invalid
    reply is answered with its validation errors, at most ``max_retries`` times. A backend error
    counts as a failed attempt with that error. ``progress(what, total)`` may return a per-item
    callback (the CLI's bars)."""
    convs = [parse_messages(t) for t in texts]
    docs: list[S3APDocument | None] = [None] * len(texts)
    errors: list[list[list[str]]] = [[] for _ in texts]
    attempts = [0] * len(texts)
    todo = list(range(len(texts)))
    for attempt in range(max_retries + 1):
        if not todo:
            break
        tick = progress(f"tom: S3AP parse, attempt {attempt + 1} (stories)", len(todo)) if progress else None
        outs = _in_chunks(backend.complete, [convs[i] for i in todo], tick, _chunk(backend))
        left = []
        for i, out in zip(todo, outs):
            attempts[i] += 1
            doc, errs = (None, [f"backend error: {out.error}"]) if out.error else validate_s3ap(out.text)
            if doc is not None:
                docs[i] = doc
                continue
            errors[i].append(errs)
            convs[i] = convs[i] + [{"role": "assistant", "content": out.text},
                                   {"role": "user", "content": TOM_PARSE_RETRY.format(errors="; ".join(errs))}]
            left.append(i)
        todo = left
    return [ParseResult(d, a, e) for d, a, e in zip(docs, attempts, errors)]


_WORLD_PROPOSE = re.compile("^" + re.escape(WORLD_SENTENCES["propose"]).replace(r"\{agent\}", r"(?P<agent>\w+)")
                            .replace(r"\{obj\}", r"(?P<obj>\w+)").replace(r"\{dest\}", r"(?P<dest>\w+)") + "$")
_PATTERNS = {kind: re.compile("^" + re.escape(t).replace(r"\{agent\}", r"(?P<agent>\w+)").replace(r"\{room\}", r"\w+")
                              .replace(r"\{obj\}", r"(?P<obj>\w+)").replace(r"\{dest\}", r"(?P<dest>\w+)") + "$")
             for kind, t in TOM_SENTENCES.items()}


@dataclass
class ScriptedS3APParser:
    """A reference parser backend: reads the story sentences with the templates' own patterns and
    replays them through the story tracker (exact on generated stories; anything else -> ``{}``)."""

    name: str = "scripted-s3ap"
    decoding: dict = field(default_factory=lambda: {"strategy": "rules"})

    def complete(self, conversations):
        from socialworld.agents.lm.backends import Completion

        return [Completion(self._parse(c[1]["content"])) for c in conversations]

    def _parse(self, text: str) -> str:
        events, obj = [], None
        for sent in re.split(r"(?<=\.)\s+", text.strip()):
            m = _WORLD_PROPOSE.match(sent)
            if m:
                events.append(StoryEvent(kind="propose", agent=m["agent"], obj=m["obj"], dest=m["dest"]))
                continue
            for kind, pat in _PATTERNS.items():
                m = pat.match(sent)
                if m:
                    events.append(StoryEvent(kind=kind, agent=m["agent"], dest=m.groupdict().get("dest")))  # type: ignore[arg-type]
                    obj = m.groupdict().get("obj") or obj
                    break
            else:
                return "{}"
        agents = list(dict.fromkeys(e.agent for e in events))
        if any(e.kind == "propose" for e in events):
            if any(e.kind in ("place", "move") for e in events):
                return "{}"
            return _world_reference("tom", 0, agents, events)[0].model_dump_json()
        tr, steps = _Tracker(agents), []
        for t, ev in enumerate(events):
            before = set(tr.present)
            tr.apply(ev)
            saw = before | tr.present
            steps.append(S3APStep(
                timestep=t, state=tr.state(obj or "object"),
                observations={a: SAME_AS_STATE if a == ev.agent else same_as_last_action(ev.agent) if a in saw else NOT_OBSERVED
                              for a in agents},
                actions={a: (_sentence(ev, obj or "object") if a == ev.agent else NOT_OBSERVED) for a in agents}))
        return S3APDocument(scenario_id="tom", seed=0, agents=agents, timesteps=steps).model_dump_json()


def observation_accuracy(doc: S3APDocument | None, reference: S3APDocument) -> float:
    """Share of the reference's (timestep, agent) observation tags that ``doc`` has, equal up to
    surrounding whitespace (a missing timestep or agent counts as wrong)."""
    cells = [(t, a, o.strip()) for t, st in enumerate(reference.timesteps) for a, o in st.observations.items()]
    if not cells:
        raise ValueError("the reference has no observations")
    if doc is None:
        return 0.0
    got = {(t, a): o.strip() for t, st in enumerate(doc.timesteps) for a, o in st.observations.items()}
    return sum(got.get((t, a)) == o for t, a, o in cells) / len(cells)


def parser_quality(result: ParseResult, reference: S3APDocument) -> dict[str, float]:
    """``0.3 * structural + 0.7 * observation_accuracy``; structural = 1 when the parse validated."""
    structural = float(result.doc is not None)
    acc = observation_accuracy(result.doc, reference)
    return {"structural": structural, "observation_accuracy": acc, "quality": 0.3 * structural + 0.7 * acc}


# ------------------------------------------------------------------ question answering


def qa_messages(story: Story, q: Question, s3ap: S3APDocument | None) -> list[dict[str, str]]:
    """The QA prompt (``tom-v1``), with the S3AP document in it when given."""
    extra = TOM_QA_S3AP.format(s3ap=s3ap.model_dump_json()) if s3ap is not None else ""
    system = WORLD_QA_SYSTEM if story.version == WORLD_STORY_VERSION else TOM_QA_SYSTEM
    return [{"role": "system", "content": system},
            {"role": "user", "content": TOM_QA_USER.format(story=story.text, s3ap=extra, question=q.text,
                                                           options=", ".join(story.containers))}]


def answer_questions(backend, items: Sequence[tuple[Story, Question, S3APDocument | None]], tick: Tick | None = None
                     ) -> list[str | None]:
    """One answer per item: a local model picks one container under constrained decoding; other
    backends answer freely and the first container named is the answer (None if none is).
    ``tick``: called once per item answered."""
    convs = [qa_messages(s, q, d) for s, q, d in items]
    if backend.local:
        from socialworld.agents.lm.constrained import Choice

        programs = [[Choice("answer", tuple(s.containers))] for s, _, _ in items]
        outs = _in_chunks(lambda part: backend.constrained([c for c, _ in part], [p for _, p in part]),
                          list(zip(convs, programs)), tick, _chunk(backend))
        return [o.text.strip() for o in outs]
    answers: list[str | None] = []
    for (s, _, _), out in zip(items, _in_chunks(backend.complete, convs, tick, _chunk(backend))):
        hits = sorted((m.start(), c) for c in s.containers for m in [re.search(rf"\b{c}\b", out.text.lower())] if m)
        answers.append(hits[0][1] if hits and not out.error else None)
    return answers


__all__ = ["Story", "Question", "StoryEvent", "ParseResult", "ScriptedS3APParser", "generate_story", "generate_stories",
           "validate_s3ap", "parse_s3ap", "observation_accuracy", "parser_quality", "qa_messages", "answer_questions",
           "TOM_PROMPT_VERSION", "world_story", "world_stories"]


# ------------------------------------------------------------------ the evaluation


S3AP_SOURCES = ("none", "reference", "parsed")
"""QA prompt variants: no S3AP, the exact reference S3AP, the model's own parse (none where it failed)"""


def _evaluate_source(backend, stories: Sequence[Story], max_retries: int, iv, progress: Progress | None = None,
                     what: str = "") -> tuple[dict[str, ParserScores], dict[str, QAScores], list[dict]]:
    """Parser rows (the model and the scripted parser), QA per S3AP source and question kind, and
    the answer rows, for one set of stories."""
    parsers = {"model": backend, "scripted": ScriptedS3APParser()}
    parses = {name: parse_s3ap(p, [s.text for s in stories], max_retries, progress if name == "model" else None)
              for name, p in parsers.items()}
    parser_rows = {}
    for name, results in parses.items():
        q = [parser_quality(r, s.reference) for r, s in zip(results, stories)]
        parser_rows[name] = ParserScores(quality=iv([x["quality"] for x in q]), structural=iv([x["structural"] for x in q]),
                                         observation_accuracy=iv([x["observation_accuracy"] for x in q]),
                                         attempts=sum(r.attempts for r in results), valid=sum(r.doc is not None for r in results))
    docs: dict[str, list[S3APDocument | None]] = {"none": [None] * len(stories), "reference": [s.reference for s in stories],
                                                  "parsed": [r.doc for r in parses["model"]]}
    rows, qa = [], {}
    for source in S3AP_SOURCES:
        items = [(s, q, d) for s, d in zip(stories, docs[source]) for q in s.questions]
        answers = answer_questions(backend, items, progress(f"tom: QA{what}, S3AP {source} (questions)", len(items))
                                   if progress else None)
        correct = [float(a == q.answer) for (_, q, _), a in zip(items, answers)]
        by_kind = {kind: iv([c for c, (_, q, _) in zip(correct, items) if q.kind == kind])
                   for kind in ("reality", "first_order", "second_order")}
        qa[source] = QAScores(all=iv(correct), unanswered=sum(a is None for a in answers), **by_kind)
        rows += [{"story": s.id, "source": source, "kind": q.kind, "question": q.text, "answer": q.answer, "given": a}
                 for (s, q, _), a in zip(items, answers)]
    return parser_rows, qa, rows


TOM_RESULT_SCHEMA: Final = "tom-result-v1"


class ParserScores(Document):
    """An S3AP parser's quality over a set of stories (means with 95% bootstrap intervals)."""

    quality: Interval
    structural: Interval
    observation_accuracy: Interval
    attempts: int
    valid: int
    """stories whose parse validated"""


class QAScores(Document):
    """QA accuracy with one S3AP source in the prompt, per question kind."""

    all: Interval
    reality: Interval
    first_order: Interval
    second_order: Interval
    unanswered: int


class WorldStoriesScores(Document):
    """The same scores on stories told from world episodes."""

    story_version: str
    stories: int
    parser: dict[str, ParserScores]
    qa: dict[str, QAScores]
    scenarios: dict[str, str]
    """scenario id -> content hash of the scenarios the stories came from"""
    questions: int


class TomResult(Document):
    """``tom.json``: parser quality and QA accuracy per S3AP source."""

    schema_version: Literal["tom-result-v1"] = TOM_RESULT_SCHEMA
    prompt_version: str
    story_version: str
    model: str
    config: TomConfig
    parser: dict[str, ParserScores]
    """parser (model, scripted) -> scores"""
    qa: dict[str, QAScores]
    """S3AP source (none, reference, parsed) -> accuracy"""
    questions: int
    world: WorldStoriesScores | None = None


def evaluate_tom(cfg: TomConfig, backend=None, progress: Progress | None = None) -> TomResult:
    """Parser quality (the model and the scripted reference parser) and QA accuracy per S3AP
    source and question kind, each a mean with a 95% bootstrap interval; writes ``tom.json`` and
    ``answers.jsonl`` to ``cfg.out`` atomically. ``backend`` overrides ``cfg.model`` (tests);
    ``progress(what, total)`` may return a per-item callback (the CLI's bars)."""
    from pathlib import Path

    from socialworld.metrics.stats import bootstrap
    from socialworld.records import atomic_write_text
    from socialworld.world.spec import resolve_scenarios

    specs = resolve_scenarios(list(cfg.scenarios) or None) if cfg.world_stories > 0 else []  # checked before the model loads
    if backend is None:
        from socialworld.agents.registry import make_backend

        backend = make_backend(cfg.model, max_new_tokens=cfg.parse_tokens, batch_size=cfg.batch_size)
    stories = generate_stories(cfg.seed, cfg.stories, n_agents=cfg.agents, n_extra=cfg.extra_events)

    def iv(values: Sequence[float]) -> Interval:
        return bootstrap(values, seed=cfg.seed)

    parser_rows, qa, rows = _evaluate_source(backend, stories, cfg.max_retries, iv, progress)
    world = world_stories(cfg.seed, cfg.world_stories, specs=specs) if cfg.world_stories > 0 else []
    world_doc = None
    if world:
        w_parser, w_qa, w_rows = _evaluate_source(backend, world, cfg.max_retries, iv, progress, " (world stories)")
        rows += w_rows
        world_doc = WorldStoriesScores(story_version=WORLD_STORY_VERSION, stories=len(world), parser=w_parser, qa=w_qa,
                                       scenarios={s.id: s.content_hash for s in specs}, questions=len(w_rows) // len(S3AP_SOURCES))
    doc = TomResult(prompt_version=TOM_PROMPT_VERSION, story_version=TOM_STORY_VERSION, model=getattr(backend, "name", cfg.model),
                    config=cfg, parser=parser_rows, qa=qa, questions=sum(len(s.questions) for s in stories), world=world_doc)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "answers.jsonl", "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    atomic_write_text(out / "tom.json", doc.to_json())
    return doc
