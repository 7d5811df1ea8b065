"""One Parquet file of rows sorted by some columns, written in bounded memory (an external merge sort).

`write_sorted_parquet` takes a file's rows as Arrow record batches in any order and holds about
`run_bytes` of them at a time, however large the file: rows gather into a run until it reaches
`run_bytes` (Arrow's in-memory size), the run is sorted and spilled to a local temporary Arrow IPC
stream; at the end the sorted runs are merged, a slice of each at a time, into a Parquet writer that
streams row groups of about ROW_GROUP_BYTES into the file's temporary name, published atomically
(`published_file`: renamed into place locally, uploaded whole to an object store). The spill files
live in a temporary folder that is removed afterwards, also on error. A file whose rows fit in one
run is sorted in memory and written whole (`write_table_atomic`), with no spill.

The same two steps also run apart, so that a file's rows never have to meet on one worker before
they are sorted: `spill_sorted_runs` writes the sorted runs of some of a file's rows to a shared
folder (a worker each part), and `merge_sorted_runs` merges all the runs of the file from their
paths (`pipelines.stage.WriteParquetBatches`).

Order: ascending by `sort_columns`, then by the schema's other orderable columns in schema order
(so rows equal on `sort_columns` still come out in an order given by their contents, not by the
order a runner delivered them), then rows equal on all of those (identical but for nested columns)
in the order they arrived. This is Arrow's `Table.sort_by` (a stable sort; strings in UTF-8 byte
order, NaN after numbers, nulls last) of all the rows at once: the merge orders each slice with
`sort_by` too, breaking its ties by (run, position in the run), so the merged order is exactly the
one-pass order.

Merge step: every live run has a slice in memory; the smallest of the slices' last rows bounds what
is final: every row not yet read from any run sorts after it (a run's unread rows sort after its
slice's last row, which sorts at or after the bound), so the slices' rows up to and including the
bound row are written, the rest stay, and the run whose slice ran out reads its next slice. Rows
whose first sort column is greater than the bound's (Arrow's `greater`: byte order for strings;
never true for NaN or null, so those are always ordered) cannot be written yet and are not ordered
again: a step sorts about the rows it writes, not every slice (with k runs that would be k/2 times
the work).
"""
from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipelines.io import storage
from pipelines.io.atomic import published_file
from pipelines.io.parquet import write_table_atomic

# A run's rows in memory before they are sorted and spilled (Arrow bytes). The merge holds a slice of
# every run (RUN_SLICES slices a run: about RUN_BYTES for a file of up to RUN_SLICES runs), the
# bound row and the row group being filled and encoded (ROW_GROUP_BYTES), whatever the file's size.
RUN_BYTES = 16 << 20
RUN_SLICES = 16
# The merge's row groups (Arrow bytes before encoding; ~25,000 rows of labse-mine's pairs). The
# Parquet writer holds a row group's encoded pages until it ends, so its memory follows this, not
# the file: row groups of RUN_BYTES made a mining worker's peak ~10-20 MB higher at a 113,783-row
# file (BENCHMARKS.md, "What a mining worker kept between its steps"); still ample for zstd
# and for readers.
ROW_GROUP_BYTES = 4 << 20
_RUN, _POSITION = "__run", "__position"


def sort_keys(schema: pa.Schema, sort_columns: Sequence[str]) -> list[tuple[str, str]]:
    """`Table.sort_by` keys: `sort_columns`, then the schema's other orderable (non-nested) columns."""
    missing = [name for name in sort_columns if name not in schema.names]
    if missing:
        raise ValueError(f"sort columns {missing} are not in the schema {schema.names}")
    ties = [f.name for f in schema if f.name not in sort_columns
            and not pa.types.is_nested(f.type) and not pa.types.is_null(f.type)]
    return [(name, "ascending") for name in (*sort_columns, *ties)]


