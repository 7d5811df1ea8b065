"""labse-score's bounded threshold summary (issue 30 item 5): merges in any grouping, stays within its
size bound, and decides the threshold as the exact method does (exactly up to its exact limit; within a
stated tolerance from the histogram beyond it)."""
import pickle
from types import SimpleNamespace

import numpy as np
import pytest

from pipelines.score.calibration import fit_calibration
from pipelines.score.decision import decide_from_summary, decide_threshold, decision_statistic, margin_denominators
from pipelines.score.summary import DENOMINATOR_RANGE, LOG_LR_RANGE, PRODUCT_RANGE, ScoreSummary, SummaryRange
from tests.test_score import _synthetic_pool  # pairs shaped like a mined set's


def _summary(values, range_=LOG_LR_RANGE, exact_limit=100):
    return ScoreSummary(range_, exact_limit).add_all(values)


@pytest.mark.parametrize("n", [60, 1000])  # below and above the exact limit (100)
def test_merging_is_associative_and_order_free(n):
    values = np.random.default_rng(n).normal(0, 5, n).tolist()
    parts = [values[:n // 3], values[n // 3: n // 2], values[n // 2:]]
    left = _summary(parts[0]).merge(_summary(parts[1])).merge(_summary(parts[2]))
    right = _summary(parts[0]).merge(_summary(parts[1]).merge(_summary(parts[2])))
    shuffled = _summary(parts[2]).merge(_summary(parts[0])).merge(_summary(parts[1]))
    whole = _summary(values)
    assert left == right == shuffled == whole
    assert whole.is_exact == (n <= 100) and whole.count == n
    np.testing.assert_array_equal(left.points().values, whole.points().values)
    assert pickle.loads(pickle.dumps(left)) == left  # what Beam does between a combine's phases


def test_a_summary_holds_at_most_its_bound_whatever_the_count():
    summary = ScoreSummary(LOG_LR_RANGE)
    rng = np.random.default_rng(0)
    sizes = []
    for _ in range(20):
        summary.add_all(rng.normal(0, 8, 10_000).tolist())
        sizes.append(len(pickle.dumps(summary)))
    bound = 8 * max(summary.exact_limit, LOG_LR_RANGE.bins)
    assert summary.count == 200_000 and not summary.is_exact
    assert summary.nbytes <= bound
    assert max(sizes) <= bound + 1024 and max(sizes[2:]) - min(sizes[2:]) <= 16  # flat from the switch on
    # values outside the range land in the edge bins (counted, never lost)
    edges = _summary([-1e9, 1e9, float("inf"), float("-inf")] + [0.0] * 200)
    assert edges.count == 204 and edges.counts[0] == 2 and edges.counts[-1] == 2


def test_the_median_is_exact_below_the_limit_and_within_one_bin_above():
    values = np.random.default_rng(1).normal(0.55, 0.03, 5000)
    assert _summary(values, DENOMINATOR_RANGE, exact_limit=10_000).median() == float(np.median(values))
    assert abs(_summary(values, DENOMINATOR_RANGE).median() - np.median(values)) <= DENOMINATOR_RANGE.width
    assert _summary([], DENOMINATOR_RANGE).median() == 0.0


def test_merging_summaries_over_different_ranges_is_refused():
    with pytest.raises(ValueError, match="cannot merge"):
        _summary([1.0]).merge(_summary([1.0], SummaryRange(0.0, 1.0, 10)))


@pytest.fixture(scope="module")
def scorer():
    """A scorer's calibration (the decision reads nothing else), fitted on synthetic pools."""
    rng = np.random.default_rng(0)
    pools = [_synthetic_pool(1000, p, d, rng) for p in (0.1, 0.3, 0.6, 0.9) for d in (0.5, 0.55, 0.6)]
    return SimpleNamespace(calibration=fit_calibration(pools))


def _summarised_decision(scorer, components, keep, exact_limit, adapt):
    """The decision as labse-score's Beam steps make it: z from the denominators' summary, then the
    statistics under z summarised."""
    denominators = margin_denominators(scorer, "de-en", components[:, 2], components[:, 3])
    z = ScoreSummary(DENOMINATOR_RANGE, exact_limit).add_all(denominators).median() \
        if scorer.calibration is not None else None
    statistics = decision_statistic(scorer, "de-en", components, z)
    range_ = LOG_LR_RANGE if scorer.calibration is not None else PRODUCT_RANGE
    points = ScoreSummary(range_, exact_limit).add_all(statistics).points()
    keep_precision, keep_fraction, keep_best_f1 = keep
    return decide_from_summary("de-en", points, z, [], keep_precision, keep_fraction, scorer, keep_best_f1, adapt)


def _kept(scorer, components, decision):
    from pipelines.score.decision import calibrated_scores

    return calibrated_scores(scorer, components, decision) >= decision["threshold"]


KEEPS = {"precision": (0.8, None), "fraction": (None, 0.3), "best_f1": (None, None, True)}


@pytest.mark.parametrize("keep", sorted(KEEPS))
@pytest.mark.parametrize("calibrated", [True, False])
def test_the_threshold_agrees_with_the_exact_method(scorer, keep, calibrated):
    """Below the exact limit the summary's decision is the exact one (same threshold, same kept pairs);
    from the histogram (limit 0) the kept pairs differ from the exact method's by at most 0.5% of them
    and the share of good pairs by at most 0.002. (The set adaptation, the costly part, runs in the
    keep-precision case only.)"""
    scorer = scorer if calibrated else SimpleNamespace(calibration=None)
    adapt = keep == "precision"
    rng = np.random.default_rng(3)
    pool = _synthetic_pool(3000, 0.35, 0.56, rng)
    components = np.column_stack([pool["ranker"], pool["sanity"], pool["cosine"], pool["margin"]])
    keep_precision, keep_fraction, *best_f1 = KEEPS[keep]
    exact = decide_threshold("de-en", components, [], keep_precision, keep_fraction, scorer, bool(best_f1), adapt)
    args = (keep_precision, keep_fraction, bool(best_f1))
    same = _summarised_decision(scorer, components, args, exact_limit=20_000, adapt=adapt)
    assert same["threshold_summary"] == "exact"
    assert same["threshold"] == exact["threshold"] and same["kept_predicted"] == exact["kept_predicted"]
    assert same["estimated_good_share"] == exact["estimated_good_share"]
    histogram = _summarised_decision(scorer, components, args, exact_limit=0, adapt=adapt)
    assert histogram["threshold_summary"].startswith("histogram")
    kept_exact, kept_histogram = _kept(scorer, components, exact), _kept(scorer, components, histogram)
    assert kept_exact.sum() > 300
    assert (kept_exact != kept_histogram).sum() <= 0.005 * kept_exact.sum(), (kept_exact.sum(), kept_histogram.sum())
    assert histogram["kept_predicted"] == kept_histogram.sum()  # the cut falls at a bin edge: the count is exact
    assert histogram["estimated_good_share"] == pytest.approx(exact["estimated_good_share"], abs=0.002)
