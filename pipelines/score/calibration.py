"""The keep threshold's probabilities: P(good pair) that holds on mined sets the scorer never saw.

`labse-score --keep-precision P` keeps the most pairs whose expected precision (the mean of their
probabilities) reaches P, so it is only as right as those probabilities on *this* mined set. Two
things differ from one mined set to the next, and both moved the old estimate (issue 14):

* the share of good pairs (the class prior): 60% of the mined pairs when a corpus is mostly
  parallel, 15% when most sentences have no partner;
* how pairs look: the more sentences a set holds, the denser every sentence's neighbourhood, the
  higher the kNN means in the margin's denominator and the lower a true pair's margin (Multi30k,
  de-en: mean margin of true pairs 1.33 among 1,000 distractors, 1.25 among 7,000). A calibration
  that ignores this under-estimates the good pairs of large sets and keeps too few.

The model (fitted by `labse-score train`, saved in scorer.json as `calibration`):

    log LR(pair; z) = log p(pair | good, z) / p(pair | bad, z) = w . phi(pair, z) + c0 + c1 * z
    phi = [logit ranker, logit sanity, margin, cosine, margin * z, cosine * z]   (standardised)
    z   = the median over the set's mined pairs of their margin denominator (kNN means)

It is fitted on *calibration pools* mined from parallel rows the scorer was not fitted on: true
pairs hidden among sentences whose partners are absent, at many sizes and shares (15 pools per
language pair by default), each mined exactly as `labse-mine` does (LASER `max`) and labelled by
the alignment. The fit is a logistic regression with one intercept per pool (fixed effects): each
pool's intercept absorbs its own prior, so `w` learns the likelihood ratio alone, not the pools'
mix of priors. A term in z alone is constant within a pool, so the intercepts absorb it too:
(pool intercept - logit(pool's share of good pairs)) is what is left of log LR per pool, and c0 +
c1 * z is its least-squares line over the pools.

On a mined set (per language pair) the share of good pairs pi is then the maximum-likelihood
weight of the two-component mixture whose component ratio is that LR — the fixed point of the EM
of Saerens, Latinne & Decaestecker (2002), pi = mean_i sigmoid(logit pi + log LR_i), found by
root finding (the likelihood is concave in pi, so the root is unique) — and each pair's
probability is sigmoid(logit pi + log LR_i). No label of the mined set is used.

Out of the calibration's domain (Tatoeba's short sentences, language pairs never calibrated) the log
LR comes out shifted and stretched: over-confident, so pi is over-estimated. Before the EM, the set's
log LRs are therefore mapped back, log LR = shift + scale * u, with (shift, scale) fitted on the set's
own log LR distribution against the calibration pools' per-class distributions (`adapt_to_set`,
`reference`); in the calibrated domain the map stays near the identity.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from pipelines.io.config_options import UsageError

PHI_NAMES = ("logit_ranker", "logit_sanity", "margin", "cosine", "margin*z", "cosine*z")
_EPS = 1e-9
# Calibration pools, as (true pairs, distractor sentences per side), for 13,000 held-out rows;
# scaled down proportionally when fewer rows are held out. Shares of good mined pairs 0.1-0.97,
# 750 to 7,500 sentences per side.
POOL_GRID = tuple((n_true, n_distractor) for n_true in (500, 1000, 2000)
                  for n_distractor in (250, 1000, 2000, 4000, 5500))
POOL_GRID_ROWS = 13_000
# adapt_to_set: quantiles kept per class, the kernel bandwidth over them (in log LR units), the prior sd of
# (shift, log scale) — chosen, with the clipping in adapt_to_set, on the benchmark's seed-13 sets only
# (BENCHMARKS.md, section mining; seed-14 sets reported apart) — and the most pairs one fit reads
REFERENCE_QUANTILES = 100
ADAPT_BANDWIDTH = 0.7
ADAPT_PRIOR_SD = (0.5, 0.5)
ADAPT_MAX_PAIRS = 20_000


class CalibrationError(UsageError):
    """A saved calibration is malformed (wrong shapes, non-finite numbers)."""


def logit(p) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), _EPS, 1 - _EPS)
    return np.log(p) - np.log1p(-p)


def sigmoid(x) -> np.ndarray:
    from scipy.special import expit

    return expit(np.asarray(x, dtype=np.float64))


def margin_denominator(cosine, margin, margin_kind: str) -> np.ndarray:
    """Each pair's (fwd_mean + bwd_mean) / 2, recovered from its cosine and margin."""
    cosine = np.asarray(cosine, dtype=np.float64)
    margin = np.asarray(margin, dtype=np.float64)
    if margin_kind == "ratio":
        return cosine / np.where(margin == 0, 1e-12, margin)
    if margin_kind == "distance":
        return cosine - margin
    return np.zeros_like(cosine)  # "absolute": margin is the cosine, no neighbourhood is recorded


