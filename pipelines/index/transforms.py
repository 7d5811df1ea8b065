"""The Beam pieces of labse-index: train once on a sample, fill every shard in parallel, write the
manifest and `_SUCCESS` last (layout in `pipelines.index.shards`).

Accounting (`_stats.json`, README contract 11): `vectors`: rows read -> kept (added to a shard) or
dropped (`not_finite`, `zero_vector`: no direction to search by; `duplicate`: the same sentence
again within a shard, the first row kept).
"""
from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Sequence

import apache_beam as beam
import numpy as np

from pipelines.accounting import MergeTallies, accounting_section
from pipelines.index.config import IndexConfig
from pipelines.embed.saved_vectors import key_hash
from pipelines.index.shards import (RERANK_SUFFIX, SOURCE_IDS_SUFFIX, SOURCE_ROW_BITS, TRAINED, IndexManifest,
                                    SeenKeys, ShardPlan, faiss_threads, from_bytes, sample_ranges, to_bytes,
                                    usable_rows)
from pipelines.index.training import train_bounded
from pipelines.index.vector_files import MatrixFile, source_identity
from pipelines.io import storage
from pipelines.io.atomic import write_bytes_atomic
from pipelines.io.completion import finish_output

logger = logging.getLogger(__name__)
COUNTER_NAMESPACE = "index"
UNITS = ("vectors",)
ADD_CHUNK = 16_384  # rows read and added at a time (16 MB of float32 at 256 dimensions; a worker's
# memory should not grow with its shard, and FAISS adds as fast in chunks of this size)


def _train(_, files: Sequence[MatrixFile], factory: str, sample_size: int, config: IndexConfig, output: str):
    """Train on a uniform sample holding at most `config.train_memory_rows` vectors at once
    (`pipelines.index.training`), write `trained.faiss`; yields its path."""
    memory_rows = min(sample_size, config.train_memory_rows)
    held = sample_ranges(files, memory_rows, config.seed)
    stream = sample_ranges(files, sample_size, config.seed + 1) if sample_size > memory_rows else []
    logger.info("training %s on %d vectors, %d at a time", factory, max(sample_size, memory_rows), memory_rows)
    index = train_bounded(lambda number, start, stop: files[number].read_rows(start, stop), held, stream,
                          files[0].dim, factory, config.train_memory_rows, config.seed, config.train_threads,
                          unit=lambda rows: usable_rows(rows)[0])
    path = f"{output}/{TRAINED}"
    write_bytes_atomic(path, to_bytes(index))
    yield path


class _FillShard(beam.DoFn):
    """One shard plan -> `shard-*.faiss` + `shard-*.txt` written; yields its tally and entry."""

    def __init__(self, files: Sequence[MatrixFile], output: str):
        self.files, self.output = list(files), output
        self._trained: bytes | None = None

    def process(self, plan: ShardPlan, trained_path: str):
        import tempfile

        if self._trained is None:
            self._trained = storage.read_bytes(trained_path)
        index = from_bytes(self._trained)
        # One thread: the runner runs one bundle per core, and FAISS threads would fight them.
        with tempfile.TemporaryFile() as rows_file, tempfile.TemporaryFile() as texts_file, \
                tempfile.TemporaryFile() as ids_file, faiss_threads(1):
            filled = self._fill(plan, index, rows_file, texts_file, ids_file)
        yield filled

    def _fill(self, plan: ShardPlan, index, rows_file, texts_file, ids_file) -> dict:
        """Add the shard's rows; its unit rows go to `rows_file` as float16 (for exact re-ranking at
        search time), its sentences to `texts_file` and their (file number, row) to `ids_file` on the
        way, and repeats are found by 64-bit hash (`SeenKeys`), so the worker holds one chunk and 8
        bytes a sentence of the shard."""
        seen, kept = SeenKeys(), 0
        tally = {"vectors.read": 0}
        for number, start, stop in plan.ranges:
            chunks = self.files[number].iter_chunks(start, stop, ADD_CHUNK)
            for first, (vectors, lines) in zip(range(start, stop, ADD_CHUNK), chunks):
                unit, not_finite, zero = usable_rows(vectors)
                usable = len(lines) - int(not_finite.sum()) - int(zero.sum())
                rows = first + np.flatnonzero(~(not_finite | zero))
                kept_lines = [line for line, bad in zip(lines, not_finite | zero) if not bad]
                fresh = seen.add_new(np.array([key_hash(line) for line in kept_lines], dtype=np.uint64))
                if len(fresh) < len(kept_lines):
                    unit, rows = unit[fresh], rows[fresh]
                    kept_lines = [kept_lines[row] for row in fresh]
                if len(unit):
                    index.add(unit)
                    rows_file.write(unit.astype("<f2").tobytes())
                    texts_file.write("".join(t + "\n" for t in kept_lines).encode("utf-8"))
                    ids_file.write(((np.int64(number) << SOURCE_ROW_BITS) | rows.astype(np.int64)).astype("<i8").tobytes())
                kept += len(kept_lines)
                tally["vectors.read"] += len(lines)
                for reason, count in (("not_finite", int(not_finite.sum())), ("zero_vector", int(zero.sum())),
                                      ("duplicate", usable - len(fresh))):
                    if count:
                        tally[f"vectors.dropped.{reason}"] = tally.get(f"vectors.dropped.{reason}", 0) + count
        data = to_bytes(index)
        write_from_file(f"{self.output}/{plan.name}.txt", texts_file)
        write_npy_from_raw(f"{self.output}/{plan.name}{RERANK_SUFFIX}", rows_file, kept, index.d)
        write_npy_from_raw(f"{self.output}/{plan.name}{SOURCE_IDS_SUFFIX}", ids_file, kept, None, "<i8")
        write_bytes_atomic(f"{self.output}/{plan.name}.faiss", data)
        tally["vectors.kept"] = kept
        tally["index.bytes"] = len(data)
        return {"tally": tally, "shard": {"name": plan.name, "sentences": kept, "bytes": len(data)}}


