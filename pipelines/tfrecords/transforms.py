"""labse-tfrecords' Beam transforms: read pairs, encode them in batches, write the shards.

    with beam.Pipeline() as pipeline:
        pipeline | BuildTFRecords("vocab.txt", "shards/", TFRecordsConfig(num_shards=16),
                                  parquet_files=["scored/part-00000.parquet"])

The per-pair logic they run is in `pipelines.tfrecords.encode` (no Beam); the CLI that checks the
inputs and holds the output (`labse-tfrecords`) is `pipelines.tfrecords.cli`.
"""
from __future__ import annotations

import itertools
import logging
import os
import tempfile
from array import array
from collections import Counter
from dataclasses import asdict, replace
from typing import Callable, Iterator, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from pipelines.accounting import TALLY, CountByName, MergeTallies, ReasonCounters, accounting_section
from pipelines.io.atomic import write_bytes_atomic, write_json_atomic
from pipelines.progress import worker_tracker
from pipelines.io.parquet import MissingColumnsError, iter_parquet_rows
from pipelines.io.completion import mark_complete, write_stats_json
from pipelines.io.parallel_text import ParallelTextSpec
from pipelines.io.tfrecord import TFRecordWriter, encode_index, frame_record, index_path
from pipelines.tfrecords.config import TFRecordsConfig, shards_for
from pipelines.tfrecords.encode import (
    build_manifests,
    encode_pair,
    load_tfte_tokenizer,
    normalise_pair,
    passes_min_score,
    shard_name,
    tokenize_texts,
    vocab_facts,
)

logger = logging.getLogger(__name__)

COUNTER_NAMESPACE = "tfrecords"  # Beam counters: one namespace per stage, its name

# stats.json's accounting units (pipelines.accounting, README contract 11):
#   pairs: read (Parquet rows, and parallel-text line positions) -> kept (written to a shard),
#       dropped by reason (missing_text, empty_text, bad_score, below_min_score, score_missing,
#       no_word_pieces, unaligned_line, duplicate_pair) or errored (tokenizer_error);
#   parquet_files: the --pairs files -> kept (read through) or errored (parquet_unreadable,
#       parquet_without_src_tgt); rows read before a file turned out damaged are pairs read.
PAIRS, FILES = "pairs", "parquet_files"
UNITS = (PAIRS, FILES)
FILE_REASONS = ("parquet_unreadable", "parquet_without_src_tgt")
ERROR_REASONS = ("tokenizer_error",)


def drop_key(reason: str) -> str | None:
    """The tally key of a pair's drop reason; None for a file's (the reader's tally counts those)."""
    if reason in FILE_REASONS:
        return None
    return f"{PAIRS}.{'errored' if reason in ERROR_REASONS else 'dropped'}.{reason}"


def vocab_fingerprint(vocab_path: str) -> dict:
    """File name, sha256, size and special-token ids of a vocab.txt (recorded in schema.json),
    read through Beam's FileSystems (local or gs://)."""
    with FileSystems.open(vocab_path, compression_type="uncompressed") as f:
        raw = f.read()
    return vocab_facts(raw, vocab_path)


def load_tokenizer(vocab_path: str):
    """`load_tfte_tokenizer` for a vocab.txt anywhere: one on an object store (gs://) is read
    through Beam's FileSystems into a temporary local copy (the tokenizer reads its file once,
    while it is built), so Dataflow workers load it from the path the job names."""
    if "://" not in vocab_path:
        return load_tfte_tokenizer(vocab_path)
    with FileSystems.open(vocab_path, compression_type="uncompressed") as remote:
        content = remote.read()
    with tempfile.TemporaryDirectory(prefix="labse-vocab-") as local:
        local_path = os.path.join(local, "vocab.txt")
        with open(local_path, "wb") as handle:
            handle.write(content)
        return load_tfte_tokenizer(local_path)


# ---------------------------------------------------------------------------------------------
# Beam building blocks

_COUNTERS = ReasonCounters(COUNTER_NAMESPACE)  # one Beam counter object per reason and process


