"""labse-report's options (RUN_ROOT is positional and added by the CLI; everything else is here)."""
from __future__ import annotations

from dataclasses import dataclass

from pipelines.io.config_options import option

DEFAULT_NAME = "report.html"


@dataclass
class ReportConfig:
    output: str | None = option(None, help=f"where to write the page, local or gs:// (default: RUN_ROOT/{DEFAULT_NAME})")
    title: str | None = option(None, help="the page's title (default: 'Run report: RUN_ROOT')")
    max_depth: int = option(6, help="how many folders below RUN_ROOT to look for stage outputs")

    def __post_init__(self):
        if self.max_depth < 0:
            raise ValueError(f"--max-depth must be >= 0, not {self.max_depth}")
