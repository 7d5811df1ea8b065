"""The cleaning stage's Beam transforms: reader output in, sentence shards, errors and stats.json out.

    ReadAll(inputs) -> CleanCorpus(output_dir, config)
        = ExtractSentences (clean_bundle per bundle of documents) -> DeduplicateSentences
          -> WriteSentenceShards / WriteErrors -> stats.json, then _SUCCESS

The cleaning logic is `pipelines.clean.bundle` (`prepare_document` per page, `clean_bundle` per
bundle; `pipelines.clean.document.clean_document` is a bundle of one), without Beam; this module
only loads models once per worker, holds documents until a bundle is full, calls it, counts and
deduplicates across documents. The CLI is `pipelines.clean`.
"""
from __future__ import annotations

import heapq
import json
import math
import os
from collections import Counter
from dataclasses import asdict
from typing import Iterable, Iterator, Mapping

import apache_beam as beam
from apache_beam.transforms.window import BoundedWindow, GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from pipelines.accounting import TALLY, ReasonCounters, SumTallies, Tally, build_stats
from pipelines.io.documents import Document, Dropped, ReadError, ReadResult
from pipelines.io.parquet import (  # noqa: F401 (row_dict: see ExtractSentences)
    DEFAULT_ROWS_PER_FILE,
    NO_SENTENCES_FILE,
    ROW_LANG,
    row_dict,
    sentence_table,
    shard_of,
    write_parquet_atomic,
    write_table_atomic,
)
from pipelines.io.completion import mark_complete, write_stats_json
from pipelines.clean.bundle import (BundleResult, PreparedDocument, clean_bundle, error_record, main_content_scorer,
                                     prepare_document)
from pipelines.clean.config import CleanConfig
from pipelines.text.langid import LanguageIdentifier
from pipelines.text.normalise import dedup_keys

COUNTER_NAMESPACE = "clean"  # Beam counters: one namespace per stage, its name
ERRORS = "errors"
DOCUMENTS = "documents"
FILES = "files"

# How many input files stats.json lists one by one (the ones with the most errored documents).
DEFAULT_PER_FILE_LIMIT = 100


def _global_window(value) -> WindowedValue:
    """An element emitted from `finish_bundle`, which has no input element to inherit a window from."""
    return WindowedValue(value, MIN_TIMESTAMP, [GlobalWindow()])


def _in_window(value, window: BoundedWindow) -> WindowedValue:
    """`value` in `window` (at its end; in the global window at MIN_TIMESTAMP, as `_global_window`)."""
    if isinstance(window, GlobalWindow):
        return _global_window(value)
    return WindowedValue(value, window.max_timestamp(), [window])


def load_main_content_model(path: str):
    """The main-content model at `path`, local or remote (gs://...).

    fastText reads local files only, so a remote model is copied to a temporary file, loaded (the
    model then lives in memory) and the copy deleted at once.
    """
    from pipelines.main_content.model import MainContentModel, MainContentModelError

    if "://" not in path:
        return MainContentModel.load(path)
    import tempfile

    from apache_beam.io.filesystems import FileSystems

    fd, local = tempfile.mkstemp(prefix="main-content-", suffix=".bin")
    try:
        try:
            with os.fdopen(fd, "wb") as out, FileSystems.open(path) as remote:
                while chunk := remote.read(1 << 20):
                    out.write(chunk)
        except Exception as exc:  # Beam filesystems raise their own error types
            raise MainContentModelError(f"cannot copy main-content model {path!r}: {exc}") from exc
        return MainContentModel.load(local)
    finally:
        os.unlink(local)


# A bundle of documents is cleaned at once (`clean_bundle`) when it holds this many documents or
# this many characters of lines, and at the end of every Beam bundle. Only lines are held (the HTML
# is parsed as each document arrives), so the characters bound a worker's memory.
DEFAULT_BUNDLE_DOCUMENTS = 256
DEFAULT_BUNDLE_CHARS = 16 << 20


