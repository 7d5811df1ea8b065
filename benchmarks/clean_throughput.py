"""Cleaning throughput: the labse-clean pipeline vs a `trafilatura.extract` loop, on the same pages.

The web-pages WARC (110 real pages) is repeated to at least --pages pages (default 2,000). Measured
in one run, one process each, all on the same pages:

  trafilatura   `trafilatura.extract(html)` per page (what datatrove-style pipelines run), given
                HTML already decoded by our reader (its reading is NOT timed: in its favour);
  text loop     our text functions in a plain Python loop: `clean_document` per page (HTML to lines,
                heuristic main content, lid.176, sentences, filters) plus a dict for dedup;
  pipeline      the whole `labse-clean` Beam pipeline (DirectRunner, one in-process worker): WARC
                reading and decompression, all of the above, dedup, Parquet, errors, stats.json.

Pages per second per core = pages / CPU seconds of the process (and, for the pipeline, its
children), so the numbers do not depend on how busy the shared machine was; wall-clock rates are
printed too. "Beam overhead" = pipeline CPU time / text-loop CPU time.

    .venv/bin/python benchmarks/clean_throughput.py --data ../shared/data [--pages 2000]
"""
from __future__ import annotations

import argparse
import logging
import math
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

WEB_PAGES = "commoncrawl/web-pages-sample.warc.gz"


def cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class Timer:
    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), cpu_seconds()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.wall
        self.cpu = cpu_seconds() - self.cpu


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("LABSE_DATA", "../shared/data")))
    parser.add_argument("--pages", type=int, default=2000)
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary directory")
    args = parser.parse_args(argv)
    logging.getLogger().setLevel(logging.WARNING)

    import trafilatura

    from pipelines.clean import CleanConfig, clean_document, run
    from pipelines.io.documents import Document
    from pipelines.io.readers import read_records
    from pipelines.text.langid import LanguageIdentifier
    from pipelines.text.normalise import dedup_key

    source = args.data / WEB_PAGES
    pages_once = [r for r in read_records(str(source), "warc") if isinstance(r, Document)]
    copies = math.ceil(args.pages / len(pages_once))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="clean-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    repeated = workdir / "web-pages-repeated.warc.gz"
    raw = source.read_bytes()
    repeated.write_bytes(raw * copies)  # concatenated gzip streams are one valid .warc.gz
    docs = [r for r in read_records(str(repeated), "warc") if isinstance(r, Document)]
    n = len(docs)
    print(f"{n} pages ({len(pages_once)} distinct x {copies}), {sum(len(d.body) for d in docs) / 1e6:.0f} MB of HTML",
          file=sys.stderr, flush=True)

    results = {}

    with Timer() as t:
        extracted = sum(1 for d in docs if trafilatura.extract(d.body))
    results["trafilatura.extract loop"] = t
    print(f"trafilatura: {t.wall:.1f} s wall, {t.cpu:.1f} s CPU ({extracted} pages with text)", file=sys.stderr, flush=True)

    config = CleanConfig()
    with Timer() as t:
        lid = LanguageIdentifier()
        seen: dict[tuple[str, str], tuple] = {}
        for doc in docs:
            for row in clean_document(doc, lid, config).rows:
                seen.setdefault((row["lang"], dedup_key(row["text"])), (row["file"], row["offset"]))
    results["text functions, plain loop"] = t
    print(f"text loop: {t.wall:.1f} s wall, {t.cpu:.1f} s CPU ({len(seen)} unique sentences)", file=sys.stderr, flush=True)

    out = workdir / "out"
    shutil.rmtree(out, ignore_errors=True)
    with Timer() as t:
        stats = run([(str(repeated), "warc")], str(out), config, ["--direct_num_workers", "1"])
    results["labse-clean pipeline (DirectRunner)"] = t
    print(f"pipeline: {t.wall:.1f} s wall, {t.cpu:.1f} s CPU ({stats['sentences_kept']} sentences kept)",
          file=sys.stderr, flush=True)
    assert stats["documents_read"] >= n and stats["identity_holds"]

    peer = results["trafilatura.extract loop"]
    print(f"\n{n} pages of {WEB_PAGES} repeated x{copies}\n")
    print("| what | wall s | CPU s | pages/s (wall) | pages/s/core (CPU) | vs trafilatura (per core) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, t in results.items():
        print(f"| {name} | {t.wall:.1f} | {t.cpu:.1f} | {n / t.wall:.0f} | {n / t.cpu:.0f} | "
              f"{peer.cpu / t.cpu:.2f}x |")
    overhead = results["labse-clean pipeline (DirectRunner)"].cpu / results["text functions, plain loop"].cpu
    print(f"\nBeam overhead (pipeline CPU / text-loop CPU): {overhead:.2f}x")
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
