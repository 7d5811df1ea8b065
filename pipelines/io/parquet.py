"""Sinks of the cleaning stage: hive-partitioned sentence Parquet and JSONL errors.

Layout under DIR (contract 4):
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

import io
import json
import math
import uuid
import zlib
from typing import Iterable, Iterator

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from pipelines.io.atomic import write_bytes_atomic

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
    """Write `rows` as one Parquet file at `path` (local or any Beam filesystem), atomically."""
    write_table_atomic(pa.Table.from_pylist(rows, schema=schema), path)


def write_table_atomic(table: pa.Table, path: str) -> None:
    """Write `table` as one Parquet file at `path` (local or any Beam filesystem), atomically."""
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="zstd")
    if "://" not in path:  # a local file: flushed to the disk before the rename (write_bytes_atomic)
        write_bytes_atomic(path, buffer.getvalue())
        return
    directory, name = path.rsplit("/", 1)
    tmp = f"{directory}/.{name}.{uuid.uuid4().hex}.tmp"
    with FileSystems.create(tmp) as handle:
        handle.write(buffer.getvalue())
    if FileSystems.exists(path):
        FileSystems.delete([path])  # a retried bundle: same name, same content
    FileSystems.rename([tmp], [path])


class MissingColumnsError(ValueError):
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


class _CountPerLanguage(beam.CombineFn):
    def create_accumulator(self) -> dict:
        return {}

    def add_input(self, acc: dict, row: tuple) -> dict:
        lang = row[ROW_LANG]
        acc[lang] = acc.get(lang, 0) + 1
        return acc

    def merge_accumulators(self, accs) -> dict:
        total: dict = {}
        for acc in accs:
            for lang, n in acc.items():
                total[lang] = total.get(lang, 0) + n
        return total

    def extract_output(self, acc: dict) -> dict:
        return acc


class _WriteShard(beam.DoFn):
    def __init__(self, sentences_dir: str):
        self.sentences_dir = sentences_dir

    def process(self, keyed: tuple[tuple[str, int, int], Iterable[tuple]]):
        (lang, shard, num_shards), rows = keyed
        rows = sorted(rows)  # ROW_FIELDS tuples compare in sentence order
        path = f"{self.sentences_dir}/lang={lang}/part-{shard:05d}-of-{num_shards:05d}.parquet"
        write_table_atomic(sentence_table(rows), path)
        yield {lang: len(rows)}


class _WriteEmptyDatasetIfNoRows(beam.DoFn):
    def __init__(self, sentences_dir: str):
        self.sentences_dir = sentences_dir

    def process(self, counts_by_lang: dict[str, int]):
        if not counts_by_lang:
            write_parquet_atomic([], f"{self.sentences_dir}/{NO_SENTENCES_FILE}")
            yield {}


class WriteSentenceShards(beam.PTransform):
    """Sentence rows (`ROW_FIELDS` tuples) -> `DIR/sentences/lang=XX/part-*.parquet`; outputs
    {lang: rows} per file written. Rows in a file are sorted in sentence order.

    The number of files per language is ceil(rows / rows_per_file), so a worker holds at most about
    `rows_per_file` rows of one shard in memory. Without any row it writes one empty file,
    `DIR/sentences/no-sentences.parquet`, and outputs `{}` for it.
    """

    def __init__(self, output_dir: str, rows_per_file: int = DEFAULT_ROWS_PER_FILE):
        super().__init__()
        self.sentences_dir = output_dir.rstrip("/") + "/sentences"
        self.rows_per_file = rows_per_file

    def expand(self, rows: beam.PCollection[tuple]) -> beam.PCollection[dict[str, int]]:
        rows_per_file = self.rows_per_file
        # One combine (lifted into the producing stage) instead of a Map and a shuffle per row.
        counts = rows | "CountPerLang" >> beam.CombineGlobally(_CountPerLanguage())

        def key_by_shard(row: tuple, counts_by_lang: dict[str, int]):
            lang = row[ROW_LANG]
            num_shards = max(1, math.ceil(counts_by_lang[lang] / rows_per_file))
            return (lang, shard_of(row, num_shards), num_shards), row

        shards = (
            rows
            | "KeyByShard" >> beam.Map(key_by_shard, counts_by_lang=beam.pvalue.AsSingleton(counts))
            | "GroupShard" >> beam.GroupByKey()
            | "WriteShard" >> beam.ParDo(_WriteShard(self.sentences_dir))
        )
        # Part of the output, so whatever waits on it (stats.json) also waits for the empty file.
        empty = counts | "WriteEmptyIfNoRows" >> beam.ParDo(_WriteEmptyDatasetIfNoRows(self.sentences_dir))
        return (shards, empty) | "AllWritten" >> beam.Flatten()


class WriteErrors(beam.PTransform):
    """Error dicts (file, offset, reason, detail, ...) -> `DIR/errors/errors-*.jsonl`; outputs file names."""

    def __init__(self, output_dir: str):
        super().__init__()
        self.prefix = output_dir.rstrip("/") + "/errors/errors"

    def expand(self, errors: beam.PCollection[dict]) -> beam.PCollection[str]:
        return (
            errors
            | "ToJson" >> beam.Map(lambda e: json.dumps(e, ensure_ascii=False, sort_keys=True))
            | "WriteJsonl" >> beam.io.WriteToText(self.prefix, file_name_suffix=".jsonl")
        )
