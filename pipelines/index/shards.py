"""The index's pure logic (no Beam): plan its shards, train it, fill a shard, search shards.

An index directory holds `trained.faiss` (the trained, empty index: rotation, coarse quantiser, PQ
codebooks), `shard-SSSSS-of-NNNNN.faiss` (the trained index with the shard's vectors added; ids
0..n-1 within the shard), `shard-SSSSS-of-NNNNN.txt` (the shard's sentences, line i = id i,
whitespace-normalised: labse-mine's sentence key), `shard-SSSSS-of-NNNNN.f16.npy` (its rows, for
re-ranking), `shard-SSSSS-of-NNNNN.ids.npy` (where each sentence is in the saved vectors it was
built from: labse-mine names a hit by it, without its text, when its store holds those very
files), `_stats.json` and `_SUCCESS` last. Its manifest (`IndexManifest`) is the `index` section
of the stats.

Every shard shares the trained quantiser, so a query visits the same `nprobe` lists in each
shard: its cost is nprobe x (sentences / nlist) codes however many shards the language has, plus
the quantiser, which labse-mine runs once a query for all shards (`coarse_assignment`).
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np

from pipelines.index.vector_files import MatrixFile

TRAINED = "trained.faiss"
RERANK_SUFFIX = ".f16.npy"  # a shard's unit rows as float16, on disk only: exact re-ranking reads its hits
# a shard's sentences as rows of the files it was built from: int64 (file number << 32) | row, the
# file numbers those of the manifest's `source_files` (labse-mine names a hit by its store id with it)
SOURCE_IDS_SUFFIX = ".ids.npy"
SOURCE_ROW_BITS = 32


def shard_name(shard: int, shards: int) -> str:
    return f"shard-{shard:05d}-of-{shards:05d}"


@dataclass(frozen=True)
class ShardPlan:
    """One shard: row ranges (file index, start, stop) of the saved vector files."""

    shard: int
    shards: int
    ranges: tuple[tuple[int, int, int], ...]

    @property
    def name(self) -> str:
        return shard_name(self.shard, self.shards)

    @property
    def rows(self) -> int:
        return sum(stop - start for _, start, stop in self.ranges)


def plan_shards(files: Sequence[MatrixFile], per_shard: int) -> list[ShardPlan]:
    """Consecutive row ranges of at most `per_shard` rows (a shard may span files)."""
    total = sum(f.rows for f in files)
    shards = max(1, math.ceil(total / per_shard))
    plans, current, filled = [], [], 0
    for number, f in enumerate(files):
        start = 0
        while start < f.rows:
            take = min(f.rows - start, per_shard - filled)
            current.append((number, start, start + take))
            filled += take
            start += take
            if filled == per_shard:
                plans.append(current)
                current, filled = [], 0
    if current or not plans:
        plans.append(current)
    return [ShardPlan(i, shards, tuple(r)) for i, r in enumerate(plans)]


class SeenKeys:
    """The 64-bit keys seen so far, as a few sorted numpy runs (merged like a binary counter):
    8 bytes a key and no Python object per key; a lookup is a binary search in each run."""

    def __init__(self) -> None:
        self.runs: list[np.ndarray] = []

    def __len__(self) -> int:
        return sum(len(run) for run in self.runs)

    def add_new(self, keys: np.ndarray) -> list[int]:
        """Positions in `keys` of those not seen before (the first of repeats within `keys`), which
        are then remembered."""
        keys = np.asarray(keys, dtype=np.uint64)
        _, first = np.unique(keys, return_index=True)
        fresh = np.zeros(len(keys), bool)
        fresh[first] = True
        for run in self.runs:
            at = np.minimum(np.searchsorted(run, keys), len(run) - 1)
            fresh &= run[at] != keys
        new = np.sort(keys[fresh])
        if len(new):
            self.runs.append(new)
            while len(self.runs) > 1 and len(self.runs[-2]) <= 2 * len(self.runs[-1]):
                merged = np.concatenate([self.runs.pop(), self.runs.pop()])
                merged.sort(kind="stable")
                self.runs.append(merged)
        return np.flatnonzero(fresh).tolist()


SAMPLE_RUN = 256  # rows read together: a sample of runs costs size/256 ranged reads, not one a row


def sample_ranges(files: Sequence[MatrixFile], size: int, seed: int = 0) -> list[tuple[int, int, int]]:
    """About `size` rows over all files as (file index, start, stop) runs of SAMPLE_RUN consecutive
    rows, the runs chosen uniformly (files hold sentences in crawl order, so a run of neighbours is
    as varied as the page it came from, and a sample of a billion rows stays cheap to read)."""
    runs = [(number, start, min(start + SAMPLE_RUN, f.rows))
            for number, f in enumerate(files) for start in range(0, f.rows, SAMPLE_RUN)]
    wanted = min(len(runs), max(1, math.ceil(size / SAMPLE_RUN)))
    chosen = np.sort(np.random.default_rng(seed).choice(len(runs), size=wanted, replace=False))
    return [runs[i] for i in chosen]


def usable_rows(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(unit-length float32 rows that can be indexed, mask of non-finite rows, mask of zero rows)."""
    finite = np.isfinite(vectors).all(axis=1)
    norms = np.linalg.norm(np.where(finite[:, None], vectors, 0), axis=1)
    zero = finite & (norms == 0)
    keep = finite & ~zero
    unit = np.ascontiguousarray(vectors[keep] / norms[keep, None], dtype=np.float32)
    return unit, ~finite, zero


