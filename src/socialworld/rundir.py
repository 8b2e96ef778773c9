"""A resumable, auditable run directory (contract §9).

``runs/<run-id>/`` holds ``config.yaml``, ``manifest.json`` and the run's artifacts. Every
artifact is written atomically (temporary name, then rename) and then *committed* to the
manifest with its sha256, producer and inputs (each with the sha256 it had when the artifact was
made). An artifact counts as complete only when the manifest lists it, its bytes still hash to
the listed value and every input still has the hash it was made from, so a run killed mid-write
resumes from its last complete artifact and redoes the rest, and an input made again with other
bytes has everything built from it made again, down the chain.

What a resumed run equals: an uninterrupted run with the same config, artifact for artifact, byte
for byte (adapter hashes included: adapter configs are written in a canonical order), except the
``latency_s`` of each step (wall time) and ``timings.json``. Temporary names a killed run left
behind (``.<name>.swtmp-XXXXXXXX`` folders and ``….tmp`` files) are removed when the run
starts again (:meth:`RunDir.write_config`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import yaml

from socialworld.records import TMP_MARK, atomic_write_text, shareable

MANIFEST_VERSION = "manifest-v1"
LOCATION_KEYS = ("out",)
"""config keys that say where the run folder is, not what it makes: never compared on resume (the
folder is where ``config.yaml`` lies; ``runs/a/``, ``./runs/a`` or a moved folder resume as ``runs/a``)"""
TIMINGS = "timings.json"
"""wall seconds each artifact took to make, by its path: a side file, not an artifact (times are
not reproducible, the artifacts are)"""


_LEFTOVER = re.compile(rf"^\..+\.{TMP_MARK}[a-z0-9_]{{8}}(\.tmp)?$")
"""the names ``RunDir.produce``, ``atomic_write_text``, ``write_parquet`` and the trainer give
their temporary folders and files (``.<name>.swtmp-XXXXXXXX``, files ending ``.tmp``)"""


def remove_leftovers(root: Path) -> list[Path]:
    """Remove the temporary folders and files a killed run left under ``root``; returns them."""
    found = [p for p in root.rglob(".*") if _LEFTOVER.match(p.name) and (p.is_dir() or p.name.endswith(".tmp"))]
    found = [p for p in found if not any(q in p.parents for q in found)]  # the outermost only
    for p in found:
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    return found


FOLDER_HASH = "folder-v2"
"""how :func:`sha256_path` hashes a folder (recorded with each folder artifact in the manifest)"""


def sha256_path(path: Path, folder: str = FOLDER_HASH) -> str:
    """sha256 of a file (its bytes), or of a folder: for each of its files in sorted order, the
    length and text of its relative path, then the length and bytes of its content (``folder-v2``),
    so no two different folders hash alike. ``folder-v1`` (the manifests written before it, whose
    entries name no ``hash``) put each path and its bytes one after the other: a file ``a`` holding
    ``x``, ``b`` holding ``y`` and a file ``a`` holding ``x b\0 y`` hashed the same."""
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        if path.is_dir():
            rel = str(f.relative_to(path)).encode()
            h.update(rel + b"\0" if folder == "folder-v1" else b"%d:" % len(rel) + rel + b"%d:" % f.stat().st_size)
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def _differences(old: dict[str, Any], new: dict[str, Any], skip: Sequence[str] = (), prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, old value, new value) of every leaf where two configs differ."""
    out = []
    for k in sorted(set(old) | set(new)):
        if k in skip:
            continue
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, (), f"{prefix}{k}.")
        elif a != b:
            out.append((f"{prefix}{k}", a, b))
    return out


