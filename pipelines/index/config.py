"""labse-index's configuration (written into `_stats.json` as `config`); each field is also its
option of the same name (`pipelines.io.config_options`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from pipelines.index.training import TRAIN_MEMORY_ROWS
from pipelines.io.config_options import REQUIRED, option

# A shard is one worker's unit when the index is filled and searched: 40M sentences at ~74 bytes is
# 3 GB of codes, ~3.3 GB for the labse-index worker that fills it and ~4 GB a harness thread of a
# labse-mine search worker, which reads the next shard's files onto local disk, not into memory
# (n1-highmem-2 runs two). Every shard a query meets costs it FAISS's fixed ~0.026 ms, so at 20M
# mining a snapshot cost ~1,040 vCPU-hours a billion sentences, at 40M ~880 (BENCHMARKS.md).
DEFAULT_SHARD_SENTENCES = 40_000_000
MAX_SHARD_SENTENCES = 1_000_000_000


@dataclass(frozen=True)
class IndexConfig:
    lang: str = option(REQUIRED, "the language of the vectors (lid.176 code), recorded in the index")
    factory: str = option("auto", "FAISS factory string, e.g. OPQ64,IVF65536,PQ64; auto: by size "
                          "(pipelines/index/choice.py, after stopes: Flat below 10k sentences, IVF-PQ above)")
    train_sample: Optional[int] = option(None, "vectors to train on (default: 100 per IVF list, at least 50,000)")
    shard_sentences: int = option(DEFAULT_SHARD_SENTENCES, "sentences per index shard, one worker's unit (40 million: "
                                  "~3 GB of codes; smaller shards need smaller workers, and each shard a query "
                                  "meets costs it ~0.026 ms: docs/guides/mining-a-snapshot.md)")
    nprobe: int = option(32, "inverted lists a query visits, recorded for labse-mine (32 with 64 hits re-ranked: "
                         "recall@1 0.93 at 2M with fast-scan codes, BENCHMARKS.md; stopes uses 128 without re-ranking)")
    train_memory_rows: int = option(TRAIN_MEMORY_ROWS, "vectors the trainer holds at once: a larger training sample "
                                    "streams through a two-level k-means (pipelines/index/training.py)")
    train_threads: int = option(1, "threads FAISS trains with (one worker trains)")
    seed: int = option(0, "seed of the training sample")

    def __post_init__(self) -> None:
        problems = []
        if not self.factory.strip():
            problems.append("factory (--factory) must be `auto` or a FAISS factory string")
        if self.train_sample is not None and self.train_sample < 1:
            problems.append(f"train_sample (--train-sample) must be at least 1, got {self.train_sample}")
        if not 1 <= self.shard_sentences <= MAX_SHARD_SENTENCES:
            problems.append(f"shard_sentences (--shard-sentences) must be between 1 and {MAX_SHARD_SENTENCES:,}, "
                            f"got {self.shard_sentences}")
        if not 1 <= self.nprobe <= 1 << 20:
            problems.append(f"nprobe (--nprobe) must be between 1 and {1 << 20:,}, got {self.nprobe}")
        if not 64 <= self.train_memory_rows <= 1 << 30:
            problems.append(f"train_memory_rows (--train-memory-rows) must be between 64 and {1 << 30:,}, "
                            f"got {self.train_memory_rows}")
        if not 1 <= self.train_threads <= 1_024:
            problems.append(f"train_threads (--train-threads) must be between 1 and 1,024, got {self.train_threads}")
        if problems:
            raise ValueError("; ".join(problems))
