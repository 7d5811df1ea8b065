"""Global mining's search, margins and selection on packed elements (`pipelines.mine.packed`).

The steps of `IndexNeighbourLists` / `CandidatesBackwardLists`, `BestCandidates` and `SelectPairs`
with `--embedder vectors:DIR`, with the same numbers, but every element a `Packed` of one range key
`(side, file, block)`: a sentence is its store id, so no shuffle carries a Python object per
sentence, and a worker's share of each shuffle costs its columns' bytes (8 an id, 4 or 8 a number).

1. Search (`_SearchBatches`): a query batch (the run's sentences of one range key) goes, with the
   next batches of its side, across the store's files (`pipelines.mine.search_groups`), through
   every shard of the OTHER side's index: each query's inverted lists are assigned once
   (`coarse_assignment`: all shards share the quantiser), each shard is loaded once for the group,
   the next while this one is searched; the rows are read where they are searched,
   and a hit becomes the other side's store id: from its row in the files the index was built
   from (the shard's `.ids.npy`) where the store holds those files (`store_rows_of`), else
   from its text (`SavedVectorsEmbedder.find`; -1 where the store lacks it). The shards' answers are merged
   as they come into the batch's top k (`merge_top`): one Packed `{ids [n], sims [n, k], hits [n,
   k]}` a batch (missing hits: -inf, -1).
2. `--backward-search candidates`: the side `side_searched_in_full` is searched in full, of the other
   only the sentences in this run's input among those top-k lists (`_AskedOnly`); `all`: both sides.
3. Margins: each (query a, hit b, cosine, a's kNN mean) goes to b's range key (`margin_requests`),
   where b's own mean gives the margin (`score_candidates`; a b with no mean is no candidate:
   `candidates.not_in_input`), and back to a's key, where a keeps its best (`best_candidates`:
   largest (margin, cosine, other id)). These messages name a sentence by its row within its range
   key (`within`: 2 bytes at the default query batch), 16 bytes a hit each way. The best
   candidates leave keyed by the source's range key, so a pair found from both sides meets its
   other record in one group.
4. `PackedSelect`: per distinct pair the strategy's choice (`decide_pairs`), for `max` LASER's
   greedy over the whole run in rounds of candidates that are the best of both their sentences
   (`GreedyMax`: no worker holds the run's candidates), then `--min-margin`.

What differs from the text-keyed path: ties (equal cosines, equal margins) are broken by store ids
instead of texts, which only changes a choice between candidates of exactly equal numbers; and
`--rerank` is the depth of the whole index (`RerankFloor`: a superset of the hits the index in one
shard would re-rank), where the text-keyed path re-ranks that many hits in every shard, so with
compressed codes a kNN list, and a margin, can differ in its last members.
"""
from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from functools import cached_property
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator, Optional

import apache_beam as beam
import numpy as np

from pipelines.accounting import MergeTallies
from pipelines.embed.saved_vectors import is_saved_vectors_spec
from pipelines.index.shards import (SOURCE_IDS_SUFFIX, SOURCE_ROW_BITS, IndexManifest, RerankFloor, coarse_assignment,
                                    search_shard_arrays)
from pipelines.mine.config import MineConfig
from pipelines.mine.index_search import HELD_SHARDS, _SearchShard, index_plan, load_manifest, release_pages
from pipelines.mine.margin import greedy_unique_columns, margin_scores, side_searched_in_full
from pipelines.mine.units import SIDE_UNIT
from pipelines.mine.search_groups import (GROUP_MEMORY, GroupState, batches_per_load, file_block_offsets,
                                          group_bytes_per_query)
from pipelines.mine.packed import (ROW_BITS, SRC, TGT, Packed, among, concat, references, rows_of, split_by_column,
                                   split_by_range, store_ids, take)

logger = logging.getLogger(__name__)
COUNTER_NAMESPACE = "mine"  # the text-keyed path's counters, the same names
OTHER = {SRC: TGT, TGT: SRC}
RangeKey = tuple  # (side, file number, block)


def _side_unit(side: str) -> str:
    return SIDE_UNIT[side]


def _tally(counts: dict):
    """A tally on the `tally` output, without its zero counts (an accounting lists no empty reason)."""
    return beam.pvalue.TaggedOutput("tally", {name: int(n) for name, n in counts.items() if n})


