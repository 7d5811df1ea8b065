"""Every import of a project name resolves, the lazy ones inside functions included.

Modules import their heavy dependencies inside functions (Beam, TensorFlow, torch load only when a
command needs them), so importing a module does not prove that its imports hold: a name moved to
another module broke `labse-eval mining --scorer` while every test that imports the module passed.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("pipelines", "labse_model", "vocab", "recipes")
# the benchmark scripts and docs generator import the packages too: a moved name breaks a measurement's command
SOURCES = PACKAGES + ("benchmarks", "docs")


def _project_imports():
    for folder in SOURCES:
        for path in sorted((REPO / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                        and node.module.split(".")[0] in PACKAGES:
                    for alias in node.names:
                        yield path.relative_to(REPO), node.lineno, node.module, alias.name


def _resolves(module_name: str, name: str) -> bool:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError:
        return False
    if name == "*" or hasattr(module, name):
        return True
    # a submodule not imported yet: only a package has them
    return hasattr(module, "__path__") and importlib.util.find_spec(f"{module_name}.{name}") is not None


def test_every_project_import_names_something_that_exists():
    imports = list(_project_imports())
    assert len(imports) > 100, "the walk found too few imports: the package list is wrong"
    broken = [f"{path}:{line}: from {module} import {name}"
              for path, line, module, name in imports if not _resolves(module, name)]
    assert not broken, "imports of names that do not exist:\n" + "\n".join(broken)


@pytest.mark.parametrize("source, expected", [
    ("from pipelines.io.config_options import UsageError", True),
    ("from pipelines.io.config_options import NoSuchName", False),
    ("from pipelines import io", True),
])
def test_the_check_tells_a_missing_name(source, expected):
    node = ast.parse(source).body[0]
    assert _resolves(node.module, node.names[0].name) is expected


def test_no_test_module_leaves_the_benchmarks_folder_on_the_import_path():
    # runs after every test module was collected: benchmarks/vocab.py first on sys.path would
    # shadow the vocab package in whichever test imports it next (conftest.benchmark_script)
    import sys

    benchmarks = REPO / "benchmarks"
    assert not [entry for entry in sys.path if entry and Path(entry).resolve() == benchmarks]
