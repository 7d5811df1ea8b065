"""Which package may import which: the dependency runs one way, labse_model -> pipelines.io.

`labse_model` (the trainer) uses the neutral formats package `pipelines.io` (atomic writes, stage
outputs, text lines, TFRecord framing). Nothing under `pipelines/` or `vocab/` imports `labse_model`
back (the `make demo` orchestration, which runs every stage, lives at the top: `labse_model/demo.py`). Read from
the sources with `ast`, so the check needs no heavy import and sees imports inside functions too.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _sources(*packages: str) -> list[Path]:
    return sorted(p for package in packages for p in (ROOT / package).rglob("*.py"))


def _imports(path: Path, module_level_only: bool = False) -> list[tuple[int, str]]:
    """(line, imported module) for every import in the file (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    nodes = tree.body if module_level_only else ast.walk(tree)
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((node.lineno, module))
    return found


def _is(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_sources_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in _sources("pipelines", "vocab")}
    assert {"pipelines/io/tfrecord.py", "pipelines/tfrecords/transforms.py", "vocab/builder.py"} <= names


def test_pipelines_and_vocab_never_import_labse_model():
    offenders = [
        f"{path.relative_to(ROOT).as_posix()}:{line} imports {module}"
        for path in _sources("pipelines", "vocab")
        for line, module in _imports(path)
        if _is(module, "labse_model")
    ]
    assert offenders == []


@pytest.mark.parametrize("module", ["pipelines/io/tfrecord.py", "pipelines/io/stage_output.py",
                                    "pipelines/io/atomic.py", "pipelines/io/text_lines.py",
                                    "pipelines/io/parallel_text.py", "pipelines/io/config_options.py",
                                    "pipelines/tfrecords/encode.py"])
def test_modules_used_without_beam_import_no_heavy_framework_at_load(module):
    """GPU hosts run torch alone: what the trainer loads from pipelines.io imports no Beam,
    TensorFlow or torch when it is loaded; the pure TFRecord-pair logic imports none anywhere."""
    heavy = ("apache_beam", "tensorflow", "tensorflow_text", "torch")
    path = ROOT / module
    imports = _imports(path, module_level_only=not module.startswith("pipelines/tfrecords/"))
    assert [m for _, m in imports if any(_is(m, h) for h in heavy)] == []