@contextmanager
def faiss_threads(threads: int):
    """FAISS runs on `threads` OpenMP threads inside the block, and the calling thread's count is
    given back after it: the OpenMP runtime (and its count) is shared with torch, so a count left
    at 1 would slow every later torch operation of the process and change its reduction order."""
    import faiss

    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(threads)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def train_index(sample: np.ndarray, factory: str, threads: int = 1):
    """An empty FAISS inner-product index of `factory`, trained on unit-length `sample` rows."""
    import faiss

    with faiss_threads(threads):
        index = faiss.index_factory(sample.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
        _skip_polysemous_training(index)
        if not index.is_trained:
            index.train(np.ascontiguousarray(sample, dtype=np.float32))
    return index


def _skip_polysemous_training(index) -> None:
    """FAISS's factory turns on polysemous training for PQ codes (a slow annealing that only
    Hamming-distance filtering uses, which labse-mine never turns on): off."""
    import faiss

    for candidate in (index, getattr(faiss, "downcast_index", lambda x: x)(index)):
        try:
            ivf = faiss.extract_index_ivf(candidate)
        except RuntimeError:
            ivf = None
        for part in (candidate, ivf):
            if part is not None and hasattr(part, "do_polysemous_training"):
                part.do_polysemous_training = False
    pq_index = faiss.downcast_index(index.index) if hasattr(index, "index") and isinstance(
        faiss.downcast_index(index), faiss.IndexPreTransform) else None
    if pq_index is not None and hasattr(pq_index, "do_polysemous_training"):
        pq_index.do_polysemous_training = False


def to_bytes(index) -> bytes:
    import faiss

    return faiss.serialize_index(index).tobytes()


def from_bytes(data: bytes):
    import faiss

    return faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))


QUANTISER_EF_SEARCH = 64  # an HNSW coarse quantiser's candidates a query: FAISS's default 16 finds
# 73% of the 32 nearest of 262,144 lists, 64 finds 90% at 0.4 ms, under half a flat quantiser's
# 0.95 ms (BENCHMARKS.md, "Global mining under the goal")


def set_nprobe(index, nprobe: int) -> None:
    """Search `nprobe` inverted lists (capped at the index's list count), an HNSW coarse quantiser
    (`IVF<n>_HNSW32`) with max(QUANTISER_EF_SEARCH, 2 x nprobe) candidates (adding vectors keeps
    FAISS's 16: one list each); no-op without IVF."""
    import faiss

    try:
        ivf = faiss.extract_index_ivf(index)
    except RuntimeError:
        return
    ivf.nprobe = min(nprobe, ivf.nlist)
    quantiser = faiss.downcast_index(ivf.quantizer)
    if isinstance(quantiser, faiss.IndexHNSW):
        quantiser.hnsw.efSearch = quantiser_ef_search(ivf.nprobe)


