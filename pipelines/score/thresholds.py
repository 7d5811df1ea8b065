"""Score thresholds per language pair: keep a target fraction, reach a target precision, or
maximise the expected F1.

The precision target works from a labelled sample (labels 0/1 from raters, as in LaBSE, where the
threshold was set so that 80% of kept pairs were rated good) or, without one, from the scorer's
calibrated probabilities (`calibration.py`): the expected precision of the kept set is the mean
probability in it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class Threshold:
    value: float            # keep pairs with score >= value
    kept: int
    total: int
    estimated_precision: float | None
    method: str             # "fraction", "precision:labelled", "precision:expected", "f1:expected"

    def as_dict(self) -> dict:
        return {"threshold": self.value, "kept": self.kept, "total": self.total,
                "estimated_precision": self.estimated_precision, "method": self.method}


def _weights(scores: np.ndarray, weights: Sequence[float] | None) -> np.ndarray:
    """How many pairs each score stands for: one each, or a histogram bin's count."""
    return np.ones(len(scores)) if weights is None else np.asarray(weights, dtype=np.float64)


def threshold_for_fraction(scores: Sequence[float], fraction: float, weights: Sequence[float] | None = None) -> Threshold:
    """The threshold that keeps the best `fraction` of pairs (ties may keep slightly more).
    `weights`: how many pairs each score stands for (a histogram's counts; default one each)."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError("fraction must be within [0, 1]")
    scores = np.asarray(scores, dtype=np.float64)
    weights = _weights(scores, weights)
    total = int(round(weights.sum()))
    n_keep = int(round(fraction * total))
    if n_keep == 0:
        return Threshold(float("inf"), 0, total, None, "fraction")
    order = np.argsort(-scores, kind="stable")
    reached = int(np.searchsorted(np.cumsum(weights[order]), n_keep - 0.5))
    value = float(scores[order][min(reached, len(order) - 1)])
    return Threshold(value, int(round(weights[scores >= value].sum())), total, None, "fraction")


def threshold_for_precision(scores: Sequence[float], labels: Sequence[float] | None, target: float,
                            weights: Sequence[float] | None = None) -> Threshold:
    """The lowest threshold whose kept set reaches `target` precision (the most pairs kept).

    `labels` are 0/1 ratings for the same pairs; None uses the scores themselves as
    probabilities (expected precision). Returns an infinite threshold when no prefix reaches it.
    `weights`: how many pairs each score stands for (default one each).
    """
    scores = np.asarray(scores, dtype=np.float64)
    method = "precision:expected" if labels is None else "precision:labelled"
    goodness = scores if labels is None else np.asarray(labels, dtype=np.float64)
    if len(scores) == 0:
        return Threshold(float("inf"), 0, 0, None, method)
    weights = _weights(scores, weights)
    order = np.argsort(-scores, kind="stable")
    sorted_scores = scores[order]
    kept = np.cumsum(weights[order])
    precision = np.cumsum(goodness[order] * weights[order]) / kept
    # only cut between distinct scores: a threshold keeps every pair with an equal score
    boundary = np.append(sorted_scores[1:] < sorted_scores[:-1], True)
    ok = np.flatnonzero((precision >= target) & boundary)
    total = int(round(kept[-1]))
    if len(ok) == 0:
        return Threshold(float("inf"), 0, total, None, method)
    last = int(ok[-1])
    return Threshold(float(sorted_scores[last]), int(round(kept[last])), total, float(precision[last]), method)


def threshold_for_expected_f1(probabilities: Sequence[float], weights: Sequence[float] | None = None) -> Threshold:
    """The threshold whose kept set has the highest expected F1, from calibrated probabilities.

    Keeping the n most probable pairs, E[correct] = sum of their probabilities and E[good pairs in
    the set] = sum of all probabilities; F1 = 2 correct / (kept + good) is approximated by the ratio
    of those expectations (tight for sets of hundreds of pairs). `estimated_precision` is the
    expected precision of the kept set. Only cuts between distinct probabilities. `weights`: how
    many pairs each probability stands for (default one each).
    """
    p = np.asarray(probabilities, dtype=np.float64)
    weights = _weights(p, weights)
    total = int(round(weights.sum()))
    if len(p) == 0 or p.sum() <= 0:
        return Threshold(float("inf"), 0, total, None, "f1:expected")
    order = np.argsort(-p, kind="stable")
    sorted_p = p[order]
    correct = np.cumsum(sorted_p * weights[order])
    kept = np.cumsum(weights[order])
    f1 = 2 * correct / (kept + (p * weights).sum())
    boundary = np.append(sorted_p[1:] < sorted_p[:-1], True)
    best = int(np.flatnonzero(boundary)[np.argmax(f1[boundary])])
    return Threshold(float(sorted_p[best]), int(round(kept[best])), total, float(correct[best] / kept[best]),
                     "f1:expected")


def adapt_to_prior(probabilities: Sequence[float], train_prior: float = 0.5, iterations: int = 100,
                   tolerance: float = 1e-6, weights: Sequence[float] | None = None) -> tuple[np.ndarray, float]:
    """Re-calibrate classifier probabilities to the unknown share of good pairs in new data.

    The scorer is trained with balanced classes (prior 0.5), but the share of true pairs among
    mined candidates varies from one corpus and language pair to the next. The EM procedure of
    Saerens, Latinne & Decaestecker (2002) estimates the new prior from the unlabelled
    probabilities themselves and adjusts each probability by Bayes' rule. Returns (adjusted, prior).
    `weights`: how many pairs each probability stands for (default one each).
    """
    p = np.clip(np.asarray(probabilities, dtype=np.float64), 1e-9, 1 - 1e-9)
    if len(p) == 0:
        return p, train_prior
    prior = train_prior
    adjusted = p
    for _ in range(iterations):
        good = p * (prior / train_prior)
        bad = (1 - p) * ((1 - prior) / (1 - train_prior))
        adjusted = good / (good + bad)
        new_prior = float(adjusted.mean() if weights is None else np.average(adjusted, weights=weights))
        if abs(new_prior - prior) < tolerance:
            prior = new_prior
            break
        prior = new_prior
    return adjusted, prior
