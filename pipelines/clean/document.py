"""The cleaning stage's per-document logic, without Beam: one document in, candidate sentences,
a tally and error records out.

`clean_document(doc, lid, config)` is everything `labse-clean` does to ONE document (lines,
main-content scores, language, sentences, filters). It is `pipelines.clean.bundle.clean_bundle` on a
bundle of one: the Beam transforms in `pipelines.clean.transforms` clean bundles of documents at once
(one lid.176 call, array operations over all their sentences) with the same results per document,
and count and deduplicate across documents. This module (and `bundle`) does not import apache_beam
(a test checks it), so it runs in a REPL, a benchmark or another framework.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from pipelines.clean.bundle import clean_bundle, prepare_document
from pipelines.clean.config import CleanConfig
from pipelines.io.documents import Document
from pipelines.text.langid import LanguageIdentifier


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


def clean_document(
    doc: Document,
    lid: LanguageIdentifier,
    config: CleanConfig,
    main_content_model=None,
) -> DocumentResult:
    """Lines, scores, language, sentences and filters for ONE document.

    This is `pipelines.clean.bundle.clean_bundle` on a bundle of one. To clean many documents,
    give them to `clean_bundle` together (as labse-clean does, 256 at a time): the same results,
    and one page alone pays the fixed cost of the bundle's array operations (about 3.0 ms a page
    one at a time against 2.1 ms in bundles of 256, on the web-pages sample).

    Args:
        doc: a reader's `Document` (HTML from WARC, or text lines from WET / Wikipedia).
        lid: the language identifier (lid.176), loaded once and reused for every document.
        config: the stage's `CleanConfig` (thresholds and lengths).
        main_content_model: a loaded `MainContentModel` (see `pipelines.clean.transforms.
            load_main_content_model`), or None for the heuristic rules (or, with
            `config.main_content_teacher`, trafilatura); `config.main_content_fallback` adds the
            fallback (pipelines.main_content.scoring). Wikipedia text is main content whatever this is.

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
    bundle = clean_bundle([prepare_document(doc, config, main_content_model)], lid, config)
    return DocumentResult(rows=bundle.rows(), tally=Counter(bundle.tallies[0]), errors=bundle.errors[0])
