"""The batch writer's external merge sort (`pipelines.io.sorted_parquet.write_sorted_parquet`) against
the peer it replaces, one in-memory `pyarrow.Table.sort_by` of a whole file then `pq.write_table`
(`write_table_atomic`), on the same 200,000 pair rows (`PAIR_SCHEMA`, random multilingual texts of
WORDS words a side) in record batches of 1,000 rows.

Prints, for each: the peak of the Arrow memory the write allocates (a proxy memory pool set just
before it, so the input batches do not count), CPU seconds (process time: this machine is shared,
wall time is not comparable) over RUNS runs, and whether the two files hold the same rows in the
same order (rows that tie on (src, tgt) the peer leaves in arrival order, the merge orders by the other
columns).

    PYTHONPATH=. .venv/bin/python benchmarks/sorted_writer.py [WORDS ...]
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.io.parquet import write_table_atomic
from pipelines.io.sorted_parquet import RUN_BYTES, sort_keys, write_sorted_parquet
from pipelines.mine.transforms import PAIR_SCHEMA

ROWS = 200_000
RUNS = 3
WORDS = ["Wort", "über", "Straße", "the", "cat", "naïve", "日本", "xxxxxxxxxxxx", "sentence", "mining"]


def pair_batches(words: int) -> list[pa.RecordBatch]:
    rng = np.random.default_rng(1)
    vocabulary = np.array(WORDS, dtype=object)

    def texts():
        return [" ".join(rng.choice(vocabulary, words)) for _ in range(ROWS)]

    ids = [str(i) for i in range(ROWS)]
    table = pa.table({"src": texts(), "tgt": texts(), "src_lang": ["de"] * ROWS, "tgt_lang": ["en"] * ROWS,
                      "cosine": rng.random(ROWS).astype(np.float32), "margin": rng.random(ROWS).astype(np.float32),
                      "src_url": [f"https://example.org/some/long/path/{i}" for i in ids], "src_doc_id": ids,
                      "tgt_url": [f"https://example.com/other/path/{i}" for i in ids], "tgt_doc_id": ids},
                     schema=PAIR_SCHEMA)
    return table.to_batches(max_chunksize=1000)


def in_memory(batches, path):
    write_table_atomic(pa.Table.from_batches(batches, schema=PAIR_SCHEMA).sort_by([("src", "ascending"),
                                                                                   ("tgt", "ascending")]), path)


def merged(batches, path):
    write_sorted_parquet(iter(batches), path, PAIR_SCHEMA, ("src", "tgt"))


def measure(write, batches, path) -> tuple[float, list[float]]:
    parent = pa.default_memory_pool()
    pool = pa.proxy_memory_pool(parent)
    pa.set_memory_pool(pool)
    try:
        write(batches, path)
    finally:
        pa.set_memory_pool(parent)
    seconds = []
    for _ in range(RUNS):
        start = time.process_time()
        write(batches, path)
        seconds.append(time.process_time() - start)
    return pool.max_memory() / 2**20, seconds


def main(argv: list[str]) -> None:
    folder = tempfile.mkdtemp(prefix="sorted-writer-")
    for words in [int(w) for w in argv] or [5, 20, 80]:
        batches = pair_batches(words)
        size = sum(b.nbytes for b in batches) / 2**20
        peer_peak, peer_seconds = measure(in_memory, batches, f"{folder}/peer.parquet")
        ours_peak, ours_seconds = measure(merged, batches, f"{folder}/ours.parquet")
        # the peer keeps rows that tie on (src, tgt) in arrival order; the merge orders them by the other columns
        same = pq.read_table(f"{folder}/peer.parquet").sort_by(sort_keys(PAIR_SCHEMA, ("src", "tgt"))).equals(
            pq.read_table(f"{folder}/ours.parquet"))
        print(f"{ROWS:,} pair rows, {size:.0f} MB in Arrow ({words} words a side), runs of {RUN_BYTES >> 20} MiB: "
              f"peak Arrow memory of the write {ours_peak:.0f} MB (merge) vs {peer_peak:.0f} MB (one sort), "
              f"ratio {ours_peak / peer_peak:.2f}; CPU s median {statistics.median(ours_seconds):.2f} "
              f"[{min(ours_seconds):.2f}-{max(ours_seconds):.2f}] vs {statistics.median(peer_seconds):.2f} "
              f"[{min(peer_seconds):.2f}-{max(peer_seconds):.2f}] over {RUNS} runs, ratio "
              f"{statistics.median(ours_seconds) / statistics.median(peer_seconds):.2f}; same rows, in the order of "
              f"one sort by (src, tgt, the other columns): {same}")


if __name__ == "__main__":
    main(sys.argv[1:])
