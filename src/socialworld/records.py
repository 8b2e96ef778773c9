"""Typed, versioned five-dimensional trajectory records (contract §4).

A :class:`StepRecord` carries the five dimensions — setting, observation, mental state,
action, dialogue — plus its signals (each a :class:`Signal` with provenance) and the
policy that acted. An :class:`EpisodeRecord` holds the steps, the final state summary,
metrics, diagnostics and lineage. Records round-trip through JSONL and Parquet exactly.
"""

from __future__ import annotations

import functools
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Final, Iterable, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from socialworld.metric_registry import SIGNAL_KEYS, metric

STEP_SCHEMA: Final = "step-v1"
EPISODE_SCHEMA: Final = "episode-v1"
JUDGE_SCHEMA: Final = "judge-v1"

R = TypeVar("R", bound=BaseModel)
TMP_MARK = "swtmp-"
"""in the name of every temporary file or folder the project makes beside an artifact
(``.<name>.swtmp-XXXXXXXX``), so a run started again removes exactly what a killed run left"""
Source = Literal["direct", "fused", "degraded", "proxy", "missing"]


class _Rec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Document(BaseModel):
    """A typed result file (a command's JSON document), or a part of one: a file's top-level type
    names its ``schema_version``; :meth:`to_json` is the file's canonical text (every field, nulls
    included)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=1, sort_keys=True) + "\n"


class Signal(_Rec):
    """A value with its provenance: where it came from and how much to trust it."""

    value: float | None
    source: Source
    confidence: float = Field(ge=0, le=1)
    detail: str = ""


class Setting(_Rec):
    scenario_id: str
    tier: str
    seed: int
    step: int
    turn_budget: int


class ObservationRec(_Rec):
    structured: dict[str, Any]
    text: str
    provenance: dict[str, Source]


class MentalStateRec(_Rec):
    stated: dict[str, Any] | None
    """the policy's estimate (None: nothing parseable was stated)"""
    truth: dict[str, Any]
    """the true values, for scoring only; never shown to the policy"""


class ActionRec(_Rec):
    structured: dict[str, str | None] | None
    raw: str
    parse_status: Literal["ok", "unparseable", "illegal"]
    error: str | None
    executed: str
    """canonical key of what the world executed (``wait()`` for unparseable/illegal)"""
    foresight: dict[str, Any] | None = None
    """Foresee-and-Act only: the draft, each foreseen candidate's predicted S3AP step and score,
    the world model, and whether the draft was replaced (absent for every other policy)"""
    failure: Literal["endpoint"] | None = None
    """``endpoint``: no reply came back (a transport or API failure; ``error`` says which), counted
    apart from replies that did not parse; the world treats the step as it treats any step without
    a usable action"""


def _absent(value: Any) -> bool:
    return value is None


VoiceStatus = Literal["voiced", "cut", "leak", "empty", "not_text", "failed"]
"""what became of one voiced NPC line (:mod:`socialworld.world.voice`): ``voiced`` and ``cut`` reach the
agent in the voice's words; ``leak``, ``empty``, ``not_text`` and ``failed`` reach it as the template line"""


class ReplyVoice(_Rec):
    """How an NPC line was voiced (:mod:`socialworld.world.voice`); absent under the templates."""

    status: VoiceStatus
    """``voiced``/``cut``: the agent heard the voice's words; otherwise it heard the template line"""
    template: str
    """the line the rules wrote"""
    prompt_hash: str
    detail: str = ""


class Reply(_Rec):
    speaker: str
    text: str
    """what the agent heard"""
    voice: ReplyVoice | None = Field(default=None, exclude_if=_absent)
    """set only where a voice spoke (records of template runs are as before)"""


class DialogueRec(_Rec):
    utterance: str
    replies: list[Reply]
    announcements: list[str]


class StepSignals(_Rec):
    align: Signal
    reward: Signal
    penalty: Signal
    q: Signal
    moods: dict[str, Signal]
    phi: float
    """task progress Phi after the step"""
    penalty_reasons: list[str]
    q_features: dict[str, float]
    leaked: list[str]


class Message(_Rec):
    role: str
    content: str


class PromptRec(_Rec):
    """What a language model received for one decision: its prompt template version and the
    chat messages exactly as sent (the token count is :attr:`PolicyRec.tokens_in`)."""

    version: str
    messages: list[Message]