def write_sorted_parquet(batches: Iterable[pa.RecordBatch], path: str, schema: pa.Schema,
                         sort_columns: Sequence[str], *, run_bytes: int = RUN_BYTES) -> int:
    """Write the rows of `batches` (record batches of `schema`) as one Parquet file at `path` (local or
    object store), sorted as the module says, holding about `run_bytes` of rows at a time. Returns
    the number of rows written. A failure leaves nothing at `path`."""
    keys = sort_keys(schema, sort_columns)
    with tempfile.TemporaryDirectory(prefix="labse-sort-") as spill:
        runs = []
        for run in _runs(batches, run_bytes):
            if not runs and sum(batch.nbytes for batch in run) < run_bytes:  # the file's only run: no spill
                table = _sorted(run, schema, keys)
                write_table_atomic(table, path)
                return table.num_rows
            runs.append(_spill(_sorted(run, schema, keys), os.path.join(spill, f"run-{len(runs)}.arrow")))
        return merge_sorted_runs(runs, path, schema, sort_columns, run_bytes=run_bytes)


def spill_sorted_runs(batches: Iterable[pa.RecordBatch], folder: str, schema: pa.Schema,
                      sort_columns: Sequence[str], *, prefix: str, run_bytes: int = RUN_BYTES) -> list[str]:
    """The rows of `batches` sorted in runs of about `run_bytes`, each an Arrow IPC stream
    `folder/PREFIX-NNNNN.arrow` (local or object store, each published whole); their paths, in order.
    Holds about one run at a time. `merge_sorted_runs` of any such runs of one file writes it: so a
    file's rows can be sorted in parts on different workers and merged on one."""
    keys = sort_keys(schema, sort_columns)
    paths = []
    for run in _runs(batches, run_bytes):
        path = f"{folder.rstrip('/')}/{prefix}-{len(paths):05d}.arrow"
        with published_file(path) as local:
            _spill(_sorted(run, schema, keys), local)
        paths.append(path)
    return paths


def merge_sorted_runs(runs: Sequence[str], path: str, schema: pa.Schema, sort_columns: Sequence[str], *,
                      run_bytes: int = RUN_BYTES) -> int:
    """Merge sorted runs (Arrow IPC streams of `schema`, each sorted by `sort_keys`, local or object
    store: those on a store are copied to local disk first) into one Parquet file at `path`, in the
    order of one sort of all their rows, ties between runs in the order of `runs`. Holds a slice of
    each run and a row group of about ROW_GROUP_BYTES. Returns the number of rows. A failure leaves
    nothing at `path`."""
    keys = sort_keys(schema, sort_columns)
    with tempfile.TemporaryDirectory(prefix="labse-merge-") as copies:
        local = []
        for number, run in enumerate(runs):
            if storage.is_remote(run):
                storage.download(run, Path(copies) / f"run-{number}.arrow")
                run = os.path.join(copies, f"run-{number}.arrow")
            local.append(run)
        if len(local) <= 1:  # already in order: written whole (a run is about run_bytes)
            table = _read_run(local[0]) if local else schema.empty_table()
            write_table_atomic(table, path)
            return table.num_rows
        written = 0
        with published_file(path) as target, pq.ParquetWriter(target, schema, compression="zstd") as writer:
            for group in _row_groups(_merged(local, keys, schema), min(run_bytes, ROW_GROUP_BYTES)):
                writer.write_table(group)
                written += group.num_rows
        return written


def _runs(batches: Iterable[pa.RecordBatch], run_bytes: int) -> Iterator[list[pa.RecordBatch]]:
    """The non-empty batches gathered into runs of at least `run_bytes` (Arrow bytes); the last may be smaller."""
    pending, pending_bytes = [], 0
    for batch in batches:
        if batch.num_rows:
            pending.append(batch)
            pending_bytes += batch.nbytes
        if pending_bytes >= run_bytes:
            yield pending
            pending, pending_bytes = [], 0
    if pending:
        yield pending


def _read_run(path: str) -> pa.Table:
    with pa.OSFile(path, "rb") as handle:
        return pa.ipc.open_stream(handle).read_all()


