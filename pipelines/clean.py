"""labse-clean: CommonCrawl WARC/WET and Wikipedia dumps to per-language sentence shards.

    labse-clean --input 'PATTERN' [--input 'PATTERN' ...] --format warc|wet|wikipedia|auto \\
        --output DIR [--main-content-model PATH] [options] [Beam options]

Per document: HTML to lines (resiliparse), main-content score per line (a fastText model or
heuristic rules), language per line (lid.176), sentences per line (sentencex), quality filters per
sentence; then exact deduplication of normalised sentences per language across the whole run,
keeping the first source (smallest file, offset, doc_id, position). Writes
`DIR/sentences/lang=XX/*.parquet`, `DIR/errors/*.jsonl` and `DIR/stats.json`.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from pipelines.accounting import (
    ReasonCounters,
    SumTallies,
    Tally,
    build_stats,
    identity_violations,
)
from pipelines.io.stage_output import (
    OutputExistsError,
    OutputLockedError,
    mark_complete,
    output_lock,
    prepare_output,
    usage_error,
    write_stats_json,
)
from pipelines.io.documents import KIND_HTML, SOURCE_WIKI, Document, Dropped, ReadError, ReadResult
from pipelines.io.parquet import DEFAULT_ROWS_PER_FILE, WriteErrors, WriteSentenceShards, sentence_order
from pipelines.text.boilerplate import heuristic_main_content_scores
from pipelines.text.filters import FilterConfig, first_failures
from pipelines.text.html import html_to_lines, parse_html, tree_to_lines
from pipelines.text.langid import DEFAULT_THRESHOLD, LanguageDecision, LanguageIdentifier, decide_language
from pipelines.text.normalise import clean_text, dedup_key
from pipelines.text.sentences import split_sentences

logger = logging.getLogger("labse.clean")

FORMATS = ("warc", "wet", "wikipedia")


@dataclass(frozen=True)
class CleanConfig:
    """What the cleaning stage does to each document; written into stats.json as `config`."""

    langid_threshold: float = DEFAULT_THRESHOLD
    main_content_model: str | None = None
    main_content_threshold: float = 0.5
    min_chars: int = 10            # LaBSE kept sentences of 10 to 5,000 characters
    max_chars: int = 5000
    # A line longer than this is not split or identified but dropped as one `line_too_long`
    # sentence: it bounds the work one 10 MB single-line page can cause.
    max_line_chars: int = 50_000
    rows_per_file: int = DEFAULT_ROWS_PER_FILE

    def filters(self) -> FilterConfig:
        return FilterConfig(min_chars=self.min_chars, max_chars=self.max_chars)


# ---------------------------------------------------------------------------------------------
# Text logic without Beam: one document in, candidate sentences + tally + errors out.


def document_lines(doc: Document) -> list[str]:
    """The document's blocks, one per line: extracted from HTML, or the given text's lines."""
    if doc.kind == KIND_HTML:
        return html_to_lines(doc.body)
    return [line.strip() for line in doc.body.split("\n") if line.strip()]


@dataclass
class DocumentResult:
    rows: list[dict] = field(default_factory=list)      # candidate sentences (before deduplication)
    tally: Counter = field(default_factory=Counter)
    errors: list[dict] = field(default_factory=list)


def error_record(file: str, offset: int, reason: str, detail: str, **extra) -> dict:
    return {"file": file, "offset": int(offset), "reason": reason, "detail": detail[:2000], **extra}


def clean_document(
    doc: Document,
    lid: LanguageIdentifier,
    config: CleanConfig,
    main_content_model=None,
) -> DocumentResult:
    """Lines, scores, language, sentences and filters for ONE document.

    Counts go to `result.tally` (flat keys, see pipelines.accounting) in *sentence-level units*: a
    sentence of a line that passes main-content scoring, or a whole line that does not (one
    `sentences.dropped.main_content` unit, not split: splitting boilerplate only to count it was a
    large share of the work on boilerplate-heavy pages), or a whole `line_too_long` line. Every unit
    is `sentences.read` and ends as a candidate row, a `sentences.dropped.<reason>` or
    `sentences.errored`. The document's own outcome (kept or dropped) is settled after
    deduplication, except for documents without any candidate.
    """
    result = DocumentResult()
    tally = result.tally
    tally["documents.read"] += 1
    tree = None
    if doc.kind == KIND_HTML and doc.body:
        tree = parse_html(doc.body)  # once: the lines and the model's HTML feature share it
        lines = tree_to_lines(tree)
    else:
        lines = document_lines(doc)
    if not lines:
        tally["documents.dropped.no_text"] += 1
        return result

    max_line_chars = config.max_line_chars
    oversized = [len(line) > max_line_chars for line in lines]
    workable = [line for line, big in zip(lines, oversized) if not big] if any(oversized) else lines
    if doc.source == SOURCE_WIKI:
        # Wikipedia article text is main content by construction (the reader removed the rest).
        scores = [1.0] * len(workable)
    elif main_content_model is not None:
        scores = _model_scores(main_content_model, workable, tree)
    else:
        scores = heuristic_main_content_scores(workable)
    threshold = config.main_content_threshold
    min_chars = config.min_chars
    # lid.176 only for lines that pass the main-content threshold and can hold a long enough
    # sentence: the others are dropped anyway, and on web pages they are most lines.
    wanted = [i for i, (line, score) in enumerate(zip(workable, scores))
              if score >= threshold and len(line) >= min_chars]
    predictions = dict(zip(wanted, lid.predict([workable[i] for i in wanted])))
    filter_config = config.filters()
    langid_threshold = config.langid_threshold
    rows = result.rows
    dropped: Counter = Counter()
    candidates: list[tuple[str, LanguageDecision, int, float]] = []  # sentences for the filters

    position = -1
    work_index = -1
    for line, big in zip(lines, oversized):
        if big:
            position += 1
            dropped["line_too_long"] += 1
            continue
        work_index += 1
        score = scores[work_index]
        if score < threshold:  # one unit, not split (see the docstring)
            position += 1
            dropped["main_content"] += 1
            continue
        prediction = predictions.get(work_index)
        if prediction is None:  # main content but shorter than min_chars: split only to count
            decision = None
            split_lang = doc.lang
        else:
            decision = decide_language(prediction[0], prediction[1], doc.lang, langid_threshold)
            split_lang = decision.lang or prediction[0]
        try:
            # Cleaned once per line: its sentences (stripped pieces of it) are then clean already.
            sentences = split_sentences(clean_text(line), split_lang)
        except Exception as exc:  # a splitter bug must cost one line, not the document
            position += 1
            tally["sentences.errored"] += 1
            result.errors.append(error_record(doc.file, doc.offset, "sentence_split_failed",
                                              f"{type(exc).__name__}: {exc}", doc_id=doc.doc_id, url=doc.url))
            continue
        if not sentences:  # nothing visible was left after cleaning: one unit, too short
            position += 1
            dropped["too_short"] += 1
            continue
        if decision is None:
            # Every sentence of a line shorter than min_chars is too short (cleaning only shrinks).
            position += len(sentences)
            dropped["too_short"] += len(sentences)
            continue
        language_drop = decision.drop_reason
        if language_drop is not None:
            position += len(sentences)
            dropped[language_drop] += len(sentences)
            continue
        for text in sentences:
            position += 1
            candidates.append((text, decision, position, score))
    # Every unit (kept, dropped or errored) advanced `position` by one.
    tally["sentences.read"] += position + 1
    # The filters run once over the document's sentences (page-wide tests of the rare rules).
    reasons = first_failures([c[0] for c in candidates], [c[1].lang for c in candidates], filter_config)
    for (text, decision, position, score), reason in zip(candidates, reasons):
        if reason is not None:
            dropped[reason] += 1
            continue
        rows.append({
            "text": text,
            "lang": decision.lang,
            "lang_score": decision.score,
            "source": doc.source,
            "url": doc.url,
            "doc_id": doc.doc_id,
            "position": position,
            "main_content_score": score,
            "file": doc.file,
            "offset": doc.offset,
        })
    for reason, count in dropped.items():
        tally[f"sentences.dropped.{reason}"] += count
    if rows:
        tally["documents.with_candidates"] += 1
    else:
        tally["documents.dropped.no_sentences_kept"] += 1
    return result


def _model_scores(model, lines: list[str], tree) -> list[float]:
    """P(main content) per line from the classifier; the page's parsed HTML, when there is one,
    feeds its HTML feature without a second parse (WET text has none)."""
    if tree is None:
        return model.score_lines(lines, html=None).tolist()
    from pipelines.main_content.model import html_main_flags

    return model.score_lines_with_flags(lines, html_main_flags(lines, tree)).tolist()


# ---------------------------------------------------------------------------------------------
# Beam transforms.

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
    """Reader output -> {"rows": ((lang, dedup key), candidate row), "tally": tallies, "errors": error records}."""

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
    """Reader output -> deduplicated sentences, written under `output_dir` with errors and stats.json.

    Returns the PCollection holding the one stats dict, written last (after every shard and error file).
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
    """Several (pattern, format) inputs -> one PCollection of reader output."""

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