def write_npy_from_raw(path: str, raw, rows: int, dim: int | None, descr: str = "<f2") -> None:
    """`path` (local or gs://) as a .npy of `rows` x `dim` (`rows` where `dim` is None) of `descr`
    (float16 by default) whose data are the bytes of the open file `raw`, copied through in chunks
    (never the whole matrix in memory)."""
    import io

    header = io.BytesIO()
    shape = (rows,) if dim is None else (rows, dim)
    np.lib.format.write_array_header_1_0(header, {"descr": descr, "fortran_order": False, "shape": shape})
    write_from_file(path, raw, header.getvalue())


def write_from_file(path: str, raw, header: bytes = b"", chunk: int = 1 << 24) -> None:
    """`path` (local: atomically; or gs://) = `header` + the bytes of the open file `raw`, copied
    through in chunks."""
    from pipelines.io.atomic import atomic_path

    raw.seek(0)

    def copy(handle):
        handle.write(header)
        while block := raw.read(chunk):
            handle.write(block)

    if "://" in path:
        from apache_beam.io.filesystems import FileSystems

        with FileSystems.create(path) as handle:
            copy(handle)
        return
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        copy(handle)


def _finish(_, shards: list[dict], tally: dict, trained_path: str, manifest: dict, config: IndexConfig,
            output: str):
    """The manifest, `_stats.json` and `_SUCCESS` (last). bytes_per_sentence is what the added
    sentences cost (shard bytes less the trained index each shard repeats), measured."""
    entries = sorted((s["shard"] for s in shards), key=lambda s: s["name"])
    sentences = sum(s["sentences"] for s in entries)
    shared = len(storage.read_bytes(trained_path))
    added = sum(s["bytes"] - shared for s in entries)
    manifest = dict(manifest, shards=entries, shared_bytes_per_shard=shared, rerank_vectors=True, source_ids=True,
                    bytes_per_sentence=round(added / sentences, 2) if sentences else 0.0)
    stats = {**accounting_section(tally, UNITS), "counts": dict(sorted(tally.items())),
             "index": IndexManifest.from_dict(manifest).as_dict(), "config": asdict(config)}
    finish_output(output, stats, stage="labse-index", shards_in_root=True)
    yield stats


class BuildIndex(beam.PTransform):
    """PBegin -> one stats dict, after `trained.faiss`, every shard and `_SUCCESS` are written.

    `files` and `plans` come from the launcher (`list_matrix_files`, `plan_shards`): a few numbers
    a shard, no vectors, go into the job graph."""

    def __init__(self, files: Sequence[MatrixFile], plans: Sequence[ShardPlan], factory: str, sample_size: int,
                 config: IndexConfig, output: str):
        super().__init__()
        self.files, self.plans, self.factory, self.sample_size = list(files), list(plans), factory, sample_size
        self.config, self.output = config, output.rstrip("/")

    def expand(self, pbegin):
        files, output, config = self.files, self.output, self.config
        trained = (pbegin
                   | "Once" >> beam.Create([None])
                   | "Train" >> beam.FlatMap(_train, files, self.factory, self.sample_size, config, output))
        filled = (pbegin
                  | "Plans" >> beam.Create(self.plans)
                  | "Spread" >> beam.Reshuffle()
                  | "Fill" >> beam.ParDo(_FillShard(files, output), beam.pvalue.AsSingleton(trained)))
        tally = (filled | "Tallies" >> beam.Map(lambda f: f["tally"]),) | "Total" >> MergeTallies()
        manifest = {"lang": config.lang, "factory": self.factory, "dim": files[0].dim, "nprobe": config.nprobe,
                    "trained_on": self.sample_size, "source_files": [source_identity(f) for f in files]}
        return (pbegin
                | "Finish" >> beam.Create([None])
                | "Stats" >> beam.FlatMap(_finish, beam.pvalue.AsList(filled), beam.pvalue.AsSingleton(tally),
                                          beam.pvalue.AsSingleton(trained), manifest, config, output))
