"""`make test`'s two workers (tests/conftest.py): a module that uses an expensive session fixture, or
builds this package's sdist for a Dataflow dry run, must be in that fixture's group, or the fixture
is built on both workers (and two sdists race on one `*.egg-info`). Read from the sources with
`ast`, so a new module that forgets its group fails here, in the fast suite."""
from __future__ import annotations

import ast
from pathlib import Path

from conftest import GROUP_OF_MODULE, SHARED_GROUPS, work_unit

TESTS = Path(__file__).resolve().parent
SHARED_FIXTURES = {"doc_runs": "doc_runs", "chains": "cloud_chain"}
# what a test module names when it builds a Dataflow job from ./setup.py (an sdist)
SDIST_NAMES = {"SETUP_FILE", "dataflow_commands"}


def _uses(path: Path) -> tuple[set[str], set[str]]:
    """(fixtures named as test or fixture arguments, names imported from cloud_chain) of a module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    arguments = {arg.arg for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) for arg in node.args.args}
    imported = {alias.name for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module == "cloud_chain" for alias in node.names}
    return arguments, imported


def test_modules_sharing_a_session_fixture_or_building_an_sdist_share_a_worker():
    misplaced = []
    for path in sorted(TESTS.glob("test_*.py")):
        arguments, imported = _uses(path)
        wanted = {group for fixture, group in SHARED_FIXTURES.items() if fixture in arguments}
        if imported & SDIST_NAMES:
            wanted.add("cloud_chain")
        for group in wanted:
            if GROUP_OF_MODULE.get(path.stem) != group:
                misplaced.append(f"{path.name} belongs in SHARED_GROUPS[{group!r}]")
    assert not misplaced, misplaced
    assert len(GROUP_OF_MODULE) == sum(len(modules) for modules in SHARED_GROUPS.values())  # one group a module


def test_a_test_is_scheduled_with_its_modules_group():
    assert work_unit("tests/test_remine.py::test_x") == work_unit("tests/test_doc_commands.py::test_y[README.md:1]")
    assert work_unit("tests/test_mine_global.py::test_z") == "cloud_chain"
    assert work_unit("tests/test_locks.py::test_a[p::q]") == "test_locks"
