"""The cleaning stage's configuration: what `labse-clean` does to each document (one CLI option per field)."""
from __future__ import annotations

from dataclasses import dataclass

from pipelines.io.config_options import option
from pipelines.io.parquet import DEFAULT_ROWS_PER_FILE
from pipelines.main_content.config import MAIN_CONTENT_THRESHOLD
from pipelines.text.filters import FilterConfig
from pipelines.text.langid import DEFAULT_THRESHOLD


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
        "locally); without it, documented heuristic rules score lines (docs/reference/labse-clean.md)", metavar="PATH")
    main_content_fallback: float | None = option(
        None, "with --main-content-model: pages where at least this share of the words are in lines the model is "
        "unsure of (score within 0.1 of the threshold) are decided by trafilatura instead; the share of pages "
        "sent is in stats.json (docs/reference/labse-clean.md)", metavar="SHARE")
    main_content_teacher: bool = option(
        False, "trafilatura (the classifier's teacher) decides the main content of every HTML page, "
        "without a model (slower; text input is scored by the rules)")
    main_content_threshold: float = option(
        MAIN_CONTENT_THRESHOLD, "drop sentences whose line scores below this P(main content) (default %(default)s)")
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
        if self.main_content_fallback is not None and not (
                self.main_content_model and 0.0 <= self.main_content_fallback <= 1.0):
            problems.append("--main-content-fallback needs --main-content-model and a share between 0 and 1, got "
                            f"{self.main_content_fallback}")
        if self.main_content_teacher and self.main_content_model:
            problems.append("--main-content-teacher and --main-content-model exclude each other")
        if not 1 <= self.min_chars <= self.max_chars:
            problems.append(f"need 1 <= min_chars (--min-chars) <= max_chars (--max-chars), got {self.min_chars} "
                            f"and {self.max_chars}")
        problems += [f"{name} (--{name.replace('_', '-')}) must be at least 1, got {getattr(self, name)}"
                     for name in ("max_line_chars", "rows_per_file") if getattr(self, name) < 1]
        if problems:
            raise ValueError("; ".join(problems))

    def filters(self) -> FilterConfig:
        return FilterConfig(min_chars=self.min_chars, max_chars=self.max_chars)