def quantiser_ef_search(nprobe: int) -> int:
    return max(QUANTISER_EF_SEARCH, 2 * nprobe)


@dataclass(frozen=True)
class IndexManifest:
    """What labse-mine needs to search an index directory (the `index` section of its stats)."""

    lang: str
    factory: str
    dim: int
    nprobe: int
    trained_on: int
    shards: list[dict] = field(default_factory=list)   # {"name", "sentences", "bytes"}
    bytes_per_sentence: float = 0.0                  # measured: (shard bytes - shared) / sentences
    shared_bytes_per_shard: int = 0                  # the trained index every shard file repeats
    rerank_vectors: bool = False                     # shard-*.f16.npy: the rows, for exact re-ranking
    source_files: list[dict] = field(default_factory=list)  # `source_identity` of each file built from
    source_ids: bool = False                         # shard-*.ids.npy: each sentence's file and row there

    @property
    def sentences(self) -> int:
        return sum(s["sentences"] for s in self.shards)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "IndexManifest":
        """Read back from an index's `_stats.json`: shard names are plain file names in the index
        folder and counts are non-negative integers, or ValueError (nothing named there is trusted)."""
        for shard in data.get("shards") or []:
            name = shard.get("name") if isinstance(shard, dict) else None
            if (not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name
                    or ":" in name):
                raise ValueError(f"shard name {name!r} is not a file name inside the index folder")
            count = shard.get("sentences")
            if not _count(count):
                raise ValueError(f"shard {name}: sentence count {count!r} is not a non-negative integer")
        sources = data.get("source_files") or []
        for source in sources:
            if (not isinstance(source, dict) or not isinstance(source.get("path"), str)
                    or any(not _count(source.get(n)) for n in ("rows", "npy_bytes", "txt_bytes"))
                    or any(not isinstance(source.get(n), (int, float)) or isinstance(source.get(n), bool)
                           for n in ("npy_updated", "txt_updated"))):
                raise ValueError(f"source file {source!r} is not a path with its rows, sizes and times")
        return cls(**{k: data[k] for k in ("lang", "factory", "dim", "nprobe", "trained_on", "shards",
                                          "bytes_per_sentence", "shared_bytes_per_shard")},
                   rerank_vectors=bool(data.get("rerank_vectors")), source_files=list(sources),
                   source_ids=bool(data.get("source_ids")) and bool(sources))


