"""labse-tfrecords' configuration (written into the manifest); checked when built."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TFRecordsConfig:
    max_seq_length: int = 64
    num_shards: int = 16
    min_score: float | None = None
    include_text: bool = False
    seed: int = 0
    tokenize_batch_size: int = 512

    def __post_init__(self):
        if self.max_seq_length < 3:
            raise ValueError(f"max_seq_length must be >= 3 ([CLS], one piece, [SEP]), got {self.max_seq_length}")
        if self.num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {self.num_shards}")