class _CleanDocumentsFn(beam.DoFn):
    """Document | Dropped | ReadError -> (dedup key, row) candidates (`dedup_keys`, row a
    `ROW_FIELDS` tuple).

    Documents are prepared as they arrive (`prepare_document`: HTML to lines, the model's scores)
    and cleaned in bundles (`clean_bundle`: one lid.176 call, the filters over all sentences at
    once), flushed when `bundle_documents` documents or `bundle_chars` characters of lines are held
    and in `finish_bundle`. Each output carries the timestamp and window of the document it comes
    from. Side outputs: error records, one tally per bundle (summing in the DoFn keeps the
    per-element Beam overhead off the counting path), and per bundle one (file, file tally) per
    input file seen (`file_outcome`).
    """

    def __init__(self, config: CleanConfig, bundle_documents: int = DEFAULT_BUNDLE_DOCUMENTS,
                 bundle_chars: int = DEFAULT_BUNDLE_CHARS):
        if bundle_documents < 1 or bundle_chars < 1:
            raise ValueError("bundle_documents and bundle_chars must be positive")
        self.config = config
        self.bundle_documents = bundle_documents
        self.bundle_chars = bundle_chars

    def setup(self):
        # Heavy objects once per worker, never per element.
        self.lid = LanguageIdentifier()
        model = load_main_content_model(self.config.main_content_model) if self.config.main_content_model else None
        self.main_content_model = main_content_scorer(self.config, model)  # the mode; None: the rules
        self.counters = ReasonCounters(COUNTER_NAMESPACE)

    def start_bundle(self):
        # Tallies per window, and per (window, input file): each is emitted in its window.
        self.bundle_tally: dict[BoundedWindow, Counter] = {}
        self.bundle_files: dict[tuple[BoundedWindow, str], Counter] = {}
        self.pending: list[PreparedDocument] = []
        self.pending_places: list[tuple] = []  # (timestamp, window) of each pending document
        self.pending_chars = 0

    def process(self, element: ReadResult, timestamp=beam.DoFn.TimestampParam,
                window=beam.DoFn.WindowParam) -> Iterator:
        if not isinstance(window, BoundedWindow):  # called directly, outside a pipeline (tests)
            timestamp, window = MIN_TIMESTAMP, GlobalWindow()
        if isinstance(element, Document):
            try:
                prepared = prepare_document(element, self.config, self.main_content_model)
            except Exception as exc:  # bad input must never crash the run; it is routed to errors/
                error = self._failed(element, exc)
                self._count(window, element.file, {"documents.read": 1, "documents.errored": 1}, [error])
                yield beam.pvalue.TaggedOutput(ERRORS, error)
                return
            self.pending.append(prepared)
            self.pending_places.append((timestamp, window))
            self.pending_chars += sum(map(len, prepared.lines))
            if len(self.pending) >= self.bundle_documents or self.pending_chars >= self.bundle_chars:
                yield from self._flush()
            return
        if isinstance(element, Dropped):
            file, tally, errors = element.file, {"documents.read": 1, f"documents.dropped.{element.reason}": 1}, []
        elif isinstance(element, ReadError):
            file, tally = element.file, {"documents.read": 1, "documents.errored": 1}
            errors = [error_record(element.file, element.offset, element.reason, element.detail)]
        else:
            file, tally = "", {"documents.read": 1, "documents.errored": 1}
            errors = [error_record("", 0, "unknown_element", repr(element)[:500])]
        self._count(window, file, tally, errors)
        for error in errors:
            yield beam.pvalue.TaggedOutput(ERRORS, error)

    def finish_bundle(self):
        yield from self._flush()
        for window, tally in self.bundle_tally.items():
            yield beam.pvalue.TaggedOutput(TALLY, _in_window(dict(tally), window))
        for (window, file), per_file in self.bundle_files.items():
            yield beam.pvalue.TaggedOutput(FILES, _in_window((file, dict(per_file)), window))

    @staticmethod
    def _failed(doc: Document, exc: Exception) -> dict:
        return error_record(doc.file, doc.offset, "processing_failed", f"{type(exc).__name__}: {exc}",
                            doc_id=doc.doc_id, url=doc.url)

    def _count(self, window: BoundedWindow, file: str, tally: Mapping[str, int], errors: list[dict]) -> None:
        self.counters.inc_tally(tally)
        bundle_tally = self.bundle_tally.get(window)
        if bundle_tally is None:
            bundle_tally = self.bundle_tally[window] = Counter()
        bundle_tally.update(tally)
        per_file = self.bundle_files.get((window, file))
        if per_file is None:
            per_file = self.bundle_files[(window, file)] = Counter()
        per_file.update(file_outcome(tally, errors))

    def _clean(self, prepared: list[PreparedDocument]) -> tuple[BundleResult, list[bytes], list[tuple]]:
        result = clean_bundle(prepared, self.lid, self.config)
        return result, dedup_keys(result.text, result.lang), result.row_tuples()

    def _flush(self) -> Iterator:
        pending, places = self.pending, self.pending_places
        if not pending:
            return
        self.pending, self.pending_places, self.pending_chars = [], [], 0
        templates: dict[tuple, WindowedValue] = {}  # one per (timestamp, window): outputs copy it
        for place in places:
            if place not in templates:
                templates[place] = WindowedValue(None, place[0], (place[1],))
        try:
            cleaned = [(self._clean(pending), list(range(len(pending))))]
        except Exception:
            # A bug in one document must cost that document only: clean them one at a time.
            cleaned = []
            for i, prepared in enumerate(pending):
                try:
                    cleaned.append((self._clean([prepared]), [i]))
                except Exception as exc:
                    error = self._failed(prepared.doc, exc)
                    template = templates[places[i]]
                    self._count(template.windows[0], prepared.doc.file,
                                {"documents.read": 1, "documents.errored": 1}, [error])
                    yield beam.pvalue.TaggedOutput(ERRORS, template.with_value(error))
        for (result, keys, rows), indices in cleaned:
            placed = [templates[places[i]] for i in indices]
            for d, (doc, tally, errors) in enumerate(zip(result.docs, result.tallies, result.errors)):
                self._count(placed[d].windows[0], doc.file, tally, errors)
                for error in errors:
                    yield beam.pvalue.TaggedOutput(ERRORS, placed[d].with_value(error))
            if len(templates) == 1:
                template = placed[0]
                for key, row in zip(keys, rows):
                    yield template.with_value((key, row))
            else:
                for d, key, row in zip(result.doc, keys, rows):
                    yield placed[d].with_value((key, row))


