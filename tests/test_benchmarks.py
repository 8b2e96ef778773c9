"""The benchmarks and examples still import (they run outside the test suite, so a moved name would
otherwise break them unseen)."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", sorted(p.relative_to(ROOT).as_posix() for p in [*ROOT.glob("benchmarks/*.py"), *ROOT.glob("examples/*.py")]))
def test_imports(path):
    if path.startswith("examples/"):
        pytest.importorskip("gymnasium")
    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # the module level only: each runs its work under __main__
    assert callable(getattr(module, "main", None)), f"{path} has no main()"
