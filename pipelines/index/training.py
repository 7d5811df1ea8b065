"""Training an index in memory that does not grow with the language.

The coarse quantiser of an IVF index wants ~40-100 training vectors a list, so a one-level k-means
at the size table's top row (262,144 lists) would hold 10-26M vectors (10-26 GB at 256
dimensions) in one worker. Instead the trainer holds at most `memory_rows` vectors at a time:

1. a sample of `memory_rows` rows trains the pre-transforms (OPQ) and, at the end, the codes (PQ
   on residuals: 16 or 256 centroids a sub-quantiser need far fewer points than the lists);
2. when the lists want more training vectors than that (`sample_size` > `memory_rows`), the coarse
   quantiser is clustered in two levels: ~sqrt(nlist) first-level centroids on the held sample,
   then the whole training sample is streamed in chunks, each vector spilled to a local temporary
   file of its first-level cluster, and each cluster is split into its share of the lists
   (proportional to its size) from its own file, at most `memory_rows` of its vectors at a time.
   (Two-level clustering as in `faiss.contrib.clustering.two_level_clustering`, with the second
   level's points on disk rather than in memory.)

The worker's memory is then about 3 x memory_rows x dim x 4 bytes (held sample, one chunk, one
cluster) however large the language; local disk holds the streamed sample once (sample_size x dim
x 4 bytes). Recall against one-level training: BENCHMARKS.md ("Worker memory flat").
"""
from __future__ import annotations

import logging
import math
import os
import tempfile
from typing import Callable, Iterator, Sequence

import numpy as np

logger = logging.getLogger(__name__)

TRAIN_MEMORY_ROWS = 16_384  # vectors the trainer holds at once (16 MB at 256 dimensions)
STREAM_CHUNK = 8_192  # rows of the training sample read, assigned and spilled at a time
COARSE_ITERATIONS = 10  # k-means iterations, as FAISS's IVF training (Level1Quantizer.cp.niter)

RowReader = Callable[[int, int, int], np.ndarray]  # (file number, start, stop) -> float32 rows


def level_one_lists(nlist: int) -> int:
    """First-level clusters for `nlist` lists: the power of two nearest sqrt(nlist) (512 at 262,144)."""
    return max(1, 1 << round(math.log2(math.sqrt(nlist))))


def split_lists(counts: np.ndarray, nlist: int) -> np.ndarray:
    """Lists per first-level cluster, proportional to its vectors (largest remainders first), summing
    to `nlist`, never more lists than a cluster has vectors."""
    counts = np.asarray(counts, dtype=np.int64)
    exact = counts * nlist / max(int(counts.sum()), 1)
    lists = np.minimum(np.floor(exact).astype(np.int64), counts)
    for cluster in np.argsort(-(exact - lists), kind="stable"):
        if lists.sum() >= nlist:
            break
        if lists[cluster] < counts[cluster]:
            lists[cluster] += 1
    while lists.sum() < nlist and (room := counts - lists).max() > 0:  # every cluster can take more
        lists[int(np.argmax(room))] += 1
    return lists


def _kmeans(points: np.ndarray, k: int, seed: int) -> np.ndarray:
    """k centroids of `points` as FAISS trains an inner-product IVF: spherical k-means (unit-length
    centroids, max inner product assignment)."""
    import faiss

    if k >= len(points):
        return np.ascontiguousarray(points[:k], dtype=np.float32)
    if k == 1:
        mean = points.mean(axis=0, keepdims=True).astype(np.float32)
        return mean / max(float(np.linalg.norm(mean)), 1e-12)
    parameters = faiss.ClusteringParameters()
    parameters.niter, parameters.seed = COARSE_ITERATIONS, seed
    parameters.max_points_per_centroid, parameters.spherical = 256, True
    clustering = faiss.Clustering(points.shape[1], k, parameters)
    clustering.verbose = False
    clustering.train(np.ascontiguousarray(points, dtype=np.float32), faiss.IndexFlatIP(points.shape[1]))
    return faiss.vector_to_array(clustering.centroids).reshape(k, points.shape[1]).astype(np.float32)


def _chunks(read: RowReader, ranges: Sequence[tuple[int, int, int]], chunk: int) -> Iterator[np.ndarray]:
    """The rows of `ranges`, about `chunk` rows at a time."""
    held, filled = [], 0
    for number, start, stop in ranges:
        held.append(read(number, start, stop))
        filled += stop - start
        if filled >= chunk:
            yield np.concatenate(held)
            held, filled = [], 0
    if held:
        yield np.concatenate(held)


