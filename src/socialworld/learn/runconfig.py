"""A run's ``config.yaml`` (a loop's or a bench's) as one typed, versioned record, and the one
migration step that reads the files of earlier versions.

:class:`RunConfig` is what a run records: its config (:class:`~socialworld.learn.config.LoopConfig`
or the bench's ``BenchConfig``; the fields that only change how it executes left out), the user
scenarios it stored (id -> content hash), the metrics contract it is scored under and the format
of its training pairs. Its file is one flat mapping: the config's fields, then those keys, then
``config_version``.

A stored file is read through :func:`migrate` (every reader: a resumed run, ``--reuse-from``,
``--config FILE``, ``socialworld gate``). ``run-config-v1`` (files without ``config_version``) to
v2 is the one step so far; it holds what the hand-kept tables of fields added since runs were
written held, frozen, and the sleep recipe's new form:

* each field added while v1 was current takes the value that behaves as the code did before it
  (not always its default: ``train.dtype`` was float32 before it existed);
* the sleep phase's four switches become the recipe's list of pair sources (issue 41):
  ``utterance_pairs`` and ``reference_pairs`` (off, best, own) -> ``sources`` and
  ``reference_chosen``; ``wake_chosen`` (best, continuation) with ``label_gate`` (margin,
  disagree) -> ``wake_chosen`` (best, label_by_margin, label).

v2 to v3 adds the fields added while v2 was current (:data:`V2_ADDED`), each at the value that
behaves as the code did before it (scenarios held out of training: none; reference episodes on
variants: none).

v3 to v4 adds the NPC voice (:data:`V3_ADDED`): the templates' lines, as before.

A field added from now on comes with a new version and one more step (a stored file lacks it, and a
resumed run compares the whole config).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any, Final, Generic, TypeVar

from socialworld.learn.pairs.record import PAIR_SCHEMA
from socialworld.metrics.core import METRICS_CONTRACT, ContractMismatch

CONFIG_VERSION: Final = "run-config-v4"
VERSION_KEY: Final = "config_version"
CONTRACT_KEY: Final = "metrics_contract"
"""the key naming the metrics contract a run is scored under (a v1 file without it: metrics-v1)"""
PAIRS_KEY: Final = "pair_schema"
"""the key naming the format of a run's training pairs (a v1 file without it: pair-v1, whose action
turns end at the ACTION line)"""
RECORDED_KEYS: Final = ("user_scenarios", CONTRACT_KEY, PAIRS_KEY, VERSION_KEY)
"""the keys a ``config.yaml`` holds beside the config's fields"""
EXECUTION_FIELDS: Final = ("ray", "max_endpoint_failures")
"""config fields that change how a run executes, never its artifacts: left out of ``config.yaml``
(``max_endpoint_failures`` decides whether an endpoint's arm is scored at all, so a rerun may
loosen it)"""

V1_ADDED: Final[dict[str, dict[str, Any]]] = {
    "loop": {"max_turns": 0, "user_scenarios": {}, "reference_episodes": 0, "dialogue_steps": 0, "judge": "",
             CONTRACT_KEY: "metrics-v1", PAIRS_KEY: "pair-v1",
             "sleep": {"values": "off", "discount": 1.0, "reference_pairs": "off", "replay": 0.0, "wake_chosen": "best",
                       "label_gate": "margin", "judge_margin": 2.0, "utterance_pairs": True},
             "train": {"max_epochs": 0.0, "lora_upper": 1.0, "dtype": "float32", "balance": 0, "value_temperature": 0.05,
                       "value_margin": 0.05, "decision_weight": 0.2, "activated": False, "flat_reward_patience": 0}},
    "bench": {"scenarios": [], "user_scenarios": {}, "judge": "", CONTRACT_KEY: "metrics-v1", PAIRS_KEY: "pair-v1"},
}
"""v1 -> v2: the fields added while v1 was current, each with the value that behaves as the code
did before it, by the kind of run (a bench's file names a ``preset``, a loop's a ``sleep``)"""


V2_ADDED: Final[dict[str, dict[str, Any]]] = {
    "loop": {"holdout": [], "reference_varied": 0.0},
    "bench": {"holdout": []},
}
"""v2 -> v3: the fields added while v2 was current, each with the value that behaves as the code did before it"""


V3_ADDED: Final[dict[str, dict[str, Any]]] = {
    "loop": {"npc_voice": "template"},
    "bench": {"npc_voice": "template"},
}
"""v3 -> v4: the fields added while v3 was current, each with the value that behaves as the code did before it"""