# ---------------------------------------------------------------------------------------------
# CLI.


def infer_format(pattern: str) -> str:
    name = pattern.lower()
    if name.endswith((".xml", ".xml.bz2", ".xml.gz")):
        return "wikipedia"
    if ".wet" in name:
        return "wet"
    if name.endswith((".warc", ".warc.gz", ".arc.gz")) or ".warc" in name:
        return "warc"
    raise ValueError(f"cannot tell the format of {pattern!r} from its name; pass --format warc|wet|wikipedia")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="labse-clean",
        description="Clean CommonCrawl WARC/WET and Wikipedia pages-articles dumps into per-language "
                    "sentence Parquet shards (Apache Beam). Unknown options are passed to Beam "
                    "(e.g. --runner DataflowRunner --project P --region R --temp_location gs://B/tmp "
                    "--setup_file ./setup.py, or --direct_running_mode multi_processing --direct_num_workers 2).",
    )
    parser.add_argument("--input", action="append", required=True, metavar="PATTERN",
                        help="Beam file pattern (local or gs://); repeat for several inputs")
    parser.add_argument("--format", default="auto", choices=FORMATS + ("auto",),
                        help="input format for every --input; 'auto' (default) infers it per pattern from "
                             "the file name (.warc[.gz] -> warc, .wet -> wet, .xml[.bz2] -> wikipedia)")
    parser.add_argument("--output", required=True, metavar="DIR", help="output directory (local or gs://)")
    parser.add_argument("--main-content-model", default=None, metavar="PATH",
                        help="fastText main-content model from `labse-main-content` (local or gs://; workers "
                             "copy it locally); without it, documented heuristic rules score lines "
                             "(README, section clean)")
    parser.add_argument("--main-content-threshold", type=float, default=CleanConfig.main_content_threshold,
                        help="drop sentences whose line scores below this P(main content) (default %(default)s)")
    parser.add_argument("--langid-threshold", type=float, default=CleanConfig.langid_threshold,
                        help="lid.176 probability a web line needs to be kept under its language; for "
                             "Wikipedia, the probability of ANOTHER language that removes a line "
                             "(default %(default)s)")
    parser.add_argument("--min-chars", type=int, default=CleanConfig.min_chars,
                        help="shortest sentence kept, in characters (default %(default)s, as LaBSE)")
    parser.add_argument("--max-chars", type=int, default=CleanConfig.max_chars,
                        help="longest sentence kept, in characters (default %(default)s, as LaBSE)")
    parser.add_argument("--max-line-chars", type=int, default=CleanConfig.max_line_chars,
                        help="lines longer than this are dropped unsplit as `line_too_long` (default %(default)s)")
    parser.add_argument("--rows-per-file", type=int, default=CleanConfig.rows_per_file,
                        help="target rows per Parquet file; a language gets ceil(rows / this) files")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace sentences/, errors/ and stats.json of an earlier run in DIR")
    return parser


