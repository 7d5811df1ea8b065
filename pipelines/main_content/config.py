"""labse-main-content's configuration: the teacher (trafilatura), `build-data` and `train`."""
from __future__ import annotations

from dataclasses import dataclass, field


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


@dataclass(frozen=True)
class BuildConfig:
    dev_fraction: float = 0.1
    test_fraction: float = 0.1
    max_lines_per_page: int = 200
    max_class_ratio: float = 1.0
    max_lines_per_language: int = 200_000
    # Share of training pages featurised WITHOUT the HTML feature, so the model also works on text
    # only (WET, Wikipedia). 0.25 keeps text-only quality at the level of a text-only model while
    # the HTML feature still helps where it is present (measured: BENCHMARKS.md).
    html_feature_dropout: float = 0.25
    teacher: TeacherConfig = field(default_factory=TeacherConfig)


@dataclass(frozen=True)
class TrainConfig:
    """fastText hyper-parameters. Small and fast: the features carry the signal, not a big embedding.

    word_ngrams=2: with 1, fasttext-numpy2 0.10 diverged ("Encountered NaN") at any learning rate
    on a small repetitive training file, and held-out quality was the same either way.
    """

    epoch: int = 20
    lr: float = 0.2
    dim: int = 32
    word_ngrams: int = 2
    bucket: int = 100_000
    min_count: int = 1
    threads: int = 2
    seed: int = 0
    quantize: bool = False
    threshold: float = 0.5

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
