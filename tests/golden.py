"""Hashes of seeded scripted runs: the behaviour a refactor must keep bit for bit.

Per shipped scenario and seed: the episode records of the expert, the oracle and the random
policy (canonical JSONL, :func:`socialworld.records.to_jsonl`), and the counterfactual action
pairs the sleep phase scores from the random policy's episodes against the expert's (a default
:class:`~socialworld.sleep.SleepConfig` with reference pairs at the expert's states). ``python
tests/golden.py --write`` stores them in ``tests/data/golden-runs.json``; ``tests/test_golden.py``
checks them. Rewrite the file only for a change that means to alter behaviour, and say so."""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from socialworld.evaluate import episode_seeds
from socialworld.policies import make_policy
from socialworld.records import atomic_write_text, to_jsonl
from socialworld.runner import EpisodeJob, run_episodes
from socialworld.sleep import GatingReport, SleepConfig, candidate_pairs
from socialworld.spec import load_builtin_scenarios

STORED = Path(__file__).parent / "data" / "golden-runs.json"
SEEDS = 2


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def run_hashes() -> dict[str, str]:
    """``{"<policy>/<scenario id>": sha256, "pairs/<scenario id>": sha256}`` of the runs above."""
    specs = load_builtin_scenarios()
    out: dict[str, str] = {}
    episodes = {}
    for name in ("expert", "oracle", "random"):
        jobs = [EpisodeJob(s, seed) for s in specs.values() for seed in episode_seeds(0, s.id, SEEDS)]
        eps = run_episodes(make_policy(name, seed=0), jobs)
        episodes[name] = eps
        for sid in specs:
            out[f"{name}/{sid}"] = _sha(to_jsonl([e for e in eps if e.scenario_id == sid]))
    reference = {(e.scenario_id, e.seed): e for e in episodes["expert"]}
    cfg = SleepConfig(reference_pairs="own")
    for sid in specs:
        wake = [e for e in episodes["random"] if e.scenario_id == sid]
        pairs = candidate_pairs(specs, wake, {k: v for k, v in reference.items() if k[0] == sid}, cfg, GatingReport())
        out[f"pairs/{sid}"] = _sha("\n".join(p.model_dump_json() for p in pairs))
    return out


if __name__ == "__main__":
    hashes = run_hashes()
    if sys.argv[1:] == ["--write"]:
        atomic_write_text(STORED, json.dumps(hashes, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(hashes)} hashes to {STORED}")
    else:
        print(json.dumps(hashes, indent=1, sort_keys=True))
