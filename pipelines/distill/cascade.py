"""The mining cascade: a static embedder finds candidates, the teacher decides.

The costly part of mining with a transformer is not scoring a few candidate pairs but searching
every sentence against every other. The cascade searches with the static vectors (cheap to make and
to search) and keeps each sentence's `candidates` nearest, in both directions; the teacher's
cosines are then computed for those candidate pairs only, and the margin (its k-nearest means over
the candidates) and selection are labse-mine's own (`pipelines.mine.margin`). So the teacher's
pairs survive when the static miner ranks them among the first `candidates` (the recall the
benchmark measures), and the teacher's judgement sets the margins.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from pipelines.mine.margin import MarginConfig, MinedPairs, best_candidates, select
from pipelines.mine.search import knn

DEFAULT_CANDIDATES = 16


@dataclass
class Candidates:
    """Each source's (fwd) and each target's (bwd) static nearest neighbours, ids [n, candidates]."""

    fwd_ids: np.ndarray
    bwd_ids: np.ndarray


def static_candidates(static_src: np.ndarray, static_tgt: np.ndarray, candidates: int = DEFAULT_CANDIDATES) -> Candidates:
    _, fwd_ids = knn(static_src, static_tgt, candidates)
    _, bwd_ids = knn(static_tgt, static_src, candidates)
    return Candidates(fwd_ids, bwd_ids)


def _rescored(query: np.ndarray, base: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Teacher cosines of each query's candidate ids, best first."""
    sims = np.einsum("nd,nkd->nk", query, base[ids])
    order = np.argsort(-sims, axis=1, kind="stable")
    return np.take_along_axis(sims, order, axis=1).astype(np.float32), np.take_along_axis(ids, order, axis=1)


def cascade_mine(candidates: Candidates, teacher_src: np.ndarray, teacher_tgt: np.ndarray,
                 config: MarginConfig = MarginConfig()) -> MinedPairs:
    """Pairs with the teacher's margins over the static candidates (`config` as labse-mine's)."""
    if candidates.fwd_ids.shape[1] == 0 or candidates.bwd_ids.shape[1] == 0:
        return MinedPairs.empty()
    fwd_sims, fwd_ids = _rescored(teacher_src, teacher_tgt, candidates.fwd_ids)
    bwd_sims, bwd_ids = _rescored(teacher_tgt, teacher_src, candidates.bwd_ids)
    k = min(config.k, fwd_sims.shape[1])
    fwd_mean, bwd_mean = fwd_sims[:, :k].mean(axis=1), bwd_sims[:, :k].mean(axis=1)
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


def mine_texts(src: Sequence[str], tgt: Sequence[str], static, teacher, *, candidates: int = DEFAULT_CANDIDATES,
               config: MarginConfig = MarginConfig(), log: Callable[[str], None] = lambda _: None) -> MinedPairs:
    """The cascade over texts: `static` and `teacher` are embedders (`encode(texts) -> unit rows`)."""
    found = static_candidates(static.encode(list(src)), static.encode(list(tgt)), candidates)
    log(f"static candidates: {found.fwd_ids.shape[1]} per sentence")
    return cascade_mine(found, teacher.encode(list(src)), teacher.encode(list(tgt)), config)