def set_statistic(cosine, margin, margin_kind: str) -> float:
    """z of a mined set: the median margin denominator of its pairs (0.0 for an empty set)."""
    denominator = margin_denominator(cosine, margin, margin_kind)
    denominator = denominator[np.isfinite(denominator)]
    return float(np.median(denominator)) if len(denominator) else 0.0


def phi(ranker, sanity, cosine, margin, z: float) -> np.ndarray:
    cosine = np.asarray(cosine, dtype=np.float64)
    margin = np.asarray(margin, dtype=np.float64)
    return np.column_stack([logit(ranker), logit(sanity), margin, cosine, margin * z, cosine * z])


@dataclass
class Calibration:
    """log LR(pair; z) = ((phi - mean) / scale) . coef + offset + offset_z * z; see the module docstring."""

    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray
    offset: float
    offset_z: float = 0.0
    margin_kind: str = "ratio"
    z_range: tuple[float, float] = (0.0, 0.0)     # z of the calibration pools (for reporting)
    pools: list[dict] = field(default_factory=list)
    # language pair -> its own calibration (fitted on its pools only); others use this pooled one
    language_pairs: dict[str, "Calibration"] = field(default_factory=dict)
    # quantiles of the calibration pools' log LR, row 0 of their good pairs, row 1 of their bad pairs
    # (`adapt_to_set`); None for a calibration saved before it existed (then no per-set adaptation)
    reference: np.ndarray | None = None

    def for_language_pair(self, language_pair: str) -> tuple["Calibration", str]:
        """(the calibration for pairs of `language_pair`, its name: the language pair or "pooled")."""
        if language_pair in self.language_pairs:
            return self.language_pairs[language_pair], language_pair
        return self, "pooled"

    def set_statistic(self, cosine, margin) -> float:
        return set_statistic(cosine, margin, self.margin_kind)

    def log_likelihood_ratio(self, ranker, sanity, cosine, margin, z: float) -> np.ndarray:
        if len(np.atleast_1d(ranker)) == 0:
            return np.zeros(0)
        return ((phi(ranker, sanity, cosine, margin, z) - self.mean) / self.scale) @ self.coef + \
            self.offset + self.offset_z * z

    def to_dict(self) -> dict:
        payload = {"phi": list(PHI_NAMES), "mean": self.mean.tolist(), "scale": self.scale.tolist(),
                   "coef": self.coef.tolist(), "offset": self.offset, "offset_z": self.offset_z,
                   "margin": self.margin_kind, "z_range": list(self.z_range), "pools": self.pools}
        if self.reference is not None:
            payload["reference"] = self.reference.tolist()
        if self.language_pairs:
            payload["language_pairs"] = {lp: c.to_dict() for lp, c in sorted(self.language_pairs.items())}
        return payload

    @classmethod
    def from_dict(cls, payload: dict) -> "Calibration":
        try:
            if payload.get("phi") != list(PHI_NAMES):
                raise CalibrationError(f"calibration features {payload.get('phi')} != {list(PHI_NAMES)}")
            arrays = [np.asarray(payload[name], dtype=np.float64) for name in ("mean", "scale", "coef")]
            offset, offset_z = float(payload["offset"]), float(payload.get("offset_z", 0.0))
            z_range = tuple(float(v) for v in payload.get("z_range", (0.0, 0.0)))
        except (KeyError, TypeError, ValueError) as error:
            raise CalibrationError(f"malformed calibration: {error}") from error
        if any(a.shape != (len(PHI_NAMES),) for a in arrays):
            raise CalibrationError(f"calibration arrays do not match {len(PHI_NAMES)} features")
        if not all(np.isfinite(a).all() for a in arrays) or not np.isfinite([offset, offset_z]).all():
            raise CalibrationError("non-finite (NaN or infinite) calibration coefficients")
        if (arrays[1] == 0).any():
            raise CalibrationError("a calibration feature scale of 0 (division by zero)")
        language_pairs = payload.get("language_pairs", {})
        if not isinstance(language_pairs, dict):
            raise CalibrationError("malformed calibration: language_pairs is not an object")
        reference = payload.get("reference")
        if reference is not None:
            try:
                reference = np.asarray(reference, dtype=np.float64)
            except (TypeError, ValueError) as error:
                raise CalibrationError(f"malformed calibration reference: {error}") from error
            if reference.ndim != 2 or reference.shape[0] != 2 or not np.isfinite(reference).all():
                raise CalibrationError("calibration reference is not two rows of finite quantiles")
        return cls(*arrays, offset, offset_z, payload.get("margin", "ratio"), z_range, list(payload.get("pools", [])),
                   {str(lp): cls.from_dict(c) for lp, c in language_pairs.items()}, reference)


