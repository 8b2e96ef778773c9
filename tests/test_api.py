"""The public API: the names ``socialworld`` exports, each loaded on first use."""

from __future__ import annotations

import ast
import subprocess
import sys
from importlib import import_module

import pytest
from test_layout import PKG, modules

import socialworld


def test_every_exported_name_is_the_object_of_its_home_module() -> None:
    for name, home in socialworld._EXPORTS.items():
        if name == "SocialWorldEnv":
            pytest.importorskip("gymnasium")
        assert getattr(socialworld, name) is getattr(import_module(home), name), name
    assert set(socialworld.__all__) == {"__version__", *socialworld._EXPORTS}
    assert set(socialworld.__all__) <= set(dir(socialworld))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Wrold'"):
        socialworld.Wrold  # noqa: B018
    with pytest.raises(ImportError):
        exec("from socialworld import Wrold", {})


def test_importing_the_package_loads_no_model_library_and_no_layer() -> None:
    code = ("import sys, socialworld; socialworld.__version__; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'gymnasium', 'trl') "
            "or m.startswith('socialworld.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    code = "import sys; from socialworld import World; print('socialworld.world.engine' in sys.modules, 'torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split() == ["True", "False"]


def test_the_type_checkers_names_are_the_exported_names() -> None:
    tree = ast.parse((PKG / "__init__.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    seen = {a.name: node.module for node in block.body if isinstance(node, ast.ImportFrom) for a in node.names}
    assert seen == socialworld._EXPORTS


def test_no_module_of_the_package_imports_from_the_facade() -> None:
    """The facade names every layer: a module importing from it would hide an upward import from the layout test."""
    for name, path in modules().items():
        if not name:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "socialworld":
                assert all(a.name == "__version__" or a.name not in socialworld._EXPORTS for a in node.names), (name, ast.unparse(node))
