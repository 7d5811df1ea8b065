"""Global mining: each sentence's k nearest neighbours from the other language's index
(`labse-index`), instead of (block, shard) cells.

Query vectors travel in batches of `query_batch` sentences; a batch goes once to each shard of the
other side's index (a language has few shards: 40M sentences each by default), so a vector is
copied (index shards) times, not (cells) times, and a query's cost is `nprobe` inverted lists of
each shard, which grows with the other side only through the lists' length (the index's list
count grows with the language, `pipelines.index.choice`). The kNN means of the margin come from
the same searches: forward (sources against the target index) and backward (targets against the
source index). With `--backward-search candidates` (the default, `CandidatesBackwardLists`) the
backward search is limited to the sentences among the forward lists, whose kNN means the margins
need, so a hub language (English, ~45% of a snapshot, paired with every other language) is searched
at most k times the smaller side's sentences per language pair, not in full once per pair.

The index knows sentences by their text only, so global mining keys sentences by (side, text)
(items with group and provenance left blank, `searchable`) and `RestoreProvenance` puts each
selected pair's url and doc_id back from the input.

With `--embedder vectors:DIR` (the vectors the indexes were built from) labse-mine runs the packed
path instead (`pipelines.mine.packed_search`), which reuses this module's shard search (`_SearchShard`
reads a batch's rows by (file number, row) reference where it searches them).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import apache_beam as beam
import numpy as np

from pipelines.index.shards import (RERANK_SUFFIX, IndexManifest, faiss_threads, release_pages, search_shard,
                                    set_nprobe)
from pipelines.io import storage
from pipelines.io.config_options import UsageError
from pipelines.io.parquet import c_library
from pipelines.io.completion import IncompleteOutputError, read_output_stats, require_complete
from pipelines.mine.margin import side_searched_in_full as full_side
from pipelines.mine.search import top_hits
from pipelines.stage import stable_hash

from pipelines.mine.units import SRC, TGT


def load_manifest(index_dir: str, option: str) -> IndexManifest:
    """The manifest of a complete labse-index output; UsageError (one line) otherwise."""
    index_dir = index_dir.rstrip("/")
    try:
        require_complete(index_dir, f"{option} (labse-index output)")
        section = read_output_stats(index_dir).get("index")
    except IncompleteOutputError:
        raise
    except (OSError, ValueError) as error:
        raise UsageError(f"{option} {index_dir}: cannot read its _stats.json ({error})") from None
    if not isinstance(section, dict):
        raise UsageError(f"{option} {index_dir} is not a labse-index output (its _stats.json has no `index`)")
    try:
        return IndexManifest.from_dict(section)
    except (KeyError, TypeError, ValueError) as error:
        raise UsageError(f"{option} {index_dir}: its _stats.json is not a labse-index manifest ({error})") from None


def searchable(item: tuple) -> tuple:
    """(side, group, text, url, doc_id) -> (side, "", text, "", ""): how an index names a sentence."""
    return (item[0], "", item[2], "", "")


def _local_file(path: str, keep: list) -> str:
    """`path` on local disk: itself, or a copy in a temporary folder that `keep` holds for as long as
    it is used (`pipelines.io.storage.download`: gcsfs spent two thirds of the CPU a byte that Beam's
    GCS reader did, BENCHMARKS.md "Shards read while searched, hits named by their rows")."""
    import tempfile

    if not storage.is_remote(path):
        return path
    folder = tempfile.TemporaryDirectory(prefix="labse-shard-")
    keep.append(folder)
    local = Path(folder.name) / path.rsplit("/", 1)[-1]
    storage.download(path, local)
    return str(local)


class ShardLabels:
    """A shard's sentence labels (side, "", text, "", "") by id, read from its memory-mapped .txt
    on demand: a worker holds the line offsets (8 bytes a sentence), no Python object a sentence."""

    SCAN = 1 << 26  # bytes scanned for line ends at a time

    def __init__(self, side: str, path: str, count: int):
        import mmap

        self.side = side
        with open(path, "rb") as handle:
            self.text = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if count else b""
        ends = [np.flatnonzero(np.frombuffer(self.text, np.uint8, min(self.SCAN, len(self.text) - lo), lo) == 10) + lo
                for lo in range(0, len(self.text), self.SCAN)]
        ends = np.concatenate(ends) if ends else np.zeros(0, np.int64)
        if len(ends) < count:
            raise ValueError(f"{path} holds {len(ends):,} lines but its index {count:,} vectors")
        # line i is text[bounds[i]:bounds[i + 1] - 1] (its newline left out)
        self.bounds = np.concatenate([[0], ends[:count] + 1]).astype(np.int64)
        release_pages(self.text)

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __getitem__(self, i) -> tuple:
        return (self.side, "", self.text[self.bounds[i]:self.bounds[i + 1] - 1].decode("utf-8"), "", "")


MMAP_THRESHOLD = 1 << 17  # glibc's default threshold, kept fixed (`return_freed_memory`)


def return_freed_memory() -> None:
    """Have glibc give freed blocks of 128 KiB and more back to the system in this worker process.

    By default glibc raises its mmap threshold to the largest block freed (up to 32 MB), so after
    the first batch the search's and the margin steps' arrays and buffers (MBs each) come from the
    heap, where freed memory stays in the process: the worker grew by hundreds of MB over a 100x
    run (BENCHMARKS.md, "labse-mine's global layout without vectors in its elements"). A fixed
    threshold (mallopt, as MALLOC_MMAP_THRESHOLD_ would set it) keeps those blocks mapped and
    returned when freed. A no-op where the C library is not glibc."""
    mallopt = getattr(c_library(), "mallopt", None)
    if mallopt is None:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    mallopt(m_mmap_threshold, MMAP_THRESHOLD)
    mallopt(m_trim_threshold, MMAP_THRESHOLD)


class LoadedShard:
    """One index shard as a worker searches it: the FAISS index (its codes), the sentence labels, the
    float16 rows memory-mapped for re-ranking (or None), the local copies they are read from, and
    `hit_ids` (the packed path's store ids of its sentences hit so far, `_SearchPackedShards`)."""

    def __init__(self, key: tuple, index, labels: ShardLabels, rows, keep: list):
        self.key, self.index, self.labels, self.rows, self.keep = key, index, labels, rows, keep
        self.hit_ids: np.ndarray | None = None
        self.source_ids = None  # the packed path's shard-*.ids.npy, memory-mapped (labels None then)
        self.counted = False  # its load counted (`HeldShards.first_use`): a load in a prefetching
        # thread cannot count itself, Beam's counters belong to the bundle's thread


class FetchedShard:
    """One shard's files on local disk, by suffix (`.faiss`, the float16 rows, the sentences' text or
    ids): the index folder's own, or copies of a bucket's in temporary folders that `keep` holds.
    What the packed search reads ahead while it searches a shard: the next one's files, not its
    codes in memory (a worker holds one shard's codes a bundle, the next one waits on disk)."""

    def __init__(self, key: tuple, paths: dict, keep: list):
        self.key, self.paths, self.keep = key, paths, keep


class HeldShards:
    """The index shards a worker process holds: the one each running bundle searches, and the one the
    last finished bundle searched (kept for the next bundle, dropped as soon as another shard is
    loaded). A runner keeps a finished stage's DoFn instances for reuse, and the forward and the
    backward searches are two stages: a shard held by its DoFn stayed in the worker through the
    later stages (at 100x, the first direction's index beside the second's)."""

    def __init__(self):
        import threading
        import weakref

        self._lock = threading.Lock()
        self._live: "weakref.WeakValueDictionary[tuple, LoadedShard]" = weakref.WeakValueDictionary()
        self._loading: dict = {}  # key -> threading.Event set when its load ends
        self._kept: LoadedShard | None = None

    def get(self, key: tuple, load) -> LoadedShard:
        """The shard of `key`, loaded by `load()` unless a bundle holds it. The bundles running on a
        worker's threads share a shard, and wait for one load of it; the lock is not held while a
        shard loads (a read from a bucket takes minutes at a crawl's shard size), so a bundle
        switching to a shard already held never waits for another's load."""
        import threading

        while True:
            with self._lock:
                shard = self._live.get(key)
                if shard is not None:
                    return shard
                pending = self._loading.get(key)
                if pending is None:
                    pending = self._loading[key] = threading.Event()
                    self._kept = None  # the last bundle's shard, unless a running bundle still holds it
                    break
            pending.wait()  # another thread loads it: then it is held (or that load failed: load it here)
        try:
            shard = load()
            with self._lock:
                self._live[key] = shard
            return shard
        finally:
            with self._lock:
                del self._loading[key]
            pending.set()

    def holds(self, key: tuple) -> bool:
        with self._lock:
            return key in self._live

    def keep(self, shard: LoadedShard) -> None:
        with self._lock:
            self._kept = shard

    def drop_kept(self) -> None:
        """Let go of the shard the last search bundle kept (a running bundle's shard stays). Called
        where the steps after the searches begin: they start once every search is done (the
        searches' hits reach them through a grouping), and a shard kept for a search that never
        comes stayed in the worker through the margins, the selection and the writing (~10 MB of
        codes at a 200,000-sentence shard; GBs at a crawl's)."""
        with self._lock:
            self._kept = None

    def first_use(self, shard: LoadedShard) -> bool:
        """True once a load: for the bundle that counts it."""
        with self._lock:
            first, shard.counted = not shard.counted, True
            return first


HELD_SHARDS = HeldShards()  # per worker process, as Beam's `Shared` objects are


class _SearchShard(beam.DoFn):
    """(index side, shard name, query items, query matrix) -> (query item, (similarity, hit item)) for
    the query's top-k in that shard (the packed path's subclass passes (file number, row) references
    into the `store` instead of vectors), re-ranked
    by exact cosine from the shard's float16 rows when `rerank` > k and the index has them. A
    bundle holds the shard it searches; the worker keeps the last one (`HeldShards`)."""

    def __init__(self, index_dirs: dict, nprobes: dict, k: int, rerank: dict, store: str | None = None):
        from apache_beam.utils.shared import Shared

        self.index_dirs, self.nprobes, self.k, self.rerank, self.store = index_dirs, nprobes, k, rerank, store
        self.searched = beam.metrics.Metrics.counter("mine", "index.queries_searched")
        self.loads = beam.metrics.Metrics.counter("mine", "index.shard_loads")
        self._loaded = None
        self._shared = Shared()

    def setup(self):
        return_freed_memory()
        if self.store is not None:
            from pipelines.embed.embedders import held_embedder

            self._held = held_embedder(self._shared, self.store, 1)

    def finish_bundle(self):
        if self._loaded is not None:
            HELD_SHARDS.keep(self._loaded)
            self._loaded = None

    def _shard(self, side: str, name: str) -> LoadedShard:
        key = self._key(side, name)
        if self._loaded is None or self._loaded.key != key:
            self._loaded = None  # free the last shard before reading the next
            self._loaded = self._held_shard(side, name)
            if HELD_SHARDS.first_use(self._loaded):
                self.loads.inc()
        return self._loaded

    def _key(self, side: str, name: str) -> tuple:
        return side, self.index_dirs[side], name, self.nprobes[side], self.rerank[side] > self.k, self.store

    def _held_shard(self, side: str, name: str) -> LoadedShard:
        """The shard, from the worker's held ones or loaded."""
        key = self._key(side, name)
        return HELD_SHARDS.get(key, lambda: self._load(key))

    def _label_suffix(self, key: tuple) -> str:
        """The file that names a shard's sentences: here its text."""
        return ".txt"

    def _fetch(self, key: tuple) -> FetchedShard:
        """The files `_load` reads, on local disk (thread-safe: the packed search's read-ahead calls it)."""
        side, _dir, name, _nprobe, rerank = key[:5]
        base = f"{self.index_dirs[side]}/{name}"
        keep: list = []
        suffixes = [".faiss", *([RERANK_SUFFIX] if rerank else []), self._label_suffix(key)]
        return FetchedShard(key, {suffix: _local_file(f"{base}{suffix}", keep) for suffix in suffixes}, keep)

    def _files(self, key: tuple) -> FetchedShard:
        """The files `_load` opens: read now (the packed search reads them ahead)."""
        return self._fetch(key)

    def _load(self, key: tuple) -> LoadedShard:
        import faiss

        fetched = self._files(key)
        index = faiss.read_index(fetched.paths[".faiss"])  # from local disk: no copy of the codes in bytes
        set_nprobe(index, key[3])
        rows = (np.load(fetched.paths[RERANK_SUFFIX], mmap_mode="r", allow_pickle=False)
                if RERANK_SUFFIX in fetched.paths else None)
        shard = LoadedShard(key, index, None, rows, fetched.keep)
        self._name_sentences(shard, fetched.paths[self._label_suffix(key)])
        return shard

    def _name_sentences(self, shard: LoadedShard, path: str) -> None:
        """What names a hit's sentence (`path`: the local file of `_label_suffix`): here the shard's
        labels, read from its text."""
        shard.labels = ShardLabels(shard.key[0], path, shard.index.ntotal)

    def _searched(self, side: str, name: str, matrix: np.ndarray, search):
        """(the shard's labels, `search(index, labels, queries, k, rows, depth)`'s answer) for the
        queries `matrix` (vectors, or (file number, row) references read here, a batch at a time)."""
        if matrix.dtype.kind == "i":
            matrix = self._held.embedder.read_located(matrix)
        shard = self._shard(side, name)
        if matrix.shape[1] != shard.index.d:
            raise ValueError(f"the embedder gives {matrix.shape[1]}-dimensional vectors but the index "
                             f"{self.index_dirs[side]} holds {shard.index.d}: build the index from the same vectors")
        self.searched.inc(len(matrix))
        with faiss_threads(1):  # the runner runs one bundle per core; FAISS threads would fight them
            found = search(shard.index, shard.labels, matrix, self.k, shard.rows, self.rerank[side])
        if shard.labels is not None:  # the rows' pages are dropped as they are read (`exact_similarities`)
            release_pages(shard.labels.text)
        return shard.labels, found

    def process(self, element) -> Iterator[Any]:  # Any: flattened with `_ask_targets`' hits, an inferred
        # type would carry its TaggedOutput into the GroupByKey's type check
        side, name, items, matrix = element
        _labels, found = self._searched(side, name, matrix, search_shard)
        for item, hits in zip(items, found):
            for sim, other in hits:
                yield item, (sim, other)


def _to_shards(keyed, shard_names: dict):
    """A batch of one side's queries -> one element per shard of the OTHER side's index."""
    (side, *_batch), members = keyed
    members = sorted(members, key=lambda m: m[0])  # the rows in item order, whatever the runner's
    items = [m[0] for m in members]
    matrix = np.stack([m[1] for m in members]).astype(np.float32)
    other = TGT if side == SRC else SRC
    for name in shard_names[other]:
        yield other, name, items, matrix


def index_plan(src_index: str, tgt_index: str, src: IndexManifest, tgt: IndexManifest, nprobe: int | None,
               rerank: int) -> tuple[dict, dict, dict, dict]:
    """Per side (SRC, TGT): the index folder, its non-empty shards' names, the nprobe and the re-rank
    depth its searches use."""
    dirs = {SRC: src_index.rstrip("/"), TGT: tgt_index.rstrip("/")}
    shards = {SRC: [s["name"] for s in src.shards if s["sentences"]],
              TGT: [s["name"] for s in tgt.shards if s["sentences"]]}
    nprobes = {SRC: nprobe or src.nprobe, TGT: nprobe or tgt.nprobe}
    # re-rank only where the index kept its rows (labse-index writes them; older indexes lack them)
    reranks = {SRC: rerank if src.rerank_vectors else 0, TGT: rerank if tgt.rerank_vectors else 0}
    return dirs, shards, nprobes, reranks


class IndexNeighbourLists(beam.PTransform):
    """(searchable item, unit vector) of both sides -> (item, [(similarity, other item)] hits from
    every shard of the other side's index), to be merged per item into the top k."""

    def __init__(self, src_index: str, tgt_index: str, src: IndexManifest, tgt: IndexManifest, k: int,
                 nprobe: int | None, query_batch: int, rerank: int = 0):
        super().__init__()
        self.dirs, self.shards, self.nprobes, self.rerank = index_plan(src_index, tgt_index, src, tgt, nprobe, rerank)
        self.k, self.query_batch = k, query_batch

    def expand(self, embedded):
        query_batch = self.query_batch
        counts = (embedded
                  | "Sides" >> beam.Map(lambda e: e[0][0])
                  | "CountSides" >> beam.combiners.Count.PerElement()
                  | "Batches" >> beam.Map(lambda kv: (kv[0], max(1, -(-kv[1] // query_batch)))))
        keyed = embedded | "KeyBatch" >> beam.Map(lambda e, n: ((e[0][0], stable_hash(e[0][2]) % n[e[0][0]]), e),
                                                  beam.pvalue.AsDict(counts))
        return (keyed
                | "GroupBatch" >> beam.GroupByKey()
                | "ToShards" >> beam.FlatMap(_to_shards, self.shards)
                | "Spread" >> beam.Reshuffle()
                | "SearchShards" >> beam.ParDo(_SearchShard(self.dirs, self.nprobes, self.k, self.rerank)))


class RestoreProvenance(beam.PTransform):
    """(selected pair records keyed by searchable items, the input's items) -> the pair records
    with each side's full item (group, url, doc_id) back."""

    def expand(self, pcolls):
        pairs, items = pcolls
        keyed_items = items | "KeyItems" >> beam.Map(lambda item: (searchable(item), item))
        for side in ("src", "tgt"):
            pairs = (
                {"pair": pairs | f"Key{side}" >> beam.Map(lambda p, s=side: (p[s], p)), "item": keyed_items}
                | f"Join{side}" >> beam.CoGroupByKey()
                | f"Put{side}" >> beam.FlatMap(_put_back, side))
        return pairs


def _put_back(joined, side: str):
    _key, grouped = joined
    full = list(grouped["item"])
    for pair in grouped["pair"]:
        yield dict(pair, **{side: full[0]}) if full else pair


def _on_side(element, counts: dict, strategy: str, full: bool) -> bool:
    """Whether the element's side is (full=True) or is not the side searched in full."""
    side = SRC if full_side(counts.get(SRC, 0), counts.get(TGT, 0), strategy) == "src" else TGT
    return (element[0][0] == side) == full


def _ask_targets(keyed):
    """(query item, its merged top-k) -> (candidate, None) for each of its candidates, and the
    top-k back as hits."""
    item, top = keyed
    for sim, other in top:
        yield beam.pvalue.TaggedOutput("asked", (other, None))
        yield item, (sim, other)


class _AskedOnly(beam.DoFn):
    """(item, {"vector": its vector, "asked": a None per time it is a candidate}) -> (item, vector)
    for the items that are some sentence's candidate; the others are counted, not searched."""

    def __init__(self):
        self.asked = beam.metrics.Metrics.counter("mine", "index.backward_searched")
        self.skipped = beam.metrics.Metrics.counter("mine", "index.backward_skipped")

    def process(self, joined):
        item, grouped = joined
        vectors = list(grouped["vector"])
        if not vectors:  # a candidate from the index that is not in this run's input: no kNN mean
            return
        if any(True for _ in grouped["asked"]):
            self.asked.inc()
            yield item, vectors[0]
        else:
            self.skipped.inc()


class CandidatesBackwardLists(beam.PTransform):
    """IndexNeighbourLists with the backward direction limited to the forward candidates: every
    sentence of one side (`pipelines.mine.margin.side_searched_in_full`) is searched in the other's
    index, and of the other side only the sentences among those k-nearest lists, which are the ones
    whose kNN mean a margin needs. The forward lists and every margin computed from them are the full search's; what
    is not computed is the best candidate of a sentence that is in no forward list (the `bwd`
    direction's pairs of sentences nobody proposed), which `max` could have selected."""

    def __init__(self, strategy: str, merge_key, *search_args, **search_kwargs):
        super().__init__()
        self.strategy, self.merge_key = strategy, merge_key  # merge_key: how labse-mine orders a sentence's hits
        self.first = IndexNeighbourLists(*search_args, **search_kwargs)
        self.then = IndexNeighbourLists(*search_args, **search_kwargs)

    def expand(self, embedded):
        counts = (embedded
                  | "Sides" >> beam.Map(lambda e: e[0][0])
                  | "CountSides" >> beam.combiners.Count.PerElement()
                  | "CountsDict" >> beam.combiners.ToDict())
        sides = beam.pvalue.AsSingleton(counts)
        full = embedded | "FullSide" >> beam.Filter(_on_side, sides, self.strategy, True)
        other = embedded | "OtherSide" >> beam.Filter(_on_side, sides, self.strategy, False)
        forward = (full
                   | "SearchFull" >> self.first
                   | "GroupFull" >> beam.GroupByKey()  # not Top.PerKey: see BestCandidates' `lifted`
                   | "MergeFull" >> beam.Map(top_hits, self.first.k, self.merge_key)
                   | "AskTargets" >> beam.FlatMap(_ask_targets).with_outputs("asked", main="hits"))
        wanted = ({"vector": other, "asked": forward.asked}
                  | "JoinAsked" >> beam.CoGroupByKey()
                  | "AskedOnly" >> beam.ParDo(_AskedOnly()))
        backward = wanted | "SearchAsked" >> self.then
        return (forward.hits, backward) | "BothDirections" >> beam.Flatten()