def estimate_share(log_lr: Sequence[float], weights: Sequence[float] | None = None) -> tuple[np.ndarray, float]:
    """(posteriors, share of good pairs) of a set whose pairs have these log likelihood ratios
    (`weights`: how many pairs each value stands for, as a `summary.ScoreSummary` histogram gives them).

    The share pi maximises sum_i log(pi * LR_i + 1 - pi), the likelihood of a two-component
    mixture with fixed component ratio LR_i; its stationary point is the Saerens et al. (2002) EM
    fixed point pi = mean_i sigmoid(logit pi + log LR_i). The likelihood is concave in pi, so
    that point is unique: it lies at 0 when mean(LR) <= 1 (the set holds no more good-looking
    pairs than chance), at 1 when mean(1 / LR) <= 1, and inside (0, 1) otherwise, where it is
    found by root finding on the derivative (computed without overflow or cancellation).
    """
    from scipy.optimize import brentq

    s = np.asarray(log_lr, dtype=np.float64)
    if len(s) == 0:
        return s.copy(), 0.0
    positive = s > 0
    exp_neg = np.exp(-np.abs(s))           # e^-|s|, never overflows

    def slope(a: float) -> float:
        """d/dpi of the mean log-likelihood at pi = sigmoid(a): mean (LR - 1) / (pi LR + 1 - pi)."""
        pi, rest = float(sigmoid(a)), float(sigmoid(-a))
        # s > 0: (1 - e^-s) / (pi + (1 - pi) e^-s);  s <= 0: (e^s - 1) / (pi e^s + 1 - pi)
        terms = np.where(positive, (1 - exp_neg) / (pi + rest * exp_neg), (exp_neg - 1) / (pi * exp_neg + rest))
        return float(terms.mean() if weights is None else np.average(terms, weights=weights))

    low, high = -40.0, 40.0                # shares from 4e-18 to 1 - 4e-18
    if slope(low) <= 0:
        a = -np.inf
    elif slope(high) >= 0:
        a = np.inf
    else:
        a = brentq(slope, low, high, xtol=1e-10, maxiter=500)
    if np.isinf(a):
        share = 0.0 if a < 0 else 1.0
        return np.full(len(s), share), share
    posteriors = sigmoid(a + s)
    return posteriors, float(sigmoid(a))


def fit_calibration(pools: Sequence[dict], margin_kind: str = "ratio", c: float = 1e3,
                    per_language_pair: bool = True, min_pools: int = 5) -> Calibration:
    """Fit the log-LR model on labelled calibration pools (fixed effects: one intercept per pool).

    Each pool is a dict with arrays `ranker`, `sanity`, `cosine`, `margin`, `label` (0/1), as
    mined; other keys are kept as the pool's description. Pools holding one class only inform
    nothing about the ratio and are left out. With `per_language_pair`, a language pair (the pools'
    `language_pair` key) with `min_pools` usable pools also gets a calibration of its own: the
    pooled fit leaves a per-language offset (measured: the pooled model under-estimated the share
    of good de-en pairs and over-estimated fr-en's by about 0.01 on their own pools); the pooled
    one serves language pairs the scorer was not calibrated on.
    """
    calibration = _fit_one(pools, margin_kind, c)
    if per_language_pair:
        by_pair: dict[str, list[dict]] = {}
        for pool in pools:
            if "language_pair" in pool and 0 < np.mean(pool["label"]) < 1:
                by_pair.setdefault(pool["language_pair"], []).append(pool)
        if len(by_pair) > 1:
            calibration.language_pairs = {lp: _fit_one(own, margin_kind, c) for lp, own in sorted(by_pair.items())
                                          if len(own) >= min_pools}
    return calibration


