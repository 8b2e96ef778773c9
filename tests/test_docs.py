"""Every Python block of the README and the site's pages (the experiment logs apart) runs, a page's blocks in
order in one fresh folder, so the docs cannot drift from the code. A block that cannot run here in a few seconds says why in its fence
(```` ```python test="skip" reason="..." ````); one that needs an extra names its module (``needs="gymnasium"``);
a block whose prints carry ``#>`` lines has them checked (pytest-examples)."""

from pathlib import Path

import pytest
from pytest_examples import EvalExample, find_examples

ROOT = Path(__file__).resolve().parents[1]
PAGES = [p for p in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "tutorials").glob("*.md")))
         if any(True for _ in find_examples(p))]
"""the pages with a Python block"""


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_pages_python_blocks_run_in_order(page: Path, eval_example: EvalExample, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A page's blocks run one after another in one fresh folder, as a reader following the page would."""
    monkeypatch.chdir(tmp_path)
    ran = 0
    for example in find_examples(page):
        settings = example.prefix_settings()
        if settings.get("test") == "skip":
            assert settings.get("reason"), f"{example}: a block the tests skip says why (reason=\"...\")"
            continue
        if "needs" in settings:
            pytest.importorskip(settings["needs"], reason=f"{example} needs it")
        try:
            if "#>" in example.source:
                eval_example.run_print_check(example)
            else:
                eval_example.run(example)
        except (Exception, pytest.fail.Exception) as err:  # the block's place, then its own error (a print check fails by pytest.fail)
            raise AssertionError(f"{example}: {type(err).__name__}: {err}") from None
        ran += 1
    if not ran:
        pytest.skip(f"{page.name}: every block says why it cannot run here")


def test_the_api_reference_documents_every_exported_name() -> None:
    import re

    import socialworld

    listed = re.findall(r"^::: socialworld\.(\w+)$", (ROOT / "docs" / "reference.md").read_text(), flags=re.M)
    assert sorted(listed) == sorted(socialworld._EXPORTS) and len(listed) == len(set(listed))


def test_every_page_of_the_site_is_on_its_nav() -> None:
    """mkdocs only notes a page left off the nav (the experiment logs are reached from their index)."""
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in (*(ROOT / "docs").glob("*.md"), *(ROOT / "docs" / "tutorials").glob("*.md")):
        assert f" {page.relative_to(ROOT / 'docs').as_posix()}\n" in nav, page.name
