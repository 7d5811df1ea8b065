"""Parquet without Beam: the sentence schema and layout, atomic writes (local or object store), reading
with required columns. The Beam sinks are `pipelines.stage.WriteParquetShards` (mine, score) and
labse-clean's `WriteSentenceShards` / `WriteErrors` (`pipelines.clean.transforms`).

labse-clean's layout under DIR (contract 4):
    sentences/lang=XX/part-SSSSS-of-NNNNN.parquet   readable with
        pyarrow.dataset.dataset(DIR + "/sentences", partitioning="hive")
    sentences/no-sentences.parquet                  only when the run kept no sentence: 0 rows with
        SENTENCE_SCHEMA, so the documented read still works (an empty directory does not exist on
        object stores, and pyarrow reads one as a dataset without columns)
    errors/errors-SSSSS-of-NNNNN.jsonl              one JSON object per line: file, offset, reason, detail

Each Parquet shard is written to a hidden temporary name in its final directory, then renamed
(`os.rename` locally; on GCS the object appears only when the upload completes), so readers never
see a half-written file and a retried bundle rewrites the same deterministic name.
"""
from __future__ import annotations

import functools
import io
import zlib
from typing import Iterable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.io.atomic import write_bytes_atomic
from pipelines.io.config_options import UsageError

SENTENCE_SCHEMA = pa.schema(
    [
        ("text", pa.string()),
        ("lang", pa.string()),
        ("lang_score", pa.float32()),
        ("source", pa.string()),
        ("url", pa.string()),
        ("doc_id", pa.string()),
        ("position", pa.int32()),
        ("main_content_score", pa.float32()),
        ("file", pa.string()),
        ("offset", pa.int64()),
    ]
)
SENTENCE_COLUMNS = tuple(SENTENCE_SCHEMA.names)
# Between its steps the cleaning stage moves a sentence as a plain tuple of these fields (compact
# to encode, no per-row dict): the first four are the sentence order, so tuples compare in it.
ROW_FIELDS = ("file", "offset", "doc_id", "position", "text", "lang", "lang_score", "source", "url",
              "main_content_score")
ROW_TEXT, ROW_LANG = ROW_FIELDS.index("text"), ROW_FIELDS.index("lang")
_ROW_INDEX = tuple(ROW_FIELDS.index(name) for name in SENTENCE_COLUMNS)
DEFAULT_ROWS_PER_FILE = 200_000
NO_SENTENCES_FILE = "no-sentences.parquet"


@functools.cache
def c_library():
    """The running process's C functions (ctypes: the C library's among them), or None."""
    import ctypes

    try:
        return ctypes.CDLL(None)
    except (OSError, TypeError):
        return None


def release_freed_memory() -> None:
    """Give back to the system the memory that Arrow's default pool and the C library's heap hold freed.

    pyarrow's wheels allocate from mimalloc, which keeps freed pages for reuse: a worker that built
    and wrote an output file's columns (tens of MB) kept them after the file was written, which
    added to every later step's peak (~40 MB at a 113,783-row file of pair rows, measured). glibc
    keeps the small blocks (under 128 KiB: Python's larger objects, small numpy arrays) freed in its
    heap until `malloc_trim`: the steps before a mining job's writer left ~10 MB there at 200,000
    sentences a side (BENCHMARKS.md, "What a mining worker kept between its steps"). Call it
    after a batch or file of Arrow work, not per row."""
    pa.default_memory_pool().release_unused()
    trim = getattr(c_library(), "malloc_trim", None)  # glibc's; absent elsewhere
    if trim is not None:
        trim(0)


def sentence_order(row: dict) -> tuple:
    """The deterministic order of sentences: input file, record offset, document id, position.

    The document id breaks ties between records of a file compressed as one gzip member, which
    share their offset.
    """
    return (row["file"], row["offset"], row["doc_id"], row["position"])


def row_dict(row: tuple) -> dict:
    """A `ROW_FIELDS` tuple as a dict of the Parquet columns (`SENTENCE_COLUMNS`)."""
    return {name: row[i] for name, i in zip(SENTENCE_COLUMNS, _ROW_INDEX)}


def sentence_table(rows: list[tuple]) -> pa.Table:
    """`ROW_FIELDS` tuples as a table of SENTENCE_SCHEMA, built column by column."""
    if not rows:
        return SENTENCE_SCHEMA.empty_table()
    columns = list(zip(*rows))
    return pa.Table.from_arrays([pa.array(columns[i], type=field.type) for field, i in zip(SENTENCE_SCHEMA, _ROW_INDEX)],
                                schema=SENTENCE_SCHEMA)


def write_parquet_atomic(rows: list[dict], path: str, schema: pa.Schema = SENTENCE_SCHEMA) -> None:
    """Write `rows` as one Parquet file at `path` (local or object store), atomically."""
    write_table_atomic(pa.Table.from_pylist(rows, schema=schema), path)


def write_table_atomic(table: pa.Table, path: str) -> None:
    """Write `table` as one Parquet file at `path` (local or object store), atomically: locally a
    temporary file renamed into place, on an object store one upload (visible only when complete)."""
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="zstd")
    write_bytes_atomic(path, buffer.getvalue())


class MissingColumnsError(UsageError):
    """A Parquet file lacks a column the reader needs."""


def iter_parquet_rows(handle, path: str, required: Iterable[str], optional: Iterable[str] = (),
                      batch_size: int = 4096) -> Iterator[dict]:
    """Rows of one Parquet file as dicts of `required` and the `optional` columns it has, a batch
    at a time (a 200,000-row shard is never held as Python objects at once). `handle`: a seekable
    binary file (Beam's FileSystems.open / ReadableFile.open). Raises MissingColumnsError naming
    `path` when a required column is missing."""
    parquet = pq.ParquetFile(handle)
    names = set(parquet.schema_arrow.names)
    required = list(required)
    missing = [c for c in required if c not in names]
    if missing:
        raise MissingColumnsError(f"{path}: Parquet file without the column(s) {missing} (has {sorted(names)})")
    columns = required + [c for c in optional if c in names]
    for batch in parquet.iter_batches(batch_size=batch_size, columns=columns):
        yield from batch.to_pylist()


def shard_of(row: tuple, num_shards: int) -> int:
    # crc32 of the text, not Python's hash(): stable across processes and runs.
    return zlib.crc32(row[ROW_TEXT].encode("utf-8")) % num_shards if num_shards > 1 else 0


