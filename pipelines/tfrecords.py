"""labse-tfrecords: translation pairs -> globally shuffled `tf.train.Example` shards (contract 8).

    labse-tfrecords --pairs SCORED_DIR --vocab vocab.txt --output SHARDS_DIR \\
        [--parallel-text de:train.de.gz,en:train.en.gz ...] [--max-seq-length 64] [--num-shards 16] \\
        [--min-score S] [--include-text] [--seed 0] [--overwrite] [Beam options]

Inputs: scored pairs Parquet (`src, tgt, src_lang, tgt_lang, score, ...`; any Parquet with `src`
and `tgt` columns is accepted, missing languages become "und" and a missing score NaN) and/or
line-aligned plain-text files (a human-translated corpus such as Multi30k; score 1.0).

Each pair is tokenised with `vocab.tokenizer.TFTextTokenizer` (loaded once per worker), wrapped as
`[CLS] ... [SEP]`, truncated to `--max-seq-length` (keeping `[SEP]`), and assigned a 64-bit key
hashed from (seed, languages, texts).  The key picks the shard and orders records inside it, so the
shuffle is global across shards, reproducible for a seed, and independent of the runner's bundling.
Identical pairs get the same key and are written once (duplicates are in-batch false negatives for
the ranking loss).  Every dropped pair is counted by reason in `stats.json` and Beam counters.

Outputs in SHARDS_DIR: `pairs-SSSSS-of-NNNNN.tfrecord` (uncompressed, written atomically),
`schema.json` (features, dtypes, version, vocabulary checksum, max_seq_length, shard list),
`stats.json` and last `_SUCCESS` (`pipelines.io.stage_output`).  The trainer reads them without
TensorFlow (`labse_model.data`).  `--pairs` Parquet must lie in complete stage outputs (`_SUCCESS`);
the output is locked while the stage runs and refused if it holds anything, unless `--overwrite`.
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import itertools
import json
import logging
import math
import os
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Callable, Iterator, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.io.tfrecord import TFRecordWriter, encode_example
from pipelines.accounting import ReasonCounters
from pipelines.io.atomic import write_json_atomic
from pipelines.io.parquet import MissingColumnsError, iter_parquet_rows
from pipelines.io.stage_output import (
    IncompleteOutputError,
    OutputExistsError,
    OutputLockedError,
    mark_complete,
    output_lock,
    prepare_output,
    read_completion,
    usage_error,
    write_stats_json,
)

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
SHARD_PREFIX = "pairs"
COUNTER_NAMESPACE = "labse-tfrecords"
UNKNOWN_LANG = "und"

FEATURES_DOC = {
    "src_ids": {"dtype": "int64", "shape": "[n], 2 <= n <= max_seq_length",
                "description": "word-piece ids of the source sentence: [CLS] first, [SEP] last"},
    "tgt_ids": {"dtype": "int64", "shape": "[n], 2 <= n <= max_seq_length",
                "description": "word-piece ids of the target sentence: [CLS] first, [SEP] last"},
    "src_lang": {"dtype": "bytes", "shape": "[1]", "description": "lid.176 language code of the source (utf-8), 'und' if unknown"},
    "tgt_lang": {"dtype": "bytes", "shape": "[1]", "description": "lid.176 language code of the target (utf-8), 'und' if unknown"},
    "score": {"dtype": "float32", "shape": "[1]",
              "description": "pair quality score from labse-score (1.0 for --parallel-text, NaN if the input had none)"},
}
TEXT_FEATURES_DOC = {
    "src_text": {"dtype": "bytes", "shape": "[1]", "description": "the source sentence (utf-8), only with --include-text"},
    "tgt_text": {"dtype": "bytes", "shape": "[1]", "description": "the target sentence (utf-8), only with --include-text"},
}


@dataclass(frozen=True)
class TFRecordsConfig:
    max_seq_length: int = 64
    num_shards: int = 16
    min_score: float | None = None
    include_text: bool = False
    seed: int = 0
    tokenize_batch_size: int = 512

    def __post_init__(self):
        if self.max_seq_length < 3:
            raise ValueError(f"max_seq_length must be >= 3 ([CLS], one piece, [SEP]), got {self.max_seq_length}")
        if self.num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {self.num_shards}")


@dataclass(frozen=True)
class ParallelTextSpec:
    src_lang: str
    src_path: str
    tgt_lang: str
    tgt_path: str

    @classmethod
    def parse(cls, spec: str) -> "ParallelTextSpec":
        """`src_lang:path,tgt_lang:path`."""
        parts = spec.split(",")
        if len(parts) != 2 or any(":" not in p for p in parts):
            raise ValueError(f"--parallel-text expects 'src_lang:path,tgt_lang:path', got {spec!r}")
        (src_lang, src_path), (tgt_lang, tgt_path) = (p.split(":", 1) for p in parts)
        return cls(src_lang.strip(), src_path.strip(), tgt_lang.strip(), tgt_path.strip())


# ---------------------------------------------------------------------------------------------
# Pure functions (unit-tested without Beam)

def vocab_fingerprint(vocab_path: str) -> dict:
    """File name, sha256, size and special-token ids of a vocab.txt (recorded in schema.json)."""
    with FileSystems.open(vocab_path, compression_type="uncompressed") as f:
        raw = f.read()
    try:
        tokens = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise ValueError(f"{vocab_path}: not UTF-8 text ({error})") from None
    first_line: dict[str, int] = {}
    for number, token in enumerate(tokens, 1):
        if token in first_line:  # two ids for one token: the tokenizer would silently use one of them
            raise ValueError(f"{vocab_path}: token {token!r} appears twice (lines {first_line[token]} and {number})")
        first_line[token] = number
    special = {t: first_line[t] - 1 for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]") if t in first_line}
    missing = {"[CLS]", "[SEP]", "[PAD]", "[UNK]"} - set(special)
    if missing:
        raise ValueError(f"{vocab_path}: vocabulary lacks {sorted(missing)}")
    return {"file": os.path.basename(vocab_path), "sha256": hashlib.sha256(raw).hexdigest(), "size": len(tokens),
            "special_ids": special}


def wrap_and_truncate(pieces: Sequence[int], cls_id: int, sep_id: int, max_seq_length: int) -> tuple[list[int], bool]:
    """`[CLS] pieces [SEP]` cut to max_seq_length (the [SEP] kept); returns (ids, was_truncated)."""
    room = max_seq_length - 2
    truncated = len(pieces) > room
    return [cls_id, *pieces[:room], sep_id], truncated


def normalise_pair(row: dict, default_score: float = float("nan")) -> dict | str:
    """A clean pair dict from an input row, or the reason it is dropped."""
    src, tgt = row.get("src"), row.get("tgt")
    if not isinstance(src, str) or not isinstance(tgt, str):
        return "missing_text"
    src, tgt = src.strip(), tgt.strip()
    if not src or not tgt:
        return "empty_text"
    score = row.get("score", default_score)
    try:
        score = float(score) if score is not None else default_score
    except (TypeError, ValueError):
        return "bad_score"
    return {
        "src": src,
        "tgt": tgt,
        "src_lang": str(row.get("src_lang") or UNKNOWN_LANG),
        "tgt_lang": str(row.get("tgt_lang") or UNKNOWN_LANG),
        "score": score,
    }


def passes_min_score(score: float, min_score: float | None) -> str | None:
    """None if the pair is kept, else the drop reason."""
    if min_score is None:
        return None
    if math.isnan(score):
        return "score_missing"
    return None if score >= min_score else "below_min_score"


def shuffle_key(seed: int, pair: dict) -> int:
    """A 64-bit key from the seed and the pair's content: the global shuffle order."""
    h = hashlib.blake2b(digest_size=8, key=str(seed).encode())
    for name in ("src_lang", "tgt_lang", "src", "tgt"):
        h.update(pair[name].encode("utf-8"))
        h.update(b"\x00")
    return int.from_bytes(h.digest(), "little")