def run(inputs: list[tuple[str, str]], output: str, config: CleanConfig, beam_args: list[str] | None = None,
        overwrite: bool = False) -> dict:
    """Build and run the pipeline; returns the stats written to `output/stats.json`."""
    output = output.rstrip("/")
    with output_lock(output):  # before looking at the output: no check-then-act race between runs
        prepare_output(output, overwrite=overwrite)
        return _run_pipeline(inputs, output, config, beam_args)


def _run_pipeline(inputs: list[tuple[str, str]], output: str, config: CleanConfig,
                  beam_args: list[str] | None) -> dict:
    run_config = {
        "inputs": [{"pattern": p, "format": f} for p, f in inputs],
        "output": output,
        **asdict(config),
        "beam_args": list(beam_args or []),
    }
    options = PipelineOptions(beam_args or [])
    started = time.perf_counter()
    with beam.Pipeline(options=options) as pipeline:
        _ = pipeline | "ReadInputs" >> ReadAll(inputs) | "CleanCorpus" >> CleanCorpus(output, config, run_config)
    logger.info("pipeline finished in %.1f s", time.perf_counter() - started)
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.open(f"{output}/stats.json") as handle:
        return json.loads(handle.read().decode("utf-8"))


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args, beam_args = parser.parse_known_args(argv)
    try:
        inputs = [(pattern, infer_format(pattern) if args.format == "auto" else args.format) for pattern in args.input]
    except ValueError as exc:
        parser.error(str(exc))
    if not 0.0 <= args.main_content_threshold <= 1.0 or not 0.0 <= args.langid_threshold <= 1.0:
        parser.error("--main-content-threshold and --langid-threshold must be between 0 and 1")
    if not 1 <= args.min_chars <= args.max_chars:
        parser.error("need 1 <= --min-chars <= --max-chars")

    from pipelines.io.readers import check_pattern_matches

    for pattern, _fmt in inputs:
        try:
            check_pattern_matches(pattern)
        except FileNotFoundError as exc:
            print(f"labse-clean: error: {exc}", file=sys.stderr)
            return 2
    if args.main_content_model:
        from pipelines.main_content.model import MainContentModelError

        try:  # fail before the pipeline starts, not in every worker
            load_main_content_model(args.main_content_model)
        except MainContentModelError as exc:
            print(f"labse-clean: error: --main-content-model: {exc}", file=sys.stderr)
            return 2
    config = CleanConfig(
        langid_threshold=args.langid_threshold,
        main_content_model=args.main_content_model,
        main_content_threshold=args.main_content_threshold,
        min_chars=args.min_chars,
        max_chars=args.max_chars,
        max_line_chars=args.max_line_chars,
        rows_per_file=args.rows_per_file,
    )
    try:
        stats = run(inputs, args.output, config, beam_args, overwrite=args.overwrite)
    except (OutputExistsError, OutputLockedError) as exc:
        return usage_error("labse-clean", str(exc))
    print(summarise(stats))
    problems = identity_violations(stats)
    if problems:
        print("labse-clean: accounting identity broken (a bug, please report): " + "; ".join(problems), file=sys.stderr)
        return 1
    return 0


