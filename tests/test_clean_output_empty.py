"""A labse-clean run that keeps no sentence still writes a `sentences/` dataset readable as documented."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow.dataset as ds

from pipelines.clean.cli import main
from pipelines.io.parquet import NO_SENTENCES_FILE, SENTENCE_SCHEMA

NAVIGATION_ONLY = (
    b"<html><body><nav><a href='/'>Home</a> | <a href='/news'>News</a> | <a href='/about'>About us</a>"
    b"</nav><footer>Copyright 2020 Example Ltd. All rights reserved.</footer></body></html>"
)


def _navigation_page_warc(path: Path) -> Path:
    http = (b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n"
            b"Content-Length: %d\r\n\r\n" % len(NAVIGATION_ONLY)) + NAVIGATION_ONLY
    head = (
        "WARC/1.0\r\nWARC-Type: response\r\nWARC-Record-ID: <urn:uuid:00000000-0000-0000-0000-0000000000aa>\r\n"
        "WARC-Date: 2020-08-01T00:00:00Z\r\nWARC-Target-URI: http://example.com/\r\n"
        f"Content-Type: application/http; msgtype=response\r\nContent-Length: {len(http)}\r\n\r\n"
    ).encode("ascii")
    path.write_bytes(gzip.compress(head + http + b"\r\n\r\n"))
    return path


def test_a_run_that_keeps_no_sentence_writes_an_empty_readable_dataset(tmp_path):
    warc = _navigation_page_warc(tmp_path / "navigation-only.warc.gz")
    out = tmp_path / "out"

    assert main(["--input", str(warc), "--output", str(out)]) == 0

    stats = json.loads((out / "stats.json").read_text(encoding="utf-8"))
    assert stats["documents_read"] == 1 and stats["sentences_kept"] == 0 and stats["per_language"] == {}
    table = ds.dataset(str(out / "sentences"), partitioning="hive").to_table()
    assert table.num_rows == 0
    assert table.schema.equals(SENTENCE_SCHEMA)
    # Readers that glob the language directories see no file at all.
    assert [p.name for p in (out / "sentences").iterdir()] == [NO_SENTENCES_FILE]
