"""Packed elements: global mining with `--embedder vectors:DIR` moves columns, not sentences.

A sentence is named by its store id, the int64 `file number << 32 | row` of its vector in the
`vectors:DIR` store (`SavedVectorsEmbedder.find`), which is also how the store files its text, so
no element carries a text, a vector or a Python object per sentence. Per-sentence state (a query's
hits, kNN means, margin requests, best candidates, provenance) travels as a `Packed` element: a
dict of equal-length numpy columns for the sentences of one range key `(side, file, block)`, the
store rows `[block * query_batch, (block + 1) * query_batch)` of one file of one side (a query batch,
as the search reads rows in runs). A GroupByKey then joins a range's columns from every producer.

Why: a runner moves and holds elements. The DirectRunner hands a worker its whole share of a
GroupByKey as one message and decodes it into Python objects (~300 bytes of overhead an element,
BENCHMARKS.md "Why the DirectRunner's workers grow with the input"), so per-sentence elements made
its workers grow with the input; on Dataflow every element costs a shuffle record and a decode.
Columns cost their bytes: 8 for an id, 4 or 8 for a number.
"""
from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np

ROW_BITS = 32
Packed = dict  # column name -> 1-D numpy array, all of one length

from pipelines.mine.units import SRC, TGT  # noqa: F401 (the packed modules take them from here)


def store_ids(located: np.ndarray) -> np.ndarray:
    """(file number, row) references `[n, 2]` -> int64 store ids (-1 where the row is -1)."""
    located = np.asarray(located, dtype=np.int64).reshape(-1, 2)
    ids = (located[:, 0] << ROW_BITS) | located[:, 1]
    return np.where(located[:, 1] < 0, -1, ids)


def references(ids: np.ndarray) -> np.ndarray:
    """Store ids -> (file number, row) references `[n, 2]` (what `SavedVectorsEmbedder.read_located` takes)."""
    ids = np.asarray(ids, dtype=np.int64)
    return np.stack([ids >> ROW_BITS, ids & ((1 << ROW_BITS) - 1)], axis=1)


def range_blocks(ids: np.ndarray, query_batch: int) -> tuple[np.ndarray, np.ndarray]:
    """(file number, block) of each store id: the range key's last two fields."""
    ids = np.asarray(ids, dtype=np.int64)
    return ids >> ROW_BITS, (ids & ((1 << ROW_BITS) - 1)) // query_batch


def split_by_range(side: str, ids: np.ndarray, query_batch: int, **columns: np.ndarray
                   ) -> Iterator[tuple[tuple[str, int, int], Packed]]:
    """`ids` (and columns of the same length) -> one ((side, file, block), Packed) per range key
    present, rows in their given order; the ids column is named `ids`."""
    ids = np.asarray(ids, dtype=np.int64)
    if not len(ids):
        return
    files, blocks = range_blocks(ids, query_batch)
    order = np.lexsort((blocks, files))
    files, blocks = files[order], blocks[order]
    cuts = np.flatnonzero((np.diff(files) != 0) | (np.diff(blocks) != 0)) + 1
    for part in np.split(np.arange(len(ids)), cuts):
        rows = order[part]
        yield ((side, int(files[part[0]]), int(blocks[part[0]])),
               {"ids": ids[rows], **{name: np.asarray(column)[rows] for name, column in columns.items()}})


def split_by_column(packed: Packed, side: str, column: str, query_batch: int
                    ) -> Iterator[tuple[tuple[str, int, int], Packed]]:
    """`packed` -> one (range key of its `column`'s store ids on `side`, its rows there) per range key
    present, the columns keeping their names (nothing for an empty `packed`)."""
    if not packed or not len(packed[column]):
        return
    rest = {name: values for name, values in packed.items() if name != column}
    for key, part in split_by_range(side, packed[column], query_batch, **rest):
        part[column] = part.pop("ids")
        yield key, part


def concat(parts: Iterable[Packed]) -> Packed:
    """Packed elements of the same columns -> one (rows in the given order); {} when there are none."""
    parts = [part for part in parts if part]
    if not parts:
        return {}
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


def among(ids: np.ndarray, packed: Packed) -> np.ndarray:
    """Whether each of `ids` is among `packed`'s ids (none are when `packed` is empty: {})."""
    return np.isin(ids, packed["ids"]) if packed else np.zeros(len(ids), bool)


def rows_of(packed: Packed) -> int:
    return len(next(iter(packed.values()))) if packed else 0


def take(packed: Packed, rows: np.ndarray) -> Packed:
    return {name: column[rows] for name, column in packed.items()}