def _sorted(batches: list[pa.RecordBatch], schema: pa.Schema, keys) -> pa.Table:
    return pa.Table.from_batches(batches, schema=schema).sort_by(keys)


def _spill(table: pa.Table, path: str) -> str:
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, table.schema) as stream:
        stream.write_table(table, max_chunksize=max(1, math.ceil(table.num_rows / RUN_SLICES)))
    return path


def _merged(paths: list[str], keys, schema: pa.Schema) -> Iterator[pa.Table]:
    """The rows of the sorted runs at `paths`, in the order of one sort of them all (see the module)."""
    files = [pa.OSFile(path, "rb") for path in paths]
    try:
        readers = [pa.ipc.open_stream(handle) for handle in files]
        slices: dict[int, pa.RecordBatch] = {}
        read = [0] * len(paths)  # rows of each run written so far
        merge_keys = [*keys, (_RUN, "ascending"), (_POSITION, "ascending")]
        first = keys[0][0]
        while True:
            for run in range(len(paths)):
                if readers[run] is not None and (run not in slices or not slices[run].num_rows):
                    slices.pop(run, None)
                    try:
                        slices[run] = readers[run].read_next_batch()
                    except StopIteration:
                        readers[run] = None
            if len(slices) <= 1:
                break
            # the bound: the smallest of the slices' last rows (Arrow orders the k rows)
            lasts = pa.Table.from_batches([_numbered(batch.slice(batch.num_rows - 1), run, read[run] + batch.num_rows - 1)
                                           for run, batch in slices.items()])
            at = pc.sort_indices(lasts, sort_keys=merge_keys)[0].as_py()
            bound_key, bound_run, bound_position = (lasts.column(name)[at] for name in (first, _RUN, _POSITION))
            # a slice's rows whose first sort column is greater than the bound's sort after it: only the
            # rest (the rows to write, and those equal on the first column) are ordered by Arrow
            parts = []
            for run, batch in slices.items():
                after = pc.greater(batch.column(first), bound_key).fill_null(False).to_numpy(zero_copy_only=False)
                candidates = np.flatnonzero(~after)
                if len(candidates):
                    parts.append(_numbered(batch.slice(0, int(candidates[-1]) + 1), run, read[run]))
            pool = pa.Table.from_batches(parts)
            order = pc.sort_indices(pool, sort_keys=merge_keys)
            is_bound = pc.and_(pc.equal(pool.column(_RUN), bound_run), pc.equal(pool.column(_POSITION), bound_position))
            out = pool.take(order[:int(np.argmax(is_bound.take(order).to_numpy())) + 1])
            taken = np.bincount(out.column(_RUN).to_numpy(), minlength=len(paths))
            for run in slices:
                slices[run] = slices[run].slice(int(taken[run]))
                read[run] += int(taken[run])
            yield out.select(schema.names)
        for run, batch in slices.items():  # the one run left: the rest of it as it is
            yield pa.Table.from_batches([batch])
            if readers[run] is not None:
                yield from (pa.Table.from_batches([rest]) for rest in readers[run])
    finally:
        for handle in files:
            handle.close()


def _numbered(batch: pa.RecordBatch, run: int, start: int) -> pa.RecordBatch:
    """`batch` with its run and its rows' positions in the run (the merge's last sort keys)."""
    return (batch.append_column(_RUN, pa.array(np.full(batch.num_rows, run, dtype=np.int32)))
            .append_column(_POSITION, pa.array(np.arange(start, start + batch.num_rows))))


def _row_groups(tables: Iterator[pa.Table], group_bytes: int) -> Iterator[pa.Table]:
    """`tables` gathered into tables of about `group_bytes` (one Parquet row group each)."""
    pending, size = [], 0
    for table in tables:
        pending.append(table)
        size += table.nbytes
        if size >= group_bytes:
            yield pa.concat_tables(pending)
            pending, size = [], 0
    if pending:
        yield pa.concat_tables(pending)