def _count(reason: str, value: int = 1) -> None:
    _COUNTERS.inc(reason, value)
    if reason == "input_pairs":
        worker_tracker("pairs").advance(value)


class _ReadParquetPairs(beam.DoFn):
    """One Parquet file -> pair dicts, in record batches; unreadable files are counted, not fatal.

    Outputs per file a tally (`tally`): its rows (`pairs.read`) and its outcome
    (`parquet_files.kept`, or `parquet_files.errored.<reason>` plus the reason on `dropped`)."""

    def process(self, path: str):
        from pipelines.read.readers import local_file_problem

        rows = 0
        try:
            problem = local_file_problem(path)
            if problem is not None:  # a named pipe would block the open forever
                raise OSError(problem[1])
            with FileSystems.open(path, compression_type="uncompressed") as f:
                for row in iter_parquet_rows(f, path, ("src", "tgt"), ("src_lang", "tgt_lang", "score")):
                    _count("input_pairs")
                    rows += 1
                    yield row
        except MissingColumnsError as exc:
            _count("parquet_without_src_tgt")
            logger.warning("%s; skipped", exc)
            outcome = "parquet_without_src_tgt"
        except Exception as exc:  # corrupt footer, truncated file, permission ...
            _count("parquet_unreadable")
            logger.error("%s: unreadable Parquet file (%s); skipped", path, exc)
            outcome = "parquet_unreadable"
        else:
            outcome = None
        tally = {f"{PAIRS}.read": rows, f"{FILES}.kept" if outcome is None else f"{FILES}.errored.{outcome}": 1}
        yield beam.pvalue.TaggedOutput(TALLY, tally)
        if outcome is not None:
            yield beam.pvalue.TaggedOutput("dropped", outcome)


class ReadParquetPairs(beam.PTransform):
    """Parquet files (a list of paths) -> dict rows with src/tgt[/src_lang/tgt_lang/score]; drops
    tagged 'dropped'; tallies (`pairs.read`, `parquet_files.*`) tagged 'tally'."""

    def __init__(self, paths: Sequence[str]):
        super().__init__()
        self.paths = list(paths)

    def expand(self, pbegin: beam.pvalue.PBegin) -> dict[str, beam.PCollection]:
        files = pbegin | "Files" >> beam.Create(self.paths)
        read = files | "Read" >> beam.ParDo(_ReadParquetPairs()).with_outputs("dropped", TALLY, main="pairs")
        matched = files | "CountFiles" >> CountByName(lambda _path: f"{FILES}.read")
        tally = (matched, read[TALLY]) | "ReaderTally" >> MergeTallies()
        return {"pairs": read.pairs, "dropped": read.dropped, TALLY: tally}


class _ReadParallelText(beam.DoFn):
    """Two line-aligned files -> pair dicts; a line one side has more of is `unaligned_line` on
    `dropped`; a tally (`tally`) of the line positions read (`pairs.read`)."""

    def process(self, spec: ParallelTextSpec):
        unaligned = positions = 0
        # Line by line from both files at once: a parallel corpus can be larger than memory.
        with FileSystems.open(spec.src_path) as fs, FileSystems.open(spec.tgt_path) as ft:
            for src, tgt in itertools.zip_longest(_text_lines(fs), _text_lines(ft)):
                positions += 1
                if src is None or tgt is None:
                    unaligned += 1
                    _count("unaligned_line")
                    yield beam.pvalue.TaggedOutput("dropped", "unaligned_line")
                    continue
                _count("input_pairs")
                yield {"src": src, "tgt": tgt, "src_lang": spec.src_lang, "tgt_lang": spec.tgt_lang, "score": 1.0}
        if unaligned:
            logger.warning("%s and %s differ by %d lines: the extra lines are dropped",
                           spec.src_path, spec.tgt_path, unaligned)
        yield beam.pvalue.TaggedOutput(TALLY, {f"{PAIRS}.read": positions})


