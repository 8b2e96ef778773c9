"""A run folder's scenarios: the user scenarios a loop or bench run stores
(``RUN/scenarios/<id>.yaml``, their content hashes in its ``config.yaml``), so a run is resumed,
re-gated and fitted by id without the user's file, and never silently with a changed one. The
world (:mod:`socialworld.world.spec`) knows scenarios, not runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from socialworld.layout import SCENARIO_STORE
from socialworld.learn.runconfig import read_stored
from socialworld.world.spec import ScenarioError, ScenarioSpec, check_tiers, load_builtin_scenarios, load_spec, resolve_scenarios


def resolve_in_run(names: list[str], run_dir: str | Path, tiers: list[str] | None = None, max_turns: int = 0) -> list[ScenarioSpec]:
    """:func:`~socialworld.world.spec.resolve_scenarios` where an id names first a user scenario
    the run in ``run_dir`` stored (:func:`stored_scenarios`), then a shipped one."""
    return resolve_scenarios(names, tiers, max_turns, stored=stored_scenarios(run_dir), stored_in=str(Path(run_dir) / SCENARIO_STORE))


def stored_scenarios(run_dir: str | Path) -> dict[str, ScenarioSpec]:
    """The user scenarios a run folder stored (``RUN/scenarios/<id>.yaml``), by id; a copy whose
    content hash is not the one the run's ``config.yaml`` records (``user_scenarios``) is refused."""
    root = Path(run_dir)
    if not (root / SCENARIO_STORE).is_dir():
        return {}
    recorded: dict = read_stored(root).get("user_scenarios") or {} if (root / "config.yaml").is_file() else {}
    out = {}
    for path in sorted((root / SCENARIO_STORE).glob("*.yaml")):
        spec = load_spec(path)
        if spec.id in recorded and recorded[spec.id] != spec.content_hash:
            raise ScenarioError(f"{path}: changed since the run was made (content hash {spec.content_hash[:12]}, "
                                f"config.yaml records {str(recorded[spec.id])[:12]})")
        out[spec.id] = spec
    return out



def specs_for(ids: Iterable[str], run_dir: str | Path | None = None, files: Sequence[str] = (),
              max_turns: int = 0) -> dict[str, ScenarioSpec]:
    """The specs of the scenario ids that records or pairs name, by id: first the YAML ``files``
    given, then the user scenarios stored in ``run_dir``, then the shipped ones (each capped at
    ``max_turns``, the run's smoke budget, so that its snapshots restore)."""
    given = {s.id: s for s in resolve_scenarios(list(files), max_turns=max_turns)} if files else {}
    rest = sorted(set(ids) - set(given))
    found = resolve_in_run(rest, run_dir, max_turns=max_turns) if rest and run_dir is not None else \
        resolve_scenarios(rest, max_turns=max_turns) if rest else []
    return given | {s.id: s for s in found}



@dataclass(frozen=True)
class RunScenarios:
    """The scenarios of a run (loop or bench), resolved and checked before any work starts."""

    specs: tuple[ScenarioSpec, ...]
    """the scenarios of the run's tiers, in the order named (default: the shipped ones), uncapped"""
    names: tuple[str, ...]
    """the names given, each naming a user scenario (a YAML path, or an id stored in the run)
    replaced by its full id: what the run's config records, so the run is resumed by id without the file"""
    user: dict[str, str]
    """id -> content hash of each scenario that is not a shipped one: the run stores its canonical
    YAML (``RUN/scenarios/<id>.yaml``) and records the hash in its config"""


def run_scenarios(names: Sequence[str], tiers: Sequence[str], run_dir: str | Path) -> RunScenarios:
    """Resolve a run's scenarios (ids, or YAML paths of the user's own; empty: the shipped ones)
    against ``run_dir``'s stored copies and the shipped scenarios, and check them: a file may not
    reuse a shipped id with other content, nor differ from the copy the run was made with (a
    resumed run never silently uses a changed file), and some scenario must be in ``tiers``."""
    check_tiers(tiers)
    builtin = load_builtin_scenarios()
    named = resolve_in_run(list(names), run_dir) if names else list(builtin.values())
    stored = stored_scenarios(run_dir)
    by_id: dict[str, ScenarioSpec] = {}
    for name, spec in zip(names or [s.id for s in named], named):
        # a name resolved as an id is the shipped or stored spec itself: only a file can differ
        if spec.id in builtin and builtin[spec.id].content_hash != spec.content_hash:
            raise ScenarioError(f"{name}: id {spec.id} is a shipped scenario's, with other content; "
                                "give your scenario an id of its own")
        if spec.id in stored and stored[spec.id].content_hash != spec.content_hash:
            raise ScenarioError(f"{name}: scenario {spec.id} differs from the copy the run in {run_dir} was made with "
                                f"({Path(run_dir) / SCENARIO_STORE / spec.id}.yaml): resume without the changed file "
                                "(by id) or use a new run folder")
        if spec.id in by_id and by_id[spec.id].content_hash != spec.content_hash:
            raise ScenarioError(f"{name}: a second, different scenario with id {spec.id}")
        by_id[spec.id] = spec
    specs = tuple(s for s in by_id.values() if s.tier in tiers)
    if not specs:
        raise ScenarioError(f"no scenario of tier(s) {', '.join(tiers)} among "
                            f"{', '.join(f'{s.id} ({s.tier})' for s in by_id.values())}")
    user = {s.id: s.content_hash for s in specs if s.id not in builtin}
    # a shipped scenario named by id is recorded as given (older runs resume); any other name by its full id
    as_given = lambda n, s: s.id in builtin and n in (s.id, s.id.rsplit("-v", 1)[0])  # noqa: E731
    return RunScenarios(specs, tuple(n if as_given(n, s) else s.id for n, s in zip(names, named)), user)
