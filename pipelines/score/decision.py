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


def decide_threshold(language_pair: str, components, ratings: Sequence[tuple[Sequence[float], int]],
                     keep_precision, keep_fraction, scorer, keep_best_f1: bool = False, adapt: bool = True) -> dict:
    """(language pair, (ranker, sanity, cosine, margin) of all its pairs, (those four, 0/1) of its rated
    pairs) -> its share of good pairs, calibration and threshold.

    The share of good pairs is estimated from all the pairs (no labels; `calibration.py`), after the
    log LR is adapted to the set's own distribution (`adapt_to_set`; `adapt=False` skips it, as before
    it existed), then every pair gets its probability under that share. With ratings (and no
    keep_fraction / keep_best_f1) the precision is measured on them; else it is expected from the
    probabilities.
    """
    from pipelines.score.calibration import adapt_to_set, estimate_share
    from pipelines.score.thresholds import (
        adapt_to_prior,
        threshold_for_expected_f1,
        threshold_for_fraction,
        threshold_for_precision,
    )

    components = np.asarray(components, dtype=np.float64).reshape(-1, 4)
    decision = {"language_pair": language_pair, "pairs": len(components)}
    if scorer.calibration is None:
        _, prior = adapt_to_prior(components[:, 0] * components[:, 1])
        decision.update({"estimated_good_share": prior, "calibration": "uncalibrated scorer: EM on its product",
                         "train_prior": 0.5})
        probabilities = calibrated_scores(scorer, components, decision)
    else:
        calibration, name = scorer.calibration.for_language_pair(language_pair)
        z = calibration.set_statistic(components[:, 2], components[:, 3])
        log_lr = calibration.log_likelihood_ratio(*components.T, z)
        # the set's own log LR distribution corrects an over-confident LR (shift, scale; no labels)
        shift, scale = adapt_to_set(log_lr, calibration.reference) if adapt else (0.0, 1.0)
        _, prior = estimate_share((log_lr - shift) / scale)
        low, high = calibration.z_range
        decision.update({"estimated_good_share": prior, "calibration": name, "set_statistic": z,
                         "set_statistic_in_calibration_range": bool(low <= z <= high),
                         "log_lr_shift": shift, "log_lr_scale": scale})
        probabilities = _probabilities(log_lr, decision)
    if keep_fraction is not None:
        threshold = threshold_for_fraction(probabilities, keep_fraction)
    elif keep_best_f1:
        threshold = threshold_for_expected_f1(probabilities)
    elif ratings:
        rated = calibrated_scores(scorer, [c for c, _ in ratings], decision)
        threshold = threshold_for_precision(rated, np.array([label for _, label in ratings]), keep_precision)
        decision["labelled_pairs"] = len(ratings)
    else:
        threshold = threshold_for_precision(probabilities, None, keep_precision)
    decision.update(threshold.as_dict())
    # the kept count written to _stats.json is the number of rows written (see _finalise)
    decision["kept_predicted"] = decision.pop("kept")
    return decision