def _fit_one(pools: Sequence[dict], margin_kind: str, c: float) -> Calibration:
    from sklearn.linear_model import LogisticRegression

    usable = [p for p in pools if 0 < np.mean(p["label"]) < 1]
    if not usable:
        raise UsageError("no calibration pool holds both good and bad pairs")
    blocks, labels, owner, zs = [], [], [], []
    for k, pool in enumerate(usable):
        z = set_statistic(pool["cosine"], pool["margin"], margin_kind)
        zs.append(z)
        blocks.append(phi(pool["ranker"], pool["sanity"], pool["cosine"], pool["margin"], z))
        labels.append(np.asarray(pool["label"], dtype=int))
        owner.append(np.full(len(pool["label"]), k))
    features, y, owner = np.vstack(blocks), np.concatenate(labels), np.concatenate(owner)
    mean, scale = features.mean(axis=0), features.std(axis=0)
    scale[scale < 1e-9] = 1.0
    one_hot = np.zeros((len(y), len(usable)))
    one_hot[np.arange(len(y)), owner] = 1.0
    model = LogisticRegression(C=c, fit_intercept=False, max_iter=5000)
    model.fit(np.hstack([(features - mean) / scale, one_hot]), y)
    coef = model.coef_[0][: features.shape[1]].astype(np.float64)
    intercepts = model.coef_[0][features.shape[1]:]
    shares = np.array([np.mean(p["label"]) for p in usable])
    left = intercepts - logit(shares)   # per pool: log LR minus the phi part, which z alone may move
    zs_array = np.asarray(zs)
    if len(usable) > 2 and np.ptp(zs_array) > 1e-9:
        offset_z, offset = (float(v) for v in np.polyfit(zs_array, left, 1))
    else:
        offset_z, offset = 0.0, float(np.median(left))
    calibration = Calibration(mean, scale, coef, offset, offset_z, margin_kind, (float(min(zs)), float(max(zs))))
    log_lrs = []
    for pool, z in zip(usable, zs):
        log_lrs.append(calibration.log_likelihood_ratio(pool["ranker"], pool["sanity"], pool["cosine"],
                                                        pool["margin"], z))
        _, estimated = estimate_share(log_lrs[-1])
        described = {k: v for k, v in pool.items() if k not in ("ranker", "sanity", "cosine", "margin", "label")}
        calibration.pools.append({**described, "pairs": int(len(pool["label"])), "z": round(z, 5),
                                  "good_share": round(float(np.mean(pool["label"])), 4),
                                  "estimated_good_share": round(estimated, 4)})
    log_lr, good = np.concatenate(log_lrs), np.concatenate([np.asarray(p["label"]) == 1 for p in usable])
    calibration.reference = reference_quantiles(log_lr[good], log_lr[~good])
    return calibration


def reference_quantiles(good_log_lr, bad_log_lr, n: int = REFERENCE_QUANTILES) -> np.ndarray:
    """(2, n): evenly spaced quantiles of the log LR of good pairs (row 0) and bad pairs (row 1)."""
    levels = (np.arange(n) + 0.5) / n
    return np.vstack([np.quantile(np.asarray(good_log_lr, dtype=np.float64), levels),
                      np.quantile(np.asarray(bad_log_lr, dtype=np.float64), levels)])


def _log_density(u: np.ndarray, quantiles: np.ndarray, bandwidth: float) -> np.ndarray:
    """log of a Gaussian kernel density through the reference quantiles, at u."""
    from scipy.special import logsumexp

    d = (u[:, None] - quantiles[None, :]) / bandwidth
    return logsumexp(-0.5 * d * d, axis=1) - np.log(len(quantiles) * bandwidth * np.sqrt(2 * np.pi))