class RunDir:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._manifest_path = self.root / "manifest.json"
        if self._manifest_path.exists():
            try:
                data = json.loads(self._manifest_path.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError) as err:
                raise ValueError(f"{self._manifest_path}: not a readable manifest ({err}); it is written atomically, so "
                                 "something else damaged it: restore it, or delete it to make every artifact again") from None
            if not isinstance(data, dict) or not isinstance(data.get("artifacts"), dict):
                raise ValueError(f"{self._manifest_path}: not a manifest (no 'artifacts' table); restore it, or delete it "
                                 "to make every artifact again")
            if data.get("version") != MANIFEST_VERSION:
                raise ValueError(f"{self._manifest_path}: unsupported manifest version {data.get('version')!r}")
            self.artifacts: dict[str, dict[str, Any]] = data["artifacts"]
            for entry in self.artifacts.values():  # manifest-v1 before inputs carried hashes: the file was
                if isinstance(entry.get("inputs"), list):  # consistent when written, so take today's hashes
                    entry["inputs"] = {i: self.artifacts.get(i, {}).get("sha256") for i in entry["inputs"]}
        else:
            self.artifacts = {}

    # ------------------------------------------------------------------ config

    def write_config(self, config: dict[str, Any], may_grow: Sequence[str] = (),
                     read: Callable[[dict[str, Any], Path], dict[str, Any]] | None = None) -> None:
        """Write ``config.yaml``; a resumed run must have the same config (else a clear error),
        except that the top-level integer fields named in ``may_grow`` may increase (a finished
        loop extended by more cycles: the earlier artifacts do not depend on the later ones) and
        ``LOCATION_KEYS`` are not compared. ``read(stored, path)`` reads the stored file's mapping
        in the form ``config`` has (an earlier version's migrated) and may refuse it (a run this
        code cannot continue); the file is then written in ``config``'s form.
        Called when a run starts (or resumes): it then removes the
        temporary names a killed run left (:func:`remove_leftovers`) — not when a folder is only
        opened to be read, which another process may be writing."""
        path = self.root / "config.yaml"
        text = yaml.safe_dump(config, sort_keys=True)
        if path.exists():
            old, new = yaml.safe_load(path.read_text()), yaml.safe_load(text)
            if read is not None:
                old = read(old, path)
            skip = [k for k in may_grow if isinstance(old.get(k), int) and isinstance(new.get(k), int) and new[k] > old[k]]
            skip += LOCATION_KEYS  # where the folder is, not what it makes
            if {k: v for k, v in old.items() if k not in skip} != {k: v for k, v in new.items() if k not in skip}:
                differ = ", ".join(f"{k}: {a!r} there, {b!r} now" for k, a, b in _differences(old, new, skip))
                raise ValueError(f"{path} exists with a different config ({differ}): resume with the same settings "
                                 "or use a new run folder")
        atomic_write_text(path, text)
        remove_leftovers(self.root)

    # ------------------------------------------------------------------ artifacts

    def path(self, rel: str) -> Path:
        return self.root / rel

    def complete(self, rel: str) -> bool:
        """Listed, its bytes unchanged, and every input as it was when ``rel`` was made (a
        manifest written before inputs carried hashes lists names only: they are taken with the
        hashes they have when the manifest is read)."""
        entry = self.artifacts.get(rel)
        p = self.path(rel)
        if entry is None or not p.exists() or sha256_path(p, entry.get("hash", "folder-v1")) != entry["sha256"]:
            return False
        return not self.stale_inputs(rel)

    def stale_inputs(self, rel: str) -> list[str]:
        """The inputs of ``rel`` whose hash changed since ``rel`` was made."""
        inputs = self.artifacts.get(rel, {}).get("inputs") or {}
        return [i for i, h in inputs.items() if self.artifacts.get(i, {}).get("sha256") != h]

    def commit(self, rel: str, producer: str, inputs: Sequence[str] = ()) -> str:
        """Record an artifact already written at ``rel``; returns its sha256."""
        p = self.path(rel)
        if not p.exists():
            raise FileNotFoundError(p)
        self._check_inputs(rel, inputs)
        digest = sha256_path(p)
        self.artifacts[rel] = {"sha256": digest, "producer": producer, "inputs": {i: self.artifacts[i]["sha256"] for i in inputs},
                               **({"hash": FOLDER_HASH} if p.is_dir() else {})}
        atomic_write_text(self._manifest_path, json.dumps({"version": MANIFEST_VERSION, "artifacts": self.artifacts},
                                                          indent=1, sort_keys=True) + "\n")
        return digest

    def _check_inputs(self, rel: str, inputs: Sequence[str]) -> None:
        missing = [i for i in inputs if i not in self.artifacts]
        if missing:
            raise ValueError(f"{rel}: inputs not in the manifest: {missing}")

    def sha(self, rel: str) -> str:
        return self.artifacts[rel]["sha256"]

    def produce(self, rel: str, producer: str, write: Callable[[Path], None], inputs: Sequence[str] = ()) -> bool:
        """Make ``rel`` unless complete: ``write(tmp)`` writes a file or folder at ``tmp``, which
        is then renamed into place and committed. Returns True if it (re)made the artifact."""
        if self.complete(rel):
            return False
        self._check_inputs(rel, inputs)
        dest = self.path(rel)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.{TMP_MARK}", dir=dest.parent)) / dest.name
        t0 = time.perf_counter()
        try:
            write(tmp)
            for q in [tmp, *(tmp.rglob("*") if tmp.is_dir() else ())]:  # what a library wrote through tempfile (600) too
                shareable(q)
            if dest.is_dir():
                shutil.rmtree(dest)
            os.replace(tmp, dest)
        finally:
            shutil.rmtree(tmp.parent, ignore_errors=True)
        self.commit(rel, producer, inputs)
        atomic_write_text(self.root / TIMINGS, json.dumps(self.timings() | {rel: round(time.perf_counter() - t0, 2)},
                                                          indent=1) + "\n")  # in the order they were made
        return True

    def derive(self, rel: str, producer: str, text: str, inputs: Sequence[str] = ()) -> bool:
        """:meth:`produce` for a document computed afresh on every run from artifacts this manifest
        does not list (another run folder's: a bench's loop, a suite's variants): written unless
        already there with exactly ``text``, so a resumed run whose sources changed (a variant run
        again) replaces it instead of keeping the first one. Returns True if it (re)wrote it."""
        if self.complete(rel) and self.path(rel).read_text() != text:
            del self.artifacts[rel]  # listed no more, so made again (atomically, and committed)
        return self.produce(rel, producer, lambda p: atomic_write_text(p, text), inputs)

    def timings(self) -> dict[str, float]:
        """Wall seconds each artifact made in this folder took (the last time it was made)."""
        try:
            doc = json.loads((self.root / TIMINGS).read_text())
        except (OSError, ValueError):  # absent or damaged: times are a convenience, never a reason to stop a run
            return {}
        return doc if isinstance(doc, dict) else {}
