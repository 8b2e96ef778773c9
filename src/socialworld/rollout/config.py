"""The configs of running policies (``socialworld eval``) and the checks other configs share: light
to import (the command line builds its options from them)."""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from socialworld.agents.models import parse_model_spec
from socialworld.agents.registry import NPC_VOICE_TEMPLATE, check_voice
from socialworld.config import SHARE, FieldError, above, at_least, check_fields, within
from socialworld.records import TMP_MARK

RAY_HELP = ("run the parallel work as Ray tasks: '' (off: one process), 'local' (a local Ray on this machine's CPUs), "
            "or a cluster address (ray://host:10001, auto); needs pip install 'socialworld[scale]'")


def check_ray(address: str) -> None:
    """Fail before any work when ``address`` asks for Ray and Ray is not installed."""
    if not address:
        return
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise ValueError(f"--ray {address}: Ray is not installed; pip install 'socialworld[scale]' (or drop --ray)")


NPC_VOICE_HELP = (
    "who words the NPCs' lines: template (the rules' own lines) or a model spec (bundled, a local folder, "
    "openai:<model>@<url>) that rewrites each line from what it reveals; the rules decide every response either way, "
    "and a voiced line that names what its template line does not is replaced by it and counted")


def check_npc_voice(voice: str, ray: str = "") -> None:
    """A config's ``npc_voice`` (``template`` or a language-model spec) as a field's error, before any
    work; a voice speaks in the process that evaluates, so never beside ``ray``'s rollouts."""
    try:
        check_voice(voice)
    except ValueError as err:
        raise FieldError("npc_voice", str(err)) from None
    if ray and voice != NPC_VOICE_TEMPLATE:
        raise FieldError("npc_voice", "a voice speaks in this process: run it without {ray}", related=("ray",))


def check_judge(judge: str) -> None:
    """A config's ``judge`` (empty: none) is a language-model spec; raises ``ValueError`` before any work."""
    from socialworld.agents.models import parse_model_spec

    if judge and parse_model_spec(judge).kind == "scripted":
        raise ValueError(f"the judge must be a language model spec, not the scripted policy {judge!r}")


@dataclass
class EvalConfig:
    """Configuration of ``socialworld eval``; each field's help is the CLI's help."""

    policy: str = field(
        default="expert",
        metadata={"help": ("policy: random, expert, oracle, bundled, a model path or hub id, or openai:<model>@<base_url>; "
                           "a local model with a trained run's adapters as <model>+<run folder>")},
    )
    tiers: list[str] | None = field(default=None, metadata={"help": "tiers to evaluate (L0, L1, L2); default all"})
    scenarios: list[str] | None = field(
        default=None, metadata={"commas": False, "help": "scenario ids or YAML paths; default all shipped scenarios"}
    )
    episodes: int = field(default=3, metadata={"check": at_least(1), "help": "episodes per scenario"})
    seed: int = field(default=0, metadata={"check": at_least(0), "help": "run seed; episode seeds are derived from it"})
    batch_size: int = field(default=64, metadata={"check": at_least(1), "help": "episodes advanced in lockstep per batch"})
    lm_batch_size: int = field(default=12, metadata={"check": at_least(1), "help": "language models: prompts per forward pass (or concurrent API calls)"})
    decoding: Literal["auto", "free", "constrained"] = field(
        default="auto",
        metadata={"help": ("language models: free (parse BELIEF/ACTION/SAY), constrained (greedy under the reply grammar: "
                           "parseable by construction; for an openai: endpoint the grammar goes as a regex in vLLM's "
                           "structured_outputs field), auto (constrained for local models; for an endpoint, constrained when one "
                           "probe request shows the server decodes under structured_outputs, else free: the choice "
                           "is printed and recorded)")},
    )
    max_new_tokens: int = field(default=64, metadata={"check": at_least(1), "help": "language models: tokens generated per free-form reply"})
    judge: str = field(default="", metadata={"help": (
        "an LM judge's model spec (off when empty): scores every episode 0-10 on goal and believability "
        "(SOTOPIA-style) from its public transcript, beside the rule metrics (source proxy, written to judge.jsonl)")})
    request_timeout: float = field(default=180.0, metadata={"check": above(0), "help": (
        "openai: endpoints: the most seconds one request may take, from connecting to the reply's last byte (a CPU "
        "server batching a lockstep step's requests under load took more than a minute)")})
    npc_voice: str = field(default="template", metadata={"help": NPC_VOICE_HELP})
    paired: bool = field(default=False, metadata={"help": (
        "with --npc-voice M: also play the same seeds with the template lines (records in <out>/template/) and report "
        "voiced - template for every metric, overall and by tier, with paired bootstrap intervals: how much of the "
        "policy's skill survives the voice's words")})
    out: Path | None = field(
        default=None,
        metadata={"help": "folder for episodes.jsonl, episodes.parquet, metrics.json [default: runs/eval-<policy>-s<seed>, "
                          "or the first of runs/eval-<policy>-s<seed>-2, -3, ... that holds no records]"},
    )
    overwrite: bool = field(default=False, metadata={"help": "replace the records already in the output folder"})
    ray: str = field(default="", metadata={"help": RAY_HELP + "; scripted and openai: policies only, one episode per task"})
    max_endpoint_failures: float = field(default=0.2, metadata={"check": SHARE, "help": (
        "language models: when more than this share of steps got no reply (a transport or API failure), the "
        "evaluation ends with an error instead of scores (the records are kept)")})

    def __post_init__(self) -> None:
        check_fields(self)
        check_ray(self.ray)
        kind = parse_model_spec(self.policy).kind  # a typo (or adapters that are not there) fails now
        check_judge(self.judge)
        check_npc_voice(self.npc_voice, self.ray)
        if self.paired and self.npc_voice == NPC_VOICE_TEMPLATE:
            raise FieldError("paired", "compares a voice with the templates: name the voice with {npc_voice}", related=("npc_voice",))
        if self.ray and kind not in ("scripted", "openai"):
            raise FieldError("policy", f"{self.policy!r} is a local model; {{ray}} spreads scripted and openai: policies only "
                             "(run it without it)", related=("ray",))

    def out_dir(self) -> Path:
        """``out``, or ``runs/eval-<policy>-s<seed>`` with every character of the policy spec that is
        not a letter, digit, ``.``, ``_`` or ``-`` written ``_`` (an ``openai:m@http://h:1/v1`` spec
        would otherwise nest folders, with colons no file system takes everywhere). Where that default
        already holds records (and not ``overwrite``), the first of ``<default>-2``, ``-3``, ... that
        holds none: the same command run twice keeps both runs. Resolve it once per run."""
        if self.out is not None:
            return Path(self.out)
        base = Path("runs") / f"eval-{re.sub(r'[^A-Za-z0-9._-]', '_', self.policy)}-s{self.seed}"
        out, n = base, 1
        while (out / "episodes.jsonl").exists() and not self.overwrite:
            n += 1
            out = base.with_name(f"{base.name}-{n}")
        return out

    def check_out(self) -> Path:
        """Before any work: the output folder is writable, and holds no records unless ``overwrite``."""
        out = self.out_dir()
        if (out / "episodes.jsonl").exists() and not self.overwrite:
            raise ValueError(f"{out} already holds an evaluation's records: use another --out, or --overwrite to replace them")
        try:
            out.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(dir=out, prefix=f".probe.{TMP_MARK}", suffix=".tmp")
            os.close(fd)
            os.unlink(probe)
        except OSError as err:
            raise ValueError(f"cannot write the records to {out}: {err.strerror or err}") from None
        return out