class ExtractSentences(beam.PTransform):
    """Reader output -> candidate sentences, tallies and error records: `clean_document`'s results
    for every document, computed a bundle of documents at a time (`clean_bundle`).

    Every element counts as one document read: a `Document` is cleaned (an exception becomes one
    `processing_failed` error for that document, never a failed run), a `Dropped` is a document
    dropped by its reason, a `ReadError` an errored document. lid.176 and the main-content model load
    once per worker.

    Args:
        config: the stage's `CleanConfig`; `config.main_content_model` is a path (local or
            gs://) that every worker loads in `DoFn.setup`, or None for the heuristic rules.
        bundle_documents, bundle_chars: a worker cleans the documents it holds at once when they
            are this many, or hold this many characters of lines, and at the end of a Beam bundle.

    Returns (from `expand`) a dict of PCollections:
        "rows": (dedup key, row) candidate sentences, before deduplication: the key a digest of the
            language and the normalised text (`pipelines.text.normalise.dedup_keys`), the row a
            tuple of `pipelines.io.parquet.ROW_FIELDS` (`row_dict` makes it a dict);
        "tally": tally dicts (one per bundle) to sum with `pipelines.accounting.SumTallies`;
        "errors": error records (`pipelines.clean.document.error_record`);
        "files": (input file, file tally) pairs (`file_outcome`), several per file, to sum per file.

    Example::

        with beam.Pipeline() as pipeline:
            extracted = (pipeline
                         | ReadAll([("data/commoncrawl/*.warc.gz", "warc")])
                         | ExtractSentences(CleanConfig(min_chars=20)))
            _ = (extracted["rows"] | beam.Values() | beam.Map(row_dict)
                 | beam.Map(lambda row: print(row["lang"], row["text"])))
    """

    def __init__(self, config: CleanConfig, bundle_documents: int = DEFAULT_BUNDLE_DOCUMENTS,
                 bundle_chars: int = DEFAULT_BUNDLE_CHARS):
        super().__init__()
        self.config = config
        self.bundle_documents = bundle_documents
        self.bundle_chars = bundle_chars

    def expand(self, documents: beam.PCollection[ReadResult]) -> dict[str, beam.PCollection]:
        clean = _CleanDocumentsFn(self.config, self.bundle_documents, self.bundle_chars)
        outputs = documents | "CleanDocuments" >> beam.ParDo(clean).with_outputs(TALLY, ERRORS, FILES, main="rows")
        return {"rows": outputs.rows, "tally": outputs[TALLY], "errors": outputs[ERRORS], "files": outputs[FILES]}