def _text_lines(handle) -> Iterator[str]:
    """The lines of a UTF-8 text file, without their line ends (undecodable bytes replaced)."""
    for raw in iter(handle.readline, b""):
        yield raw.decode("utf-8", "replace").rstrip("\r\n")


class ReadParallelText(beam.PTransform):
    """Line-aligned text files (gzip or plain) -> pair dicts with score 1.0; extra lines tagged
    'dropped'; a tally per pair of files (`pairs.read`) tagged 'tally'."""

    def __init__(self, specs: Sequence[ParallelTextSpec]):
        super().__init__()
        self.specs = list(specs)

    def expand(self, pbegin: beam.pvalue.PBegin) -> dict[str, beam.PCollection]:
        read = (
            pbegin
            | "Specs" >> beam.Create(self.specs)
            | "Read" >> beam.ParDo(_ReadParallelText()).with_outputs("dropped", TALLY, main="pairs")
        )
        return {"pairs": read.pairs, "dropped": read.dropped, TALLY: read[TALLY]}


class _EncodePairs(beam.DoFn):
    """Batches of normalised pairs -> (shard, (key, serialized Example, facts)); drops tagged 'dropped'."""

    def __init__(self, vocab_path: str, special_ids: dict[str, int], config: TFRecordsConfig,
                 tokenizer_factory: Callable[[str], object]):
        self.vocab_path = vocab_path
        self.cls_id, self.sep_id = special_ids["[CLS]"], special_ids["[SEP]"]
        self.config = config
        self.tokenizer_factory = tokenizer_factory

    def setup(self):
        self.tokenizer = self.tokenizer_factory(self.vocab_path)

    def process(self, batch: list[dict]):
        src_pieces = tokenize_texts(self.tokenizer, [p["src"] for p in batch])
        tgt_pieces = tokenize_texts(self.tokenizer, [p["tgt"] for p in batch])
        for pair, src, tgt in zip(batch, src_pieces, tgt_pieces):
            encoded = encode_pair(pair, src, tgt, self.cls_id, self.sep_id, self.config)
            if isinstance(encoded, str):  # the drop reason
                _count(encoded)
                yield beam.pvalue.TaggedOutput("dropped", encoded)
                continue
            yield encoded


def _keep_or_drop(row: dict, min_score: float | None, default_score: float):
    pair = normalise_pair(row, default_score)
    reason = pair if isinstance(pair, str) else passes_min_score(pair["score"], min_score)
    if reason is not None:
        _count(reason)
        yield beam.pvalue.TaggedOutput("dropped", reason)
    else:
        yield pair


class _WriteShard(beam.DoFn):
    """All records of one shard -> one TFRecord file, sorted by key (the shuffle), duplicates dropped."""

    def __init__(self, output_dir: str, num_shards: int):
        self.output_dir = output_dir
        self.num_shards = num_shards

    def process(self, element):
        shard, records = element
        path = FileSystems.join(self.output_dir, shard_name(shard, self.num_shards))
        langs: Counter = Counter()
        src_tokens = tgt_tokens = src_cut = tgt_cut = duplicates = written = 0
        previous_key = None
        writer = _open_shard_writer(path)
        try:
            for key, data, (lang_pair, src_len, tgt_len, s_cut, t_cut) in sorted(records, key=lambda r: (r[0], r[1])):
                if key == previous_key:
                    duplicates += 1
                    _count("duplicate_pair")
                    continue
                previous_key = key
                writer.write(data)
                written += 1
                langs[lang_pair] += 1
                src_tokens += src_len
                tgt_tokens += tgt_len
                src_cut += s_cut
                tgt_cut += t_cut
            writer.close()
        except BaseException:
            writer.abort()
            raise
        _count("written_pairs", written)
        yield {
            "file": shard_name(shard, self.num_shards),
            "index": index_path(shard_name(shard, self.num_shards)),
            "num_records": written,
            "num_bytes": writer.num_bytes,
            "language_pairs": dict(langs),
            "src_tokens": src_tokens,
            "tgt_tokens": tgt_tokens,
            "truncated_src": src_cut,
            "truncated_tgt": tgt_cut,
            "duplicate_pair": duplicates,
        }


