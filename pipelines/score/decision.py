"""Each language pair's decision, without Beam: its share of good pairs, every pair's probability
under it, and the threshold (`decide_threshold`); `calibrated_scores` gives the `score` column from
the same function, so the threshold and the column cannot disagree. Used by labse-score's Beam steps,
`labse-eval mining` (`bucc.py`) and the benchmarks."""
from __future__ import annotations

from typing import Sequence

import numpy as np


def recalibrate(raw_scores, prior: float):
    """The scorer's probabilities (trained at a 0.5 prior) re-calibrated to the corpus' share of good pairs."""
    raw = np.clip(raw_scores, 1e-9, 1 - 1e-9)
    good, bad = raw * prior / 0.5, (1 - raw) * (1 - prior) / 0.5
    return good / (good + bad)


def calibrated_scores(scorer, components, decision: dict) -> np.ndarray:
    """P(good pair) of pairs given as rows of (ranker, sanity, cosine, margin), in the mined set that
    `decision` describes (its estimated share of good pairs and its statistic z). It and
    `decide_threshold` both end in `_probabilities`, so the threshold and the `score` column cannot
    disagree."""
    components = np.asarray(components, dtype=np.float64).reshape(-1, 4)
    ranker, sanity, cosine, margin = components.T
    prior = decision["estimated_good_share"]
    if scorer.calibration is None:  # a scorer trained before calibration existed
        return recalibrate(ranker * sanity, prior)
    calibration, _ = scorer.calibration.for_language_pair(decision["language_pair"])
    return _probabilities(calibration.log_likelihood_ratio(ranker, sanity, cosine, margin, decision["set_statistic"]),
                          decision)


def _probabilities(log_lr: np.ndarray, decision: dict) -> np.ndarray:
    """P(good pair) from the calibrated log LR under `decision`'s share and per-set map."""
    from pipelines.score.calibration import logit, sigmoid

    shift, scale = decision.get("log_lr_shift", 0.0), decision.get("log_lr_scale", 1.0)
    return sigmoid(logit(decision["estimated_good_share"]) + (log_lr - shift) / scale)


def decision_statistic(scorer, language_pair: str, components, z: float | None) -> np.ndarray:
    """Each pair's decision statistic, one number whose order is the order of the pairs' probabilities:
    its calibrated log LR under the set statistic `z`, or ranker x sanity for a scorer saved without
    a calibration (then `z` is unused)."""
    components = np.asarray(components, dtype=np.float64).reshape(-1, 4)
    if scorer.calibration is None:
        return components[:, 0] * components[:, 1]
    calibration, _ = scorer.calibration.for_language_pair(language_pair)
    return calibration.log_likelihood_ratio(*components.T, z)


def margin_denominators(scorer, language_pair: str, cosine, margin) -> np.ndarray:
    """The finite margin denominators whose median is the set statistic z (none without a calibration)."""
    from pipelines.score.calibration import margin_denominator

    if scorer.calibration is None:
        return np.zeros(0)
    calibration, _ = scorer.calibration.for_language_pair(language_pair)
    denominators = margin_denominator(cosine, margin, calibration.margin_kind)
    return denominators[np.isfinite(denominators)]


def decide_threshold(language_pair: str, components, ratings: Sequence[tuple[Sequence[float], int]],
                     keep_precision, keep_fraction, scorer, keep_best_f1: bool = False, adapt: bool = True) -> dict:
    """(language pair, (ranker, sanity, cosine, margin) of all its pairs, (those four, 0/1) of its rated
    pairs) -> its share of good pairs, calibration and threshold (`decide_from_summary` over every pair)."""
    from pipelines.score.summary import SummaryPoints

    components = np.asarray(components, dtype=np.float64).reshape(-1, 4)
    z = None if scorer.calibration is None else \
        scorer.calibration.for_language_pair(language_pair)[0].set_statistic(components[:, 2], components[:, 3])
    statistic = decision_statistic(scorer, language_pair, components, z)
    return decide_from_summary(language_pair, SummaryPoints.of(statistic), z, ratings, keep_precision, keep_fraction,
                               scorer, keep_best_f1, adapt)


def decide_from_summary(language_pair: str, points, z: float | None, ratings: Sequence[tuple[Sequence[float], int]],
                        keep_precision, keep_fraction, scorer, keep_best_f1: bool = False, adapt: bool = True) -> dict:
    """(language pair, its pairs' decision statistics as `summary.SummaryPoints`, its set statistic z,
    (ranker, sanity, cosine, margin, 0/1) of its rated pairs) -> its share of good pairs, calibration
    and threshold.

    The share of good pairs is estimated from all the pairs (no labels; `calibration.py`), after the
    log LR is adapted to the set's own distribution (`adapt_to_set`; `adapt=False` skips it, as before
    it existed), then every pair gets its probability under that share. With ratings (and no
    keep_fraction / keep_best_f1) the precision is measured on them; else it is expected from the
    probabilities. From a histogram (`points.weights`), each bin counts as its centre and the threshold
    is the probability at the lower edge of the last bin kept, so exactly the pairs of the bins kept
    reach it.
    """
    from dataclasses import replace

    from pipelines.score.calibration import adapt_to_set, estimate_share
    from pipelines.score.thresholds import (
        adapt_to_prior,
        threshold_for_expected_f1,
        threshold_for_fraction,
        threshold_for_precision,
    )

    values, weights = points.values, points.weights
    decision = {"language_pair": language_pair, "pairs": points.count, "threshold_summary": points.kind}
    if scorer.calibration is None:
        _, prior = adapt_to_prior(values, weights=weights)
        decision.update({"estimated_good_share": prior, "calibration": "uncalibrated scorer: EM on its product",
                         "train_prior": 0.5})

        def probability(statistic):
            return recalibrate(statistic, prior)
    else:
        calibration, name = scorer.calibration.for_language_pair(language_pair)
        # the set's own log LR distribution corrects an over-confident LR (shift, scale; no labels)
        shift, scale = adapt_to_set(values, calibration.reference, weights=weights) if adapt else (0.0, 1.0)
        _, prior = estimate_share((values - shift) / scale, weights)
        low, high = calibration.z_range
        decision.update({"estimated_good_share": prior, "calibration": name, "set_statistic": z,
                         "set_statistic_in_calibration_range": bool(low <= z <= high),
                         "log_lr_shift": shift, "log_lr_scale": scale})

        def probability(statistic):
            return _probabilities(statistic, decision)
    probabilities = probability(values)
    if keep_fraction is not None:
        threshold = threshold_for_fraction(probabilities, keep_fraction, weights)
    elif keep_best_f1:
        threshold = threshold_for_expected_f1(probabilities, weights)
    elif ratings:
        rated = calibrated_scores(scorer, [c for c, _ in ratings], decision)
        threshold = threshold_for_precision(rated, np.array([label for _, label in ratings]), keep_precision)
        decision["labelled_pairs"] = len(ratings)
    else:
        threshold = threshold_for_precision(probabilities, None, keep_precision, weights)
    if weights is not None and np.isfinite(threshold.value) and threshold.method != "precision:labelled":
        # cut at a bin edge: the lower edge of the last bin kept (a rated pair's probability is exact)
        kept_bins = probabilities >= threshold.value
        threshold = replace(threshold, value=float(np.min(probability(points.lower[kept_bins]))))
    decision.update(threshold.as_dict())
    # the kept count written to _stats.json is the number of rows written (see _finalise)
    decision["kept_predicted"] = decision.pop("kept")
    return decision