def summarise(stats: dict) -> str:
    lines = [
        f"documents: read {stats['documents_read']}, kept {stats['documents_kept']}, "
        f"dropped {sum(stats['documents_dropped'].values())}, errored {stats['documents_errored']}",
        f"sentences: read {stats['sentences_read']}, kept {stats['sentences_kept']}, "
        f"dropped {sum(stats['sentences_dropped'].values())}, errored {stats['sentences_errored']}",
        "sentences dropped by reason: " + ", ".join(f"{k} {v}" for k, v in
                                                    sorted(stats["sentences_dropped"].items(), key=lambda kv: -kv[1])),
        "per language: " + ", ".join(f"{k} {v}" for k, v in stats["per_language"].items()),
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Demo step (contract 10).

DEMO_INPUTS = [
    ("commoncrawl/CC-MAIN-2020-34-sample.warc.gz", "warc"),
    ("commoncrawl/web-pages-sample.warc.gz", "warc"),
    ("maincontent/article-pages.warc.gz", "warc"),
    ("wikipedia/enwiki-pages-articles-sample.xml.bz2", "wikipedia"),
    ("wikipedia/ltgwiki-pages-articles-sample.xml.bz2", "wikipedia"),
]


def run_demo(data: Path, out: Path, artifacts: dict) -> list[str]:
    """labse-clean on every sample in LABSE_DATA, through the real CLI, into out/clean/."""
    output = out / "clean"
    argv = []
    for relative, fmt in DEMO_INPUTS:
        argv += ["--input", str(data / relative)]
    argv += ["--output", str(output), "--overwrite"]
    model = artifacts.get("main_content_model")
    if model:
        argv += ["--main-content-model", str(model)]
    print(f"labse-clean {' '.join(argv)}", flush=True)
    code = main(argv)
    if code != 0:
        raise RuntimeError(f"labse-clean failed with exit code {code}")
    stats = json.loads((output / "stats.json").read_text(encoding="utf-8"))
    artifacts["clean_output"] = str(output)
    lines = [
        f"inputs: {len(DEMO_INPUTS)} sample files; main content by "
        + (f"the model {model}" if model else "heuristic rules (no main-content model available)"),
        f"documents read {stats['documents_read']}: kept {stats['documents_kept']}, "
        f"dropped {sum(stats['documents_dropped'].values())}, errored {stats['documents_errored']}",
        f"sentences read {stats['sentences_read']}: kept {stats['sentences_kept']}, "
        f"dropped {sum(stats['sentences_dropped'].values())} "
        f"(duplicates {stats['sentences_dropped'].get('duplicate', 0)}), errored {stats['sentences_errored']}",
        f"accounting identity read = kept + dropped + errored: {'holds' if stats['identity_holds'] else 'BROKEN'}",
        "lang  sentences",
    ]
    for lang, count in list(stats["per_language"].items())[:15]:
        lines.append(f"{lang:<5} {count}")
    if len(stats["per_language"]) > 15:
        rest = list(stats["per_language"].values())[15:]
        lines.append(f"(+{len(rest)} more languages, {sum(rest)} sentences)")
    lines.append(f"output: {output}/sentences (lang=XX/*.parquet), errors/, stats.json")
    return lines


if __name__ == "__main__":
    sys.exit(main())
