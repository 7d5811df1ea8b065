"""The per-document module of labse-clean (`pipelines.clean.document`) stays free of Beam."""
from __future__ import annotations

import doctest
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_per_document_module_does_not_import_apache_beam():
    """Imported in a fresh interpreter (this one has Beam loaded already), cleaning one page with the
    heuristic rules loads no apache_beam module, nor does the main-content model's module that
    `clean_document` imports when given a model."""
    script = (
        "import sys\n"
        "from pipelines.io.documents import Document\n"
        "from pipelines.clean.config import CleanConfig\n"
        "from pipelines.clean.document import clean_document\n"
        "from pipelines.text.langid import LanguageIdentifier\n"
        "import pipelines.main_content.model\n"
        "doc = Document(source='cc', url='u', doc_id='d', file='f', offset=0, kind='html', lang=None,\n"
        "               body='<p>The council approved the new budget on Tuesday after a long debate.</p>')\n"
        "assert clean_document(doc, LanguageIdentifier(), CleanConfig()).rows\n"
        "print(sorted(m for m in sys.modules if m == 'apache_beam' or m.startswith('apache_beam.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_the_clean_document_example_runs():
    import pipelines.clean.document as document

    failed, attempted = doctest.testmod(document, verbose=False)
    assert attempted >= 1 and failed == 0


def test_the_cli_module_keeps_its_public_names(capsys):
    """setup.py's console script, the demo (recipes.demo_text) and benchmarks use these names of
    pipelines.clean.cli: each is resolved the way its user resolves it and called as its user calls it."""
    import importlib
    import inspect
    import re

    import pytest

    import pipelines.clean.cli as clean
    from pipelines.clean.config import CleanConfig
    from pipelines.clean.document import clean_document

    (target,) = re.findall(r'"labse-clean\s*=\s*([\w.]+:\w+)"', (ROOT / "setup.py").read_text(encoding="utf-8"))
    module, name = target.split(":")
    assert getattr(importlib.import_module(module), name) is clean.main
    with pytest.raises(SystemExit) as exit_info:
        clean.main(["--help"])
    assert exit_info.value.code == 0 and "usage: labse-clean" in capsys.readouterr().out
    # benchmarks/clean_throughput.py: run([(path, format)], output, config, beam_args)
    inspect.signature(clean.run).bind([("page.warc.gz", "warc")], "out", CleanConfig(), ["--direct_num_workers", "1"])
    assert clean.CleanConfig is CleanConfig