class _RemoteShardWriter:
    """Shard writer for object stores (gs://, s3://), whose objects appear atomically on close."""

    def __init__(self, path: str):
        self._frame = frame_record
        self._path = path
        self._file = FileSystems.create(path)
        self._offsets = array("Q")
        self.num_bytes = 0

    def write(self, data: bytes) -> None:
        framed = self._frame(data)
        self._file.write(framed)
        self._offsets.append(self.num_bytes)
        self.num_bytes += len(framed)

    def close(self) -> None:
        # The index first: a reader that finds the shard finds its index too.
        write_bytes_atomic(index_path(self._path), encode_index(self._offsets))
        self._file.close()

    def abort(self) -> None:
        """Remove the partial shard: closing an upload publishes the object, so delete it afterwards."""
        try:
            self._file.close()
        except Exception as exc:  # the upload may already be broken; the error that made us abort matters more
            logger.warning("%s: closing the partial shard failed (%s)", self._path, exc)
        try:
            FileSystems.delete([self._path])
        except Exception as exc:  # never mask the original error with a clean-up failure
            logger.error("%s: partial shard not deleted (%s)", self._path, exc)


def _open_shard_writer(path: str):
    return _RemoteShardWriter(path) if "://" in path else TFRecordWriter(path)


READ_BY_INPUT = "read_by_input"  # tally keys of the pairs each kind of input gave (after its reader's drops)


class _CountAs(beam.PTransform):
    """The number of elements, as a one-key tally `{key: n}` (0 for none)."""

    def __init__(self, key: str):
        super().__init__()
        self.key = key

    def expand(self, pcoll):
        key = self.key
        return pcoll | beam.combiners.Count.Globally() | beam.Map(lambda n: {key: n})


class _WriteManifests(beam.DoFn):
    def __init__(self, output_dir: str, config: TFRecordsConfig, vocab: dict, inputs: dict):
        self.output_dir = output_dir
        self.config = config
        self.vocab = vocab
        self.inputs = inputs

    def process(self, _, shards: list[dict], drops: dict[str, int], input_pairs: int, tally: dict):
        # the pairs kept are the records the shards hold; duplicates are dropped where they are written
        tally = dict(tally)
        tally[f"{PAIRS}.kept"] = sum(s["num_records"] for s in shards)
        tally[f"{PAIRS}.dropped.duplicate_pair"] = sum(s["duplicate_pair"] for s in shards)
        schema, stats = build_manifests(shards, drops, config=self.config, vocab=self.vocab,
                                        inputs=self.inputs, input_pairs=input_pairs,
                                        accounting=accounting_section(tally, UNITS))
        prefix = f"{READ_BY_INPUT}."
        stats[READ_BY_INPUT] = {key[len(prefix):]: n for key, n in sorted(tally.items()) if key.startswith(prefix)}
        write_json_atomic(FileSystems.join(self.output_dir, "schema.json"), schema)
        write_stats_json(FileSystems.join(self.output_dir, "stats.json"), stats)
        mark_complete(self.output_dir, stats, stage="labse-tfrecords")  # the last write of the stage
        yield stats


