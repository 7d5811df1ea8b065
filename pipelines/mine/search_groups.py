"""Groups of query batches for labse-mine's packed global search (`_SearchPackedShards`): which
batches go through an index's shards together, how many, and what a group carries per query from
one shard to the next.

A group loads every shard of the index it searches once, so an index is read once a group, and
its loads cost index bytes x groups: the more queries a group holds, the less loading a query
costs. A group runs on across the store's files (a batch's place in its side is its file's offset
plus its block, `file_block_offsets`), and a group too large for memory keeps its per-query state
in files on the worker's local disk (`GroupState`).
"""
from __future__ import annotations

import math
import tempfile

import numpy as np

from pipelines.index.shards import IndexManifest, release_pages

# A shard is loaded for at least one query per this many of its sentences. Loading reads its codes,
# float16 rows and text (~700 bytes a sentence at 256 dimensions: ~2.8 us at ~250 MB/s from a
# bucket, assumed), 22 us a query at 8, about what searching a query in one more shard costs once
# its lists are assigned (27 us, benchmarks/shard_search.py at 50 shards).
SENTENCES_PER_QUERY_AT_LOAD = 8
# What a group may hold in a running bundle: in memory up to GROUP_MEMORY (a batch of 8,192 queries
# is ~4.6 MB at nprobe 32, --rerank 64 and k 4), the rest in files on the worker's local disk
# (`GroupState`), where only the batch being searched is resident: so a worker's memory does not
# follow the group's size, which follows the shards' (512 MB in memory made a mining worker ~13 MB
# larger at 200,000-sentence shards than at 20,000). 4 GB is ~7.5 million queries at those
# settings (`group_bytes_per_query`): the rule above reaches it at shards of ~60 million sentences.
GROUP_MEMORY = 8 << 20
GROUP_BYTES = 4 << 30
FILL_BYTES = 1 << 20  # of a group's state on disk filled at a time


def group_bytes_per_query(nprobe: int, depth: int, k: int) -> int:
    """What a group holds a query: its list assignment (8 bytes a list), its re-ranking floor (4 a
    hit re-ranked, `RerankFloor`), its top k so far (12 a neighbour) and its id."""
    return 8 * nprobe + 4 * depth + 12 * k + 8


def batches_per_load(manifest: IndexManifest, query_batch: int, per_query: int, given: int = 0) -> int:
    """How many query batches are searched together in `manifest`'s shards, each shard loaded once
    for them: `given`, or where 0, enough for one query per SENTENCES_PER_QUERY_AT_LOAD sentences
    of its largest shard (1 for shards of up to 65,536 sentences at the default batch of 8,192), as
    far as they fit in GROUP_BYTES at `per_query` bytes a query."""
    if given:
        return given
    largest = max((shard["sentences"] for shard in manifest.shards), default=0)
    wanted = math.ceil(largest / (SENTENCES_PER_QUERY_AT_LOAD * query_batch))
    held = GROUP_BYTES // (query_batch * per_query)
    return max(1, min(wanted, held))


def file_block_offsets(last_blocks: dict) -> dict:
    """{(side, file number): its last block with queries} -> {(side, file number): the block slots
    of that side's earlier files}: a batch's ordinal in its side is its file's offset plus its
    block, so consecutive ordinals run on from one file into the next."""
    offsets, ran = {}, {}
    for side, file in sorted(last_blocks):
        offsets[(side, file)] = ran.get(side, 0)
        ran[side] = ran.get(side, 0) + last_blocks[(side, file)] + 1
    return offsets


class GroupState:
    """What a group of query batches carries per query from shard to shard (its list assignment,
    re-ranking floor and top k so far): one [queries, width] array per name, rows lo:hi a batch's.
    Held in memory when `queries x bytes_per_query` fits in `memory`, else memory-mapped from files
    in a temporary folder on the worker's local disk, deleted on exit (`release` drops the pages
    read from this process: they stay in the page cache). Use as a context manager."""

    def __init__(self, queries: int, bytes_per_query: int, memory: int = GROUP_MEMORY):
        self.queries = queries
        self.on_disk = queries * bytes_per_query > memory
        self._folder = tempfile.TemporaryDirectory(prefix="labse-mine-group-") if self.on_disk else None
        self._arrays: dict[str, np.ndarray] = {}

    def array(self, name: str, width: int, dtype, fill) -> np.ndarray:
        """The [queries, width] array `name`, filled with `fill` when first asked for (on disk a
        slice at a time, its pages dropped after each: filling it whole would make it resident)."""
        held = self._arrays.get(name)
        if held is None:
            shape = (self.queries, width)
            if self._folder is None:
                held = np.full(shape, fill, dtype)
            else:
                held = np.memmap(f"{self._folder.name}/{name}", dtype=dtype, mode="w+", shape=shape)
                step = max(1, FILL_BYTES // (width * held.itemsize))
                for lo in range(0, self.queries, step):
                    held[lo:lo + step] = fill
                    release_pages(held)
            self._arrays[name] = held
        elif held.shape[1] != width or held.dtype != np.dtype(dtype):
            raise ValueError(f"group state {name!r} is {held.shape[1]} x {held.dtype}, asked for {width} x "
                             f"{np.dtype(dtype)}")
        return held

    def release(self) -> None:
        if self._folder is not None:
            release_pages(*self._arrays.values())

    def __enter__(self) -> "GroupState":
        return self

    def __exit__(self, *_exc) -> None:
        self._arrays.clear()
        if self._folder is not None:
            self._folder.cleanup()