# ------------------------------------------------------------------------------------ pure steps
def pad_hits(sims: np.ndarray, hits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """[n, w] similarities and hit ids -> [n, k], missing columns as (-inf, -1)."""
    n, width = sims.shape
    if width >= k:
        return sims[:, :k], hits[:, :k]
    return (np.concatenate([sims, np.full((n, k - width), -np.inf, np.float32)], axis=1),
            np.concatenate([hits, np.full((n, k - width), -1, np.int64)], axis=1))


def merge_top(parts: list[Packed], k: int) -> Packed:
    """One query batch's answers from every shard -> its top k: `{ids, sims [n, k], hits [n, k]}`,
    best first (by cosine, ties by the larger hit id), (-inf, -1) where there are fewer than k."""
    ids = parts[0]["ids"]
    for part in parts[1:]:
        if not np.array_equal(part["ids"], ids):
            raise ValueError("the shards of one query batch answered for different queries")
    sims = np.concatenate([part["sims"] for part in parts], axis=1)
    hits = np.concatenate([part["hits"] for part in parts], axis=1)
    order = np.lexsort((-hits, -sims), axis=-1)[:, :k]
    sims, hits = pad_hits(np.take_along_axis(sims, order, axis=1), np.take_along_axis(hits, order, axis=1), k)
    return {"ids": ids, "sims": sims, "hits": hits}


def knn_means(sims: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[n, k] top-k similarities (present ones first, -inf after) -> (whether a query has a hit, its
    kNN mean: the mean of its present similarities in float64, as `np.mean` of the list; NaN without)."""
    sims = np.asarray(sims, dtype=np.float64)
    counts = np.isfinite(sims).sum(axis=1)
    means = np.full(len(sims), np.nan)
    full = counts == sims.shape[1]
    if full.any():
        means[full] = sims[full].mean(axis=1)
    for row in np.flatnonzero((counts > 0) & ~full).tolist():
        means[row] = sims[row, :counts[row]].mean()
    return counts > 0, means


def margin_requests(key: RangeKey, top: Packed, query_batch: int):
    """A query batch's top k -> (its kNN means `{ids, mean}` (queries with a hit), [(b's range key,
    `{ids: b, asker, sim, asker_mean}`)] for every hit b the store knows, hits the store lacks)."""
    has, means = knn_means(top["sims"])
    rows, columns = np.nonzero(np.isfinite(top["sims"]))
    others = top["hits"][rows, columns]
    known = others >= 0
    rows, columns, others = rows[known], columns[known], others[known]
    asks = list(split_by_range(OTHER[key[0]], others, query_batch, asker=top["ids"][rows],
                               sim=top["sims"][rows, columns], asker_mean=means[rows]))
    return {"ids": top["ids"][has], "mean": means[has]}, asks, int((~known).sum())


def score_candidates(asks: Packed, means: Packed, margin_kind: str) -> tuple[Packed, int]:
    """At candidates b: every (asker a, b, cosine, a's mean) whose b has a kNN mean -> `{ids: a,
    other: b, margin, sim}`; and how many had none (b is no candidate: not searched in this run)."""
    order = np.argsort(means["ids"], kind="stable")
    known, known_means = means["ids"][order], means["mean"][order]
    at = np.minimum(np.searchsorted(known, asks["ids"]), max(len(known) - 1, 0))
    found = (known[at] == asks["ids"]) if len(known) else np.zeros(len(asks["ids"]), bool)
    sims = asks["sim"][found]
    margins = margin_scores(sims, asks["asker_mean"][found], known_means[at[found]], margin_kind)
    scored = {"ids": asks["asker"][found], "other": asks["ids"][found], "margin": np.asarray(margins, np.float64),
              "sim": sims}
    return scored, int((~found).sum())


def best_candidates(scored: Packed) -> Packed:
    """Scored candidates -> each asker's best: the largest (margin, cosine, other id)."""
    order = np.lexsort((scored["other"], scored["sim"], scored["margin"], scored["ids"]))
    askers = scored["ids"][order]
    last = np.flatnonzero(np.append(askers[1:] != askers[:-1], True)) if len(askers) else np.zeros(0, np.int64)
    return take(scored, order[last])


def as_pairs(side: str, best: Packed) -> Packed:
    """An asker side's best candidates -> pair columns `{src, tgt, margin, cosine, fwd}`."""
    forward = side == SRC
    return {"src": best["ids"] if forward else best["other"], "tgt": best["other"] if forward else best["ids"],
            "margin": best["margin"], "cosine": best["sim"].astype(np.float64), "fwd": np.full(rows_of(best), forward)}


def decide_pairs(bests: Packed, strategy: str) -> tuple[Packed, int]:
    """Best-candidate records -> (the distinct pairs the strategy keeps `{src, tgt, margin, cosine}`,
    the number of distinct pairs). A pair found from both sides keeps its record with the larger
    (margin, cosine, direction: fwd above bwd), as `_DecideCandidate` does; `fwd` / `bwd` keep the
    pairs found from that side, `intersect` those found from both, `max` every pair (for the greedy)."""
    order = np.lexsort((bests["fwd"], bests["cosine"], bests["margin"], bests["tgt"], bests["src"]))
    src, tgt, fwd = bests["src"][order], bests["tgt"][order], bests["fwd"][order]
    if not len(order):
        return {name: bests[name][:0] for name in ("src", "tgt", "margin", "cosine")}, 0
    starts = np.flatnonzero(np.insert((src[1:] != src[:-1]) | (tgt[1:] != tgt[:-1]), 0, True))
    ends = np.append(starts[1:], len(order)) - 1
    if strategy in ("fwd", "bwd"):
        wanted = fwd if strategy == "fwd" else ~fwd
        # the last wanted record of each pair: a pair has one record per direction
        last_wanted = np.maximum.reduceat(np.where(wanted, np.arange(len(order)), -1), starts)
        chosen = order[last_wanted[last_wanted >= 0]]
    elif strategy == "intersect":
        both = np.logical_or.reduceat(fwd, starts) & np.logical_or.reduceat(~fwd, starts)
        chosen = order[ends[both]]
    elif strategy == "max":
        chosen = order[ends]
    else:
        raise ValueError(f"unknown strategy {strategy!r}")
    return {name: bests[name][chosen] for name in ("src", "tgt", "margin", "cosine")}, len(starts)


def range_start(key: RangeKey, query_batch: int) -> np.int64:
    """The store id of a range key's first row."""
    return np.int64((key[1] << ROW_BITS) | (key[2] * query_batch))


def within(packed: Packed, keys: dict, query_batch: int) -> Packed:
    """Packed with each column named in `keys` (store ids, all within that range key) as rows from
    the key's start, in the smallest unsigned type that holds `query_batch` (2 bytes a sentence at
    the default 8,192, not 8): how the margin join's messages travel (`restored` undoes it)."""
    kind = np.uint16 if query_batch <= 1 << 16 else np.uint32
    return {name: (column - range_start(keys[name], query_batch)).astype(kind) if name in keys else column
            for name, column in packed.items()}


def restored(packed: Packed, keys: dict, query_batch: int) -> Packed:
    """`within`'s columns back to store ids."""
    return {name: range_start(keys[name], query_batch) + column.astype(np.int64) if name in keys else column
            for name, column in packed.items()}


# ------------------------------------------------------------------------------------ Beam steps
class _SearchAcrossShards:
    """One query batch's search in each shard of an index, its state in rows lo:hi of its group's
    `GroupState`: its inverted lists assigned once, by the quantiser of the first shard it meets
    (every shard holds the same), then handed to the others; its hits re-ranked at the index's
    depth, not each shard's (`RerankFloor`); its top k merged as the shards go (`merge`)."""

    def __init__(self, state: GroupState, lo: int, hi: int, k: int, depth: int, assigned_counter, reranked_counter):
        self.state, self.lo, self.hi = state, lo, hi
        self.assigned_counter, self.reranked_counter = assigned_counter, reranked_counter
        self.assigned = None
        self.done = False
        self.floor = (RerankFloor(hi - lo, depth, state.array("floor", depth, np.float32, -np.inf)[lo:hi])
                      if depth else None)
        self.sims = state.array("top_sims", k, np.float32, -np.inf)[lo:hi]
        self.hits = state.array("top_hits", k, np.int64, -1)[lo:hi]

    def __call__(self, index, _labels, queries, k, rows, depth):
        if not self.done:
            self.done = True
            assigned = coarse_assignment(index, queries)
            if assigned is not None:
                lists, sims = assigned
                self.assigned = (self.state.array("lists", lists.shape[1], lists.dtype, 0)[self.lo:self.hi],
                                 self.state.array("list_sims", sims.shape[1], np.float32, 0)[self.lo:self.hi])
                self.assigned[0][:], self.assigned[1][:] = lists, sims
                self.assigned_counter.inc(len(queries))
        if self.floor is None or rows is None or depth <= k:
            return search_shard_arrays(index, queries, k, rows, depth, assigned=self.assigned)
        before = self.floor.reranked
        found = search_shard_arrays(index, queries, k, rows, depth, assigned=self.assigned, floor=self.floor)
        self.reranked_counter.inc(self.floor.reranked - before)
        return found

    def merge(self, ids: np.ndarray, sims: np.ndarray, hits: np.ndarray) -> None:
        """One more shard's [n, k] answer into the batch's top k."""
        top = merge_top([{"ids": ids, "sims": self.sims, "hits": self.hits}, {"ids": ids, "sims": sims, "hits": hits}],
                        self.sims.shape[1])
        self.sims[:], self.hits[:] = top["sims"], top["hits"]


class _SearchPackedShards(_SearchShard):
    """((index side, group), [(range key, query store ids)]) -> (range key, `{ids, sims [n, k],
    hits [n, k]}`) for each batch of the group: its queries' top k in all shards of that side's
    index, each hit the other side's store id (by its row in the files the index was built from,
    `to_store`, or by its text: -1 where the store lacks it, counted as `index.hits_looked_up_by_text`).

    A query's lists are assigned once (`coarse_assignment`, counted as `index.queries_assigned`),
    not once a shard; the shards are then loaded one after another, each once for the whole group
    (`HeldShards`), the next one's files read onto local disk while this one is searched (a worker
    holds one shard's codes a bundle), and the group's top k lists merged as they go. `--rerank` is
    the index's
    depth: a shard re-ranks only the hits that can be among the index's best by codes so far
    (`RerankFloor`, counted as `index.hits_reranked`). What a group carries from shard to shard is
    its `GroupState`: on the worker's local disk when larger than GROUP_MEMORY (counted as
    `index.groups_on_disk`)."""

    def __init__(self, index_dirs: dict, nprobes: dict, k: int, rerank: dict, store: str, shard_names: dict,
                 memory: int | None = None, prefetch: bool = True, to_store: dict | None = None):
        # prefetch=False: read each shard's files when its searches begin (benchmarks/shard_load.py's comparison)
        super().__init__(index_dirs, nprobes, k, rerank, store)
        self.shard_names, self.memory = shard_names, GROUP_MEMORY if memory is None else memory
        self.prefetch = prefetch
        # per side, where its index's files are in the store (`store_rows_of`), or None: its hits are
        # then looked up by their text
        self.to_store = dict(to_store or {})
        self.by_text = beam.metrics.Metrics.counter(COUNTER_NAMESPACE, "index.hits_looked_up_by_text")
        self.assigned = beam.metrics.Metrics.counter(COUNTER_NAMESPACE, "index.queries_assigned")
        self.reranked = beam.metrics.Metrics.counter(COUNTER_NAMESPACE, "index.hits_reranked")
        self.on_disk = beam.metrics.Metrics.counter(COUNTER_NAMESPACE, "index.groups_on_disk")
        self._ahead = None  # the next shard's files (`FetchedShard`), read while this one is searched

    def process(self, element):
        (side, _group), batches = element
        batches = list(batches)
        names = self.shard_names[side]
        if not names:
            return
        depth = self.rerank[side] if self.rerank[side] > self.k else 0
        bounds = np.cumsum([0] + [len(ids) for _key, ids in batches]).tolist()
        per_query = group_bytes_per_query(self.nprobes[side], depth, self.k)
        with GroupState(bounds[-1], per_query, self.memory) as state, \
                ThreadPoolExecutor(1, thread_name_prefix="labse-mine-prefetch") as prefetch:
            if state.on_disk:
                self.on_disk.inc()
            searches = [_SearchAcrossShards(state, lo, hi, self.k, depth, self.assigned, self.reranked)
                        for lo, hi in zip(bounds, bounds[1:])]
            for at, name in enumerate(names):
                self._shard(side, name)
                # the next shard's files are read onto local disk while this one is searched (FAISS
                # lets go of the GIL): the transfer from the bucket hides behind the search, its CPU
                # runs beside it where the worker has a core to spare, and the worker holds one
                # shard's codes, not two; `_ahead` holds the files until `_shard` opens them
                following = (prefetch.submit(self._fetch_ahead, side, names[at + 1])
                             if self.prefetch and at + 1 < len(names) else None)
                for search, (_key, ids) in zip(searches, batches):
                    labels, (sims, positions) = self._searched(side, name, references(ids), search)
                    search.merge(ids, *pad_hits(sims, self._store_ids(labels, positions), self.k))
                    state.release()
                self._ahead = following.result() if following is not None else None
            self._ahead = None
            for search, (key, ids) in zip(searches, batches):
                yield key, {"ids": ids, "sims": np.array(search.sims), "hits": np.array(search.hits)}

    def _key(self, side: str, name: str) -> tuple:
        return (*super()._key(side, name), self.to_store.get(side) is not None)

    def _fetch_ahead(self, side: str, name: str):
        """The files of the shard searched next, unless this worker holds it already."""
        key = self._key(side, name)
        return None if HELD_SHARDS.holds(key) else self._fetch(key)

    def _files(self, key: tuple):
        ahead = self._ahead
        return ahead if ahead is not None and ahead.key == key else self._fetch(key)

    def _label_suffix(self, key: tuple) -> str:
        """Where the store holds the files the index was built from, a hit is named by its store id:
        the shard's `.ids.npy` (8 bytes a sentence, memory-mapped) is read instead of its text."""
        return SOURCE_IDS_SUFFIX if self.to_store.get(key[0]) is not None else super()._label_suffix(key)

    def _name_sentences(self, shard, path: str) -> None:
        mapping = self.to_store.get(shard.key[0])
        if mapping is None:
            super()._name_sentences(shard, path)
            return
        ids = np.load(path, mmap_mode="r", allow_pickle=False)
        if ids.shape != (shard.index.ntotal,) or ids.dtype != np.int64:
            raise ValueError(f"{path} is {ids.dtype} {ids.shape}, not the ids of the shard's "
                             f"{shard.index.ntotal:,} sentences: rebuild the index with labse-index")
        mapping.checked(np.asarray(ids), path)  # once a load: every id names a row of its file
        release_pages(ids)
        shard.source_ids = ids

    def _store_ids(self, labels, positions: np.ndarray) -> np.ndarray:
        shard = self._loaded
        if shard.source_ids is not None:
            ids = self.to_store[shard.key[0]].store_ids(np.asarray(shard.source_ids[np.maximum(positions, 0)]))
            release_pages(shard.source_ids)
            return np.where(positions >= 0, ids, -1)
        # store id + 2 by shard position, 0 where not looked up yet: zeros from calloc, so only the
        # pages of positions hit become resident
        if self._loaded.hit_ids is None:
            self._loaded.hit_ids = np.zeros(len(labels), np.int64)
        cache = self._loaded.hit_ids
        wanted = np.unique(positions[positions >= 0])
        unknown = wanted[cache[wanted] == 0]
        if len(unknown):
            self.by_text.inc(len(unknown))
            cache[unknown] = store_ids(self._held.embedder.find([labels[i][2] for i in unknown.tolist()])) + 2
            # the shard's lines read would stay resident into the later steps (the store drops its own)
            release_pages(labels.text)
        return np.where(positions >= 0, cache[np.maximum(positions, 0)] - 2, -1)


@dataclass(frozen=True)
class StoreRows:
    """How a shard's `.ids.npy` (source file number << 32 | row, in the files the index was built
    from) becomes store ids: each source file's number in the store and its rows."""

    numbers: tuple[int, ...]
    rows: tuple[int, ...]

    @cached_property
    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(self.numbers, np.int64), np.asarray(self.rows, np.int64)

    def checked(self, source: np.ndarray, path: str) -> np.ndarray:
        """`source` (a shard's ids, read from its folder), or ValueError where one names a file or a
        row the index was not built from."""
        files, rows = source >> SOURCE_ROW_BITS, source & ((1 << SOURCE_ROW_BITS) - 1)
        inside = (files >= 0) & (files < len(self.numbers))
        if not inside.all() or (rows >= self._arrays[1][files]).any():
            raise ValueError(f"{path} names rows outside the files its index was built from: rebuild the index "
                             "with labse-index")
        return source

    def store_ids(self, source: np.ndarray) -> np.ndarray:
        return (self._arrays[0][source >> SOURCE_ROW_BITS] << ROW_BITS) | (source & ((1 << SOURCE_ROW_BITS) - 1))


def store_rows_of(store: str, manifest: IndexManifest) -> StoreRows | None:
    """Where the `vectors:DIR` store holds every file `manifest`'s index was built from unchanged
    (`file_identity`: the same path, sizes and modification times), those files' numbers there and
    rows; else None (an index without `.ids.npy` files, a store copied elsewhere or rewritten since):
    its hits are then looked up by their text."""
    from pipelines.embed.saved_vectors import store_files
    from pipelines.index.vector_files import identity_of_pair, listed_files, normal_path

    if not manifest.source_ids:
        return None
    pairs = store_files(store.removeprefix("vectors:"))
    numbers = {normal_path(matrix): (number, matrix, texts) for number, (matrix, texts) in enumerate(pairs)}
    listings: dict = {}
    found = []
    for source in manifest.source_files:
        entry = numbers.get(source["path"])
        if entry is None:
            return None
        number, matrix, texts = entry
        folder = matrix.rsplit("/", 1)[0]
        if folder not in listings:  # one listing a folder, not two requests a file
            listings[folder] = listed_files(f"{folder}/*")
        if identity_of_pair(matrix, texts, listings[folder]) != {k: v for k, v in source.items() if k != "rows"}:
            return None
        found.append(number)
    return StoreRows(tuple(found), tuple(source["rows"] for source in manifest.source_files))


def _last_block(keyed) -> tuple:
    (side, file, block), _batch = keyed
    return (side, file), block


def _to_groups(keyed, per_load: dict, offsets: dict):
    """A query batch -> ((the other side, group), (range key, ids)): a group is `per_load[other
    side]` consecutive block slots of this side's files, running on from one file into the next
    (`file_block_offsets`), searched together in that side's index."""
    key, batch = keyed
    side, file, block = key
    other = OTHER[side]
    yield (other, (offsets[(side, file)] + block) // per_load[other]), (key, batch["ids"])


class _SearchBatches(beam.PTransform):
    """(range key, `{ids}`) query batches -> (range key, its top k `{ids, sims, hits}`) from every
    shard of the other side's index (nothing where that index has no sentence). Groups of
    `per_load[side]` batches go through the shards of `side` together: each query's lists are
    assigned once for all shards, and a worker loads each shard once a group (with one (batch,
    shard) an element, in the order a runner hands elements out, it would load a shard about once
    a search, run the quantiser once a shard, and shuffle k hits a query for every shard)."""

    def __init__(self, plan: tuple, k: int, store: str, per_load: dict, to_store: dict):
        super().__init__()
        self.plan, self.k, self.store, self.per_load, self.to_store = plan, k, store, per_load, to_store

    def expand(self, batches):
        dirs, shards, nprobes, rerank = self.plan
        offsets = (batches
                   | "LastBlocks" >> beam.Map(_last_block)
                   | "LastBlockOfFile" >> beam.CombinePerKey(max)
                   | "LastBlocksDict" >> beam.combiners.ToDict()
                   | "FileOffsets" >> beam.Map(file_block_offsets))
        return (batches
                | "ToGroups" >> beam.FlatMap(_to_groups, self.per_load, beam.pvalue.AsSingleton(offsets))
                | "GroupBatches" >> beam.GroupByKey()
                | "SearchShards" >> beam.ParDo(_SearchPackedShards(dirs, nprobes, self.k, rerank, self.store, shards,
                                                                  to_store=self.to_store)))


def _split_full_side(keyed, counts: dict, strategy: str):
    """A query batch -> the main output when its side is searched in full, else `other`."""
    full = SRC if side_searched_in_full(counts.get(SRC, 0), counts.get(TGT, 0), strategy) == "src" else TGT
    if keyed[0][0] == full:
        yield keyed
    else:
        yield beam.pvalue.TaggedOutput("other", keyed)


def _asked(keyed, query_batch: int):
    """A top k -> (range key, `{ids}`) of the other side's sentences among its hits."""
    key, top = keyed
    hits = np.unique(top["hits"][np.isfinite(top["sims"]) & (top["hits"] >= 0)])
    yield from split_by_range(OTHER[key[0]], hits, query_batch)


class _AskedOnly(beam.DoFn):
    """(range key, {"batch": the run's sentences there, "asked": hit ids there}) -> (range key,
    `{ids}`) of the sentences both in the run and some top k's hit; the others are counted, not
    searched (hits not in the run have no batch and are left: they get no kNN mean)."""

    def __init__(self):
        self.asked = beam.metrics.Metrics.counter(COUNTER_NAMESPACE, "index.backward_searched")
        self.skipped = beam.metrics.Metrics.counter(COUNTER_NAMESPACE, "index.backward_skipped")

    def process(self, joined):
        key, grouped = joined
        batch = concat(grouped["batch"])
        if not batch:
            return
        wanted = among(batch["ids"], concat(grouped["asked"]))
        self.asked.inc(int(wanted.sum()))
        self.skipped.inc(int((~wanted).sum()))
        if wanted.any():
            yield key, {"ids": batch["ids"][wanted]}


class _MarginRequests(beam.DoFn):
    """(range key, top k) -> `means`: (key, `{ids, mean}`); main: (b's range key, (a's range key,
    asks)) for the margin at b (`margin_requests`), ids `within` their keys; `tally`:
    `<side>_sentences.with_candidates`."""

    def __init__(self, query_batch: int):
        self.query_batch = query_batch
        self.outside = beam.metrics.Metrics.counter(COUNTER_NAMESPACE, "candidates.not_in_input")

    def process(self, keyed):
        key, top = keyed
        means, asks, outside = margin_requests(key, top, self.query_batch)
        self.outside.inc(outside)  # the index holds a sentence the store lacks: no kNN mean, no candidate
        yield _tally({f"{_side_unit(key[0])}.with_candidates": rows_of(means)})
        yield beam.pvalue.TaggedOutput("means", (key, within(means, {"ids": key}, self.query_batch)))
        for other_key, ask in asks:
            yield other_key, (key, within(ask, {"ids": other_key, "asker": key}, self.query_batch))


def _joined(grouped: dict, tag: str) -> Iterator:
    """A join's values of `tag` from every search direction (tags `tag.<direction>`)."""
    return itertools.chain.from_iterable(values for name, values in grouped.items() if name.partition(".")[0] == tag)


class _ScoreAtCandidate(beam.DoFn):
    """(b's range key, {"means.D": its kNN means, "asks.D": margin requests} for each search
    direction D) -> (a's range key, (b's range key, `{ids: a, other: b, margin,
    sim}`)) for every request whose b has a mean (ids `within` their keys); the rest are counted."""

    def __init__(self, margin_kind: str, query_batch: int):
        self.margin_kind, self.query_batch = margin_kind, query_batch
        self.outside = beam.metrics.Metrics.counter(COUNTER_NAMESPACE, "candidates.not_in_input")

    def start_bundle(self):
        HELD_SHARDS.drop_kept()  # the searches are done

    def process(self, joined):
        key, grouped = joined
        means = concat(_joined(grouped, "means")) or {"ids": np.zeros(0, np.uint32), "mean": np.zeros(0)}
        means = restored(means, {"ids": key}, self.query_batch)
        for asker_key, asks in _joined(grouped, "asks"):  # one part at a time: a part's margins need only its own rows
            asks = restored(asks, {"ids": key, "asker": asker_key}, self.query_batch)
            scored, outside = score_candidates(asks, means, self.margin_kind)
            self.outside.inc(outside)
            if rows_of(scored):
                yield asker_key, (key, within(scored, {"ids": asker_key, "other": key}, self.query_batch))


def _best_pairs(keyed, query_batch: int):
    """(a's range key, its scored candidates) -> (the source's range key, best-candidate pairs);
    `tally`: best.fwd / best.bwd."""
    key, parts = keyed
    scored = concat(restored(part, {"ids": key, "other": other_key}, query_batch) for other_key, part in parts)
    pairs = as_pairs(key[0], best_candidates(scored))
    yield _tally({f"best.{'fwd' if key[0] == SRC else 'bwd'}": rows_of(pairs)})
    if key[0] == SRC:
        yield key, pairs
    else:
        yield from split_by_column(pairs, SRC, "src", query_batch)


class PackedNeighbours(beam.PTransform):
    """Query batches `((side, file, block), {"ids": int64 store ids, sorted, unique})` of both sides
    (the run's sentences with a finite row, one element per range key) -> {"bests": (source range
    key, `{src, tgt, margin, cosine, fwd}` best-candidate pairs), "tally": `<side>_sentences.
    with_candidates`, `best.fwd`, `best.bwd`}: `Neighbours` + `BestCandidates` of the global layout
    with `--embedder vectors:DIR` (`config.embedder`), on packed elements (module docstring)."""

    def __init__(self, config: MineConfig):
        super().__init__()
        if config.resolved_layout != "global" or not is_saved_vectors_spec(config.embedder):
            raise ValueError("PackedNeighbours searches the global layout with --embedder vectors:DIR, got "
                             f"layout {config.resolved_layout!r} and embedder {config.embedder!r}")
        self.config = config

    def expand(self, batches):
        c = self.config
        manifests = {SRC: load_manifest(c.src_index, "--src-index"), TGT: load_manifest(c.tgt_index, "--tgt-index")}
        plan = index_plan(c.src_index, c.tgt_index, manifests[SRC], manifests[TGT], c.nprobe, c.rerank)
        _dirs, shards, nprobes, reranks = plan
        per_query = {side: group_bytes_per_query(nprobes[side], reranks[side] if reranks[side] > c.k else 0, c.k)
                     for side in manifests}
        per_load = {side: batches_per_load(manifest, c.query_batch, per_query[side], c.batches_per_load)
                    for side, manifest in manifests.items()}
        to_store = {side: store_rows_of(c.embedder, manifest) for side, manifest in manifests.items()}
        for side, lang in ((SRC, c.src_lang), (TGT, c.tgt_lang)):
            logger.info("the %s index's hits are named by %s", lang,
                        "their rows in the store (it holds the files the index was built from)"
                        if to_store[side] is not None else
                        "their text, looked up in the store (it does not hold the files the index was built from, "
                        "unchanged)")
            held = per_load[side] * c.query_batch * per_query[side]
            logger.info("searching the %s index's %d shard(s) in groups of %d query batches (~%d MB a group in a "
                        "running bundle, %s), each shard loaded once a group", lang, len(shards[side]),
                        per_load[side], held >> 20, "in memory" if held <= GROUP_MEMORY else "on local disk")
        if c.backward_search == "all":
            tops = {"All": batches | "Search" >> _SearchBatches(plan, c.k, c.embedder, per_load, to_store)}
        else:
            counts = (batches
                      | "SideSizes" >> beam.MapTuple(lambda key, batch: (key[0], rows_of(batch)))
                      | "CountSides" >> beam.CombinePerKey(sum)
                      | "CountsDict" >> beam.combiners.ToDict())
            split = batches | "FullSide" >> beam.FlatMap(
                _split_full_side, beam.pvalue.AsSingleton(counts), c.strategy).with_outputs("other", main="full")
            forward = split.full | "SearchFull" >> _SearchBatches(plan, c.k, c.embedder, per_load, to_store)
            asked = forward | "AskOtherSide" >> beam.FlatMap(_asked, c.query_batch)
            wanted = ({"batch": split.other, "asked": asked}
                      | "JoinAsked" >> beam.CoGroupByKey()
                      | "AskedOnly" >> beam.ParDo(_AskedOnly()))
            backward = wanted | "SearchAsked" >> _SearchBatches(plan, c.k, c.embedder, per_load, to_store)
            tops = {"Full": forward, "Asked": backward}
        # each direction's requests enter the join on their own: a Flatten of both directions' top k
        # lists would write them to the runner once more (the DirectRunner materialises a Flatten)
        to_join, tallies = {}, []
        for direction, top in tops.items():
            requests = top | f"MarginRequests{direction}" >> beam.ParDo(_MarginRequests(c.query_batch)).with_outputs(
                "means", "tally", main="asks")
            to_join.update({f"means.{direction}": requests.means, f"asks.{direction}": requests.asks})
            tallies.append(requests.tally)
        scored = (to_join
                  | "JoinAtCandidate" >> beam.CoGroupByKey()
                  | "Margins" >> beam.ParDo(_ScoreAtCandidate(c.margin_kind, c.query_batch)))
        bests = (scored
                 | "GroupByAsker" >> beam.GroupByKey()
                 | "Best" >> beam.FlatMap(_best_pairs, c.query_batch).with_outputs("tally", main="bests"))
        tally = (*tallies, bests.tally) | "Tally" >> MergeTallies()
        return {"bests": bests.bests, "tally": tally}


# ------------------------------------------------------------------------------------ selection
NOT_SELECTED = "candidate_pairs.dropped.not_selected"
BELOW_MIN_MARGIN = "candidate_pairs.dropped.below_min_margin"
GREEDY_ROUNDS = 4  # `max`'s rounds in parallel before the rest meets in one group (`GreedyMax`)
AFTER_ROUNDS = "max.candidates_after_rounds"  # how many met in that group: a count, not an outcome


def _decide(keyed, strategy: str) -> Iterator:
    key, parts = keyed
    chosen, read = decide_pairs(concat(parts), strategy)
    yield _tally({"candidate_pairs.read": read, NOT_SELECTED: read - rows_of(chosen)})
    if rows_of(chosen):
        yield key, chosen


def best_of_each(owners: np.ndarray, margins: np.ndarray, others: np.ndarray) -> np.ndarray:
    """Which candidate is each owner's best: the largest margin, then the smallest other id (the
    greedy's order restricted to one owner's candidates; NaN margins last, as there)."""
    order = np.lexsort((others, -np.asarray(margins, np.float64), owners))
    first = np.ones(len(order), bool)
    first[1:] = owners[order][1:] != owners[order][:-1]
    best = np.zeros(len(owners), bool)
    best[order[first]] = True
    return best


def dominant_at_targets(edges: Packed) -> np.ndarray:
    """Candidates of some targets (distinct pairs `{src, tgt, margin, best_at_src}`) -> which are
    locally dominant: the best of their source (`best_at_src`, found where the source's candidates
    met) and of their target. The greedy keeps every such candidate: when it reaches one, nothing
    before it in its order touched either side (Preis' locally dominant matching)."""
    return edges["best_at_src"] & best_of_each(edges["tgt"], edges["margin"], edges["src"])


def _of_free_sources(grouped: dict) -> tuple[Packed, int]:
    """At a source range key {"edges": its candidates, "matched": sources a dominant candidate took}:
    (the candidates of the other sources, how many were dropped)."""
    edges = concat(grouped["edges"])
    if not edges:
        return {}, 0
    free = ~among(edges["src"], concat(grouped["matched"]))
    return take(edges, np.flatnonzero(free)), int((~free).sum())


class _GreedyAtSources(beam.DoFn):
    """One round of `max`, at a source range key: (key, {"edges": its candidates, "matched": sources
    a dominant candidate took}) -> the candidates of unmatched sources, each marked whether it is
    its source's best, keyed by the target's range key; the others are counted not selected."""

    def __init__(self, query_batch: int):
        self.query_batch = query_batch

    def process(self, joined):
        edges, dropped = _of_free_sources(joined[1])
        yield _tally({NOT_SELECTED: dropped})
        if rows_of(edges):
            edges["best_at_src"] = best_of_each(edges["src"], edges["margin"], edges["tgt"])
            yield from split_by_column(edges, TGT, "tgt", self.query_batch)


class _GreedyAtTargets(beam.DoFn):
    """One round of `max`, at a target range key: the routed candidates -> `pairs`: the dominant
    ones (selected); `matched`: their sources by source range key; main: the candidates of targets
    still free by source range key; the candidates of matched targets are counted not selected."""

    def __init__(self, query_batch: int):
        self.query_batch = query_batch

    def process(self, keyed):
        _key, parts = keyed
        edges = concat(parts)
        dominant = dominant_at_targets(edges)
        edges.pop("best_at_src")
        taken = np.isin(edges["tgt"], edges["tgt"][dominant])
        left = ~taken
        yield _tally({NOT_SELECTED: (taken & ~dominant).sum()})
        if dominant.any():
            yield beam.pvalue.TaggedOutput("pairs", take(edges, np.flatnonzero(dominant)))
            for key, part in split_by_range(SRC, edges["src"][dominant], self.query_batch):
                yield beam.pvalue.TaggedOutput("matched", (key, part))
        if left.any():
            yield from split_by_column(take(edges, np.flatnonzero(left)), SRC, "src", self.query_batch)


def _free_of_matched(joined) -> Iterator:
    """After the last round, at a source range key: the candidates of sources no round matched."""
    edges, dropped = _of_free_sources(joined[1])
    yield _tally({NOT_SELECTED: dropped})
    if rows_of(edges):
        yield edges


def _greedy(keyed) -> Iterator:
    """`max`'s rest after the rounds: LASER's greedy one-to-one selection over the candidates no
    round decided (margin descending, ties by source id, then target id)."""
    _key, parts = keyed
    candidates = concat(parts)
    kept = greedy_unique_columns(candidates["margin"], candidates["src"], candidates["tgt"])
    yield _tally({NOT_SELECTED: (~kept).sum(), AFTER_ROUNDS: rows_of(candidates)})
    if kept.any():
        yield take(candidates, np.flatnonzero(kept))


class GreedyMax(beam.PTransform):
    """(source range key, distinct candidate pairs `{src, tgt, margin, cosine}`) -> {"pairs": the
    pairs LASER's `max` keeps (greedy one-to-one over the whole run: margin descending, then source
    id, then target id), "tally": not selected, `max.candidates_after_rounds`}.

    Without a worker holding the run's candidates: `rounds` times, every source's best candidate is
    marked where the source's candidates meet, then where the target's meet a candidate that is best
    at both is selected (the greedy keeps it) and the other candidates of its two sentences are
    dropped (the greedy would refuse them). Each round decides most of what is left: of 94,679
    candidates of 60,000 sentences a side (benchmarks/mine_million.py's vectors, exact 4-NN, ratio
    margin) 18,319, 1,081, 29 and 0 were left after rounds 1-4. What remains after the last round
    meets in one group for the greedy itself (counted `max.candidates_after_rounds`), so the result
    is the greedy's exactly (tests/test_packed_search.py) whatever the rounds left."""

    def __init__(self, query_batch: int, rounds: int = GREEDY_ROUNDS):
        super().__init__()
        self.query_batch, self.rounds = query_batch, rounds

    def expand(self, candidates):
        pairs, tallies = [], []
        # at each source range key: {"edges": its candidates, "matched": its sources already taken}
        joined = candidates | "AtSources" >> beam.MapTuple(lambda key, packed: (key, {"edges": [packed], "matched": []}))
        for round_number in range(1, self.rounds + 1):
            name = f"Round{round_number}"
            at_sources = joined | f"{name}AtSources" >> beam.ParDo(_GreedyAtSources(self.query_batch)).with_outputs(
                "tally", main="edges")
            decided = (at_sources.edges
                       | f"{name}GroupAtTargets" >> beam.GroupByKey()
                       | f"{name}AtTargets" >> beam.ParDo(_GreedyAtTargets(self.query_batch)).with_outputs(
                           "pairs", "matched", "tally", main="edges"))
            joined = ({"edges": decided.edges, "matched": decided.matched}
                      | f"{name}JoinAtSources" >> beam.CoGroupByKey())
            pairs.append(decided.pairs)
            tallies += [at_sources.tally, decided.tally]
        rest = joined | "RestFree" >> beam.FlatMap(_free_of_matched).with_outputs("tally", main="edges")
        greedy = (rest.edges
                  | "OneGroup" >> beam.Map(lambda packed: (None, packed))
                  | "GroupRest" >> beam.GroupByKey()
                  | "Greedy" >> beam.FlatMap(_greedy).with_outputs("tally", main="pairs"))
        tallies += [rest.tally, greedy.tally]
        return {"pairs": (*pairs, greedy.pairs) | "AllSelected" >> beam.Flatten(),
                "tally": tuple(tallies) | "Tally" >> MergeTallies()}


def _at_least(pairs: Packed, min_margin: Optional[float]) -> Iterator:
    if min_margin is not None:
        above = pairs["margin"] >= min_margin
        yield _tally({BELOW_MIN_MARGIN: (~above).sum()})
        pairs = take(pairs, np.flatnonzero(above))
    yield _tally({"pairs.selected": rows_of(pairs)})
    if rows_of(pairs):
        yield pairs


class PackedSelect(beam.PTransform):
    """`PackedNeighbours`' bests -> {"pairs": Packed `{src, tgt, margin, cosine}` of the selected
    pairs, "tally": `candidate_pairs.read`, `candidate_pairs.dropped.not_selected`,
    `candidate_pairs.dropped.below_min_margin`, `pairs.selected`}: `SelectPairs` on packed
    elements (the strategy per distinct pair, `max`'s greedy over the whole run (`GreedyMax`),
    then `min_margin`)."""

    def __init__(self, strategy: str, min_margin: Optional[float] = None, *, query_batch: int):
        super().__init__()
        self.strategy, self.min_margin, self.query_batch = strategy, min_margin, query_batch

    def expand(self, bests):
        decided = (bests
                   | "GroupBySource" >> beam.GroupByKey()
                   | "Decide" >> beam.FlatMap(_decide, self.strategy).with_outputs("tally", main="pairs"))
        pairs, tallies = decided.pairs, [decided.tally]
        if self.strategy == "max":
            greedy = pairs | "Max" >> GreedyMax(self.query_batch)
            pairs = greedy["pairs"]
            tallies.append(greedy["tally"])
        else:
            pairs = pairs | "DropKeys" >> beam.Values()
        selected = pairs | "MinMargin" >> beam.FlatMap(_at_least, self.min_margin).with_outputs("tally", main="pairs")
        tallies.append(selected.tally)
        return {"pairs": selected.pairs, "tally": tuple(tallies) | "Tally" >> MergeTallies()}
