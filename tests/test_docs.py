"""Every Python block of the README and the docs' tutorials runs, each in a fresh folder, so the docs cannot
drift from the code. A block that cannot run here in a few seconds says why in its fence
(```` ```python test="skip" reason="..." ````); one that needs an extra names its module (``needs="gymnasium"``);
a block whose prints carry ``#>`` lines has them checked (pytest-examples)."""

from pathlib import Path

import pytest
from pytest_examples import CodeExample, EvalExample, find_examples

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs" / "tutorials").glob("*.md"))]


@pytest.mark.parametrize("example", list(find_examples(*PAGES)), ids=str)
def test_a_docs_block_runs(example: CodeExample, eval_example: EvalExample, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = example.prefix_settings()
    if settings.get("test") == "skip":
        assert settings.get("reason"), f"{example}: a block the tests skip says why (reason=\"...\")"
        pytest.skip(settings["reason"])
    if "needs" in settings:
        pytest.importorskip(settings["needs"])
    monkeypatch.chdir(tmp_path)
    if "#>" in example.source:
        eval_example.run_print_check(example)
    else:
        eval_example.run(example)
