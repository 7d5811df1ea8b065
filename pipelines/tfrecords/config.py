"""labse-tfrecords' configuration (written into the manifest); checked when built."""
from __future__ import annotations

import math
from dataclasses import dataclass

from pipelines.io.config_options import not_an_option, option

# Every shard is one file, one group of the shuffle and one entry of schema.json: far more shards than
# that make the stage's bookkeeping, not its data, the cost (10^12 would never finish).
MAX_NUM_SHARDS = 100_000
# The default shard size: the trainer holds the offset indexes (8 bytes a record) of a window of shards
# (labse_model.data), so shards of about a million records keep that at ~64 MB a reading process.
RECORDS_PER_SHARD = 1_000_000


def shards_for(pairs: int) -> int:
    """The default shard count for `pairs` input pairs: about RECORDS_PER_SHARD records a shard."""
    return min(MAX_NUM_SHARDS, max(1, math.ceil(pairs / RECORDS_PER_SHARD)))


@dataclass(frozen=True)
class TFRecordsConfig:
    max_seq_length: int = option(64, "ids per side including [CLS] and [SEP] (default 64, as the paper)")
    num_shards: int | None = option(None, "output shards (default: input pairs / 10^6, at least 1: shards of about "
                                    "a million records); each is sorted in one worker's memory, so keep shards "
                                    "under ~1 GB")
    min_score: float | None = option(None, "drop pairs scored below this (default: keep all)")
    include_text: bool = option(False, "also store src_text/tgt_text")
    seed: int = option(0, "shuffle seed (default 0)")
    tokenize_batch_size: int = not_an_option(512)

    def __post_init__(self):
        if self.max_seq_length < 3:
            raise ValueError(f"max_seq_length must be >= 3 ([CLS], one piece, [SEP]), got {self.max_seq_length}")
        if self.num_shards is not None and not 1 <= self.num_shards <= MAX_NUM_SHARDS:
            raise ValueError(f"num_shards (--num-shards) must be between 1 and {MAX_NUM_SHARDS:,}, got {self.num_shards}")
        if self.min_score is not None and not math.isfinite(self.min_score):
            raise ValueError(f"min_score (--min-score) must be a finite number, got {self.min_score}")
        if self.tokenize_batch_size < 1:
            raise ValueError(f"tokenize_batch_size must be >= 1, got {self.tokenize_batch_size}")