def two_level_centroids(stream: Iterator[np.ndarray], held: np.ndarray, nlist: int, memory_rows: int,
                        seed: int = 0) -> np.ndarray:
    """`nlist` coarse centroids: first-level k-means on `held`, then `stream`'s vectors (already
    transformed like `held`) spilled per first-level cluster to local disk and each cluster split
    into its share of the lists, at most `memory_rows` of its vectors in memory."""
    import faiss

    first = _kmeans(held, min(level_one_lists(nlist), len(held)), seed)
    assign = faiss.IndexFlatIP(first.shape[1])
    assign.add(first)
    dim = first.shape[1]
    with tempfile.TemporaryDirectory(prefix="labse-index-train-") as spill:
        counts = np.zeros(len(first), np.int64)
        for rows in stream:
            _, nearest = assign.search(np.ascontiguousarray(rows, dtype=np.float32), 1)
            nearest = nearest[:, 0]
            order = np.argsort(nearest, kind="stable")
            clusters, starts = np.unique(nearest[order], return_index=True)
            for cluster, lo, hi in zip(clusters, starts, list(starts[1:]) + [len(order)]):
                with open(os.path.join(spill, f"{cluster}.f32"), "ab") as handle:
                    handle.write(np.ascontiguousarray(rows[order[lo:hi]], dtype=np.float32).tobytes())
            counts += np.bincount(nearest, minlength=len(first))
        lists = split_lists(counts, nlist)
        rng = np.random.default_rng(seed)
        centroids = []
        for cluster in np.flatnonzero(lists):
            points = np.memmap(os.path.join(spill, f"{cluster}.f32"), dtype=np.float32, mode="r").reshape(-1, dim)
            if len(points) > memory_rows:
                points = points[np.sort(rng.choice(len(points), memory_rows, replace=False))]
            centroids.append(_kmeans(np.asarray(points), int(lists[cluster]), seed + int(cluster)))
            del points
    logger.info("two-level coarse quantiser: %d first-level clusters, %d lists from %d streamed vectors",
                len(first), nlist, int(counts.sum()))
    return np.concatenate(centroids)


def train_bounded(read: RowReader, held_ranges: Sequence[tuple[int, int, int]],
                  stream_ranges: Sequence[tuple[int, int, int]], dim: int, factory: str, memory_rows: int,
                  seed: int = 0, threads: int = 1, unit: Callable[[np.ndarray], np.ndarray] = lambda x: x):
    """An empty FAISS inner-product index of `factory`, trained holding at most ~`memory_rows` rows.

    `held_ranges` (<= memory_rows rows) train the pre-transforms and the codes; `stream_ranges` (the
    whole training sample) train the coarse quantiser in two levels when they hold more rows than
    `memory_rows`, else the held rows train everything as FAISS would. `unit` makes rows indexable
    (drops unusable rows, scales to unit length)."""
    import faiss

    from pipelines.index.shards import _skip_polysemous_training, faiss_threads, pre_transformed

    with faiss_threads(threads):
        index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
        _skip_polysemous_training(index)
        if index.is_trained:
            return index
        held = unit(np.concatenate([read(*r) for r in held_ranges]))
        streamed = sum(stop - start for _, start, stop in stream_ranges)
        try:
            ivf = faiss.extract_index_ivf(index)
        except RuntimeError:
            ivf = None
        if ivf is not None and streamed > len(held) and ivf.nlist > 1:
            outer = faiss.downcast_index(index)
            chain = ([outer.chain.at(i) for i in range(outer.chain.size())]
                     if isinstance(outer, faiss.IndexPreTransform) else [])
            transformed = held
            for transform in chain:  # trained on the held rows, as IndexPreTransform.train would
                if not transform.is_trained:
                    transform.train(transformed)
                transformed = transform.apply(transformed)
            stream = (pre_transformed(index, unit(rows)) for rows in _chunks(read, stream_ranges, STREAM_CHUNK))
            centroids = two_level_centroids(stream, transformed, ivf.nlist, memory_rows, seed)
            faiss.downcast_index(ivf.quantizer).add(centroids)  # full: IVF training keeps it, trains the codes
        index.train(np.ascontiguousarray(held, dtype=np.float32))
    return index
