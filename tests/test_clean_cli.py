"""labse-clean under collisions, interruptions and odd input files (issue 15, items 1, 2, 3, 8, 9)."""
import json
import os
import shutil

import pyarrow.dataset as ds
import pytest

from pipelines.clean.cli import main, run
from pipelines.read.readers import read_records
from pipelines.io.completion import require_complete
from pipelines.io.locks import OutputLockedError, output_lock
from pipelines.clean.config import CleanConfig
from tests.conftest import require_file

CC = "commoncrawl/CC-MAIN-2020-34-sample.warc.gz"


def _errors(out):
    return [json.loads(line) for path in sorted((out / "errors").glob("*.jsonl"))
            for line in path.read_text(encoding="utf-8").splitlines() if line]


@pytest.fixture(scope="module")
def odd_inputs_run(tmp_path_factory, labse_data):
    """One good WARC, its copy under a name that is not UTF-8, a dangling link and a named pipe."""
    root = tmp_path_factory.mktemp("odd")
    inputs = root / "in"
    inputs.mkdir()
    shutil.copyfile(require_file(labse_data, CC), inputs / "good.warc.gz")
    # "good-" sorts before "good.", so the copy is the first source of every sentence and keeps them
    shutil.copyfile(inputs / "good.warc.gz", os.fsencode(inputs) + b"/good-\xff.warc.gz")
    os.symlink(inputs / "gone.warc.gz", inputs / "link.warc.gz")
    os.mkfifo(inputs / "pipe.warc.gz")
    out = root / "out"
    code = main(["--input", str(inputs / "*.warc.gz"), "--output", str(out)])
    return code, out


@pytest.mark.timeout(600)  # includes the module run over a named pipe: a blocking open() hangs it
def test_odd_input_files_are_counted_errors_and_the_run_goes_on(odd_inputs_run):
    code, out = odd_inputs_run
    assert code == 0
    stats = json.loads((out / "stats.json").read_text(encoding="utf-8"))
    by_file = {os.path.basename(e["file"]): e for e in _errors(out) if e["reason"] in ("open_failed", "not_regular_file")}
    assert by_file["link.warc.gz"]["reason"] == "open_failed" and "dangling" in by_file["link.warc.gz"]["detail"]
    assert by_file["pipe.warc.gz"]["reason"] == "not_regular_file" and "named pipe" in by_file["pipe.warc.gz"]["detail"]
    assert stats["identity_holds"] and stats["documents_errored"] >= 2
    # the file whose name is not UTF-8 was read, under a printable name
    files = set(ds.dataset(str(out / "sentences"), partitioning="hive").to_table(columns=["file"])
                .column("file").to_pylist())
    assert any(f.endswith("good-\\xff.warc.gz") for f in files)
    assert require_complete(out, "labse-clean output")["stats"]["documents_read"] == stats["documents_read"]


@pytest.mark.timeout(60)  # a reader that opens the pipe blocks until a writer appears
def test_read_records_never_opens_a_named_pipe(tmp_path):
    os.mkfifo(tmp_path / "pipe.warc.gz")  # opening it would block until a writer appears
    results = list(read_records(str(tmp_path / "pipe.warc.gz"), "warc"))
    assert [(r.reason, r.detail) for r in results] == [("not_regular_file", "not a regular file: named pipe")]


def test_a_second_run_into_a_locked_output_fails_at_once(tmp_path, labse_data, capsys):
    out = tmp_path / "out"
    cc = str(require_file(labse_data, CC))
    with output_lock(out):
        with pytest.raises(OutputLockedError):
            run([(cc, "warc")], str(out), CleanConfig())
        assert main(["--input", cc, "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("labse-clean: error:") and f"pid {os.getpid()}" in err and "out.lock" in err
    assert len(err.splitlines()) == 1
    assert not out.exists()  # nothing was written by the refused runs


def test_output_naming_an_existing_file_is_one_line_exit_2(tmp_path, labse_data, capsys):
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    assert main(["--input", str(require_file(labse_data, CC)), "--output", str(target), "--overwrite"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "existing file" in err
    assert target.read_text() == "mine"