class _FirstSource(beam.CombineFn):
    """Among rows with one dedup key: the first by (file, offset, doc_id, position), and how many
    there were. Rows are `ROW_FIELDS` tuples, which compare in that order."""

    def create_accumulator(self):
        return (None, 0)

    def add_input(self, acc, row):
        best, count = acc
        return (row if best is None or row < best else best, count + 1)

    def merge_accumulators(self, accs):
        best, count = None, 0
        for row, n in accs:
            count += n
            if row is not None and (best is None or row < best):
                best = row
        return (best, count)

    def extract_output(self, acc):
        return acc


class _EmitUniqueFn(beam.DoFn):
    """(key, (first row, count)) -> the row; per bundle: a tally and the documents that kept a sentence."""

    def start_bundle(self):
        self.kept = 0
        self.duplicates = 0
        self.documents: set = set()

    def process(self, keyed):
        _key, (row, count) = keyed
        self.kept += 1
        self.duplicates += count - 1
        # doc_id too: records of a file compressed as ONE gzip member share their offset.
        self.documents.add(row[:3])  # (file, offset, doc_id)
        yield row

    def finish_bundle(self):
        if self.kept:
            tally = {"sentences.kept": self.kept, "sentences.dropped.duplicate": self.duplicates}
            ReasonCounters(COUNTER_NAMESPACE).inc_tally(tally)
            yield beam.pvalue.TaggedOutput(TALLY, _global_window(tally))
        for document in self.documents:
            yield beam.pvalue.TaggedOutput(DOCUMENTS, _global_window(document))


class DeduplicateSentences(beam.PTransform):
    """Exact dedup of normalised sentences per language over the whole run, keeping the first source.

    Input: (dedup key, row), the row a `ROW_FIELDS` tuple. Returns {"rows": unique rows, "tally":
    sentences kept / dropped as duplicate, "documents": (file, offset, doc_id) of documents with a
    kept sentence (may repeat)}.
    """

    def expand(self, keyed_rows: beam.PCollection) -> dict[str, beam.PCollection]:
        unique = (
            keyed_rows
            | "FirstSource" >> beam.CombinePerKey(_FirstSource())
            | "Unique" >> beam.ParDo(_EmitUniqueFn()).with_outputs(TALLY, DOCUMENTS, main="rows")
        )
        return {"rows": unique.rows, "tally": unique[TALLY], "documents": unique[DOCUMENTS]}


def _documents_kept(distinct_documents: beam.PCollection[tuple]) -> beam.PCollection[Tally]:
    return (
        distinct_documents
        | "CountDocuments" >> beam.combiners.Count.Globally()
        | "KeptTally" >> beam.Map(lambda n: {"documents.kept": n})
    )


def settle_documents(tally: Tally) -> Tally:
    """Documents with candidates but no unique sentence left were duplicates of earlier ones."""
    out = dict(tally)
    only_duplicates = out.pop("documents.with_candidates", 0) - out.get("documents.kept", 0)
    if only_duplicates:
        out["documents.dropped.only_duplicate_sentences"] = out.get(
            "documents.dropped.only_duplicate_sentences", 0) + only_duplicates
    return out


# ---------------------------------------------------------------------------------------------
# Per input file: documents read, kept, dropped and errored, for stats.json's `per_file`.

FILE_FIELDS = ("documents_read", "documents_kept", "documents_dropped", "documents_errored")


def file_outcome(tally: Tally, errors: list[dict]) -> Tally:
    """One document's tally (`clean_document`'s, or the DoFn's for a drop or an error) as a file
    tally: read, errored (plus `errored.<reason>`), dropped before deduplication, and
    with_candidates (the document's fate is settled after deduplication, `settle_file`)."""
    out = {"read": tally.get("documents.read", 0)}
    errored = tally.get("documents.errored", 0)
    if errored:
        out["errored"] = errored
        for error in errors:  # a document's error record (sentence-level ones come without it)
            key = f"errored.{error['reason']}"
            out[key] = out.get(key, 0) + 1
    dropped = sum(v for k, v in tally.items() if k.startswith("documents.dropped."))
    if dropped:
        out["dropped"] = dropped
    if tally.get("documents.with_candidates"):
        out["with_candidates"] = tally["documents.with_candidates"]
    return out


def settle_file(file: str, tally: Mapping[str, int]) -> dict:
    """One file's summed file tally (plus `kept`: its documents with a unique sentence) -> its
    `per_file` entry. As for the totals (`settle_documents`), documents with candidates but no kept
    sentence were dropped as duplicates, so read = kept + dropped + errored per file too."""
    kept = tally.get("kept", 0)
    entry = {
        "file": file,
        "documents_read": tally.get("read", 0),
        "documents_kept": kept,
        "documents_dropped": tally.get("dropped", 0) + tally.get("with_candidates", 0) - kept,
        "documents_errored": tally.get("errored", 0),
    }
    reasons = {k[len("errored."):]: v for k, v in sorted(tally.items()) if k.startswith("errored.")}
    if reasons:
        entry["errors"] = reasons
    return entry