class PairsToTFRecords(beam.PTransform):
    """Pair dicts (+ a PCollection of drop reasons from the readers) -> shards, schema.json, stats.json.

    Filters (`normalise_pair`, `--min-score`), tokenises in batches (the tokenizer loads once per
    worker), encodes each pair as a `tf.train.Example`, groups by shard and writes every shard
    sorted by its shuffle key, duplicates dropped; then schema.json, stats.json and `_SUCCESS`.

    Args:
        vocab_path: the vocab.txt to tokenise with (local or gs://); read and hashed once, here,
            when the transform is built, so a bad vocabulary fails before the pipeline runs.
        output_dir: the shards' directory; the caller locks and prepares it
            (`pipelines.io.completion`), as `labse-tfrecords` does.
        config: `TFRecordsConfig` (max_seq_length, num_shards, min_score, include_text, seed,
            tokenize_batch_size).
        inputs: what the stage read, recorded in stats.json.
        tokenizer_factory: `vocab_path -> object with tokenize_ids(list[str])`; the project
            tokenizer by default (tests pass a light one).
        default_score: the score of a pair whose row has none.

    Input: `(pairs, reader_drops)` or `(pairs, reader_drops, reader_tally)`: dicts with `src`,
    `tgt` and optionally `src_lang`, `tgt_lang`, `score`; the drop reasons (strings) of the
    readers, counted into stats.json; and the readers' tallies (`pairs.read`, `parquet_files.*`;
    without them every input pair counts as read). Returns a PCollection holding the single stats
    dict once everything is written.

    Example::

        config = TFRecordsConfig(num_shards=4, max_seq_length=64)
        with beam.Pipeline() as p:
            pairs = p | "Pairs" >> beam.Create([{"src": "Ein Hund.", "tgt": "A dog.", "src_lang": "de",
                                                 "tgt_lang": "en", "score": 0.9}])
            no_drops = p | "NoDrops" >> beam.Create([])
            (pairs, no_drops) | PairsToTFRecords("vocab.txt", "out/shards", config)
    """

    def __init__(self, vocab_path: str, output_dir: str, config: TFRecordsConfig = TFRecordsConfig(),
                 *, inputs: dict | None = None, tokenizer_factory: Callable[[str], object] = load_tokenizer,
                 default_score: float = float("nan")):
        super().__init__()
        self.vocab_path = vocab_path
        self.vocab = vocab_fingerprint(vocab_path)
        self.output_dir = output_dir
        if config.num_shards is None:
            raise ValueError("PairsToTFRecords needs config.num_shards (BuildTFRecords derives it from its inputs)")
        self.config = config
        self.inputs = inputs or {}
        self.tokenizer_factory = tokenizer_factory
        self.default_score = default_score

    def expand(self, inputs: tuple) -> beam.PCollection:
        pairs, reader_drops, *reader_tally = inputs
        cfg = self.config
        kept = pairs | "Filter" >> beam.FlatMap(_keep_or_drop, cfg.min_score, self.default_score).with_outputs(
            "dropped", main="kept")
        encode = _EncodePairs(self.vocab_path, self.vocab["special_ids"], cfg, self.tokenizer_factory)
        encoded = (
            kept.kept
            | "Spread" >> beam.Reshuffle()
            | "Batch" >> beam.BatchElements(min_batch_size=16, max_batch_size=cfg.tokenize_batch_size)
            | "Encode" >> beam.ParDo(encode).with_outputs("dropped", main="records")
        )
        shard_stats = (
            encoded.records
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShards" >> beam.ParDo(_WriteShard(self.output_dir, cfg.num_shards))
            | "ShardList" >> beam.combiners.ToList()
        )
        all_drops = (reader_drops, kept.dropped, encoded.dropped) | "AllDrops" >> beam.Flatten()
        drops = (
            all_drops
            | "CountDrops" >> beam.combiners.Count.PerElement()
            | "DropDict" >> beam.combiners.ToDict()
        )
        input_pairs = pairs | "CountInputs" >> beam.combiners.Count.Globally()
        if not reader_tally:  # pairs made by the caller: each one, and each reader drop of a pair, is a pair read
            reader_tally = [pairs | "CountRead" >> CountByName(lambda _pair: f"{PAIRS}.read"),
                            reader_drops | "CountDroppedRead" >> CountByName(
                                lambda reason: None if reason in FILE_REASONS else f"{PAIRS}.read")]
        tally = (
            (*reader_tally, all_drops | "DropTally" >> CountByName(drop_key))
            | "Tally" >> MergeTallies()
        )
        return (
            pairs.pipeline
            | "Once" >> beam.Create([None])
            | "Manifests" >> beam.ParDo(
                _WriteManifests(self.output_dir, cfg, self.vocab, self.inputs),
                beam.pvalue.AsSingleton(shard_stats),
                beam.pvalue.AsSingleton(drops),
                beam.pvalue.AsSingleton(input_pairs),
                beam.pvalue.AsSingleton(tally),
            )
        )