def adapt_to_set(log_lr: Sequence[float], reference: np.ndarray | None, prior_sd: tuple[float, float] = ADAPT_PRIOR_SD,
                 bandwidth: float = ADAPT_BANDWIDTH, max_pairs: int = ADAPT_MAX_PAIRS, seed: int = 0,
                 weights: Sequence[float] | None = None) -> tuple[float, float]:
    """(shift, scale) such that (log LR - shift) / scale is this set's log likelihood ratio; no labels used.

    The calibration pools give the distribution of log LR among good and among bad pairs in the domain
    the scorer was calibrated on (`reference`). On a set from elsewhere (short everyday sentences,
    a language pair never calibrated), the same scorer's log LRs come out shifted and stretched — the
    LR is over-confident. Model: the set's log LR is shift + scale * u, where u has the calibrated
    distributions, so its density is the two-component mixture
        (pi f_good((s - shift) / scale) + (1 - pi) f_bad((s - shift) / scale)) / scale
    and, since u is the calibrated log LR, each pair's probability is sigmoid(logit pi + u). (pi,
    shift, log scale) are fitted by maximum a posteriori on the set's own log LRs (Nelder-Mead), with
    Gaussian priors of sd `prior_sd` on shift and log scale centred on no change (0, 1): small sets
    with few bad (or good) pairs cannot identify the map alone. In the calibrated domain it stays near
    (0, 1). Only over-confidence is corrected: shift is clipped at 0 and scale at 1 from below.
    Returns (0.0, 1.0) without a reference or when the share of good pairs is estimated at 0 or 1
    (nothing to fit). At most `max_pairs` pairs (a fixed random sample) enter the fit. With
    `weights` (a histogram's bin centres and counts) every bin enters, its count as its weight, and
    the priors weigh as against min(pairs, max_pairs) pairs, as for a sample.
    """
    from scipy.optimize import minimize

    s = np.asarray(log_lr, dtype=np.float64)
    finite = np.isfinite(s)
    s = s[finite]
    if weights is not None:
        weights = np.asarray(weights, dtype=np.float64)[finite]
    if reference is None or (len(s) < 2 if weights is None else weights.sum() < 2):
        return 0.0, 1.0
    _, share = estimate_share(s, weights)
    if not 1e-3 < share < 1 - 1e-3:
        return 0.0, 1.0
    if weights is None and len(s) > max_pairs:
        s = np.random.default_rng(seed).choice(s, max_pairs, replace=False)
    pairs = len(s) if weights is None else min(float(weights.sum()), max_pairs)
    good_q, bad_q = np.asarray(reference[0]), np.asarray(reference[1])
    sd_shift, sd_log_scale = prior_sd

    def objective(theta: np.ndarray) -> float:
        a, shift, log_scale = theta
        u = (s - shift) / np.exp(log_scale)
        log_pi, log_rest = -np.logaddexp(0.0, -a), -np.logaddexp(0.0, a)
        mixture = np.logaddexp(log_pi + _log_density(u, good_q, bandwidth), log_rest + _log_density(u, bad_q, bandwidth))
        fit = mixture.mean() if weights is None else np.average(mixture, weights=weights)
        return float(-fit + log_scale + (0.5 * (shift / sd_shift) ** 2 + 0.5 * (log_scale / sd_log_scale) ** 2)
                     / pairs)

    fit = minimize(objective, np.array([float(logit(share)), 0.0, 0.0]), method="Nelder-Mead",
                   options={"xatol": 1e-4, "fatol": 1e-7, "maxiter": 2000})
    _, shift, log_scale = fit.x
    if not (fit.success or fit.status == 2) or not np.isfinite([shift, log_scale]).all():
        return 0.0, 1.0
    # only over-confidence is corrected: a fit that would make the LR more confident than calibrated
    # (shift < 0: towards good; scale < 1) is noise in the calibrated domain (measured on Multi30k sets:
    # shift -0.6 to +0.05, scale 0.94-1.14) and on small sets with few bad pairs
    return max(float(shift), 0.0), max(float(np.exp(log_scale)), 1.0)


def scaled_grid(rows: int, grid: Sequence[tuple[int, int]] = POOL_GRID, grid_rows: int = POOL_GRID_ROWS,
                min_true: int = 20) -> list[tuple[int, int]]:
    """The pool grid shrunk to `rows` held-out rows (each pool needs true + 2 * distractors rows)."""
    factor = min(1.0, rows / grid_rows)
    out = []
    for n_true, n_distractor in grid:
        t, d = int(n_true * factor), int(n_distractor * factor)
        if t >= min_true and t + 2 * d <= rows and (t, d) not in out:
            out.append((t, d))
    return out


# The fewest held-out rows that make a calibration pool (`labse-score train --calibration-rows`).
MIN_CALIBRATION_ROWS = next(rows for rows in range(1, POOL_GRID_ROWS + 1) if scaled_grid(rows))