def shard_name(shard: int, num_shards: int) -> str:
    return f"{SHARD_PREFIX}-{shard:05d}-of-{num_shards:05d}.tfrecord"


# ---------------------------------------------------------------------------------------------
# Beam building blocks

_COUNTERS = ReasonCounters(COUNTER_NAMESPACE)  # one Beam counter object per reason and process


def _count(reason: str, value: int = 1) -> None:
    _COUNTERS.inc(reason, value)


class _ReadParquetPairs(beam.DoFn):
    """One Parquet file -> pair dicts, in record batches; unreadable files are counted, not fatal."""

    def process(self, path: str):
        from pipelines.io.readers import local_file_problem

        try:
            problem = local_file_problem(path)
            if problem is not None:  # a named pipe would block the open forever
                raise OSError(problem[1])
            with FileSystems.open(path, compression_type="uncompressed") as f:
                for row in iter_parquet_rows(f, path, ("src", "tgt"), ("src_lang", "tgt_lang", "score")):
                    _count("input_pairs")
                    yield row
        except MissingColumnsError as exc:
            _count("parquet_without_src_tgt")
            logger.warning("%s; skipped", exc)
            yield beam.pvalue.TaggedOutput("dropped", "parquet_without_src_tgt")
        except Exception as exc:  # corrupt footer, truncated file, permission ...
            _count("parquet_unreadable")
            logger.error("%s: unreadable Parquet file (%s); skipped", path, exc)
            yield beam.pvalue.TaggedOutput("dropped", "parquet_unreadable")


