"""The package's layers: no import runs upward, and no two modules import each other (directly or
round a longer cycle), counting imports inside functions too (not those under ``if TYPE_CHECKING:``,
which run only for type checkers). ``python tests/test_layout.py``
prints the layers, the module graph's counts and any offending import."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "src" / "socialworld"

LAYERS = {
    # the kernel every layer shares: the policy protocol, config checks, records, run folders
    "": 0,
    "text": 1, "metrics": 1,
    "world": 2,
    "agents": 3,
    "rollout": 4,
    "learn": 5, "swm": 5,
    "bench": 6,
    "cli": 7, "testing": 7,
}
"""Rank of each top-level package (``""`` the root modules). A module may import its own package or
one of a strictly lower rank; packages of one rank do not import each other."""


def modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        name = ".".join(p.relative_to(PKG).with_suffix("").parts)
        out[name.removesuffix(".__init__").removesuffix("__init__")] = p
    return out


def import_graph() -> dict[str, set[str]]:
    """Each module's imports of other socialworld modules (``a.b`` names, root modules bare)."""
    mods = modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps = set()
        tree = ast.parse(path.read_text())
        typing_only = {id(n) for block in ast.walk(tree)
                       if isinstance(block, ast.If) and ast.unparse(block.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
                       for stmt in block.body for n in ast.walk(stmt)}  # annotations only: not imported at run time
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom):
                assert not node.level, f"{name}: relative import"
                # each imported name is a module (``from socialworld.world import engine``) or a name of the module imported from
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}".removeprefix("socialworld.") in mods
                           else node.module or "" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for t in targets:
                t = "" if t == "socialworld" else t.removeprefix("socialworld.") if t.startswith("socialworld.") else None
                if t is not None and t in mods:
                    deps.add(t)
        deps.discard(name)
        graph[name] = deps
    return graph


def package(mod: str) -> str:
    return mod.split(".")[0] if "." in mod or mod in LAYERS else ""


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    bad = []
    for a, deps in graph.items():
        for b in deps:
            pa, pb = package(a), package(b)
            if pa != pb and LAYERS[pb] >= LAYERS[pa]:
                bad.append((a, b))
    return sorted(bad)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_package_has_a_rank():
    assert {package(m) for m in modules()} <= set(LAYERS)


def test_no_import_runs_upward():
    assert upward_imports(import_graph()) == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_the_checks_can_fail():
    g = {"world.engine": {"agents.scripted"}, "agents.scripted": {"world.engine"}}
    assert upward_imports(g) == [("world.engine", "agents.scripted")]
    assert cycles(g) == [["agents.scripted", "world.engine"]]


if __name__ == "__main__":
    g = import_graph()
    print(f"{len(g)} modules, {sum(map(len, g.values()))} imports between them")
    for pkg, rank in sorted(LAYERS.items(), key=lambda kv: kv[1]):
        print(f"  {rank} {pkg or '(root)'}: {', '.join(m for m in g if package(m) == pkg)}")
    up, cyc = upward_imports(g), cycles(g)
    print(f"upward imports: {len(up)}", *(f"  {a} -> {b}" for a, b in up), sep="\n")
    print(f"cycles: {len(cyc)}", *(f"  {' <-> '.join(c)}" for c in cyc), sep="\n")
    sys.exit(1 if up or cyc else 0)
