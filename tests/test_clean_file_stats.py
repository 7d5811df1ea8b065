"""stats.json's per-input-file breakdown (issue 14): exact totals, a bounded list of the files with
the most errored documents, and a damaged file that shows up in it."""
from __future__ import annotations

import json
import random
import shutil
from collections import Counter

import pyarrow.dataset as ds
import pytest

from pipelines.clean.cli import main, run
from pipelines.clean.transforms import FileBreakdown, per_file_violations
from pipelines.io.documents import ReadError
from pipelines.read.readers import read_records
from pipelines.clean.config import CleanConfig
from tests.conftest import require_file

CC = "commoncrawl/CC-MAIN-2020-34-sample.warc.gz"
FIELDS = ("documents_read", "documents_kept", "documents_dropped", "documents_errored")


def _combine(fn: FileBreakdown, file_tallies: list, parts: int) -> dict:
    """What a runner does: add inputs to several accumulators, merge them, extract."""
    accumulators = [fn.create_accumulator() for _ in range(parts)]
    for i, item in enumerate(file_tallies):
        accumulators[i % parts] = fn.add_input(accumulators[i % parts], item)
    return fn.extract_output(fn.merge_accumulators(accumulators))


def _synthetic(n_files: int, seed: int = 0) -> list:
    rng = random.Random(seed)
    tallies = []
    for i in range(n_files):
        read = rng.randint(1, 50)
        errored = rng.choice([0, 0, 0, 1, 2, 5]) if read > 5 else 0
        with_candidates = rng.randint(0, read - errored)
        kept = rng.randint(0, with_candidates)
        tally = {"read": read, "errored": errored, "dropped": read - errored - with_candidates,
                 "with_candidates": with_candidates, "kept": kept}
        if errored:
            tally["errored.truncated_gzip"] = errored
        tallies.append((f"gs://bucket/crawl/file-{i:05d}.warc.gz", tally))
    return tallies


def _stats_for(section: dict) -> dict:
    """Top-level counts as labse-clean writes them, with the section's totals."""
    return {"documents_read": section["documents_read"], "documents_kept": section["documents_kept"],
            "documents_dropped": {"warc_type:request": section["documents_dropped"]},
            "documents_errored": section["documents_errored"], "per_file": section}


@pytest.mark.parametrize("parts", [1, 3, 7])
def test_the_breakdown_is_exact_bounded_and_deterministic(parts):
    tallies = _synthetic(2000)
    section = _combine(FileBreakdown(limit=25), tallies, parts)
    assert section == _combine(FileBreakdown(limit=25), list(reversed(tallies)), parts + 1)
    assert section["files"] == 2000 and section["truncated"] and len(section["top_files"]) == 25
    assert section["other_files"]["files"] == 1975
    for field, key in zip(FIELDS, ("read", "kept", None, "errored")):
        if key:
            assert section[field] == sum(t.get(key, 0) for _, t in tallies)
        assert sum(e[field] for e in section["top_files"]) + section["other_files"][field] == section[field]
    assert section["files_with_errors"] == sum(1 for _, t in tallies if t["errored"])
    # The most errored files first, ties by name; nothing left out errored more than the last listed.
    ranked = sorted(tallies, key=lambda ft: (-ft[1]["errored"], ft[0]))[:25]
    assert [e["file"] for e in section["top_files"]] == [f for f, _ in ranked]
    for entry in section["top_files"]:
        assert entry["documents_read"] == entry["documents_kept"] + entry["documents_dropped"] + entry["documents_errored"]
        assert entry["errors"] == {"truncated_gzip": entry["documents_errored"]}
    assert per_file_violations(_stats_for(section)) == []


def test_few_files_are_all_listed_and_a_broken_sum_is_reported():
    section = _combine(FileBreakdown(), _synthetic(3), 2)
    assert not section["truncated"] and len(section["top_files"]) == 3 and section["other_files"]["files"] == 0
    assert _combine(FileBreakdown(limit=0), _synthetic(3), 2)["top_files"] == []
    assert _combine(FileBreakdown(), [], 1)["files"] == 0
    stats = _stats_for(section)
    stats["documents_errored"] += 1
    assert any("documents_errored" in problem for problem in per_file_violations(stats))
    with pytest.raises(ValueError):
        FileBreakdown(limit=-1)


@pytest.mark.slow
def test_a_truncated_file_among_good_ones_shows_its_errors(labse_data, tmp_path):
    """The CC sample, a copy cut in the middle of a gzip member and an empty file, listed two by two."""
    source = require_file(labse_data, CC)
    inputs = tmp_path / "in"
    inputs.mkdir()
    shutil.copy(source, inputs / "a-good.warc.gz")
    data = source.read_bytes()
    (inputs / "b-cut.warc.gz").write_bytes(data[: len(data) * 6 // 10])
    (inputs / "c-empty.warc.gz").write_bytes(b"")
    out = tmp_path / "out"
    stats = run([(str(inputs / "*.warc.gz"), "warc")], str(out), CleanConfig(), per_file_limit=2)

    section = stats["per_file"]
    assert stats["identity_holds"] and per_file_violations(stats) == []
    assert section["files"] == 3 and section["files_with_errors"] == 2 and section["truncated"]
    cut, empty = section["top_files"]
    assert cut["file"].endswith("b-cut.warc.gz") and cut["errors"] == {"truncated_gzip": 1}
    assert empty["file"].endswith("c-empty.warc.gz") and empty["errors"] == {"empty_file": 1}
    assert empty["documents_read"] == 1 and empty["documents_errored"] == 1
    # The good file is the one not listed; every file's documents are what its reader yields.
    assert section["other_files"] == {"files": 1, "documents_read": len(list(read_records(str(source), "warc"))),
                                      "documents_kept": section["other_files"]["documents_kept"],
                                      "documents_dropped": section["other_files"]["documents_dropped"],
                                      "documents_errored": 0}
    records = list(read_records(str(inputs / "b-cut.warc.gz"), "warc"))
    assert cut["documents_read"] == len(records)
    assert cut["documents_errored"] == sum(isinstance(r, ReadError) for r in records) == 1
    # Kept documents per file are the documents with a row in the Parquet output.
    table = ds.dataset(str(out / "sentences"), partitioning="hive").to_table(columns=["file", "offset", "doc_id"])
    kept = Counter(f for f, _o, _d in set(zip(*(table.column(c).to_pylist() for c in ("file", "offset", "doc_id")))))
    # (the cut copy's pages are duplicates of the good file's, which sorts first and keeps them)
    assert cut["documents_kept"] == kept[cut["file"]] == 0 and len(kept) == 1
    assert section["other_files"]["documents_kept"] == kept[str(inputs / "a-good.warc.gz")] > 0
    for field in FIELDS:
        assert section[field] == (stats[field] if field != "documents_dropped"
                                  else sum(stats["documents_dropped"].values()))
    written = json.loads((out / "stats.json").read_text(encoding="utf-8"))
    assert written["per_file"] == section


def test_the_cli_refuses_a_negative_limit(tmp_path, labse_data, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--input", str(require_file(labse_data, CC)), "--output", str(tmp_path / "o"), "--per-file-limit", "-1"])
    assert exit_info.value.code == 2
    assert "--per-file-limit must be >= 0" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