class ReadParquetPairs(beam.PTransform):
    """Parquet files (a list of paths) -> dict rows with src/tgt[/src_lang/tgt_lang/score]; drops tagged 'dropped'."""

    def __init__(self, paths: Sequence[str]):
        super().__init__()
        self.paths = list(paths)

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.pvalue.DoOutputsTuple:
        return (
            pbegin
            | "Files" >> beam.Create(self.paths)
            | "Read" >> beam.ParDo(_ReadParquetPairs()).with_outputs("dropped", main="pairs")
        )


class _ReadParallelText(beam.DoFn):
    def process(self, spec: ParallelTextSpec):
        unaligned = 0
        # Line by line from both files at once: a parallel corpus can be larger than memory.
        with FileSystems.open(spec.src_path) as fs, FileSystems.open(spec.tgt_path) as ft:
            for src, tgt in itertools.zip_longest(_text_lines(fs), _text_lines(ft)):
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


def _text_lines(handle) -> Iterator[str]:
    """The lines of a UTF-8 text file, without their line ends (undecodable bytes replaced)."""
    for raw in iter(handle.readline, b""):
        yield raw.decode("utf-8", "replace").rstrip("\r\n")


class ReadParallelText(beam.PTransform):
    """Line-aligned text files (gzip or plain) -> pair dicts with score 1.0; extra lines tagged 'dropped'."""

    def __init__(self, specs: Sequence[ParallelTextSpec]):
        super().__init__()
        self.specs = list(specs)

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.pvalue.DoOutputsTuple:
        return (
            pbegin
            | "Specs" >> beam.Create(self.specs)
            | "Read" >> beam.ParDo(_ReadParallelText()).with_outputs("dropped", main="pairs")
        )


def load_tfte_tokenizer(vocab_path: str):
    """The project tokenizer (contract 5); imported here so TensorFlow loads only in workers that tokenise."""
    from vocab.tokenizer import TFTextTokenizer

    return TFTextTokenizer(vocab_path)


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

    def _tokenize(self, texts: list[str]) -> list[list[int] | None]:
        try:
            return [list(map(int, ids)) for ids in self.tokenizer.tokenize_ids(texts)]
        except Exception:  # one bad string must not lose the batch: retry one by one
            out: list[list[int] | None] = []
            for text in texts:
                try:
                    out.append([int(i) for i in self.tokenizer.tokenize_ids([text])[0]])
                except Exception as exc:
                    logger.warning("tokenizer failed on %r: %s", text[:80], exc)
                    out.append(None)
            return out

    def process(self, batch: list[dict]):
        cfg = self.config
        src_pieces = self._tokenize([p["src"] for p in batch])
        tgt_pieces = self._tokenize([p["tgt"] for p in batch])
        for pair, src, tgt in zip(batch, src_pieces, tgt_pieces):
            if src is None or tgt is None:
                _count("tokenizer_error")
                yield beam.pvalue.TaggedOutput("dropped", "tokenizer_error")
                continue
            if not src or not tgt:
                _count("no_word_pieces")
                yield beam.pvalue.TaggedOutput("dropped", "no_word_pieces")
                continue
            src_ids, src_cut = wrap_and_truncate(src, self.cls_id, self.sep_id, cfg.max_seq_length)
            tgt_ids, tgt_cut = wrap_and_truncate(tgt, self.cls_id, self.sep_id, cfg.max_seq_length)
            features: dict[str, object] = {
                "src_ids": src_ids,
                "tgt_ids": tgt_ids,
                "src_lang": pair["src_lang"],
                "tgt_lang": pair["tgt_lang"],
                "score": float(pair["score"]),
            }
            if cfg.include_text:
                features["src_text"] = pair["src"]
                features["tgt_text"] = pair["tgt"]
            key = shuffle_key(cfg.seed, pair)
            facts = (f"{pair['src_lang']}-{pair['tgt_lang']}", len(src_ids), len(tgt_ids), src_cut, tgt_cut)
            yield key % cfg.num_shards, (key, encode_example(features), facts)


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
        from pipelines.io.tfrecord import frame_record

        self._frame = frame_record
        self._path = path
        self._file = FileSystems.create(path)
        self.num_bytes = 0

    def write(self, data: bytes) -> None:
        framed = self._frame(data)
        self._file.write(framed)
        self.num_bytes += len(framed)

    def close(self) -> None:
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