def _count(value) -> bool:
    """Whether `value`, read from a manifest, is a count: a non-negative integer."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# bytes of a shard's rows mapped at a time while re-ranking (then dropped): 8,192 rows at dim 256 in
# float16, resident whatever the shard's size (16 MB left a 200,000-sentence shard's worker 6 MB
# larger than a 20,000-sentence one's, whose rows are 10 MB)
RERANK_WINDOW = 4 << 20
RERANK_CHUNK = 8 << 20  # bytes of float32 rows gathered at a time: 8,192 (query, hit) pairs at dim 256


def release_pages(*mapped) -> None:
    """Drop the memory-mapped pages a search touched (numpy memmaps, mmap objects) from this process
    (they stay in the page cache): the rows and lines a worker read would otherwise stay in its
    resident memory, growing with the shard."""
    import mmap

    for item in mapped:
        mapping = item if isinstance(item, mmap.mmap) else getattr(item, "_mmap", None)
        if mapping is not None and hasattr(mmap, "MADV_DONTNEED"):
            mapping.madvise(mmap.MADV_DONTNEED)


def exact_similarities(queries: np.ndarray, ids: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """[n, depth] dot products of each query with the rows `vectors[ids]` of its hits (-inf where an
    id is < 0), in float32, equal to `einsum("qd,qkd->qk")` of the gathered rows.

    The (query, hit) pairs are visited in row order, RERANK_WINDOW bytes of `vectors` at a time,
    and a window's mapped pages are dropped before the next: a batch's hits reach nearly every page
    of a shard's rows (the kernel maps 64 KB around each row read), which would otherwise stay in
    the worker's resident memory until the batch ends, as large as the shard. Each page is still
    read once a batch, so this costs no more page faults than one release a batch."""
    exact = np.full(ids.size, -np.inf, np.float32)
    hits = ids.ravel()
    pairs = np.flatnonzero(hits >= 0)
    dim = vectors.shape[1]
    window = max(1, RERANK_WINDOW // (dim * vectors.dtype.itemsize))
    chunk = max(1, RERANK_CHUNK // (dim * 4))
    windows = (hits[pairs] // window).astype(np.uint16 if len(vectors) // window < 1 << 16 else np.int64)
    order = np.argsort(windows, kind="stable")  # by window, each window's pairs in query order (a radix sort)
    pairs, windows = pairs[order], windows[order]
    bounds = [0, *(np.flatnonzero(np.diff(windows)) + 1).tolist(), len(pairs)]  # the pairs of each window
    # the chunk's buffers, reused: a fresh one a chunk would be mapped and faulted in a page at a time
    size = min(chunk, len(pairs))
    stored, rows, asking = np.empty((size, dim), vectors.dtype), np.empty((size, dim), np.float32), np.empty((size, dim), np.float32)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        for start in range(lo, hi, chunk):
            part = pairs[start:min(hi, start + chunk)]
            n = len(part)
            np.take(vectors, hits[part], axis=0, out=stored[:n], mode="clip")  # clip: no buffered copy
            np.copyto(rows[:n], stored[:n])
            np.take(queries, part // ids.shape[1], axis=0, out=asking[:n], mode="clip")
            exact[part] = np.einsum("nd,nd->n", asking[:n], rows[:n])
        release_pages(vectors)
    return exact.reshape(ids.shape)


def _searched_ivf(index):
    """The IVF index whose lists a search of `index` scans when a coarse assignment can be handed to
    it: `index` itself, or the one behind its pre-transforms (OPQ, PCA); None for any other index
    (flat, or a refinement layer, whose search does more than scan the lists)."""
    import faiss

    index = faiss.downcast_index(index)
    if isinstance(index, faiss.IndexPreTransform):
        index = faiss.downcast_index(index.index)
    return index if isinstance(index, faiss.IndexIVF) else None


def pre_transformed(index, rows: np.ndarray) -> np.ndarray:
    """`rows` through `index`'s (trained) pre-transforms, e.g. OPQ; without any, as they are."""
    import faiss

    index = faiss.downcast_index(index)
    if isinstance(index, faiss.IndexPreTransform):
        for step in range(index.chain.size()):
            rows = index.chain.at(step).apply(rows)
    return rows


