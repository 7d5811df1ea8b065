"""What the trainer's token-id check (issue 26 item 9) costs the data loader.

PairBatchStream checks every batch's ids against the vocabulary size where records are decoded
(`_check_ids`: one min and one max over the batch). This times that check alone and `pairs()`
(read + decode + truncate) without it, on one shard of 16,384 pairs whose ids are drawn uniformly
from a 30,522-id vocabulary with 8-63 tokens a side (the cost depends on lengths, not on values).

    nice -n 10 .venv/bin/python benchmarks/token_id_check.py --work bench_out/ids [--repeats 5]
"""
from __future__ import annotations

import argparse
import statistics
import timeit
from pathlib import Path

import numpy as np

from labse_model.data import PairBatchStream, ShardSet
from pipelines.io.tfrecord import TFRecordWriter, encode_example

VOCAB_SIZE = 30522
BATCH = 256


def write_shard(path: Path, records: int = 16384) -> None:
    rng = np.random.default_rng(0)
    with TFRecordWriter(path) as writer:
        for _ in range(records):
            n, m = rng.integers(8, 64, 2)
            writer.write(encode_example({"src_ids": rng.integers(5, VOCAB_SIZE, n).tolist(),
                                         "tgt_ids": rng.integers(5, VOCAB_SIZE, m).tolist()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True, type=Path)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    shard = args.work / "pairs-00000-of-00001.tfrecord"
    if not shard.exists():
        write_shard(shard)
    stream = PairBatchStream(ShardSet.open([str(shard)]), global_batch_size=BATCH, rank=0, world_size=1, seed=0)
    src, tgt = stream.pairs(0)
    zeros = np.zeros(BATCH, dtype=np.int64)
    checked = PairBatchStream(stream.shards, global_batch_size=BATCH, rank=0, world_size=1, seed=0,
                              vocab_size=VOCAB_SIZE)
    check = [t / 100 for t in timeit.repeat(lambda: checked._check_ids(src, tgt, zeros, zeros), number=100,
                                            repeat=args.repeats)]
    pairs = [t / 10 for t in timeit.repeat(lambda: stream.pairs(0), number=10, repeat=args.repeats)]
    for name, seconds in (("id check", check), ("pairs() without it", pairs)):
        print(f"{name}: median {statistics.median(seconds) * 1e3:.2f} ms, min {min(seconds) * 1e3:.2f}, "
              f"max {max(seconds) * 1e3:.2f} per batch of {BATCH} pairs ({args.repeats} runs)")


if __name__ == "__main__":
    main()