def build_manifests(shards: list[dict], drops: dict[str, int], *, config: TFRecordsConfig, vocab: dict,
                    inputs: dict, input_pairs: int | None = None) -> tuple[dict, dict]:
    """(schema.json, stats.json) contents from the shard summaries and drop counts."""
    shards = sorted(shards, key=lambda s: s["file"])
    total = sum(s["num_records"] for s in shards)
    features = dict(FEATURES_DOC)
    if config.include_text:
        features.update(TEXT_FEATURES_DOC)
    schema = {
        "format": "labse-tfrecords",
        "version": SCHEMA_VERSION,
        "record": "tf.train.Example, one translation pair per record; uncompressed TFRecord framing with masked CRC32C",
        "features": features,
        "max_seq_length": config.max_seq_length,
        "vocab": vocab,
        "shuffle": {"seed": config.seed, "method": "blake2b-64 key of (seed, langs, texts): shard = key mod num_shards, records sorted by key"},
        "num_shards": config.num_shards,
        "num_records": total,
        "shards": [{k: s[k] for k in ("file", "num_records", "num_bytes")} for s in shards],
    }
    langs: Counter = Counter()
    for s in shards:
        langs.update(s["language_pairs"])
    dropped = dict(sorted(drops.items()))
    dup = sum(s["duplicate_pair"] for s in shards)
    if dup:
        dropped["duplicate_pair"] = dup
    stats = {
        "stage": "labse-tfrecords",
        "config": asdict(config),
        "inputs": inputs,
        "input_pairs": input_pairs,
        "written_pairs": total,
        "dropped": dropped,
        "language_pairs": dict(sorted(langs.items())),
        "mean_src_tokens": round(sum(s["src_tokens"] for s in shards) / total, 2) if total else None,
        "mean_tgt_tokens": round(sum(s["tgt_tokens"] for s in shards) / total, 2) if total else None,
        "truncated_src": sum(s["truncated_src"] for s in shards),
        "truncated_tgt": sum(s["truncated_tgt"] for s in shards),
        "empty_shards": config.num_shards - len(shards),
    }
    return schema, stats


class _WriteManifests(beam.DoFn):
    def __init__(self, output_dir: str, config: TFRecordsConfig, vocab: dict, inputs: dict):
        self.output_dir = output_dir
        self.config = config
        self.vocab = vocab
        self.inputs = inputs

    def process(self, _, shards: list[dict], drops: dict[str, int], input_pairs: int):
        schema, stats = build_manifests(shards, drops, config=self.config, vocab=self.vocab,
                                        inputs=self.inputs, input_pairs=input_pairs)
        write_json_atomic(FileSystems.join(self.output_dir, "schema.json"), schema)
        write_stats_json(FileSystems.join(self.output_dir, "stats.json"), stats)
        mark_complete(self.output_dir, stats, stage="labse-tfrecords")  # the last write of the stage
        yield stats


