"""The cleaning stage's per-document logic, without Beam: one document in, candidate sentences,
a tally and error records out.

`clean_document(doc, lid, config)` is everything `labse-clean` does to ONE document (lines,
main-content scores, language, sentences, filters); the Beam transforms in
`pipelines.clean_transforms` only call it, count and deduplicate across documents. This module does
not import apache_beam (a test checks it), so it runs in a REPL, a benchmark or another framework.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from pipelines.io.config_options import option
from pipelines.io.documents import KIND_HTML, SOURCE_WIKI, Document
from pipelines.text.boilerplate import heuristic_main_content_scores
from pipelines.text.filters import FilterConfig, first_failures
from pipelines.text.html import html_to_lines, parse_html, tree_to_lines
from pipelines.text.langid import DEFAULT_THRESHOLD, LanguageDecision, LanguageIdentifier, decide_language
from pipelines.text.normalise import clean_text
from pipelines.text.sentences import split_sentences

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
