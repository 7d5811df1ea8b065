"""How `labse-clean` decides the main content of a page: one of three modes (pure Python, no Beam).

- **classifier** (``--main-content-model PATH``): the fastText model's P(main content) per line.
- **classifier with fallback** (``... --main-content-fallback SHARE``): the model's scores, except on
  pages where the model is unsure: when at least SHARE of the page's words are in lines scoring
  within ``FALLBACK_BAND`` of the decision threshold, the teacher (trafilatura) decides that page
  instead, run as ``FALLBACK_TEACHER`` (fast, recall mode), and a line it keeps that the model
  scored below ``FALLBACK_MODEL_FLOOR`` is still dropped. Only HTML pages can fall back (the
  teacher needs the HTML); text input keeps the model.
- **teacher** (``--main-content-teacher``): trafilatura decides every HTML page; text input (WET)
  is scored by the heuristic rules, as without a model.

The teacher's decision is turned into the same per-line scores as the model's, 1.0 for a line it
kept and 0.0 otherwise (``labels.label_lines``, the rule build-data labels with), so every mode
writes the same outputs: the same lines, sentences, languages and Parquet columns.
Each scored page says which mode decided it (``BY_*``); labse-clean counts them in stats.json
(``main_content``: pages per decider and the fallback share).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

from pipelines.main_content.config import TeacherConfig

logger = logging.getLogger(__name__)

BY_CLASSIFIER = "classifier"
BY_FALLBACK = "fallback"  # the classifier was unsure; the teacher decided
BY_TEACHER = "teacher"
FAILED = "_failed"  # suffix: trafilatura raised (teacher_failed, fallback_failed); the lines score 0, counted
# A line is uncertain when its score is within this of the decision threshold (0.4 to 0.6 around
# 0.5). With the fallback's teacher below, the band +-0.1 reaches token F1 0.94 on the 181 article
# pages sending the fewest pages (10% of them, 14% of the speed benchmark's pages, against 12% and
# 16% with +-0.2 at 0.939) (BENCHMARKS.md, section "Main content at the teacher's quality", "A
# cheaper fallback").
FALLBACK_BAND = 0.1
# The fallback's trafilatura: fast=True (without its second pass through readability and jusText)
# and favor_recall. On the 181 article pages this teacher alone scores the token F1 of the precise,
# full one (0.947) at about 55% of its CPU; in precision mode fast=True loses 0.019. A line it keeps
# that the model scores below FALLBACK_MODEL_FLOOR (sure boilerplate) is dropped: the model vetoes
# the teacher's recall-mode leaks, up to +0.003 F1 at the same pages sent (BENCHMARKS.md,
# section "Main content at the teacher's quality", "A cheaper fallback").
FALLBACK_TEACHER = TeacherConfig(favor_precision=False, favor_recall=True, fast=True)
FALLBACK_MODEL_FLOOR = 0.2


def uncertain_share(lines: Sequence[str], scores: Sequence[float], threshold: float = 0.5,
                    band: float = FALLBACK_BAND) -> float:
    """Share of the page's words in lines scoring in [threshold - band, threshold + band)."""
    total = uncertain = 0
    low, high = threshold - band, threshold + band
    for line, score in zip(lines, scores):
        words = line.count(" ") + 1
        total += words
        if low <= score < high:
            uncertain += words
    return uncertain / total if total else 0.0


def teacher_scores(lines: Sequence[str], html: str, config: TeacherConfig = TeacherConfig()) -> list[float]:
    """1.0 for each line trafilatura keeps, else 0.0 (the labelling rule of ``labels.line_is_kept``)."""
    from pipelines.main_content.labels import label_lines, teacher_extract

    return [1.0 if kept else 0.0 for kept in label_lines(lines, teacher_extract(html, config))]


@dataclass(frozen=True)
class MainContentScorer:
    """The mode labse-clean runs in: ``model`` (a ``MainContentModel``) or ``teacher``, and with a
    model optionally ``fallback``, the uncertain word share that sends a page to the teacher."""

    model: object | None = None
    fallback: float | None = None
    teacher: bool = False
    threshold: float = 0.5

    def __post_init__(self):
        if self.teacher and self.model is not None:
            raise ValueError("the teacher mode takes no main-content model")
        if self.fallback is not None and self.model is None:
            raise ValueError("a fallback needs a main-content model")
        if self.fallback is not None and not 0.0 <= self.fallback <= 1.0:
            raise ValueError(f"the fallback share must be between 0 and 1, got {self.fallback}")

    def score(self, lines: list[str], html: str | None, tree=None) -> tuple[list[float] | None, str | None]:
        """(scores per line, who decided) for ONE document's lines; (None, None) where this mode
        has nothing to say (teacher mode on text input: the rules score it). ``html``: the page's
        HTML, None for text input; ``tree``: its parsed resiliparse tree when the caller has one."""
        if self.teacher:
            return _teacher(lines, html, BY_TEACHER) if html else (None, None)
        scores = _model_scores(self.model, lines, html, tree)
        if (self.fallback is not None and html
                and uncertain_share(lines, scores, self.threshold) >= self.fallback):
            decided, by = _teacher(lines, html, BY_FALLBACK, FALLBACK_TEACHER)
            return [kept if score >= FALLBACK_MODEL_FLOOR else 0.0 for kept, score in zip(decided, scores)], by
        return scores, BY_CLASSIFIER


def _teacher(lines: list[str], html: str, by: str,
             config: TeacherConfig = TeacherConfig()) -> tuple[list[float], str]:
    try:
        return teacher_scores(lines, html, config), by
    except Exception:  # third-party code on arbitrary pages: the page's lines are dropped, counted
        logger.warning("trafilatura failed on a page; its lines score 0", exc_info=True)
        return [0.0] * len(lines), by + FAILED


def _model_scores(model, lines: list[str], html: str | None, tree) -> list[float]:
    """P(main content) per line from the classifier; the page's parsed HTML, when there is one,
    feeds its HTML feature without a second parse (WET text has none)."""
    if html is None:
        return model.score_lines(lines, html=None).tolist()
    from pipelines.main_content.model import html_main_flags

    return model.score_lines_with_flags(lines, html_main_flags(lines, tree if tree is not None else html)).tolist()