class PairsToTFRecords(beam.PTransform):
    """Pair dicts (+ a PCollection of drop reasons from the readers) -> shards, schema.json, stats.json.

    Returns a PCollection holding the single stats dict once everything is written.  The vocabulary
    is read and hashed once, here, when the transform is built (errors surface before the pipeline runs).
    """

    def __init__(self, vocab_path: str, output_dir: str, config: TFRecordsConfig = TFRecordsConfig(),
                 *, inputs: dict | None = None, tokenizer_factory: Callable[[str], object] = load_tfte_tokenizer,
                 default_score: float = float("nan")):
        super().__init__()
        self.vocab_path = vocab_path
        self.vocab = vocab_fingerprint(vocab_path)
        self.output_dir = output_dir
        self.config = config
        self.inputs = inputs or {}
        self.tokenizer_factory = tokenizer_factory
        self.default_score = default_score

    def expand(self, inputs: tuple[beam.PCollection, beam.PCollection]) -> beam.PCollection:
        pairs, reader_drops = inputs
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
        drops = (
            (reader_drops, kept.dropped, encoded.dropped)
            | "AllDrops" >> beam.Flatten()
            | "CountDrops" >> beam.combiners.Count.PerElement()
            | "DropDict" >> beam.combiners.ToDict()
        )
        input_pairs = pairs | "CountInputs" >> beam.combiners.Count.Globally()
        return (
            pairs.pipeline
            | "Once" >> beam.Create([None])
            | "Manifests" >> beam.ParDo(
                _WriteManifests(self.output_dir, cfg, self.vocab, self.inputs),
                beam.pvalue.AsSingleton(shard_stats),
                beam.pvalue.AsSingleton(drops),
                beam.pvalue.AsSingleton(input_pairs),
            )
        )


class BuildTFRecords(beam.PTransform):
    """Parquet pairs and/or parallel text files -> TFRecord shards with schema and stats (the whole stage)."""

    def __init__(self, vocab_path: str, output_dir: str, config: TFRecordsConfig = TFRecordsConfig(), *,
                 parquet_files: Sequence[str] = (), parallel_text: Sequence[ParallelTextSpec] = (),
                 tokenizer_factory: Callable[[str], object] = load_tfte_tokenizer):
        super().__init__()
        if not parquet_files and not parallel_text:
            raise ValueError("no input: give Parquet pair files and/or parallel text files")
        self.parquet_files = list(parquet_files)
        self.parallel_text = list(parallel_text)
        inputs = {
            "parquet_files": len(self.parquet_files),
            "parallel_text": [asdict(s) for s in self.parallel_text],
        }
        # built here, not in expand(), so that a bad vocabulary fails before the pipeline starts
        self.to_tfrecords = PairsToTFRecords(vocab_path, output_dir, config, inputs=inputs,
                                             tokenizer_factory=tokenizer_factory)

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        pair_sets, drop_sets = [], []
        if self.parquet_files:
            parquet = pbegin | "ReadParquet" >> ReadParquetPairs(self.parquet_files)
            pair_sets.append(parquet.pairs)
            drop_sets.append(parquet.dropped)
        if self.parallel_text:
            text = pbegin | "ReadParallelText" >> ReadParallelText(self.parallel_text)
            pair_sets.append(text.pairs)
            drop_sets.append(text.dropped)
        pairs = tuple(pair_sets) | "AllPairs" >> beam.Flatten()
        drops = tuple(drop_sets) | "ReaderDrops" >> beam.Flatten()
        return (pairs, drops) | "PairsToTFRecords" >> self.to_tfrecords


# ---------------------------------------------------------------------------------------------
# CLI

def find_parquet_files(location: str) -> list[str]:
    """Parquet files under a directory (recursively: flat or hive-partitioned) or matching a glob."""
    if "://" not in location and os.path.isdir(location):
        found = glob.glob(os.path.join(location, "**", "*.parquet"), recursive=True)
    else:
        found = [m.path for r in FileSystems.match([location]) for m in r.metadata_list]
    return sorted(p for p in found if not os.path.basename(p).startswith((".", "_")))


def _fixed_directory(location: str) -> str:
    """The directory part of `location` before any wildcard: the folder a glob reads from."""
    parts = location.rstrip("/").split("/")
    for index, part in enumerate(parts):
        if any(ch in part for ch in "*?["):
            return "/".join(parts[:index])
    is_dir = os.path.isdir(location) if "://" not in location else not location.endswith(".parquet")
    return location.rstrip("/") if is_dir else "/".join(parts[:-1])