def coarse_assignment(index, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The `nprobe` inverted lists each query visits in `index` and its similarities to their
    centroids: ([n, nprobe] int32 list numbers, [n, nprobe] float32), 8 bytes a list a query; None
    where `index` has no lists to assign (`_searched_ivf`).

    Every shard of an index is a copy of one trained index (`trained.faiss`) with its own vectors
    added, so all share the coarse quantiser and one assignment serves a query in each of them
    (`search_shard_arrays(assigned=...)`): the quantiser (0.41 ms a query with HNSW at 262,144 lists)
    runs once a query, not once a shard."""
    ivf = _searched_ivf(index)
    if ivf is None:
        return None
    queries = pre_transformed(index, np.ascontiguousarray(queries, dtype=np.float32))
    similarities, lists = ivf.quantizer.search(queries, ivf.nprobe)
    return lists.astype(np.int32), similarities


class RerankFloor:
    """The re-ranking of a query's hits across the shards of one index, at the index's depth, not
    each shard's.

    A shard proposes `depth` hits a query by its codes; of an index in one shard, the `depth` best
    by code similarity are re-ranked by exact cosine. Per query this keeps the `depth` best code
    similarities proposed by the shards searched so far (`best`, 4 bytes each): a hit under the
    last of them cannot be among the whole index's `depth` best by codes, so a later shard
    re-ranks only its hits at or above it. The hits re-ranked are a superset of those the index in
    one shard would re-rank, and about depth x (1 + ln shards) a query, where every shard's own
    would be depth x shards (`reranked` counts them)."""

    def __init__(self, queries: int, depth: int, best: np.ndarray | None = None):
        # `best`: where to keep them ([queries, depth] float32 filled with -inf), e.g. a group's
        # state on local disk
        self.best = np.full((queries, depth), -np.inf, np.float32) if best is None else best
        self.reranked = 0

    def apply(self, code_sims: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """A shard's proposals ([n, w] code similarities; positions, -1 for none) -> the positions
        to re-rank (-1 for the rest); `best` then takes in this shard's proposals."""
        proposed = np.where(ids >= 0, code_sims, -np.inf).astype(np.float32)
        kept = np.where(proposed >= self.best.min(axis=1, keepdims=True), ids, -1)
        self.reranked += int((kept >= 0).sum())
        depth = self.best.shape[1]
        both = np.concatenate([self.best, proposed], axis=1)
        self.best[...] = -np.partition(-both, depth - 1, axis=1)[:, :depth]
        return kept


def search_shard(index, labels: Sequence, queries: np.ndarray, k: int, vectors: np.ndarray | None = None,
                 depth: int = 0) -> list[list[tuple[float, object]]]:
    """Top-`k` (similarity, label) of every query in one shard, best first; hit i is `labels[i]`.
    Hits FAISS could not fill are left out (`search_shard_arrays` has the rest)."""
    sims, ids = search_shard_arrays(index, queries, k, vectors, depth)
    return [[(float(s), labels[i]) for s, i in zip(srow, irow) if i >= 0] for srow, irow in zip(sims, ids)]


def search_shard_arrays(index, queries: np.ndarray, k: int, vectors: np.ndarray | None = None,
                        depth: int = 0, assigned: tuple[np.ndarray, np.ndarray] | None = None,
                        floor: RerankFloor | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Top-`k` of every query in one shard as arrays: float32 similarities and int64 positions in
    the shard `[n, min(k, ntotal)]`, best first, a hit FAISS could not fill (or not finite) as
    (-inf, -1).

    With the shard's `vectors` (its rows, unit length, e.g. the float16 copy labse-index writes)
    and `depth` > k, the index proposes `depth` hits by its compressed codes and the exact cosine
    re-ranks them: the similarities returned are exact.

    With `assigned`, the queries' `coarse_assignment` from this index or another shard of it, the
    lists are scanned without running the quantiser again (the same hits as a plain search). With
    `floor`, the same queries' `RerankFloor` over the shards searched before this one, only the
    proposals that can be among the index's `depth` best by codes are re-ranked."""
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    if index.ntotal == 0 or len(queries) == 0:
        return np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64)
    rerank = vectors is not None and depth > k
    wanted = min(depth if rerank else k, index.ntotal)
    ivf = _searched_ivf(index) if assigned is not None else None
    if ivf is not None:
        lists, similarities = assigned
        if lists.shape != (len(queries), ivf.nprobe):
            raise ValueError(f"a coarse assignment of {lists.shape[1]} lists a query for an index that visits "
                             f"{ivf.nprobe}")
        sims, ids = ivf.search_preassigned(pre_transformed(index, queries), wanted, lists, similarities)
    else:
        sims, ids = index.search(queries, wanted)
    if rerank:
        if floor is not None:
            ids = floor.apply(sims, ids)
        exact = exact_similarities(queries, ids, vectors)
        order = np.argsort(-exact, axis=1, kind="stable")[:, :k]
        sims, ids = np.take_along_axis(exact, order, axis=1), np.take_along_axis(ids, order, axis=1)
    missing = (ids < 0) | ~np.isfinite(sims)
    return (np.where(missing, -np.inf, sims).astype(np.float32),
            np.where(missing, -1, ids).astype(np.int64))
