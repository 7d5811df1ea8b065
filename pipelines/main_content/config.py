"""labse-main-content's configuration: the teacher (trafilatura), `build-data` and `train`."""
from __future__ import annotations

from dataclasses import dataclass, field

from pipelines.io.config_options import CLI, not_an_option, option

# P(main content) at or above which a line is kept: labse-clean's --main-content-threshold (also for the
# heuristic rules' scores), and the threshold labse-main-content train and evaluate report metrics at.
MAIN_CONTENT_THRESHOLD = 0.5


@dataclass(frozen=True)
class TeacherConfig:
    """trafilatura settings for the teacher.

    Defaults: ``favor_precision=True``, with tables, without comments. Against the human main text
    of the 181 article pages in the shared data, precision mode scored the highest token F1 of the
    three modes, and so did the line labels derived from it (BENCHMARKS.md, section Main-content
    classifier, "Teacher choice"). A precise teacher matters more than a generous one here: a
    boilerplate line taught as main content leaks menus into every language's sentences. Comments
    are left out because user comments are not the page's main content.
    """

    favor_precision: bool = True
    favor_recall: bool = False
    include_comments: bool = False
    include_tables: bool = True
    # trafilatura's fast=True: without its second pass through its own fallback extractors
    # (readability, jusText), at about 55% of the CPU (labse-clean's fallback uses it).
    fast: bool = False


# How build-data labels lines (labels.py): a committee of four extractors, or trafilatura alone.
LABEL_SCHEMES = ("committee", "teacher")


@dataclass(frozen=True)
class BuildConfig:
    # Committee by default: against the human main text of the 181 article pages its line labels
    # score token F1 0.950 against 0.947 for trafilatura alone (BENCHMARKS.md, section "Main content
    # at the teacher's quality").
    labels: str = option("committee", "how lines are labelled: 'committee' (majority of trafilatura precision "
                         "and recall modes, resiliparse main content and jusText; tied lines are not trained "
                         "on) or 'teacher' (trafilatura alone) (default %(default)s)", choices=LABEL_SCHEMES)
    dev_fraction: float = option(0.1, "share of pages (by URL hash) in dev (default %(default)s)")
    test_fraction: float = option(0.1, "share of pages (by URL hash) in test (default %(default)s)")
    max_lines_per_page: int = option(200, "training examples kept per page at most (default %(default)s)")
    max_class_ratio: float = option(1.0, "per page, majority class kept at most this times the minority "
                                    "(default %(default)s)")
    max_lines_per_language: int = option(200_000, "training examples kept per language at most (default %(default)s)")
    # Share of training pages featurised WITHOUT the HTML feature, so the model also works on text
    # only (WET, Wikipedia). 0.25 keeps text-only quality at the level of a text-only model while
    # the HTML feature still helps where it is present (measured: BENCHMARKS.md).
    html_feature_dropout: float = option(0.25, "share of training pages featurised without the HTML feature, so "
                                         "the model also serves text-only input (default %(default)s)")
    # labse-main-content build-data sets it with --teacher-balanced (favor_precision off); the
    # 'teacher' scheme uses it, the committee runs trafilatura in precision and in recall mode
    teacher: TeacherConfig = field(default_factory=TeacherConfig, metadata={CLI: None})

    def __post_init__(self):
        problems = []
        if not 0.0 <= self.html_feature_dropout <= 1.0:
            problems.append("--html-feature-dropout must be in [0, 1]")
        for name in ("dev_fraction", "test_fraction"):
            if not 0.0 <= getattr(self, name) < 1.0:
                problems.append(f"--{name.replace('_', '-')} must be in [0, 1)")
        if self.dev_fraction + self.test_fraction >= 1.0:
            problems.append("--dev-fraction + --test-fraction must leave pages for training")
        if not 1.0 <= self.max_class_ratio < float("inf"):  # below 1 the majority would become the minority
            problems.append("--max-class-ratio must be a number >= 1")
        for name in ("max_lines_per_page", "max_lines_per_language"):
            if getattr(self, name) < 1:
                problems.append(f"--{name.replace('_', '-')} must be at least 1")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(frozen=True)
class MainContentTrainConfig:
    """fastText hyper-parameters. Small and fast: the features carry the signal, not a big embedding.

    word_ngrams=2: with 1, fasttext-numpy2 0.10 diverged ("Encountered NaN") at any learning rate
    on a small repetitive training file, and held-out quality was the same either way.
    """

    epoch: int = option(20, "default %(default)s")
    lr: float = option(0.2, "default %(default)s")
    dim: int = option(32, "default %(default)s")
    word_ngrams: int = option(2, "default %(default)s")
    bucket: int = option(100_000, "hash buckets for n-grams (default %(default)s)")
    min_count: int = not_an_option(1)
    threads: int = option(2, "default %(default)s")
    seed: int = option(0, "default %(default)s")
    quantize: bool = option(False, "write a quantized (much smaller) .ftz model")
    threshold: float = option(MAIN_CONTENT_THRESHOLD,
                              "decision threshold used for the reported metrics (default %(default)s)")

    def __post_init__(self):
        # Checked here so that library use is checked too; the CLI reports the ValueError in one line.
        problems = [f"{name} (--{name.replace('_', '-')}) must be at least 1, got {getattr(self, name)}"
                    for name in ("epoch", "dim", "word_ngrams", "bucket", "min_count", "threads")
                    if getattr(self, name) < 1]
        if not 0.0 < self.lr < float("inf"):
            problems.append(f"lr (--lr) must be a positive number, got {self.lr}")
        if not 0.0 <= self.threshold <= 1.0:
            problems.append(f"threshold (--threshold) must be between 0 and 1, got {self.threshold}")
        if problems:
            raise ValueError("; ".join(problems))

    def fasttext_args(self) -> dict:
        return {"epoch": self.epoch, "lr": self.lr, "dim": self.dim, "wordNgrams": self.word_ngrams,
                "bucket": self.bucket, "minCount": self.min_count, "thread": self.threads,
                "seed": self.seed, "loss": "softmax"}


@dataclass(frozen=True)
class MainContentEvaluateConfig:
    """How `labse-main-content evaluate` scores a model against the teacher (its options besides the
    model, the input and the JSON report's path)."""

    threshold: float = option(MAIN_CONTENT_THRESHOLD, "keep lines scoring at least this (default %(default)s)")
    text_only: bool = option(False, "score lines without the HTML feature (as for WET input)")
    limit: int | None = option(None, "evaluate at most this many HTML pages", metavar="LIMIT")

    def __post_init__(self):
        problems = []
        if not 0.0 <= self.threshold <= 1.0:
            problems.append(f"threshold (--threshold) must be between 0 and 1, got {self.threshold}")
        if self.limit is not None and self.limit < 1:
            problems.append(f"limit (--limit) must be at least 1, got {self.limit}")
        if problems:
            raise ValueError("; ".join(problems))
