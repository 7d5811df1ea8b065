"""Quality of a main-content model against the teacher: line P/R/F1, agreement, kept-text token F1.

``labse-main-content evaluate --model model.bin --input 'PATTERN.warc.gz'`` labels every HTML page
of the input with the teacher (as ``build-data`` does) and reports how the model agrees with it.
The metric functions are shared by ``train`` (on the page-disjoint test split) and the benchmark.
"""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

import numpy as np

from pipelines.main_content.config import MAIN_CONTENT_THRESHOLD, TeacherConfig
from pipelines.main_content.labels import LabelledPage, label_page
from pipelines.main_content.page_types import PAGE_TYPES

logger = logging.getLogger(__name__)


def token_f1(predicted: str, truth: str) -> float:
    """F1 of the bags of whitespace tokens (the article-extraction-benchmark's measure)."""
    pred, true = Counter(predicted.split()), Counter(truth.split())
    if not pred and not true:
        return 1.0
    common = sum((pred & true).values())
    if not common:
        return 0.0
    precision, recall = common / sum(pred.values()), common / sum(true.values())
    return 2 * precision * recall / (precision + recall)


@dataclass
class LineMetrics:
    """Confusion counts of line decisions vs the teacher, with "main content" as the positive class."""

    tp: int = 0
    fp: int = 0
    fn: int = 0
    tn: int = 0
    page_f1: list[float] = field(default_factory=list)  # kept text vs teacher text, per page

    def add(self, predicted: Sequence[bool], truth: Sequence[bool]) -> None:
        p, t = np.asarray(predicted, dtype=bool), np.asarray(truth, dtype=bool)
        self.tp += int((p & t).sum())
        self.fp += int((p & ~t).sum())
        self.fn += int((~p & t).sum())
        self.tn += int((~p & ~t).sum())

    def summary(self) -> dict:
        precision = self.tp / (self.tp + self.fp) if self.tp + self.fp else 0.0
        recall = self.tp / (self.tp + self.fn) if self.tp + self.fn else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        total = self.tp + self.fp + self.fn + self.tn
        return {
            "lines": total,
            "pages": len(self.page_f1),
            "precision": round(precision, 4),
            "recall": round(recall, 4),
            "f1": round(f1, 4),
            "agreement": round((self.tp + self.tn) / total, 4) if total else 0.0,
            "kept_text_token_f1_vs_teacher": round(float(np.mean(self.page_f1)), 4) if self.page_f1 else 0.0,
        }


def evaluate_pages(model, pages: Iterable[LabelledPage], threshold: float = MAIN_CONTENT_THRESHOLD,
                   use_html: bool = True) -> dict:
    """Model decisions (``score >= threshold``) vs the labels, over pages with lines; the same
    metrics per page type (``per_page_type``, for pages that know theirs: ``page_types``).

    ``use_html=False`` scores the lines alone, as for WET input.
    """
    metrics = LineMetrics()
    per_type: dict[str, LineMetrics] = {}
    for page in pages:
        if not page.lines:
            continue
        keep = model.score_lines_with_flags(page.lines, page.html_main if use_html else None) >= threshold
        kept = "\n".join(line for line, k in zip(page.lines, keep) if k)
        page_f1 = token_f1(kept, page.teacher_text)
        for into in (metrics, per_type.setdefault(page.page_type, LineMetrics()) if page.page_type else None):
            if into is not None:
                into.add(keep, page.labels)
                into.page_f1.append(page_f1)
    summary = metrics.summary()
    if per_type:
        summary["per_page_type"] = {kind: per_type[kind].summary() for kind in PAGE_TYPES if kind in per_type}
    return summary


MIN_PAGES_TO_SCORE = 20  # below this a page-level F1 moves by several points with each page


def small_split_warnings(report: dict) -> list[str]:
    """A line for each evaluated split of a training report with too few pages for its scores to mean much."""
    return [f"the {split} split has only {report[split]['pages']} pages (< {MIN_PAGES_TO_SCORE}): its scores "
            "are too noisy to compare models; give build-data more labelled pages"
            for split in ("dev", "test") if split in report and report[split]["pages"] < MIN_PAGES_TO_SCORE]


def format_metrics(name: str, summary: dict) -> str:
    """One line for the whole set, then one indented line per page type when the summary has them."""
    text = (f"{name}: P {summary['precision']:.3f} R {summary['recall']:.3f} F1 {summary['f1']:.3f} "
            f"agreement {summary['agreement']:.3f} kept-text token F1 {summary['kept_text_token_f1_vs_teacher']:.3f} "
            f"({summary['lines']} lines, {summary['pages']} pages)")
    for kind, per_type in summary.get("per_page_type", {}).items():
        text += "\n" + format_metrics(f"  {kind}", per_type)
    return text


def labelled_pages_from_warc(pattern: str, teacher: TeacherConfig = TeacherConfig(),
                             limit: int | None = None, stats: Counter | None = None,
                             scheme: str = "committee") -> Iterator[LabelledPage]:
    """Labelled HTML pages (``scheme``: labels.label_page) of every WARC file matching ``pattern``
    (no Beam: a small job)."""
    from pipelines.io.documents import Document, Dropped, KIND_HTML
    from pipelines.read.readers import check_pattern_matches, read_records

    stats = stats if stats is not None else Counter()
    seen = 0
    for path in check_pattern_matches(pattern):
        for record in read_records(path, "warc"):
            if isinstance(record, Document) and record.kind == KIND_HTML:
                page = label_page(record.url, record.body, teacher, scheme)
                if not page.lines:
                    stats["documents.dropped.no_lines"] += 1
                    continue
                stats["documents.kept"] += 1
                yield page
                seen += 1
                if limit is not None and seen >= limit:
                    return
            elif isinstance(record, Document):
                stats["documents.dropped.not_html"] += 1
            elif isinstance(record, Dropped):
                stats[f"documents.dropped.{record.reason}"] += 1
            else:
                stats[f"documents.errored.{record.reason}"] += 1


def html_pages(pattern: str) -> list[tuple[str, str]]:
    """(url, html) of every HTML response in the WARC files matching ``pattern``."""
    from pipelines.io.documents import KIND_HTML, Document
    from pipelines.read.readers import check_pattern_matches, read_records

    return [(record.url, record.body) for path in check_pattern_matches(pattern)
            for record in read_records(path, "warc")
            if isinstance(record, Document) and record.kind == KIND_HTML]


def model_kept_text(model, html: str, threshold: float = MAIN_CONTENT_THRESHOLD, use_html: bool = True) -> str:
    """The text kept from a page with this model: html_to_lines, scored (with the HTML feature
    unless ``use_html=False``), thresholded."""
    from pipelines.text.html import html_to_lines

    lines = html_to_lines(html)
    if not lines:
        return ""
    scores = model.score_lines(lines, html=html if use_html else None)
    return "\n".join(line for line, score in zip(lines, scores) if score >= threshold)


def mean_token_f1_vs_truth(extract, pages: Iterable[tuple[str, str]], truth: dict[str, str]) -> tuple[float, int]:
    """Mean token F1 of ``extract(html)`` vs the human main text, over pages that have one."""
    scores = [token_f1(extract(html) or "", truth[url]) for url, html in pages if url in truth]
    return (float(np.mean(scores)) if scores else 0.0), len(scores)
