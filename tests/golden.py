"""Hashes of seeded scripted runs: the behaviour a refactor must keep bit for bit.

Per shipped scenario and seed: the episode records of the expert, the oracle and the random
policy (canonical JSONL, :func:`socialworld.records.to_jsonl`), and the counterfactual action
pairs the sleep phase scores from the random policy's episodes against the expert's (a default
:class:`~socialworld.learn.pairs.SleepConfig` with reference pairs at the expert's states), and which
of them screening and gating keep. (The pair hashes were rewritten once, when pairs gained
``chosen_by`` as pair-v3, and again when they gained ``candidates`` and ``legal`` as pair-v4;
``pairs-as-v2/<scenario id>`` and ``pairs-as-v3/<scenario id>`` hash the same pairs as those formats
wrote them, and their stored values are the pair hashes stored before each change. Episode records are
hashed without the package's version in their lineage, so a version bump changes no hash; rewritten
once for expert-v3 and policy-v8, issue 64, and the pair hashes, all three forms, once more for
policy-v9's prompts: the episodes' hashes did not change; and everything of the expert's once more for
expert-v4 (its version string; its episodes were checked identical before the bump) and policy-v10's
prompts; and everything of the expert's once more for expert-v5, which keeps a carried proposal, and
policy-v13's prompts.) ``python
tests/golden.py --write`` stores them in ``tests/data/golden-runs.json``; ``tests/test_golden.py``
checks them. Rewrite the file only for a change that means to alter behaviour, and say so."""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from socialworld.agents.registry import make_policy
from socialworld.learn.config import SleepConfig
from socialworld.learn.pairs.sleep import run_sleep
from socialworld.learn.pairs.sources import SleepInputs
from socialworld.records import atomic_write_text, to_jsonl
from socialworld.rollout.evaluate import episode_seeds
from socialworld.rollout.runner import EpisodeJob, run_episodes
from socialworld.world.spec import load_builtin_scenarios

STORED = Path(__file__).parent / "data" / "golden-runs.json"
SEEDS = 2


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _unversioned(e):
    return e.model_copy(update={"lineage": e.lineage.model_copy(update={"framework_version": ""})})


def run_hashes() -> dict[str, str]:
    """``{"<policy>/<scenario id>": sha256, "pairs/<scenario id>": sha256, "gated/<scenario id>": sha256}``
    of the runs above (``gated``: the ids of the pairs screening and gating keep, and the counts)."""
    specs = load_builtin_scenarios()
    out: dict[str, str] = {}
    episodes = {}
    for name in ("expert", "oracle", "random"):
        jobs = [EpisodeJob(s, seed) for s in specs.values() for seed in episode_seeds(0, s.id, SEEDS)]
        eps = run_episodes(make_policy(name, seed=0), jobs)
        episodes[name] = eps
        for sid in specs:  # the behaviour, not the package's version string in each record's lineage
            out[f"{name}/{sid}"] = _sha(to_jsonl([_unversioned(e) for e in eps if e.scenario_id == sid]))
    reference = {(e.scenario_id, e.seed): e for e in episodes["expert"]}
    cfg = SleepConfig(sources=("action", "reference", "dialogue", "utterance", "judge"), reference_chosen="own")
    for sid in specs:
        wake = [e for e in episodes["random"] if e.scenario_id == sid]
        result = run_sleep(SleepInputs(specs, wake, {k: v for k, v in reference.items() if k[0] == sid}), cfg)
        out[f"pairs/{sid}"] = _sha("\n".join(p.model_dump_json() for p in result.candidates))
        # the same pairs as pair-v2 wrote them (no chosen_by): equal to the hashes stored before pair-v3
        out[f"pairs-as-v2/{sid}"] = _sha("\n".join(
            p.model_copy(update={"schema_version": "pair-v2"}).model_dump_json(exclude={"chosen_by", "candidates", "legal"}) for p in result.candidates))
        # the same pairs as pair-v3 wrote them (no candidates or legal set): equal to the hashes stored before pair-v4
        out[f"pairs-as-v3/{sid}"] = _sha("\n".join(
            p.model_copy(update={"schema_version": "pair-v3"}).model_dump_json(exclude={"candidates", "legal"})
            for p in result.candidates))
        out[f"gated/{sid}"] = _sha(json.dumps({"kept": [p.id for p in result.kept], "report": result.report.as_dict()}, sort_keys=True))
    return out


if __name__ == "__main__":
    hashes = run_hashes()
    if sys.argv[1:] == ["--write"]:
        atomic_write_text(STORED, json.dumps(hashes, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(hashes)} hashes to {STORED}")
    else:
        print(json.dumps(hashes, indent=1, sort_keys=True))
