"""The cleaning stage's logic for a bundle of documents at once, without Beam.

`clean_document` (pipelines.text.document) is what labse-clean does to one document; this module
does the same to many documents together, so that the work that is not per page runs once per
bundle: one lid.176 call for the lines of all documents, and the sentence filters, the dedup keys
and the accounting as array operations over all sentences. Only what needs the page (parsing the
HTML, extracting its lines, the main-content model's HTML feature) stays per document, in
`prepare_document`, which the Beam step calls as each document arrives so that a bundle holds lines,
not HTML.

The results are the same as `clean_document` on each document alone (a test compares them): the
candidate rows, the tally (flat counter names, see pipelines.accounting) and the error records of
every document. `clean_document` itself is `clean_bundle` on a bundle of one.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import chain
from typing import Sequence

import numpy as np

from pipelines.io.documents import KIND_HTML, SOURCE_WIKI, Document
from pipelines.text.document import CleanConfig, document_lines, error_record
from pipelines.text.boilerplate import heuristic_main_content_scores
from pipelines.text.filters import first_failures
from pipelines.text.html import parse_html, tree_to_lines
from pipelines.text.langid import decide_language
from pipelines.text.normalise import clean_text
from pipelines.text.sentences import split_sentences


@dataclass
class PreparedDocument:
    """A document with its lines, and its lines' main-content scores when the page was needed for
    them (the model's HTML feature); else `scores` is None and `clean_bundle` scores the lines."""

    doc: Document
    lines: list[str]
    scores: list[float] | None = None


def prepare_document(doc: Document, config: CleanConfig, main_content_model=None) -> PreparedDocument:
    """The per-page part of cleaning: lines, and with a model their scores (the page's parsed HTML
    feeds the model's HTML feature without a second parse). Raises only on a bug or a reader bug
    (the Beam step turns it into one `processing_failed` error)."""
    tree = None
    if doc.kind == KIND_HTML and doc.body:
        tree = parse_html(doc.body)  # once: the lines and the model's HTML feature share it
        lines = tree_to_lines(tree)
    else:
        lines = document_lines(doc)
    scores = None
    if lines and main_content_model is not None and doc.source != SOURCE_WIKI:
        max_line_chars = config.max_line_chars
        workable = [line for line in lines if len(line) <= max_line_chars]
        scores = _model_scores(main_content_model, workable, tree)
    return PreparedDocument(doc, lines, scores)


def _model_scores(model, lines: list[str], tree) -> list[float]:
    """P(main content) per line from the classifier; the page's parsed HTML, when there is one,
    feeds its HTML feature without a second parse (WET text has none)."""
    if tree is None:
        return model.score_lines(lines, html=None).tolist()
    from pipelines.main_content.model import html_main_flags

    return model.score_lines_with_flags(lines, html_main_flags(lines, tree)).tolist()


@dataclass
class BundleResult:
    """What `clean_bundle` returns for a bundle of documents.

    Candidate sentences (before the run-wide deduplication) as columns, one entry per sentence,
    in document order: `doc` (the document's index in the bundle), `text`, `lang`, `lang_score`,
    `position`, `main_content_score`; the other Parquet columns come from the document.
    Per document (lists indexed like the bundle): `tallies` (flat counts) and `errors`.
    """

    docs: list[Document]
    doc: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    lang: list[str] = field(default_factory=list)
    lang_score: list[float] = field(default_factory=list)
    position: list[int] = field(default_factory=list)
    main_content_score: list[float] = field(default_factory=list)
    tallies: list[Counter] = field(default_factory=list)
    errors: list[list[dict]] = field(default_factory=list)

    def rows(self) -> list[dict]:
        """The candidates as Parquet rows (`pipelines.io.parquet.SENTENCE_COLUMNS`)."""
        docs = self.docs
        return [
            {"text": text, "lang": lang, "lang_score": lang_score, "source": d.source, "url": d.url,
             "doc_id": d.doc_id, "position": position, "main_content_score": score, "file": d.file,
             "offset": d.offset}
            for d, text, lang, lang_score, position, score in zip(
                map(docs.__getitem__, self.doc), self.text, self.lang, self.lang_score, self.position,
                self.main_content_score)
        ]


# Whole-line outcomes of a line (one accounting unit each unless said otherwise).
_LINE_TOO_LONG, _MAIN_CONTENT, _SPLIT = 0, 1, 2


def clean_bundle(prepared: Sequence[PreparedDocument], lid, config: CleanConfig) -> BundleResult:
    """Main content, language, sentences and filters for the lines of many documents at once.

    Args:
        prepared: `prepare_document` of each document.
        lid: the language identifier (`LanguageIdentifier`); called once for the whole bundle.
        config: the stage's `CleanConfig`.

    Returns a `BundleResult`; per document the same rows, tally and errors as `clean_document`.
    It raises only on a bug (the Beam step then cleans the bundle's documents one at a time, so
    that only the document that fails becomes a `processing_failed` error).
    """
    docs = [p.doc for p in prepared]
    n_docs = len(docs)
    result = BundleResult(docs)
    result.tallies = tallies = [Counter({"documents.read": 1}) for _ in range(n_docs)]
    result.errors = errors = [[] for _ in range(n_docs)]

    max_line_chars = config.max_line_chars
    threshold = config.main_content_threshold
    min_chars = config.min_chars
    langid_threshold = config.langid_threshold

    # Every line of the bundle, flat; `line_doc` says whose.
    counts = np.fromiter((len(p.lines) for p in prepared), dtype=np.int64, count=n_docs)
    lines = list(chain.from_iterable(p.lines for p in prepared))
    n_lines = len(lines)
    line_doc = np.repeat(np.arange(n_docs, dtype=np.int64), counts)
    lengths = np.fromiter(map(len, lines), dtype=np.int64, count=n_lines)
    oversized = lengths > max_line_chars

    # Main-content scores of the workable lines (an oversized line has none: it is dropped unsplit).
    scores = np.full(n_lines, -1.0)
    starts = np.concatenate(([0], np.cumsum(counts)))
    for i, p in enumerate(prepared):
        if not p.lines:
            continue
        lo, hi = starts[i], starts[i + 1]
        big = oversized[lo:hi]
        if p.doc.source == SOURCE_WIKI:
            doc_scores = 1.0  # Wikipedia article text is main content by construction
        elif p.scores is not None:
            doc_scores = p.scores
        else:
            workable = [line for line, too_big in zip(p.lines, big) if not too_big] if big.any() else p.lines
            doc_scores = heuristic_main_content_scores(workable)
        if big.any():
            scores[lo:hi][~big] = doc_scores
        else:
            scores[lo:hi] = doc_scores

    main = ~oversized & ~(scores < threshold)  # (a NaN score is not below the threshold)
    # lid.176 only for lines that pass the main-content threshold and can hold a long enough
    # sentence: the others are dropped anyway, and on web pages they are most lines.
    wanted = np.flatnonzero(main & (scores >= threshold) & (lengths >= min_chars))
    predictions = lid.predict([lines[i] for i in wanted.tolist()])
    prediction_of = dict(zip(wanted.tolist(), predictions))

    # Accounting units per line: 1 for a whole-line outcome, else its number of sentences.
    units = np.ones(n_lines, dtype=np.int64)
    # Whole-line drops of main-content lines, as (line, reason, units).
    line_drops: list[tuple[int, str, int]] = []
    split_failed: list[int] = []
    # Candidate sentences: line, index in its line, text, decision.
    cand_line: list[int] = []
    cand_index: list[int] = []
    cand_text: list[str] = []
    cand_lang: list[str] = []
    cand_score: list[float] = []
    doc_lang = [d.lang for d in docs]
    for i in np.flatnonzero(main).tolist():
        line = lines[i]
        d = int(line_doc[i])
        known = doc_lang[d]
        prediction = prediction_of.get(i)
        if prediction is None:  # main content but shorter than min_chars: split only to count
            decision = None
            split_lang = known
        else:
            decision = decide_language(prediction[0], prediction[1], known, langid_threshold)
            split_lang = decision.lang or prediction[0]
        try:
            # Cleaned once per line: its sentences (stripped pieces of it) are then clean already.
            sentences = split_sentences(clean_text(line), split_lang)
        except Exception as exc:  # a splitter bug must cost one line, not the document
            split_failed.append(i)
            doc = docs[d]
            errors[d].append(error_record(doc.file, doc.offset, "sentence_split_failed",
                                          f"{type(exc).__name__}: {exc}", doc_id=doc.doc_id, url=doc.url))
            continue
        if not sentences:  # nothing visible was left after cleaning: one unit, too short
            line_drops.append((i, "too_short", 1))
            continue
        count = len(sentences)
        units[i] = count
        if decision is None:
            # Every sentence of a line shorter than min_chars is too short (cleaning only shrinks).
            line_drops.append((i, "too_short", count))
            continue
        if decision.drop_reason is not None:
            line_drops.append((i, decision.drop_reason, count))
            continue
        cand_line += [i] * count
        cand_index += range(count)
        cand_text += sentences
        cand_lang += [decision.lang] * count
        cand_score += [decision.score] * count

    # Positions: every unit (kept, dropped or errored) of a document advances its position by one.
    ends = np.cumsum(units)
    doc_base = np.concatenate(([0], ends))[starts[:-1]]  # units of the bundle before each document
    first_position = ends - units - doc_base[line_doc]
    units_per_doc = np.bincount(line_doc, weights=units, minlength=n_docs).astype(np.int64)

    # The filters run once over the bundle's sentences (page-wide tests of the rare rules).
    reasons = first_failures(cand_text, cand_lang, config.filters())

    dropped: list[Counter] = [Counter() for _ in range(n_docs)]
    for i in np.flatnonzero(oversized).tolist():
        dropped[int(line_doc[i])]["line_too_long"] += 1
    for i in np.flatnonzero(~oversized & ~main).tolist():
        dropped[int(line_doc[i])]["main_content"] += 1
    for i, reason, count in line_drops:
        dropped[int(line_doc[i])][reason] += count
    for i in split_failed:
        tallies[int(line_doc[i])]["sentences.errored"] += 1

    line_score = scores.tolist()
    positions = first_position.tolist()
    out_doc, out_text, out_lang, out_lang_score = result.doc, result.text, result.lang, result.lang_score
    out_position, out_score = result.position, result.main_content_score
    kept_per_doc = [0] * n_docs
    for line, index, text, lang, score, reason in zip(cand_line, cand_index, cand_text, cand_lang, cand_score, reasons):
        d = int(line_doc[line])
        if reason is not None:
            dropped[d][reason] += 1
            continue
        kept_per_doc[d] += 1
        out_doc.append(d)
        out_text.append(text)
        out_lang.append(lang)
        out_lang_score.append(score)
        out_position.append(positions[line] + index)
        out_score.append(line_score[line])

    for d in range(n_docs):
        tally = tallies[d]
        if not counts[d]:
            tally["documents.dropped.no_text"] += 1
            continue
        tally["sentences.read"] += int(units_per_doc[d])
        for reason, count in dropped[d].items():
            tally[f"sentences.dropped.{reason}"] += count
        if kept_per_doc[d]:
            tally["documents.with_candidates"] += 1
        else:
            tally["documents.dropped.no_sentences_kept"] += 1
    return result
