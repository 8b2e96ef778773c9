"""Where a loop run and a bench run keep their artifacts: the cycle layout the loop writes and the
bench, ``socialworld gate``, ``report`` and the adapter lookup of a trained policy
(:func:`socialworld.agents.models.find_adapters`) read. The kernel's :class:`~socialworld.rundir.RunDir`
knows artifacts, not this layout."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CycleFiles:
    """Where a loop run keeps cycle ``c``'s artifacts, relative to the run folder: the paths the
    loop writes and the bench, ``gate`` and :func:`socialworld.agents.models.find_adapters` read."""

    c: int

    @property
    def root(self) -> str:
        return f"cycle-{self.c}"

    @property
    def wake(self) -> str:
        """the deployed policy's episodes on training seeds"""
        return f"{self.root}/wake/episodes.jsonl"

    @property
    def reference(self) -> str:
        """the continuation policy's episodes on training seeds"""
        return f"{self.root}/wake/reference.jsonl"

    @property
    def wake_judged(self) -> str:
        """an LM judge's record of the wake and reference episodes"""
        return f"{self.root}/wake/judge.jsonl"

    @property
    def sleep(self) -> str:
        """the sleep phase's folder: pairs per track and ``gating.json``"""
        return f"{self.root}/sleep"

    def pairs(self, track: str) -> str:
        return f"{self.sleep}/pairs-{track}.parquet"

    @property
    def gating(self) -> str:
        return f"{self.sleep}/gating.json"

    def adapter(self, name: str) -> str:
        """the LoRA adapter trained this cycle for ``name`` (a track, or ``merged``)"""
        return f"{self.root}/train/{name}/adapter"

    @property
    def eval(self) -> str:
        """the deployed policy's episodes on evaluation seeds (cycle 0: the untrained policy)"""
        return f"{self.root}/eval/episodes.jsonl"

    @property
    def holdout(self) -> str:
        """the deployed policy's episodes on the held-out scenarios' evaluation seeds (cycle 0 and the last
        cycle of a run with ``holdout``)"""
        return f"{self.root}/eval/holdout.jsonl"

    @property
    def summary(self) -> str:
        return f"{self.root}/summary.json"


def cycle_files(c: int) -> CycleFiles:
    """The paths of cycle ``c`` in a loop run folder."""
    return CycleFiles(c)


SCENARIO_STORE = "scenarios"
"""A run folder's copies of the user scenarios it runs on: ``RUN/scenarios/<id>.yaml``."""
BENCH_LOOP = "loop"
"""the loop run's folder inside a bench run folder"""
_CYCLE = re.compile(r"cycle-(\d+)")


def cycle_number(folder: str | Path) -> int | None:
    """``c`` when ``folder`` is named as cycle ``c``'s folder (:attr:`CycleFiles.root`), else None."""
    m = _CYCLE.fullmatch(Path(folder).name)
    return int(m.group(1)) if m else None


def loop_cycles(run_dir: str | Path) -> list[int]:
    """The cycles whose folders a loop run folder holds, in order (none for any other folder)."""
    root = Path(run_dir)
    if not root.is_dir():
        return []
    return sorted(c for d in root.iterdir() if d.is_dir() and (c := cycle_number(d)) is not None)