def _rank(entry: dict) -> tuple:
    return (-entry["documents_errored"], entry["file"])


class FileBreakdown(beam.CombineFn):
    """(file, summed file tally), one per input file -> stats.json's `per_file` section.

    Exact totals over every file, plus at most `limit` files listed one by one: those with the
    most errored documents, ties by file name (deterministic on every runner). The accumulator
    holds the totals and at most ~2 x `limit` candidates, so 90,000 files cost no more than 100.
    """

    def __init__(self, limit: int = DEFAULT_PER_FILE_LIMIT):
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        self.limit = limit

    def create_accumulator(self) -> list:
        return [0, Counter(), []]  # files, totals, [(rank, entry)] candidates

    def add_input(self, acc: list, file_tally: tuple[str, Mapping[str, int]]) -> list:
        entry = settle_file(*file_tally)
        acc[0] += 1
        acc[1].update({field: entry[field] for field in FILE_FIELDS})
        acc[1]["files_with_errors"] += int(entry["documents_errored"] > 0)
        acc[2].append((_rank(entry), entry))
        if len(acc[2]) > 2 * self.limit + 16:
            acc[2] = heapq.nsmallest(self.limit, acc[2], key=lambda item: item[0])
        return acc

    def merge_accumulators(self, accs) -> list:
        files, totals, candidates = 0, Counter(), []
        for acc_files, acc_totals, acc_candidates in accs:
            files += acc_files
            totals.update(acc_totals)
            candidates.extend(acc_candidates)
        return [files, totals, heapq.nsmallest(self.limit, candidates, key=lambda item: item[0])]

    def extract_output(self, acc: list) -> dict:
        files, totals, candidates = acc
        top = [entry for _rank_key, entry in heapq.nsmallest(self.limit, candidates, key=lambda item: item[0])]
        others = {field: totals.get(field, 0) - sum(entry[field] for entry in top) for field in FILE_FIELDS}
        return {
            "files": files,
            "files_with_errors": totals.get("files_with_errors", 0),
            **{field: totals.get(field, 0) for field in FILE_FIELDS},
            "limit": self.limit,
            "truncated": len(top) < files,
            "ranked_by": "documents_errored (most first), then file name",
            "other_files": {"files": files - len(top), **others},
            "top_files": top,
        }


def per_file_violations(stats: Mapping) -> list[str]:
    """Where stats.json's `per_file` section does not add up (empty when it does): its totals
    against the run's, the listed files plus `other_files` against its totals, and every listed
    file's read = kept + dropped + errored."""
    per_file = stats.get("per_file")
    if per_file is None:
        return []
    bad = []
    run_totals = {
        "documents_read": stats["documents_read"],
        "documents_kept": stats["documents_kept"],
        "documents_dropped": sum(stats["documents_dropped"].values()),
        "documents_errored": stats["documents_errored"],
    }
    top, others = per_file["top_files"], per_file["other_files"]
    for field, total in run_totals.items():
        if per_file[field] != total:
            bad.append(f"per_file.{field} {per_file[field]} != {field} {total}")
        if sum(entry[field] for entry in top) + others[field] != per_file[field]:
            bad.append(f"per_file: listed files + other_files != per_file.{field}")
    if len(top) + others["files"] != per_file["files"]:
        bad.append("per_file: listed files + other_files.files != per_file.files")
    for entry in top:
        accounted = entry["documents_kept"] + entry["documents_dropped"] + entry["documents_errored"]
        if entry["documents_read"] != accounted or min(entry[field] for field in FILE_FIELDS) < 0:
            bad.append(f"per_file: {entry['file']}: read {entry['documents_read']} != kept + dropped + errored {accounted}")
    return bad


def _per_file_breakdown(files: beam.PCollection, distinct_documents: beam.PCollection[tuple],
                        limit: int) -> beam.PCollection[dict]:
    kept = distinct_documents | "KeptPerFile" >> beam.Map(lambda document: (document[0], {"kept": 1}))
    return (
        (files, kept)
        | "AllFileTallies" >> beam.Flatten()
        | "SumPerFile" >> beam.CombinePerKey(SumTallies())
        | "FileBreakdown" >> beam.CombineGlobally(FileBreakdown(limit))
    )