class PolicyRec(_Rec):
    policy_id: str
    version: str | None = None
    """a scripted policy's rule version (``expert-v2``); None for language models (their prompt
    version is in ``decoding``) and in records written before the field existed"""
    base_model: str | None = None
    adapter_hash: str | None = None
    decoding: dict[str, Any] = Field(default_factory=dict)
    tokens_in: int = 0
    tokens_out: int = 0
    latency_s: float = 0.0
    prompt: PromptRec | None = None
    """a language model's prompt at this step (None for scripted policies, and in records written
    before the field existed)"""


class StepRecord(_Rec):
    schema_version: Literal["step-v1"] = STEP_SCHEMA
    setting: Setting
    observation: ObservationRec
    mental_state: MentalStateRec
    action: ActionRec
    dialogue: DialogueRec
    signals: StepSignals
    policy: PolicyRec


class FinalState(_Rec):
    subgoals: dict[str, bool]
    moods: dict[str, float]
    present: dict[str, bool]
    phi_0: float
    phi_T: float
    steps: int
    t_ref: int
    end_reason: str
    commitments: list[dict[str, Any]]
    leaks: int


class Metrics(_Rec):
    contract: str = "metrics-v1"
    """the metrics contract the values were computed under (contract §5.1); records written before
    the field existed were made under ``metrics-v1`` (guards counted in CR)"""
    U: Signal
    A_e: Signal
    S_npc: Signal
    D: Signal
    CR: Signal
    passed: bool
    solved: bool = False
    """every decision finalized and no guard broken (metrics-v2)"""
    guards_broken: list[str] = []
    """guards (constraints) broken at the end; any one fails the episode (metrics-v2)"""
    cr_threshold: float
    d_threshold: float


class Check(_Rec):
    step: int
    name: str
    ok: bool
    confidence: float
    detail: str = ""


class Diagnostics(_Rec):
    representative_steps: list[int]
    observation_summary: str
    checks: list[Check]
    attribution: dict[str, float]
    """failure category -> confidence (empty when the episode passed)"""
    primary_failure: str | None


class VoiceInfo(_Rec):
    """The voice that wrote a voiced episode's NPC lines."""

    model: str
    prompt_version: str
    decoding: dict[str, Any]


class Lineage(_Rec):
    framework_version: str
    spec_hash: str
    world_snapshot_version: str
    templates: dict[str, str]
    run_seed: int | None = None
    chain: dict[str, Any] | None = None
    """episode chains only: chain id, position, memory mode and the carry-over applied to the cast"""
    voice: VoiceInfo | None = Field(default=None, exclude_if=_absent)
    """the NPC voice of a voiced episode (absent under the templates)"""


class EpisodeRecord(_Rec):
    schema_version: Literal["episode-v1"] = EPISODE_SCHEMA
    episode_id: str
    scenario_id: str
    tier: str
    seed: int
    policy_id: str
    steps: list[StepRecord]
    final: FinalState
    metrics: Metrics | None = None
    diagnostics: Diagnostics | None = None
    lineage: Lineage


class JudgeRec(_Rec):
    """An LM judge's scores of one episode (contract §3.5), kept beside the episode's records and
    never in place of the rule metrics. Each score is a :class:`Signal` with source ``proxy`` and
    detail ``llm_judge:<model>``; a judge that gave no usable reply leaves ``scores`` empty and
    says why in ``failure`` (``endpoint``: no reply; ``unparseable``: a reply without every
    score), so a failure is counted, never a 0."""

    schema_version: Literal["judge-v1"] = JUDGE_SCHEMA
    episode_id: str
    judge: str
    """the judge's model spec"""
    prompt_version: str
    scores: dict[str, Signal]
    raw: str
    failure: Literal["endpoint", "unparseable"] | None = None
    error: str | None = None


# ------------------------------------------------------------------ IO


