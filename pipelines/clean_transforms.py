"""The cleaning stage's Beam transforms: reader output in, sentence shards, errors and stats.json out.

    ReadAll(inputs) -> CleanCorpus(output_dir, config)
        = ExtractSentences (clean_document per document) -> DeduplicateSentences
          -> WriteSentenceShards / WriteErrors -> stats.json, then _SUCCESS

The per-document logic is `pipelines.text.document.clean_document` (no Beam); this module only
loads models once per worker, calls it, counts and deduplicates across documents. The CLI is
`pipelines.clean`.
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import asdict
from typing import Iterator

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from pipelines.accounting import ReasonCounters, SumTallies, Tally, build_stats
from pipelines.io.documents import Document, Dropped, ReadError, ReadResult
from pipelines.io.parquet import WriteErrors, WriteSentenceShards, sentence_order
from pipelines.io.stage_output import mark_complete, write_stats_json
from pipelines.text.document import CleanConfig, clean_document, error_record
from pipelines.text.langid import LanguageIdentifier
from pipelines.text.normalise import dedup_key

TALLY = "tally"
ERRORS = "errors"
DOCUMENTS = "documents"


def _global_window(value) -> WindowedValue:
    """An element emitted from `finish_bundle`, which has no input element to inherit a window from."""
    return WindowedValue(value, MIN_TIMESTAMP, [GlobalWindow()])


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


class _CleanDocumentsFn(beam.DoFn):
    """Document | Dropped | ReadError -> ((lang, dedup key), row) candidates.

    Side outputs: error records, and one tally per bundle (summing in the DoFn keeps the per-element
    Beam overhead off the counting path).
    """

    def __init__(self, config: CleanConfig):
        self.config = config

    def setup(self):
        # Heavy objects once per worker, never per element.
        self.lid = LanguageIdentifier()
        self.main_content_model = None
        if self.config.main_content_model:
            self.main_content_model = load_main_content_model(self.config.main_content_model)
        self.counters = ReasonCounters()

    def start_bundle(self):
        self.bundle_tally: Counter = Counter()

    def process(self, element: ReadResult) -> Iterator:
        rows: list[dict] = []
        if isinstance(element, Document):
            try:
                result = clean_document(element, self.lid, self.config, self.main_content_model)
            except Exception as exc:  # bad input must never crash the run; it is routed to errors/
                tally = {"documents.read": 1, "documents.errored": 1}
                errors = [error_record(element.file, element.offset, "processing_failed",
                                       f"{type(exc).__name__}: {exc}", doc_id=element.doc_id, url=element.url)]
            else:
                tally, errors, rows = result.tally, result.errors, result.rows
        elif isinstance(element, Dropped):
            tally, errors = {"documents.read": 1, f"documents.dropped.{element.reason}": 1}, []
        elif isinstance(element, ReadError):
            tally = {"documents.read": 1, "documents.errored": 1}
            errors = [error_record(element.file, element.offset, element.reason, element.detail)]
        else:
            tally = {"documents.read": 1, "documents.errored": 1}
            errors = [error_record("", 0, "unknown_element", repr(element)[:500])]
        self.counters.inc_tally(tally)
        self.bundle_tally.update(tally)
        for row in rows:
            yield (row["lang"], dedup_key(row["text"])), row
        for error in errors:
            yield beam.pvalue.TaggedOutput(ERRORS, error)

    def finish_bundle(self):
        if self.bundle_tally:
            yield beam.pvalue.TaggedOutput(TALLY, _global_window(dict(self.bundle_tally)))


class ExtractSentences(beam.PTransform):
    """Reader output -> candidate sentences, tallies and error records: `clean_document` per document.

    Every element counts as one document read: a `Document` is cleaned (an exception becomes one
    `processing_failed` error, never a failed run), a `Dropped` is a document dropped by its reason,
    a `ReadError` an errored document. lid.176 and the main-content model load once per worker.

    Args:
        config: the stage's `CleanConfig`; `config.main_content_model` is a path (local or
            gs://) that every worker loads in `DoFn.setup`, or None for the heuristic rules.

    Returns (from `expand`) a dict of PCollections:
        "rows": ((lang, dedup key), row) candidate sentences, before deduplication;
        "tally": tally dicts (one per bundle) to sum with `pipelines.accounting.SumTallies`;
        "errors": error records (`pipelines.text.document.error_record`).

    Example::

        with beam.Pipeline() as pipeline:
            extracted = (pipeline
                         | ReadAll([("data/commoncrawl/*.warc.gz", "warc")])
                         | ExtractSentences(CleanConfig(min_chars=20)))
            _ = extracted["rows"] | beam.Values() | beam.Map(lambda row: print(row["lang"], row["text"]))
    """

    def __init__(self, config: CleanConfig):
        super().__init__()
        self.config = config

    def expand(self, documents: beam.PCollection[ReadResult]) -> dict[str, beam.PCollection]:
        outputs = documents | "CleanDocuments" >> beam.ParDo(_CleanDocumentsFn(self.config)).with_outputs(
            TALLY, ERRORS, main="rows")
        return {"rows": outputs.rows, "tally": outputs[TALLY], "errors": outputs[ERRORS]}


class _FirstSource(beam.CombineFn):
    """Among rows with one dedup key: the first by (file, offset, doc_id, position), and how many there were."""

    def create_accumulator(self):
        return (None, 0)

    def add_input(self, acc, row):
        best, count = acc
        if best is None or sentence_order(row) < sentence_order(best):
            best = row
        return (best, count + 1)

    def merge_accumulators(self, accs):
        best, count = None, 0
        for row, n in accs:
            count += n
            if row is not None and (best is None or sentence_order(row) < sentence_order(best)):
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
        self.documents.add((row["file"], row["offset"], row["doc_id"]))
        yield row

    def finish_bundle(self):
        if self.kept:
            tally = {"sentences.kept": self.kept, "sentences.dropped.duplicate": self.duplicates}
            ReasonCounters().inc_tally(tally)
            yield beam.pvalue.TaggedOutput(TALLY, _global_window(tally))
        for document in self.documents:
            yield beam.pvalue.TaggedOutput(DOCUMENTS, _global_window(document))


class DeduplicateSentences(beam.PTransform):
    """Exact dedup of normalised sentences per language over the whole run, keeping the first source.

    Input: ((lang, dedup key), row). Returns {"rows": unique rows, "tally": sentences kept / dropped
    as duplicate, "documents": (file, offset, doc_id) of documents with a kept sentence (may repeat)}.
    """

    def expand(self, keyed_rows: beam.PCollection) -> dict[str, beam.PCollection]:
        unique = (
            keyed_rows
            | "FirstSource" >> beam.CombinePerKey(_FirstSource())
            | "Unique" >> beam.ParDo(_EmitUniqueFn()).with_outputs(TALLY, DOCUMENTS, main="rows")
        )
        return {"rows": unique.rows, "tally": unique[TALLY], "documents": unique[DOCUMENTS]}


def _documents_kept(documents: beam.PCollection[tuple]) -> beam.PCollection[Tally]:
    return (
        documents
        | "DistinctDocuments" >> beam.Distinct()
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


class _WriteStats(beam.DoFn):
    def __init__(self, output_dir: str, config: dict):
        self.output_dir = output_dir
        self.config = config

    def process(self, tally: Tally, per_language: dict, error_files: list) -> Iterator[dict]:
        stats = build_stats(settle_documents(tally), per_language, self.config)
        stats["error_files"] = sorted(str(f).rsplit("/", 1)[-1] for f in error_files)
        write_stats_json(self.output_dir.rstrip("/") + "/stats.json", stats)
        mark_complete(self.output_dir, stats, stage="labse-clean")  # the last write of the stage
        yield stats


class CleanCorpus(beam.PTransform):
    """The whole cleaning stage after reading: reader output -> files under `output_dir`.

    `ExtractSentences` -> `DeduplicateSentences` -> `WriteSentenceShards` (sentences/lang=XX/*.parquet)
    and `WriteErrors` (errors/*.jsonl) -> stats.json, then `_SUCCESS` (README, section clean). It does
    not lock or check `output_dir`: `pipelines.clean.run` does that around the pipeline.

    Args:
        output_dir: the output directory (local or gs://).
        config: the stage's `CleanConfig`.
        run_config: what stats.json records as `config` (default: `asdict(config)`; the CLI adds
            the inputs, the output and the Beam arguments).

    Returns (from `expand`) the PCollection holding the one stats dict, written last (after every
    shard and error file).

    Example::

        with beam.Pipeline() as pipeline:
            _ = (pipeline
                 | ReadAll([("data/commoncrawl/*.warc.gz", "warc"), ("data/wikipedia/*.xml.bz2", "wikipedia")])
                 | CleanCorpus("out/clean", CleanConfig()))
    """

    def __init__(self, output_dir: str, config: CleanConfig, run_config: dict | None = None):
        super().__init__()
        self.output_dir = output_dir.rstrip("/")
        self.config = config
        self.run_config = run_config or asdict(config)

    def expand(self, documents: beam.PCollection[ReadResult]) -> beam.PCollection[dict]:
        extracted = documents | "ExtractSentences" >> ExtractSentences(self.config)
        unique = extracted["rows"] | "Deduplicate" >> DeduplicateSentences()
        written = unique["rows"] | "WriteSentences" >> WriteSentenceShards(self.output_dir, self.config.rows_per_file)
        error_files = extracted["errors"] | "WriteErrors" >> WriteErrors(self.output_dir)
        tally = (
            (extracted["tally"], unique["tally"], _documents_kept(unique["documents"]))
            | "AllTallies" >> beam.Flatten()
            | "SumTallies" >> beam.CombineGlobally(SumTallies())
        )
        per_language = written | "PerLanguage" >> beam.CombineGlobally(SumTallies())
        return tally | "WriteStats" >> beam.ParDo(
            _WriteStats(self.output_dir, self.run_config),
            per_language=beam.pvalue.AsSingleton(per_language),
            error_files=beam.pvalue.AsList(error_files),
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
        from pipelines.io.readers import ReadDocuments

        parts = [
            pbegin | f"Read[{i}] {fmt}" >> ReadDocuments(pattern, fmt)
            for i, (pattern, fmt) in enumerate(self.inputs)
        ]
        return parts[0] if len(parts) == 1 else tuple(parts) | "AllInputs" >> beam.Flatten()