class _WriteStats(beam.DoFn):
    def __init__(self, output_dir: str, config: dict):
        self.output_dir = output_dir
        self.config = config

    def process(self, tally: Tally, per_language: dict, error_files: list, per_file: dict) -> Iterator[dict]:
        stats = build_stats(settle_documents(tally), per_language, self.config)
        stats["error_files"] = sorted(str(f).rsplit("/", 1)[-1] for f in error_files)
        stats["per_file"] = per_file
        stats["identity_holds"] = stats["identity_holds"] and not per_file_violations(stats)
        write_stats_json(self.output_dir.rstrip("/") + "/stats.json", stats)
        mark_complete(self.output_dir, stats, stage="labse-clean")  # the last write of the stage
        yield stats


class CleanCorpus(beam.PTransform):
    """The whole cleaning stage after reading: reader output -> files under `output_dir`.

    `ExtractSentences` -> `DeduplicateSentences` -> `WriteSentenceShards` (sentences/lang=XX/*.parquet)
    and `WriteErrors` (errors/*.jsonl) -> stats.json, then `_SUCCESS` (docs/reference/labse-clean.md). It does
    not lock or check `output_dir`: `pipelines.clean.run` does that around the pipeline.

    Args:
        output_dir: the output directory (local or gs://).
        config: the stage's `CleanConfig`.
        run_config: what stats.json records as `config` (default: `asdict(config)`; the CLI adds
            the inputs, the output and the Beam arguments).
        per_file_limit: how many input files stats.json's `per_file` lists one by one (those
            with the most errored documents); the totals cover every file whatever this is.

    Returns (from `expand`) the PCollection holding the one stats dict, written last (after every
    shard and error file).

    Example::

        with beam.Pipeline() as pipeline:
            _ = (pipeline
                 | ReadAll([("data/commoncrawl/*.warc.gz", "warc"), ("data/wikipedia/*.xml.bz2", "wikipedia")])
                 | CleanCorpus("out/clean", CleanConfig()))
    """

    def __init__(self, output_dir: str, config: CleanConfig, run_config: dict | None = None,
                 per_file_limit: int = DEFAULT_PER_FILE_LIMIT):
        super().__init__()
        self.output_dir = output_dir.rstrip("/")
        self.config = config
        self.run_config = run_config or asdict(config)
        self.per_file_limit = per_file_limit

    def expand(self, documents: beam.PCollection[ReadResult]) -> beam.PCollection[dict]:
        extracted = documents | "ExtractSentences" >> ExtractSentences(self.config)
        unique = extracted["rows"] | "Deduplicate" >> DeduplicateSentences()
        written = unique["rows"] | "WriteSentences" >> WriteSentenceShards(self.output_dir, self.config.rows_per_file)
        error_files = extracted["errors"] | "WriteErrors" >> WriteErrors(self.output_dir)
        kept_documents = unique["documents"] | "DistinctDocuments" >> beam.Distinct()
        tally = (
            (extracted["tally"], unique["tally"], _documents_kept(kept_documents))
            | "AllTallies" >> beam.Flatten()
            | "SumTallies" >> beam.CombineGlobally(SumTallies())
        )
        per_language = written | "PerLanguage" >> beam.CombineGlobally(SumTallies())
        per_file = _per_file_breakdown(extracted["files"], kept_documents, self.per_file_limit)
        return tally | "WriteStats" >> beam.ParDo(
            _WriteStats(self.output_dir, self.run_config),
            per_language=beam.pvalue.AsSingleton(per_language),
            error_files=beam.pvalue.AsList(error_files),
            per_file=beam.pvalue.AsSingleton(per_file),
        )


class ReadAll(beam.PTransform):
    """Several (pattern, format) inputs -> one PCollection of reader output.

    Args:
        inputs: (Beam file pattern, format) pairs, format "warc", "wet" or "wikipedia".
    """

    def __init__(self, inputs: list[tuple[str, str]]):
        super().__init__()
        self.inputs = inputs

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection[ReadResult]:
        from pipelines.read.readers import ReadDocuments

        parts = [
            pbegin | f"Read[{i}] {fmt}" >> ReadDocuments(pattern, fmt, namespace=COUNTER_NAMESPACE)
            for i, (pattern, fmt) in enumerate(self.inputs)
        ]
        return parts[0] if len(parts) == 1 else tuple(parts) | "AllInputs" >> beam.Flatten()


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