@functools.cache
def umask() -> int:
    """The process's file-creation mask (read from /proc where it can be, without touching it)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def shareable(path: str | Path) -> None:
    """Give a file or folder made by ``tempfile`` (mode 600/700, which survives the atomic rename)
    the mode an ordinary ``open``/``mkdir`` would: 666/777 less the umask, so a group that may read
    the folder can read the results."""
    os.chmod(path, (0o777 if Path(path).is_dir() else 0o666) & ~umask())


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write via a temporary file in the same folder and rename (never a half-written file); the
    file gets the umask's mode, like any file ``open`` makes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{TMP_MARK}", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        shareable(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


_UNSAFE = re.compile("[\u0085\u2028\u2029\ud800-\udfff]")
"""characters JSON may leave raw that break a line for ``str.splitlines`` (NEL, the Unicode line
and paragraph separators) or a UTF-8 write (lone surrogates)"""


def record_json(record: BaseModel) -> str:
    """A record as one line of JSON that any text survives: what a model wrote is kept exactly,
    with line separators (U+0085, U+2028, U+2029) and lone surrogates written as ``\\uXXXX``
    escapes (control characters are escaped by JSON itself), so the line is valid UTF-8 and no
    reader can split it. Read back with :func:`record_from_json`. (A high surrogate followed by a
    low one reads back as the one character the pair encodes, as in any UTF-16 or JSON text.)"""
    text = json.dumps(record.model_dump(mode="json"), ensure_ascii=False, separators=(",", ":"))
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def record_from_json(model: type[R], text: str) -> R:
    """Parse :func:`record_json`'s output (or any JSON of ``model``), lone-surrogate escapes included
    (which pydantic's own JSON parser refuses)."""
    return model.model_validate(json.loads(text))


def to_jsonl(episodes: Iterable[EpisodeRecord]) -> str:
    return "".join(record_json(e) + "\n" for e in episodes)


def write_jsonl(path: str | Path, episodes: Iterable[EpisodeRecord]) -> None:
    atomic_write_text(path, to_jsonl(episodes))


def read_jsonl(path: str | Path) -> list[EpisodeRecord]:
    out = []
    for i, line in enumerate(Path(path).read_text(encoding="utf-8").split("\n"), 1):  # "\n" only: see record_json
        if line.strip():
            try:
                out.append(record_from_json(EpisodeRecord, line))
            except ValueError as err:
                raise ValueError(f"{path}:{i}: not an episode record: {err}") from None
    return out


def write_parquet(path: str | Path, episodes: Iterable[EpisodeRecord]) -> None:
    """One row per episode: flat columns for filtering (ids, metric values) plus the full
    record as JSON in ``record`` (nested, scenario-dependent keys do not fit one Arrow schema)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for e in episodes:
        m = e.metrics
        rows.append(
            {
                "episode_id": e.episode_id,
                "scenario_id": e.scenario_id,
                "tier": e.tier,
                "seed": e.seed,
                "policy_id": e.policy_id,
                "steps": len(e.steps),
                "passed": None if m is None else m.passed,
                "solved": None if m is None else m.solved,
                "metrics_contract": None if m is None else m.contract,
                **{k: (None if m is None else getattr(m, metric(k).field).value) for k in SIGNAL_KEYS},
                "schema_version": e.schema_version,
                "record": record_json(e),
            }
        )
    schema = pa.schema(
        [
            ("episode_id", pa.string()),
            ("scenario_id", pa.string()),
            ("tier", pa.string()),
            ("seed", pa.int64()),
            ("policy_id", pa.string()),
            ("steps", pa.int32()),
            ("passed", pa.bool_()),
            ("solved", pa.bool_()),
            ("metrics_contract", pa.string()),
            *((k, pa.float64()) for k in SIGNAL_KEYS),
            ("schema_version", pa.string()),
            ("record", pa.string()),
        ]
    )
    table = pa.Table.from_pylist(rows, schema=schema)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{TMP_MARK}", suffix=".tmp")
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        shareable(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_parquet(path: str | Path) -> list[EpisodeRecord]:
    import pyarrow.parquet as pq

    return [record_from_json(EpisodeRecord, r) for r in pq.read_table(path, columns=["record"]).column("record").to_pylist()]


D = TypeVar("D", bound=Document)


def read_document(path: str | Path, kind: type[D]) -> D:
    """A typed document read back (an older version through its model's migration); a missing,
    malformed or unknown one raises ``ValueError`` naming the file."""
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ValueError(f"{path}: cannot read it: {err}") from err
    from pydantic import ValidationError

    try:
        return kind.model_validate_json(text)
    except ValidationError as err:
        problems = err.errors()
        first = problems[0]
        where = ".".join(str(x) for x in first["loc"]) or "the document"
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ValueError(f"{path}: not a {kind.__name__} document this version reads: {where}: {first['msg']}{more}") from None
    except ValueError as err:
        raise ValueError(f"{path}: not a {kind.__name__} document this version reads: {err}") from err
