"""Exponentially smoothed language weights (mBERT/LaBSE): p_l ∝ n_l^α.

A language with n_l words of the N in the corpus has the raw share q_l = n_l / N. Smoothing gives it
the share p_l = n_l^α / Σ_k n_k^α instead (α = 1: unchanged; α = 0: every language equal; LaBSE
uses 0.3). Its word counts are multiplied by p_l / q_l, so the weighted total stays N and a language
with 100x less data gets 100^(1-α) = 25x more weight per word at α = 0.3.
"""
from __future__ import annotations

from typing import Mapping

from pipelines.io.config_options import UsageError


def smoothed_shares(totals: Mapping[str, float], alpha: float) -> dict[str, float]:
    """p_l = n_l^α / Σ_k n_k^α for every language with a positive total."""
    if not 0.0 <= alpha <= 1.0:
        raise UsageError(f"smoothing exponent must be in [0, 1], got {alpha}")
    powered = {lang: float(n) ** alpha for lang, n in totals.items() if n > 0}
    norm = sum(powered.values())
    if norm <= 0:
        raise UsageError("no language has any words")
    return {lang: value / norm for lang, value in powered.items()}


def language_weights(totals: Mapping[str, float], alpha: float) -> dict[str, float]:
    """Factor for each language's counts, p_l / q_l, so that its weighted share becomes p_l."""
    shares = smoothed_shares(totals, alpha)
    grand_total = float(sum(n for n in totals.values() if n > 0))
    return {lang: shares[lang] / (totals[lang] / grand_total) for lang in shares}
