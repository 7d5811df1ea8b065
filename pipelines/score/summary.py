"""A bounded, mergeable summary of one number per pair, per language pair: what labse-score needs
to choose a threshold without holding every pair of a language pair in one worker.

labse-score's decision (`decision.py`) reads two statistics of a language pair's pairs: the median
margin denominator (the set statistic z) and the distribution of each pair's decision statistic
(its calibrated log LR, or ranker x sanity for a scorer saved without a calibration), from which
it estimates the share of good pairs, adapts the log LR to the set and picks the cut. Both are
summarised here in at most `exact_limit` values or `bins` counts, whatever the number of pairs:

* up to `exact_limit` values (20,000) the summary keeps them all, so the decision is exactly the
  one made from every pair (the demo's and the tests' language pairs);
* beyond that it becomes a histogram of `bins` fixed bins over [low, high] (values outside are
  counted in the edge bins). The decision then reads each bin as its centre weighted by its count
  and cuts only at bin edges: the threshold is the probability at the lower edge of the last bin
  kept, so rows compare against it exactly as before. `ScoreSummary.nbytes` bounds its memory.

Summaries merge in any order and grouping with the same result (counts add; exact values are
the same multiset), which is what Beam's `CombinePerKey` needs (`transforms.SummariseScores`).
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Iterable

import numpy as np

# Values a summary keeps exactly before it becomes a histogram: as many as `adapt_to_set` reads
# (calibration.ADAPT_MAX_PAIRS), so below it every input of the decision is the exact one.
EXACT_LIMIT = 20_000


@dataclass(frozen=True)
class SummaryRange:
    """The histogram's fixed bins: `bins` of equal width over [low, high]."""

    low: float
    high: float
    bins: int

    @property
    def width(self) -> float:
        return (self.high - self.low) / self.bins


# The calibrated log LR: beyond +-40 a pair's probability is 0 or 1 to 17 digits; bins of 0.005
# (a pair's probability moves by at most 0.00125 inside one).
LOG_LR_RANGE = SummaryRange(-40.0, 40.0, 16_000)
# ranker x sanity, a product of two probabilities (a scorer saved without a calibration)
PRODUCT_RANGE = SummaryRange(0.0, 1.0, 10_000)
# The margin denominator, a mean of cosines: z to within 1e-4
DENOMINATOR_RANGE = SummaryRange(-1.0, 1.0, 20_000)


class ScoreSummary:
    """Exact values up to `exact_limit`, else counts in `range_.bins` fixed bins."""

    __slots__ = ("range_", "exact_limit", "values", "counts", "count")

    def __init__(self, range_: SummaryRange, exact_limit: int = EXACT_LIMIT):
        self.range_, self.exact_limit = range_, exact_limit
        self.values: array | None = array("d")
        self.counts: np.ndarray | None = None
        self.count = 0

    @property
    def is_exact(self) -> bool:
        return self.counts is None

    @property
    def nbytes(self) -> int:
        """Bytes held by the values or counts: at most max(8 x exact_limit, 8 x bins)."""
        return self.values.itemsize * len(self.values) if self.is_exact else self.counts.nbytes

    def add(self, value: float) -> "ScoreSummary":
        if self.is_exact:
            self.values.append(value)
            self.count += 1
            if len(self.values) > self.exact_limit:
                self._to_histogram()
        else:
            self.counts[self._bin(value)] += 1
            self.count += 1
        return self

    def add_all(self, values: Iterable[float]) -> "ScoreSummary":
        for value in values:
            self.add(value)
        return self

    def merge(self, other: "ScoreSummary") -> "ScoreSummary":
        """This summary with `other` added (in place); both must have the same range."""
        if other.range_ != self.range_:
            raise ValueError(f"cannot merge summaries over {self.range_} and {other.range_}")
        if other.is_exact:
            return self.add_all(other.values)
        if self.is_exact:
            self._to_histogram()
        self.counts += other.counts
        self.count += other.count
        return self

    def _bin(self, value: float) -> int:
        position = (value - self.range_.low) / self.range_.width
        if not position >= 0:  # below the range (NaN too)
            return 0
        return int(position) if position < self.range_.bins else self.range_.bins - 1

    def _to_histogram(self) -> None:
        counts = np.zeros(self.range_.bins, dtype=np.int64)
        if len(self.values):
            raw = (np.frombuffer(self.values, dtype=np.float64) - self.range_.low) / self.range_.width
            np.add.at(counts, np.clip(np.nan_to_num(raw, nan=0.0), 0, self.range_.bins - 1).astype(np.int64), 1)
        self.counts, self.values = counts, None

    def points(self) -> "SummaryPoints":
        """The values the decision reads: every value (exact), or each non-empty bin's centre with its
        count as weight and its lower edge as the value a threshold at that bin takes."""
        if self.is_exact:
            values = np.frombuffer(self.values, dtype=np.float64).copy() if len(self.values) else np.zeros(0)
            return SummaryPoints(values, None, values, self.count, "exact")
        filled = np.flatnonzero(self.counts)
        lower = self.range_.low + filled * self.range_.width
        return SummaryPoints(lower + self.range_.width / 2, self.counts[filled].astype(np.float64), lower, self.count,
                             f"histogram: {self.range_.bins} bins of {self.range_.width:g} over "
                             f"[{self.range_.low:g}, {self.range_.high:g}]")

    def median(self) -> float:
        """The median (0.0 when empty): exact, or interpolated within its bin (within one bin width)."""
        if self.count == 0:
            return 0.0
        if self.is_exact:
            return float(np.median(np.frombuffer(self.values, dtype=np.float64)))
        cumulative = np.cumsum(self.counts)
        half = self.count / 2
        index = int(np.searchsorted(cumulative, half))
        before = cumulative[index - 1] if index else 0
        inside = (half - before) / self.counts[index]
        return float(self.range_.low + (index + inside) * self.range_.width)

    def __eq__(self, other) -> bool:
        if not isinstance(other, ScoreSummary) or (other.range_, other.count) != (self.range_, self.count):
            return False
        if self.is_exact != other.is_exact:
            return False
        if self.is_exact:
            return sorted(self.values) == sorted(other.values)
        return bool(np.array_equal(self.counts, other.counts))

    def __reduce__(self):  # Beam pickles accumulators between the combine's phases
        return _restore, (self.range_, self.exact_limit, self.values, self.counts, self.count)


def _restore(range_, exact_limit, values, counts, count) -> ScoreSummary:
    summary = ScoreSummary(range_, exact_limit)
    summary.values, summary.counts, summary.count = values, counts, count
    return summary


@dataclass(frozen=True)
class SummaryPoints:
    """Values (in the order added, or ascending bin centres) with their weights (None: one each) and, per value, the value a
    threshold placed there takes (the value itself, or its bin's lower edge)."""

    values: np.ndarray
    weights: np.ndarray | None
    lower: np.ndarray
    count: int
    kind: str  # "exact", or the histogram's bins

    @classmethod
    def of(cls, values) -> "SummaryPoints":
        values = np.asarray(values, dtype=np.float64)
        return cls(values, None, values, len(values), "exact")
