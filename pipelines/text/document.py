"""The cleaning stage's per-document logic, without Beam: one document in, candidate sentences,
a tally and error records out.

`clean_document(doc, lid, config)` is everything `labse-clean` does to ONE document (lines,
main-content scores, language, sentences, filters). It is `pipelines.text.bundle.clean_bundle` on a
bundle of one: the Beam transforms in `pipelines.clean_transforms` clean bundles of documents at once
(one lid.176 call, array operations over all their sentences) with the same results per document,
and count and deduplicate across documents. This module (and `bundle`) does not import apache_beam
(a test checks it), so it runs in a REPL, a benchmark or another framework.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from pipelines.io.config_options import option
from pipelines.io.documents import KIND_HTML, Document
from pipelines.text.filters import FilterConfig
from pipelines.text.html import html_to_lines
from pipelines.text.langid import DEFAULT_THRESHOLD, LanguageIdentifier

# The Parquet sink's default (`pipelines.io.parquet.DEFAULT_ROWS_PER_FILE`; that module imports Beam,
# so the value is repeated here and a test checks that the two agree).
DEFAULT_ROWS_PER_FILE = 200_000


@dataclass(frozen=True)
class CleanConfig:
    """What the cleaning stage does to each document; written into stats.json as `config`.

    `rows_per_file` is the only field the per-document logic does not use (the Parquet sink's).
    """

    langid_threshold: float = option(
        DEFAULT_THRESHOLD, "lid.176 probability a web line needs to be kept under its language; for Wikipedia, "
        "the probability of ANOTHER language that removes a line (default %(default)s)")
    main_content_model: str | None = option(
        None, "fastText main-content model from `labse-main-content` (local or gs://; workers copy it "
        "locally); without it, documented heuristic rules score lines (README, section clean)", metavar="PATH")
    main_content_threshold: float = option(
        0.5, "drop sentences whose line scores below this P(main content) (default %(default)s)")
    # LaBSE kept sentences of 10 to 5,000 characters.
    min_chars: int = option(10, "shortest sentence kept, in characters (default %(default)s, as LaBSE)")
    max_chars: int = option(5000, "longest sentence kept, in characters (default %(default)s, as LaBSE)")
    # A line longer than this is not split or identified but dropped as one `line_too_long`
    # sentence: it bounds the work one 10 MB single-line page can cause.
    max_line_chars: int = option(
        50_000, "lines longer than this are dropped unsplit as `line_too_long` (default %(default)s)")
    rows_per_file: int = option(
        DEFAULT_ROWS_PER_FILE, "target rows per Parquet file; a language gets ceil(rows / this) files")

    def __post_init__(self):
        # Checked here so that library use is checked too; the CLI reports the ValueError in one line.
        problems = [f"{name} (--{name.replace('_', '-')}) must be between 0 and 1, got {getattr(self, name)}"
                    for name in ("langid_threshold", "main_content_threshold") if not 0.0 <= getattr(self, name) <= 1.0]
        if not 1 <= self.min_chars <= self.max_chars:
            problems.append(f"need 1 <= min_chars (--min-chars) <= max_chars (--max-chars), got {self.min_chars} "
                            f"and {self.max_chars}")
        problems += [f"{name} (--{name.replace('_', '-')}) must be at least 1, got {getattr(self, name)}"
                     for name in ("max_line_chars", "rows_per_file") if getattr(self, name) < 1]
        if problems:
            raise ValueError("; ".join(problems))

    def filters(self) -> FilterConfig:
        return FilterConfig(min_chars=self.min_chars, max_chars=self.max_chars)


def document_lines(doc: Document) -> list[str]:
    """The document's blocks, one per line: extracted from HTML, or the given text's lines."""
    if doc.kind == KIND_HTML:
        return html_to_lines(doc.body)
    return [line.strip() for line in doc.body.split("\n") if line.strip()]


@dataclass
class DocumentResult:
    """What `clean_document` returns for one document.

    rows: candidate sentence rows (the Parquet columns, `pipelines.io.parquet.SENTENCE_COLUMNS`),
        before the run-wide deduplication.
    tally: flat counts (`documents.read`, `sentences.dropped.<reason>`, ...; `pipelines.accounting`).
    errors: error records (`error_record`) for `errors/*.jsonl`.
    """

    rows: list[dict] = field(default_factory=list)      # candidate sentences (before deduplication)
    tally: Counter = field(default_factory=Counter)
    errors: list[dict] = field(default_factory=list)


def error_record(file: str, offset: int, reason: str, detail: str, **extra) -> dict:
    """One line of `errors/*.jsonl`: where (file, offset), why (reason), the detail (cut to 2,000
    characters) and `extra` fields such as doc_id and url."""
    return {"file": file, "offset": int(offset), "reason": reason, "detail": detail[:2000], **extra}


def clean_document(
    doc: Document,
    lid: LanguageIdentifier,
    config: CleanConfig,
    main_content_model=None,
) -> DocumentResult:
    """Lines, scores, language, sentences and filters for ONE document.

    This is `pipelines.text.bundle.clean_bundle` on a bundle of one. To clean many documents,
    give them to `clean_bundle` together (as labse-clean does, 256 at a time): the same results,
    and one page alone pays the fixed cost of the bundle's array operations (about 3.0 ms a page
    one at a time against 2.1 ms in bundles of 256, on the web-pages sample).

    Args:
        doc: a reader's `Document` (HTML from WARC, or text lines from WET / Wikipedia).
        lid: the language identifier (lid.176), loaded once and reused for every document.
        config: the stage's `CleanConfig` (thresholds and lengths).
        main_content_model: a loaded `MainContentModel` (see `pipelines.clean_transforms.
            load_main_content_model`), or None for the heuristic rules. Wikipedia text is
            main content whatever this is.

    Returns:
        A `DocumentResult`: candidate rows before deduplication, the tally, error records. It
        raises only on a bug (the Beam step turns an exception into one `processing_failed` error).

    Example:
        >>> from pipelines.io.documents import Document
        >>> from pipelines.text.langid import LanguageIdentifier
        >>> doc = Document(source="cc", url="http://example.com/", doc_id="d1", file="f.warc.gz",
        ...                offset=0, kind="html", lang=None,
        ...                body="<p>The council approved the new budget on Tuesday after a long debate.</p>")
        >>> result = clean_document(doc, LanguageIdentifier(), CleanConfig())
        >>> [(row["lang"], row["text"]) for row in result.rows]
        [('en', 'The council approved the new budget on Tuesday after a long debate.')]

    Counts go to `result.tally` (flat keys, see pipelines.accounting) in *sentence-level units*: a
    sentence of a line that passes main-content scoring, or a whole line that does not (one
    `sentences.dropped.main_content` unit, not split: splitting boilerplate only to count it was a
    large share of the work on boilerplate-heavy pages), or a whole `line_too_long` line. Every unit
    is `sentences.read` and ends as a candidate row, a `sentences.dropped.<reason>` or
    `sentences.errored`. The document's own outcome (kept or dropped) is settled after
    deduplication, except for documents without any candidate.
    """
    from pipelines.text.bundle import clean_bundle, prepare_document

    bundle = clean_bundle([prepare_document(doc, config, main_content_model)], lid, config)
    return DocumentResult(rows=bundle.rows(), tally=Counter(bundle.tallies[0]), errors=bundle.errors[0])
