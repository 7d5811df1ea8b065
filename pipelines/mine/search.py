"""k-nearest-neighbour search over L2-normalised vectors with FAISS (inner product = cosine).

* `exact` — `IndexFlatIP`, brute force; the right choice up to a few hundred thousand vectors.
* `ivf` — `IndexIVFFlat` (inner product), `nlist` ~ 4*sqrt(n) cells, `nprobe` cells searched.
* `hnsw` — `IndexHNSWFlat` (inner product), graph search, no training.
* `auto` — exact below `SearchConfig.exact_below` base vectors, else `ivf`.

`sharded_knn` searches one query matrix against several base shards (which need not be in memory
together) and merges the per-shard top-k, the same merge the Beam pipeline does across workers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

METHODS = ("auto", "exact", "ivf", "hnsw")


@dataclass(frozen=True)
class SearchConfig:
    method: str = "auto"
    exact_below: int = 100_000     # base sizes below this use brute force under `auto`
    nlist: int | None = None       # IVF cells; default 4 * sqrt(n)
    nprobe: int = 32               # IVF cells visited per query
    hnsw_m: int = 32               # HNSW graph degree
    ef_search: int = 128           # HNSW search breadth
    ef_construction: int = 80

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"search method must be one of {METHODS}, got {self.method!r}")


def _as_matrix(vectors: np.ndarray, dim: int | None = None) -> np.ndarray:
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if vectors.ndim == 1 and vectors.size == 0:
        vectors = vectors.reshape(0, dim or 0)
    if vectors.ndim != 2:
        raise ValueError(f"expected a 2-D matrix of vectors, got shape {vectors.shape}")
    return vectors


def build_index(base: np.ndarray, config: SearchConfig = SearchConfig()):
    """A FAISS inner-product index over `base` (rows L2-normalised by the caller)."""
    import faiss

    base = _as_matrix(base)
    n, dim = base.shape
    method = config.method
    if method == "auto":
        method = "exact" if n < config.exact_below else "ivf"
    if method == "ivf":
        nlist = config.nlist or max(1, int(4 * np.sqrt(n)))
        nlist = min(nlist, max(1, n // 39))  # FAISS wants ~39 training points per cell
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.train(base)
        index.nprobe = min(config.nprobe, nlist)
    elif method == "hnsw":
        index = faiss.IndexHNSWFlat(dim, config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = config.ef_construction
        index.hnsw.efSearch = config.ef_search
    else:
        index = faiss.IndexFlatIP(dim)
    index.add(base)
    return index


def knn(queries: np.ndarray, base: np.ndarray, k: int, config: SearchConfig = SearchConfig(),
        index=None) -> tuple[np.ndarray, np.ndarray]:
    """Top-`k` (similarities, base row ids) for every query, best first.

    With fewer than `k` base rows, all rows are returned (k shrinks); an empty side gives
    `(n_queries, 0)` arrays.
    """
    queries = _as_matrix(queries)
    base = _as_matrix(base, queries.shape[1] if queries.ndim == 2 else None)
    k = min(k, base.shape[0])
    if queries.shape[0] == 0 or k == 0:
        return np.zeros((queries.shape[0], 0), np.float32), np.zeros((queries.shape[0], 0), np.int64)
    if index is None:
        index = build_index(base, config)
    sims, ids = index.search(queries, k)
    # approximate indexes may return fewer than k hits (id -1): push them to the end with -inf
    missing = ids < 0
    if missing.any():
        sims = np.where(missing, -np.inf, sims).astype(np.float32)
    return sims.astype(np.float32), ids.astype(np.int64)


def merge_topk(parts: Iterable[tuple[np.ndarray, np.ndarray]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-shard top-k lists for the same queries (ids already global) into one top-k."""
    parts = [(s, i) for s, i in parts if s.shape[1] > 0]
    if not parts:
        raise ValueError("merge_topk needs at least one non-empty part")
    sims = np.concatenate([s for s, _ in parts], axis=1)
    ids = np.concatenate([i for _, i in parts], axis=1)
    k = min(k, sims.shape[1])
    # stable sort on -sim keeps ties in shard order, so the result matches one exact search
    order = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(sims, order, axis=1), np.take_along_axis(ids, order, axis=1)


def sharded_knn(queries: np.ndarray, shards: Iterable[np.ndarray], k: int,
                config: SearchConfig = SearchConfig()) -> tuple[np.ndarray, np.ndarray]:
    """Search `queries` against each base shard in turn and merge; ids index the concatenation."""
    queries = _as_matrix(queries)
    parts, offset = [], 0
    for shard in shards:
        shard = _as_matrix(shard, queries.shape[1])
        if shard.shape[0]:
            sims, ids = knn(queries, shard, k, config)
            parts.append((sims, ids + offset))
        offset += shard.shape[0]
    if not parts:
        return np.zeros((queries.shape[0], 0), np.float32), np.zeros((queries.shape[0], 0), np.int64)
    return merge_topk(parts, k)


def recall_at_1(approx_ids: np.ndarray, exact_ids: np.ndarray) -> float:
    """Share of queries whose exact nearest neighbour is the approximate index's first hit."""
    if len(exact_ids) == 0:
        return 1.0
    return float((approx_ids[:, 0] == exact_ids[:, 0]).mean())


def top_key(entry):
    """A hit (cosine, other item)'s rank: ties broken by text, so every runner merges identically."""
    sim, other = entry
    return (sim, other[2])


def top_hits(keyed, k: int, key=top_key):
    """(item, all its hits) -> (item, its k largest by `key`, largest first): Top.PerKey's result."""
    item, hits = keyed
    return item, sorted(hits, key=key, reverse=True)[:k]