def count_input_pairs(parquet_files: Sequence[str], parallel_text: Sequence[ParallelTextSpec]) -> int:
    """Pairs in the inputs, read where they say it: Parquet footers; the source file's lines of each
    parallel text (an upper bound of what is written: drops come later)."""
    from pipelines.mine.cells import parquet_rows, text_lines

    return sum(parquet_rows(p) for p in parquet_files) + sum(text_lines(s.src_path) for s in parallel_text)


class BuildTFRecords(beam.PTransform):
    """Parquet pairs and/or parallel text files -> TFRecord shards with schema and stats (the whole stage).

    Reads with `ReadParquetPairs` and `ReadParallelText` (unreadable files and unaligned lines are
    counted drops, not failures), then runs `PairsToTFRecords`.

    Args:
        vocab_path, output_dir, config, tokenizer_factory: as for `PairsToTFRecords`.
        parquet_files: Parquet files with `src` and `tgt` columns (scored pairs from labse-score);
            `pipelines.tfrecords.cli.find_parquet_files` lists a directory or glob.
        parallel_text: `ParallelTextSpec`s of line-aligned text files (score 1.0).
        At least one of `parquet_files` and `parallel_text` is needed (ValueError).

    Example::

        build = BuildTFRecords("vocab.txt", "out/shards", TFRecordsConfig(num_shards=16),
                               parquet_files=find_parquet_files("scored/"),
                               parallel_text=[ParallelTextSpec.parse("de:train.de.gz,en:train.en.gz")])
        with beam.Pipeline() as p:
            p | build                        # the stats dict, once the shards are written
    """

    def __init__(self, vocab_path: str, output_dir: str, config: TFRecordsConfig = TFRecordsConfig(), *,
                 parquet_files: Sequence[str] = (), parallel_text: Sequence[ParallelTextSpec] = (),
                 tokenizer_factory: Callable[[str], object] = load_tokenizer):
        super().__init__()
        if not parquet_files and not parallel_text:
            raise ValueError("no input: give Parquet pair files and/or parallel text files")
        self.parquet_files = list(parquet_files)
        self.parallel_text = list(parallel_text)
        if config.num_shards is None:
            config = replace(config, num_shards=shards_for(count_input_pairs(self.parquet_files, self.parallel_text)))
        self.config = config
        inputs = {
            "parquet_files": len(self.parquet_files),
            "parallel_text": [asdict(s) for s in self.parallel_text],
        }
        # built here, not in expand(), so that a bad vocabulary fails before the pipeline starts
        self.to_tfrecords = PairsToTFRecords(vocab_path, output_dir, config, inputs=inputs,
                                             tokenizer_factory=tokenizer_factory)

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        pair_sets, drop_sets, tally_sets = [], [], []
        readers = []
        if self.parquet_files:
            readers.append(("ReadParquet", ReadParquetPairs(self.parquet_files), "CountParquetPairs", "--pairs"))
        if self.parallel_text:
            readers.append(("ReadParallelText", ReadParallelText(self.parallel_text), "CountTextPairs", "--parallel-text"))
        for label, reader, count_label, option in readers:
            read = pbegin | label >> reader
            pair_sets.append(read["pairs"])
            drop_sets.append(read["dropped"])
            tally_sets.append(read[TALLY])
            tally_sets.append(read["pairs"] | count_label >> _CountAs(f"{READ_BY_INPUT}.{option}"))
        pairs = tuple(pair_sets) | "AllPairs" >> beam.Flatten()
        drops = tuple(drop_sets) | "ReaderDrops" >> beam.Flatten()
        tally = tuple(tally_sets) | "ReaderTallies" >> MergeTallies()
        return (pairs, drops, tally) | "PairsToTFRecords" >> self.to_tfrecords