def check_pairs_complete(location: str, files: Sequence[str]) -> None:
    """Every Parquet file read from `location` must lie in a complete stage output: a folder between
    it and `location` holds `_SUCCESS` (labse-score writes one; so does Spark, and `touch
    DIR/_SUCCESS` marks hand-made Parquet). Raises IncompleteOutputError naming the folder."""
    root = _fixed_directory(location)
    complete: dict[str, bool] = {}

    def is_complete(folder: str) -> bool:
        if folder not in complete:
            complete[folder] = read_completion(folder) is not None
        return complete[folder]

    for folder in sorted({f.rsplit("/", 1)[0] for f in files}):
        current = folder
        while not is_complete(current):
            if current == root or len(current) <= len(root) or "/" not in current:
                raise IncompleteOutputError(
                    f"--pairs {location}: {folder} is not a complete stage output (no _SUCCESS): the run that "
                    "writes it was interrupted or is still running: rerun the stage")
            current = current.rsplit("/", 1)[0]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="labse-tfrecords",
        description="Tokenise translation pairs and write globally shuffled tf.train.Example shards "
                    "(src_ids, tgt_ids, src_lang, tgt_lang, score) with schema.json and stats.json.",
        epilog="Unknown options are passed to Beam, e.g. --runner DataflowRunner --project P --region R "
               "--temp_location gs://B/tmp, or --direct_running_mode multi_processing --direct_num_workers 2.",
    )
    parser.add_argument("--pairs", action="append", default=[],
                        help="scored pairs: a directory of Parquet files (searched recursively) or a glob; repeatable")
    parser.add_argument("--parallel-text", action="append", default=[], metavar="SRC_LANG:PATH,TGT_LANG:PATH",
                        help="line-aligned text files (gzip ok), e.g. de:train.de.gz,en:train.en.gz; score 1.0; repeatable")
    parser.add_argument("--vocab", required=True, help="vocab.txt from labse-vocab")
    parser.add_argument("--output", required=True, help="directory for the shards, schema.json and stats.json")
    parser.add_argument("--max-seq-length", type=int, default=64, help="ids per side including [CLS] and [SEP] (default 64, as the paper)")
    parser.add_argument("--num-shards", type=int, default=16,
                        help="output shards; each is sorted in one worker's memory, so keep shards under ~1 GB (default 16)")
    parser.add_argument("--min-score", type=float, default=None, help="drop pairs scored below this (default: keep all)")
    parser.add_argument("--include-text", action="store_true", help="also store src_text/tgt_text")
    parser.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier run's output in --output (without it an existing output is refused)")
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args, beam_args = parser.parse_known_args(argv)
    try:  # everything about the inputs is checked here, before any work: one line, exit 2
        config = TFRecordsConfig(max_seq_length=args.max_seq_length, num_shards=args.num_shards,
                                 min_score=args.min_score, include_text=args.include_text, seed=args.seed)
        if args.min_score is not None and not math.isfinite(args.min_score):
            raise ValueError(f"--min-score must be a finite number, got {args.min_score}")
        specs = [ParallelTextSpec.parse(s) for s in args.parallel_text]
        parquet_files: list[str] = []
        for location in args.pairs:
            found = find_parquet_files(location)
            if not found:
                raise ValueError(f"--pairs {location}: no Parquet files found")
            check_pairs_complete(location, found)
            parquet_files.extend(found)
        if not parquet_files and not specs:
            raise ValueError("give --pairs and/or --parallel-text")
        build = BuildTFRecords(args.vocab, args.output, config, parquet_files=parquet_files, parallel_text=specs)
    except (ValueError, OSError) as exc:  # IncompleteOutputError is a ValueError
        return usage_error("labse-tfrecords", f"--vocab: {exc}" if str(exc).startswith(args.vocab) else str(exc))

    logger.info("writing TFRecords from %d Parquet files and %d parallel text pairs of files to %s",
                len(parquet_files), len(specs), args.output)
    try:
        with output_lock(args.output):  # before looking at the output: two runs never mix
            prepare_output(args.output, overwrite=args.overwrite)
            with beam.Pipeline(options=PipelineOptions(beam_args)) as pipeline:
                _ = pipeline | "BuildTFRecords" >> build
    except (OutputExistsError, OutputLockedError) as exc:
        return usage_error("labse-tfrecords", str(exc))
    stats_path = FileSystems.join(args.output, "stats.json")
    if "://" not in stats_path and os.path.exists(stats_path):
        with open(stats_path, encoding="utf-8") as f:
            stats = json.load(f)
        print(f"labse-tfrecords: {stats['written_pairs']} pairs in {config.num_shards - stats['empty_shards']} shards "
              f"under {args.output}; dropped: {stats['dropped'] or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
