"""The configs of the social-world-model commands (``tom``, ``foresee``, ``chain``). Light to import:
the command line builds its options from them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from socialworld.config import FieldError, at_least, check_fields
from socialworld.rollout.config import NPC_VOICE_HELP, check_npc_voice


@dataclass(frozen=True)
class TomConfig:
    model: str = field(default="bundled", metadata={"help": "model answering and parsing: bundled, a local folder, or openai:<model>@<url>"})
    stories: int = field(default=12, metadata={"check": at_least(1), "help": "generated stories (each: 1 reality, n first-order, n(n-1) second-order questions)"})
    agents: int = field(default=3, metadata={"check": at_least(2), "help": "agents per story"})
    extra_events: int = field(default=3, metadata={"check": at_least(0), "help": "random events after the false-belief move"})
    seed: int = field(default=0, metadata={"check": at_least(0), "help": "story seed (and bootstrap seed)"})
    max_retries: int = field(default=1, metadata={"check": at_least(0), "help": "parser retries with the validation errors fed back"})
    parse_tokens: int = field(default=384, metadata={"check": at_least(1), "help": "most new tokens per parser reply"})
    batch_size: int = field(default=8, metadata={"check": at_least(1), "help": "prompts per forward pass"})
    world_stories: int = field(default=8, metadata={"check": at_least(0), "help": "stories from expert episodes of our own world (the second source; 0: none)"})
    scenarios: tuple[str, ...] = field(default=(), metadata={"commas": False, "help": (
        "scenario ids or YAML paths of your own the world stories come from (repeatable; default: the shipped scenarios)")})
    out: str = field(default="runs/tom", metadata={"help": "folder for tom.json and answers.jsonl"})

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass
class ForeseeConfig:
    """Configuration of ``socialworld foresee``; each field's help is the CLI's help."""

    policy: str = field(default="expert", metadata={"help": "the wrapped policy: expert, random, oracle, bundled, a model path, openai:<model>@<url>"})
    world_model: str = field(default="simulator", metadata={"help": "simulator (exact lookahead, privileged: an upper bound) or a model spec (bundled, a path, openai:...)"})
    tiers: list[str] | None = field(default=None, metadata={"help": "tiers to evaluate (L0, L1, L2); default all"})
    scenarios: list[str] | None = field(default=None, metadata={"commas": False, "help": "scenario ids or YAML paths; default all shipped scenarios"})
    episodes: int = field(default=3, metadata={"check": at_least(1), "help": "episodes per scenario (the same seeds for both sides)"})
    seed: int = field(default=0, metadata={"check": at_least(0), "help": "run seed: episode seeds, alternatives' shuffle and bootstrap"})
    alternatives: int = field(default=4, metadata={"check": at_least(0), "help": "legal alternatives foreseen next to the draft at each step"})
    margin: float = field(default=1.0, metadata={"check": at_least(0), "help": "an alternative replaces the draft only if its foresight score is at least this much higher"})
    refine: Literal["harmful", "argmax"] = field(default="harmful", metadata={"help": "harmful: refine only drafts foreseen to score below 0; argmax: take any alternative foreseen margin better"})
    lm_batch_size: int = field(default=12, metadata={"check": at_least(1), "help": "language models: prompts per forward pass"})
    out: str = field(default="runs/foresee", metadata={"help": "folder for plain/ and foresee/ episodes and foresee.json"})

    def __post_init__(self) -> None:
        check_fields(self)


MODES: tuple[Literal["none", "full", "summary"], ...] = ("none", "full", "summary")


@dataclass
class ChainConfig:
    """Configuration of ``socialworld chain``; each field's help is the CLI's help."""

    policy: str = field(default="expert", metadata={"help": "policy: random, expert, oracle, bundled, a model path, openai:<model>@<url>"})
    tiers: list[str] | None = field(default=None, metadata={"help": "tiers (L0, L1, L2); default all"})
    scenarios: list[str] | None = field(default=None, metadata={"commas": False, "help": "scenario ids or YAML paths; default all shipped scenarios"})
    chains: int = field(default=3, metadata={"check": at_least(1), "help": "chains per scenario (each its own cast)"})
    length: int = field(default=3, metadata={"check": at_least(1), "help": "episodes per chain"})
    modes: list[Literal["none", "full", "summary"]] = field(default_factory=lambda: list(MODES), metadata={"help": "memory modes: none, full, summary"})
    seed: int = field(default=0, metadata={"check": at_least(0), "help": "run seed: chain casts, episode seeds, bootstrap"})
    lm_batch_size: int = field(default=12, metadata={"check": at_least(1), "help": "language models: prompts per forward pass"})
    out: str = field(default="runs/chain", metadata={"help": "folder for <mode>/episodes.jsonl and chain.json"})
    npc_voice: str = field(default="template", metadata={"help": NPC_VOICE_HELP})

    def __post_init__(self) -> None:
        check_fields(self)
        check_npc_voice(self.npc_voice)
        if not self.modes:
            raise FieldError("modes", f"must name at least one of {', '.join(MODES)}")
