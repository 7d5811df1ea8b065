"""The cleaning stage's logic for a bundle of documents at once, without Beam.

`clean_document` (pipelines.clean.document) is what labse-clean does to one document; this module
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

from dataclasses import dataclass, field, replace
from itertools import chain, compress
from operator import itemgetter
from typing import Sequence

import numpy as np

from pipelines.io.documents import KIND_HTML, SOURCE_WIKI, Document
from pipelines.clean.config import CleanConfig
from pipelines.text.boilerplate import heuristic_scores_of_documents
from pipelines.text.filters import REASONS, first_failure_codes
from pipelines.text.html import html_to_lines, parse_html, tree_to_lines
from pipelines.text.langid import decide_languages
from pipelines.text.normalise import clean_text
from pipelines.text.sentences import split_sentences_many


def document_lines(doc: Document) -> list[str]:
    """The document's blocks, one per line: extracted from HTML, or the given text's lines."""
    if doc.kind == KIND_HTML:
        return html_to_lines(doc.body)
    return [line.strip() for line in doc.body.split("\n") if line.strip()]


def error_record(file: str, offset: int, reason: str, detail: str, **extra) -> dict:
    """One line of `errors/*.jsonl`: where (file, offset), why (reason), the detail (cut to 2,000
    characters) and `extra` fields such as doc_id and url."""
    return {"file": file, "offset": int(offset), "reason": reason, "detail": detail[:2000], **extra}


@dataclass
class PreparedDocument:
    """A document (without its body: a bundle holds lines, not pages) with its lines, and its
    lines' main-content scores when the page was needed for them (the model's HTML feature);
    else `scores` is None and `clean_bundle` scores the lines."""

    doc: Document
    lines: list[str]
    scores: list[float] | None = None
    main_content_by: str | None = None  # who gave `scores` (pipelines.main_content.scoring.BY_*)


def main_content_scorer(config: CleanConfig, main_content_model=None):
    """The `MainContentScorer` of the config's mode (classifier, with fallback, teacher), or None
    for the heuristic rules. `main_content_model`: the loaded model, or a scorer already built."""
    from pipelines.main_content.scoring import MainContentScorer

    if isinstance(main_content_model, MainContentScorer):
        return main_content_model
    if main_content_model is None and not config.main_content_teacher:
        return None
    return MainContentScorer(model=main_content_model, fallback=config.main_content_fallback,
                             teacher=config.main_content_teacher, threshold=config.main_content_threshold)


def prepare_document(doc: Document, config: CleanConfig, main_content_model=None) -> PreparedDocument:
    """The per-page part of cleaning: lines, and in the model or teacher modes their scores (the
    page's parsed HTML feeds the model's HTML feature without a second parse). `main_content_model`:
    a loaded `MainContentModel`, or the `main_content_scorer` of the run. Raises only on a bug or a
    reader bug (the Beam step turns it into one `processing_failed` error)."""
    tree = None
    if doc.kind == KIND_HTML and doc.body:
        tree = parse_html(doc.body)  # once: the lines and the model's HTML feature share it
        lines = tree_to_lines(tree)
    else:
        lines = document_lines(doc)
    scores = by = None
    scorer = main_content_scorer(config, main_content_model)
    if lines and scorer is not None and doc.source != SOURCE_WIKI:
        max_line_chars = config.max_line_chars
        workable = [line for line in lines if len(line) <= max_line_chars]
        scores, by = scorer.score(workable, doc.body if tree is not None else None, tree)
    return PreparedDocument(replace(doc, body=""), lines, scores, by)


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
    tallies: list[dict] = field(default_factory=list)
    errors: list[list[dict]] = field(default_factory=list)

    def row_tuples(self) -> list[tuple]:
        """The candidates as `pipelines.io.parquet.ROW_FIELDS` tuples (file, offset, doc_id,
        position, text, lang, lang_score, source, url, main_content_score)."""
        if not self.doc:
            return []
        take = itemgetter(*self.doc) if len(self.doc) > 1 else (lambda seq: (seq[self.doc[0]],))
        docs = self.docs
        files, offsets, doc_ids, sources, urls = (take([getattr(doc, name) for doc in docs])
                                                  for name in ("file", "offset", "doc_id", "source", "url"))
        return list(zip(files, offsets, doc_ids, self.position, self.text, self.lang, self.lang_score, sources,
                        urls, self.main_content_score))

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


# Drop reasons of whole lines, then the filters' (a reason's index is its column in the counts).
_LINE_REASONS = ("line_too_long", "main_content", "too_short", "langid_low_confidence", "langid_other_language")
_REASONS = _LINE_REASONS + tuple(reason for reason in REASONS if reason not in _LINE_REASONS)
_REASON_INDEX = {reason: i for i, reason in enumerate(_REASONS)}
_FILTER_REASON_INDEX = np.array([_REASON_INDEX[reason] for reason in REASONS], dtype=np.int64)
_DROPPED_KEYS = tuple(f"sentences.dropped.{reason}" for reason in _REASONS)


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
    result.errors = errors = [[] for _ in range(n_docs)]

    threshold = config.main_content_threshold
    min_chars = config.min_chars
    langid_threshold = config.langid_threshold

    # Every line of the bundle, flat; `line_doc` says whose, `bounds` where each document's start.
    counts = np.fromiter((len(p.lines) for p in prepared), dtype=np.int64, count=n_docs)
    bounds = np.zeros(n_docs + 1, dtype=np.int64)
    np.cumsum(counts, out=bounds[1:])
    lines = list(chain.from_iterable(p.lines for p in prepared))
    n_lines = len(lines)
    line_doc = np.repeat(np.arange(n_docs, dtype=np.int64), counts)
    lengths = np.fromiter(map(len, lines), dtype=np.int64, count=n_lines)
    oversized = lengths > config.max_line_chars  # dropped unsplit, without a score

    # Main-content scores of the workable lines: Wikipedia article text is main content by
    # construction, the model's scores came with the document, the rules score the rest at once.
    scores = np.full(n_lines, -1.0)
    wiki = np.fromiter((doc.source == SOURCE_WIKI for doc in docs), dtype=bool, count=n_docs)
    given = np.fromiter((p.scores is not None for p in prepared), dtype=bool, count=n_docs) & ~wiki
    workable = ~oversized
    scores[wiki[line_doc] & workable] = 1.0
    for d in np.flatnonzero(given).tolist():
        lo, hi = bounds[d], bounds[d + 1]
        scores[lo:hi][workable[lo:hi]] = prepared[d].scores
    ruled = ~wiki & ~given
    if ruled.any():
        at = np.flatnonzero(ruled[line_doc] & workable)
        ruled_lines = lines if len(at) == n_lines else [lines[i] for i in at.tolist()]
        ruled_bounds = np.zeros(n_docs + 1, dtype=np.int64)
        np.cumsum(np.bincount(line_doc[at], minlength=n_docs), out=ruled_bounds[1:])
        scores[at] = heuristic_scores_of_documents(ruled_lines, ruled_bounds)

    main = workable & ~(scores < threshold)  # (a NaN score is not below the threshold)
    # lid.176 only for lines that pass the main-content threshold and can hold a long enough
    # sentence: the others are dropped anyway, and on web pages they are most lines.
    wanted = np.flatnonzero(main & (scores >= threshold) & (lengths >= min_chars))
    prediction_at = np.full(n_lines, -1, dtype=np.int64)
    prediction_at[wanted] = np.arange(len(wanted))
    predictions = lid.predict([lines[i] for i in wanted.tolist()])

    # The language decision of each main-content line that lid.176 saw (None for a shorter one:
    # split only to count its sentences as too short), and the language its sentences are split in.
    main_lines = np.flatnonzero(main)
    main_doc = line_doc[main_lines].tolist()
    main_prediction = prediction_at[main_lines].tolist()
    doc_lang = [doc.lang for doc in docs]
    decided = iter(decide_languages(predictions, [doc_lang[d] for d in line_doc[wanted].tolist()], langid_threshold))
    # (lid.176 saw the main-content lines in order, so its decisions come in the order of these lines)
    decisions = [None if p < 0 else next(decided) for p in main_prediction]
    split_langs = [doc_lang[d] if decision is None else (decision[0] or predictions[p][0])
                   for d, p, decision in zip(main_doc, main_prediction, decisions)]
    # Cleaned once per line: its sentences (stripped pieces of it) are then clean already.
    split = split_sentences_many([clean_text(lines[i]) for i in main_lines.tolist()], split_langs)

    # Accounting units per line: 1 for a whole-line outcome, else its number of sentences.
    units = np.ones(n_lines, dtype=np.int64)
    drop_line: list[int] = []      # whole-line drops of main-content lines: line, reason, units
    drop_reason: list[int] = []
    drop_units: list[int] = []
    split_failed: list[int] = []
    kept_line: list[int] = []      # lines whose sentences go to the filters, and their sentences
    kept_count: list[int] = []
    kept_lang: list[str] = []
    kept_score: list[float] = []
    cand_text: list[str] = []
    too_short = _REASON_INDEX["too_short"]
    for i, d, decision, sentences in zip(main_lines.tolist(), main_doc, decisions, split):
        if isinstance(sentences, Exception):  # a splitter bug costs one line, not the document
            split_failed.append(d)
            doc = docs[d]
            errors[d].append(error_record(doc.file, doc.offset, "sentence_split_failed",
                                          f"{type(sentences).__name__}: {sentences}", doc_id=doc.doc_id, url=doc.url))
            continue
        count = len(sentences)
        if not count:  # nothing visible was left after cleaning: one unit, too short
            drop_line.append(i)
            drop_reason.append(too_short)
            drop_units.append(1)
            continue
        units[i] = count
        if decision is None or decision[2] is not None:
            # A line shorter than min_chars: every sentence is too short (cleaning only shrinks).
            drop_line.append(i)
            drop_reason.append(too_short if decision is None else _REASON_INDEX[decision[2]])
            drop_units.append(count)
            continue
        kept_line.append(i)
        kept_count.append(count)
        kept_lang.append(decision[0])
        kept_score.append(decision[1])
        cand_text += sentences

    # Positions: every unit (kept, dropped or errored) of a document advances its position by one.
    ends = np.cumsum(units)
    first_position = ends - units - np.concatenate(([0], ends))[bounds[:-1]][line_doc]

    # The filters run once over the bundle's sentences.
    cand_line = np.repeat(np.array(kept_line, dtype=np.int64), kept_count)
    cand_lang = np.repeat(np.array(kept_lang, dtype=object), kept_count).tolist()
    failure = first_failure_codes(cand_text, cand_lang, config.filters())
    keep = failure < 0

    # Drops per document and reason, from all the whole-line and per-sentence outcomes at once.
    n_reasons = len(_REASONS)
    drop_doc = np.concatenate((
        line_doc[oversized], line_doc[workable & ~main],
        line_doc[np.array(drop_line, dtype=np.int64)], line_doc[cand_line[~keep]]))
    drop_code = np.concatenate((
        np.full(int(oversized.sum()), _REASON_INDEX["line_too_long"]),
        np.full(int((workable & ~main).sum()), _REASON_INDEX["main_content"]),
        np.array(drop_reason, dtype=np.int64), _FILTER_REASON_INDEX[failure[~keep]]))
    drop_weight = np.concatenate((
        np.ones(int(oversized.sum()) + int((workable & ~main).sum()), dtype=np.int64),
        np.array(drop_units, dtype=np.int64), np.ones(int((~keep).sum()), dtype=np.int64)))
    dropped = np.bincount(drop_doc * n_reasons + drop_code, weights=drop_weight,
                          minlength=n_docs * n_reasons).astype(np.int64).reshape(n_docs, n_reasons)

    kept_at = np.flatnonzero(keep)
    kept_lines = cand_line[kept_at]
    result.doc = line_doc[kept_lines].tolist()
    result.text = list(compress(cand_text, keep.tolist()))
    result.lang = list(compress(cand_lang, keep.tolist()))
    result.lang_score = list(compress(np.repeat(np.array(kept_score), kept_count).tolist(), keep.tolist()))
    sentence_index = np.arange(len(cand_line)) - np.repeat(np.cumsum(kept_count) - kept_count, kept_count)
    result.position = (first_position[kept_lines] + sentence_index[kept_at]).tolist()
    result.main_content_score = scores[kept_lines].tolist()

    kept_per_doc = np.bincount(line_doc[kept_lines], minlength=n_docs).tolist()
    units_per_doc = np.bincount(line_doc, weights=units, minlength=n_docs).astype(np.int64).tolist()
    errored_per_doc = np.bincount(np.array(split_failed, dtype=np.int64), minlength=n_docs).tolist()
    tallies = result.tallies
    for d, (n, row) in enumerate(zip(counts.tolist(), dropped.tolist())):
        if not n:
            tallies.append({"documents.read": 1, "documents.dropped.no_text": 1})
            continue
        tally = {"documents.read": 1, "sentences.read": units_per_doc[d]}
        if prepared[d].main_content_by:
            tally[f"main_content.{prepared[d].main_content_by}"] = 1
        if errored_per_doc[d]:
            tally["sentences.errored"] = errored_per_doc[d]
        for key, count in zip(_DROPPED_KEYS, row):
            if count:
                tally[key] = count
        if kept_per_doc[d]:
            tally["documents.with_candidates"] = 1
        else:
            tally["documents.dropped.no_sentences_kept"] = 1
        tallies.append(tally)
    return result
