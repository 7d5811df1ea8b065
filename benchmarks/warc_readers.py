"""Why FastWARC (behind our gzip-member layer) reads WARC files, not warcio: speed and damage.

Run: .venv/bin/python benchmarks/warc_readers.py [--data ../shared/data] [--repeat 20]

1. Speed: records per second over the web-pages sample repeated --repeat times (one gzip member
   per record, as in Common Crawl), for `read_records` (FastWARC, HTTP parsing, content decoding,
   charset detection and decoding to str) and for a warcio loop doing the same decoding steps
   (resiliparse's detect_encoding + bytes.decode), in one process, as a ratio.
2. Damage: what each does on hand-made truncated / garbage / bad Content-Length files, and on the
   web-pages sample itself (all records in one gzip member, which warcio refuses).
"""
from __future__ import annotations

import argparse
import gzip
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _records_of(path: Path) -> list[bytes]:
    """The sample's records, each re-serialised as its own gzip member (Common Crawl layout)."""
    from warcio.archiveiterator import ArchiveIterator
    from warcio.warcwriter import BufferWARCWriter

    import io

    out = []
    # warcio refuses this file as it is (one gzip member for all records): read it decompressed.
    with io.BytesIO(gzip.decompress(path.read_bytes())) as handle:
        for record in ArchiveIterator(handle):
            writer = BufferWARCWriter(gzip=False)
            writer.write_record(record)
            out.append(writer.get_contents())
    return out


def _warcio_read(path: str) -> int:
    from resiliparse.parse.encoding import detect_encoding
    from warcio.archiveiterator import ArchiveIterator

    from pipelines.read.payload import charset_from_content_type, decode_html_bytes

    documents = 0
    with open(path, "rb") as handle:
        for record in ArchiveIterator(handle):
            if record.rec_type != "response":
                continue
            body = record.content_stream().read()  # warcio undoes chunking and Content-Encoding
            content_type = record.http_headers.get_header("Content-Type") if record.http_headers else None
            decode_html_bytes(body, charset_from_content_type(content_type))
            documents += 1
    del detect_encoding
    return documents


def _ours(path: str) -> int:
    from pipelines.io.documents import Document
    from pipelines.read.readers import read_records

    return sum(isinstance(r, Document) for r in read_records(path, "warc"))


def _inflate_comparison(path: str, rounds: int = 3) -> str:
    """`read_records` CPU seconds with python-isal (what gzip_members imports) and with stdlib zlib."""
    import zlib

    from pipelines.read import gzip_members

    isal_zlib = gzip_members.zlib
    best = {}
    try:
        for _ in range(rounds):
            for name, module in (("isal", isal_zlib), ("zlib", zlib)):
                gzip_members.zlib = module
                started = time.process_time()
                _ours(path)
                best[name] = min(best.get(name, float("inf")), time.process_time() - started)
    finally:
        gzip_members.zlib = isal_zlib
    return f"isal {best['isal']:.2f} s, zlib {best['zlib']:.2f} s, ratio {best['zlib'] / best['isal']:.2f}x"


def _outcome(function, path: str) -> str:
    try:
        return f"{function(path)} documents, no error raised"
    except Exception as exc:  # noqa: BLE001 - the point is to show what each library does
        return f"raised {type(exc).__name__}: {str(exc)[:60]}"


def _ours_outcome(path: str) -> str:
    from collections import Counter

    from pipelines.io.documents import Document, ReadError
    from pipelines.read.readers import read_records

    results = list(read_records(path, "warc"))
    errors = Counter(r.reason for r in results if isinstance(r, ReadError))
    return f"{sum(isinstance(r, Document) for r in results)} documents, errors {dict(errors)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("LABSE_DATA", "../shared/data")))
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)

    records = _records_of(args.data / "commoncrawl" / "web-pages-sample.warc.gz")
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "repeated.warc.gz"
        with open(big, "wb") as handle:
            for _ in range(args.repeat):
                for record in records:
                    handle.write(gzip.compress(record, 6))
        results = {}
        for name, function in (("labse read_records (FastWARC)", _ours), ("warcio loop", _warcio_read)):
            function(str(big))  # warm-up: imports, page cache
            started = time.perf_counter()
            documents = function(str(big))
            seconds = time.perf_counter() - started
            results[name] = documents / seconds
            print(f"{name:32s} {documents} documents in {seconds:.2f} s = {documents / seconds:,.0f} documents/s")
        ours, peer = results.values()
        print(f"ratio (ours / warcio): {ours / peer:.2f}x")
        print(f"inflate: ours with ISA-L (python-isal) vs ours with the standard library's zlib, CPU time: "
              f"{_inflate_comparison(str(big))}")

        print("\ndamaged files (5 good records, damage after the 2nd or 3rd):")
        members = [gzip.compress(r) for r in records[1:6]]
        cases = {
            "truncated mid-member": b"".join(members[:4])[: sum(map(len, members[:3])) + len(members[3]) // 2],
            "garbage between members": members[0] + members[1] + b"\x00garbage\xff" * 50 + b"".join(members[2:]),
            "bad Content-Length": members[0] + members[1]
            + gzip.compress(records[3].replace(b"Content-Length: ", b"Content-Length: x", 1)) + b"".join(members[3:]),
        }
        cases["whole file as one gzip member (the web-pages sample)"] = (
            args.data / "commoncrawl" / "web-pages-sample.warc.gz").read_bytes()
        for case, data in cases.items():
            path = Path(tmp) / "damaged.warc.gz"
            path.write_bytes(data)
            print(f"  {case}:")
            print(f"    ours:   {_ours_outcome(str(path))}")
            print(f"    warcio: {_outcome(_warcio_read, str(path))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
