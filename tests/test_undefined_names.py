"""No product module names something it never defines or imports (pyflakes' undefined-name check).

Such a name fails only when its line runs, or, in a string annotation, only when something resolves
the hints (`typing.get_type_hints`, documentation tools): vocab/builder.py's `"np.ndarray"` return
annotation had no `np` at module level. Read from the sources, so nothing heavy is imported.
"""
from __future__ import annotations

import ast
from pathlib import Path

from pyflakes import checker, messages

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pipelines", "labse_model", "vocab", "recipes")


def undefined_names(path: Path) -> list[str]:
    source = path.read_text(encoding="utf-8")
    found = checker.Checker(ast.parse(source, filename=str(path)), filename=str(path))
    return [f"{path.relative_to(ROOT)}:{m.lineno}: {m.message % m.message_args}"
            for m in found.messages if isinstance(m, messages.UndefinedName)]


def test_product_modules_have_no_undefined_names():
    problems = [p for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
                for p in undefined_names(path)]
    assert not problems, "\n".join(problems)
