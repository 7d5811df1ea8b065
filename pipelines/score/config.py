"""labse-score's configuration: which pairs each language pair keeps. Checked when built; each field
is also labse-score's option of the same name (`pipelines.io.config_options`); the three ways to
keep pairs exclude one another (the "keep" group)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from pipelines.io.config_options import option

# LaBSE's target precision, used when no way of keeping pairs is given.
DEFAULT_KEEP_PRECISION = 0.8


@dataclass(frozen=True)
class ScoreConfig:
    keep_precision: Optional[float] = option(
        None, "keep the most pairs whose precision reaches this (default 0.8, as in LaBSE)", group="keep")
    keep_fraction: Optional[float] = option(None, "keep this best fraction per language pair", group="keep")
    keep_best_f1: bool = option(
        False, "keep, per language pair, the pairs that maximise the expected F1 (from the probabilities)",
        group="keep")

    def __post_init__(self) -> None:
        problems = []
        if self.keep_precision is not None and not 0.0 < self.keep_precision <= 1.0:
            problems.append(f"--keep-precision must be in (0, 1], got {self.keep_precision}")
        if self.keep_fraction is not None and not 0.0 <= self.keep_fraction <= 1.0:
            problems.append(f"--keep-fraction must be in [0, 1], got {self.keep_fraction}")
        chosen = [name for name, given in (("--keep-precision", self.keep_precision is not None),
                                           ("--keep-fraction", self.keep_fraction is not None),
                                           ("--keep-best-f1", self.keep_best_f1)) if given]
        if len(chosen) > 1:
            problems.append(f"{' and '.join(chosen)} exclude one another: give one")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def target_precision(self) -> float | None:
        """The precision to reach: --keep-precision, or LaBSE's 0.8 when no other way is chosen."""
        if self.keep_precision is not None:
            return self.keep_precision
        return None if self.keep_fraction is not None or self.keep_best_f1 else DEFAULT_KEEP_PRECISION