def _fill(doc: dict[str, Any], added: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with every key it lacks taken from ``added``, recursively into nested mappings."""
    out = dict(added) | doc
    for k, v in added.items():
        if isinstance(v, dict) and isinstance(doc.get(k), dict):
            out[k] = _fill(doc[k], v)
    return out


def _v1_sleep(sleep: dict[str, Any]) -> dict[str, Any]:
    """A v1 sleep recipe's four switches as v2's source list and choices."""
    out = {k: v for k, v in sleep.items() if k not in ("utterance_pairs", "reference_pairs", "label_gate", "wake_chosen")}
    reference, utterance = sleep["reference_pairs"], sleep["utterance_pairs"]
    out["sources"] = ["action", *(["reference"] if reference != "off" else []), "dialogue", *(["utterance"] if utterance else []),
                      "judge"]
    out["reference_chosen"] = reference if reference != "off" else "best"
    out["wake_chosen"] = "best" if sleep["wake_chosen"] == "best" else "label" if sleep["label_gate"] == "disagree" else "label_by_margin"
    return out


def migrate(doc: dict[str, Any], where: str | Path = "config.yaml") -> dict[str, Any]:
    """A stored ``config.yaml`` of any version in this version's form (see the module's text); a
    version this code does not know raises naming ``where``."""
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: a run's config holds a mapping of field names to values")
    version = doc.get(VERSION_KEY, "run-config-v1")
    if version == CONFIG_VERSION:
        return doc
    if version not in ("run-config-v1", "run-config-v2", "run-config-v3"):
        raise ValueError(f"{where}: {VERSION_KEY} {version!r} is not one this version reads (it writes {CONFIG_VERSION})")
    kind = "bench" if "preset" in doc else "loop"
    out = doc
    if version == "run-config-v1":
        out = _fill(out, V1_ADDED[kind])
        if kind == "loop" and isinstance(out.get("sleep"), dict):
            out["sleep"] = _v1_sleep(out["sleep"])
    if version in ("run-config-v1", "run-config-v2"):
        out = _fill(out, V2_ADDED[kind])
    out = _fill(out, V3_ADDED[kind])
    return out | {VERSION_KEY: CONFIG_VERSION}


def read_as_claimed(doc: dict[str, Any], where: str | Path = "config.yaml") -> dict[str, Any]:
    """A config file (``--config FILE``) read as what it claims to be: a run's stored ``config.yaml`` —
    it names its ``config_version``, or a key only a run records (its user scenarios' hashes, its metrics
    contract, its pair format) — through :func:`migrate`; any other file as this version's fields, as
    written (a key that is no field, a removed one too, is then refused by name: a file without a
    version was once read as a v1 run's, so ``cycles: 2`` alone trained in float32)."""
    if isinstance(doc, dict) and any(k in doc for k in RECORDED_KEYS):
        return migrate(doc, where)
    return doc


def check_compatible(stored: dict[str, Any], where: str | Path) -> None:
    """Raise unless a stored (migrated) config's run can be continued by this version: the same
    metrics contract (:class:`~socialworld.metrics.core.ContractMismatch`) and the same pair format."""
    if stored.get(CONTRACT_KEY) != METRICS_CONTRACT:
        raise ContractMismatch(f"{where}: this run was scored under {stored.get(CONTRACT_KEY)}, this version scores under "
                               f"{METRICS_CONTRACT}; numbers of different metrics contracts are never mixed: use a new run folder")
    if stored.get(PAIRS_KEY) != PAIR_SCHEMA:
        raise ValueError(f"{where}: this run's training pairs are {stored.get(PAIRS_KEY)}, this version writes {PAIR_SCHEMA}; "
                         "pairs of different formats are never mixed (replay, resumed training): use a new run folder")


def read_resumed(stored: dict[str, Any], path: Path) -> dict[str, Any]:
    """A resumed run's stored config in this version's form, refused when this code cannot
    continue its run (:func:`check_compatible`): what :meth:`RunDir.write_config
    <socialworld.rundir.RunDir.write_config>` compares with the run's."""
    doc = migrate(stored, path)
    check_compatible(doc, path)
    return doc


def read_stored(path: str | Path) -> dict[str, Any]:
    """A run folder's (or a file's) stored config, migrated; a missing or malformed one raises naming it."""
    import yaml

    path = Path(path)
    path = path / "config.yaml" if path.is_dir() else path
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ValueError(f"{path}: cannot read a run's config ({err})") from None
    return migrate(doc, path)


C = TypeVar("C")


@dataclass(frozen=True)
class RunConfig(Generic[C]):
    """What a run's ``config.yaml`` records."""

    config: C
    """the run's config (a dataclass: ``LoopConfig`` or ``BenchConfig``)"""
    user_scenarios: dict[str, str]
    """id -> content hash of each user scenario, stored in ``RUN/scenarios/<id>.yaml``, so a
    changed file is never resumed silently"""
    metrics_contract: str = METRICS_CONTRACT
    pair_schema: str = PAIR_SCHEMA

    @classmethod
    def read(cls, path: str | Path, config: type[C]) -> RunConfig[C]:
        """A run's stored ``config.yaml`` (or its folder; any version, migrated: :func:`read_stored`) as its typed
        record, the config a ``config`` dataclass (``LoopConfig`` or ``BenchConfig``); a value the config refuses
        raises naming the file."""
        from pydantic import TypeAdapter, ValidationError

        doc = read_stored(path)
        try:
            typed = TypeAdapter(config).validate_python({k: v for k, v in doc.items() if k not in RECORDED_KEYS})
        except (ValidationError, ValueError) as err:
            raise ValueError(f"{path}: {err}") from None
        return cls(typed, dict(doc.get("user_scenarios") or {}), doc[CONTRACT_KEY], doc[PAIRS_KEY])

    def document(self) -> dict[str, Any]:
        """The file's mapping (what :meth:`RunDir.write_config <socialworld.rundir.RunDir.write_config>` writes)."""
        if not is_dataclass(self.config) or isinstance(self.config, type):
            raise TypeError(f"a run's config is a config dataclass, not {type(self.config).__name__}")
        doc = {k: v for k, v in json.loads(json.dumps(asdict(self.config))).items() if k not in EXECUTION_FIELDS}
        return doc | {"user_scenarios": self.user_scenarios, CONTRACT_KEY: self.metrics_contract, PAIRS_KEY: self.pair_schema,
                      VERSION_KEY: CONFIG_VERSION}