def help_for(cfg_type: Any, name: str) -> str:
    """The help of config field ``name`` (its ``metadata["help"]``)."""
    return cfg_type.__dataclass_fields__[name].metadata["help"]


@dataclass
class AuditConfig:
    """Configuration of ``socialworld judge-audit`` (:mod:`socialworld.rollout.audit`); each field's help is the CLI's help."""

    judge: str = field(default="", metadata={"help": "the LM judge's model spec (bundled, a local folder, openai:<model>@<url>)"})
    episodes: tuple[str, ...] = field(default=(), metadata={"commas": False, "help": (
        "episodes.jsonl files or folders holding one (an eval's --out), repeatable: the pool to judge; default: the "
        "policies' episodes on the same seeds, played now")})
    policies: tuple[str, ...] = field(default=("random", "expert", "oracle"), metadata={"help": (
        "policies whose episodes make the pool (any policy spec; failures, partial and full successes)")})
    tiers: tuple[str, ...] = field(default=("L0", "L1", "L2"), metadata={"help": "tiers of the pool's scenarios"})
    per_scenario: int = field(default=2, metadata={"check": at_least(1), "help": "episodes per scenario and policy (the same seeds for every policy)"})
    seed: int = field(default=0, metadata={"check": at_least(0), "help": "run seed: the pool's episode seeds and the bootstrap's"})
    npc_voice: str = field(default="template", metadata={"help": (
        "template, or a model spec: then every pool episode is played again with the NPCs' lines in its words, and "
        "the audit has a row for each")})
    pass_score: int = field(default=5, metadata={"check": within(0, 10), "help": "the judge's goal score (0-10) at or above which it passes an episode"})
    resamples: int = field(default=2_000, metadata={"check": at_least(1), "help": "bootstrap resamples per interval"})
    lm_batch_size: int = field(default=12, metadata={"check": at_least(1), "help": "language models: prompts per forward pass (or concurrent API calls)"})
    request_timeout: float = field(default=180.0, metadata={"check": above(0), "help": "openai: endpoints: the most seconds one request may take"})
    out: Path = field(default=Path("runs/judge-audit"), metadata={"help": "folder for pool.jsonl, judge.jsonl, audit.json, audit.md and audit.html (the table and its plots)"})

    def __post_init__(self) -> None:
        check_fields(self)
        check_judge(self.judge)
        check_npc_voice(self.npc_voice)
        if self.episodes and self.npc_voice != NPC_VOICE_TEMPLATE:
            raise FieldError("npc_voice", "voices the pool the audit plays; {episodes} are judged as they were played",
                             related=("episodes",))
        for p in self.policies:
            parse_model_spec(p)  # a typo fails now
