"""The report's pictures: matplotlib figures as embedded PNG data (no file beside the page, no network)."""
from __future__ import annotations

import base64
import io
from typing import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")  # no display; before pyplot is imported anywhere in the process
import matplotlib.pyplot as plt  # noqa: E402

WIDTH_INCHES = 8.0  # 800 px at DPI: fits a 1280 px window with the page's margins
DPI = 100
MAX_BARS = 40  # a chart of more bars is unreadable; the table beside it lists them all


def _png(figure) -> str:
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png", dpi=DPI)
    plt.close(figure)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def bars(values: Mapping[str, float], title: str, *, xlabel: str = "", log: bool = False) -> str:
    """Horizontal bars, largest on top (at most MAX_BARS, the rest summed as 'others')."""
    items = sorted(values.items(), key=lambda kv: (-kv[1], kv[0]))
    if len(items) > MAX_BARS:
        items = items[: MAX_BARS - 1] + [(f"{len(items) - MAX_BARS + 1} others", sum(v for _, v in items[MAX_BARS - 1:]))]
    figure, axes = plt.subplots(figsize=(WIDTH_INCHES, 1.0 + 0.25 * max(len(items), 1)))
    labels = [label for label, _ in items][::-1]
    axes.barh(labels, [value for _, value in items][::-1], color="#4c72b0")
    if log and any(value > 0 for _, value in items):
        axes.set_xscale("log")
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    return _png(figure)


def histogram(values: Sequence[float], title: str, *, xlabel: str, threshold: float | None = None,
              threshold_label: str = "threshold", bins: int = 50) -> str:
    """A histogram with the kept threshold drawn as a vertical line."""
    figure, axes = plt.subplots(figsize=(WIDTH_INCHES, 3.2))
    if len(values):
        axes.hist(values, bins=bins, color="#55a868")
    else:
        axes.text(0.5, 0.5, "no values", ha="center", va="center", transform=axes.transAxes)
    if threshold is not None:
        axes.axvline(threshold, color="#c44e52", linestyle="--", label=f"{threshold_label} {threshold:.3g}")
        axes.legend(loc="upper right")
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel("count")
    return _png(figure)


def curves(series: Mapping[str, tuple[Sequence[float], Sequence[float]]], title: str, *, xlabel: str = "step",
           ylabel: str = "") -> str:
    """Line plots of (x, y) series sharing one axis."""
    figure, axes = plt.subplots(figsize=(WIDTH_INCHES, 3.2))
    for name, (xs, ys) in series.items():
        axes.plot(xs, ys, label=name)
    if not series:
        axes.text(0.5, 0.5, "no values", ha="center", va="center", transform=axes.transAxes)
    elif len(series) > 1:
        axes.legend(loc="best")
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    return _png(figure)
