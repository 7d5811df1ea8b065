"""Margin scoring, strategies, sharded search and thresholds: pure functions, no Beam."""
import numpy as np
import pytest

from pipelines.mine.margin import (MarginConfig, best_threshold_f1, greedy_unique, margin_scores, mine, neighbours,
                                   precision_recall_f1)
from pipelines.mine.search import SearchConfig, knn, merge_topk, recall_at_1, sharded_knn
from pipelines.score.thresholds import adapt_to_prior, threshold_for_fraction, threshold_for_precision

# x0=(1,0) x1=(0,1); y0=(1,0) y1=(0.6,0.8): cos(x0,y0)=1, cos(x0,y1)=.6, cos(x1,y0)=0, cos(x1,y1)=.8
X = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
Y = np.array([[1.0, 0.0], [0.6, 0.8]], dtype=np.float32)


def test_knn_means_match_hand_computation():
    nn = neighbours(X, Y, k=2)
    np.testing.assert_allclose(nn.fwd_mean, [0.8, 0.4], atol=1e-6)   # (1+.6)/2, (0+.8)/2
    np.testing.assert_allclose(nn.bwd_mean, [0.5, 0.7], atol=1e-6)   # (1+0)/2, (.6+.8)/2


@pytest.mark.parametrize("margin, expected", [
    # denominators (fwd+bwd)/2: x0y0 .65, x0y1 .75, x1y0 .45, x1y1 .55
    ("ratio", [[1 / 0.65, 0.6 / 0.75], [0.0, 0.8 / 0.55]]),
    ("distance", [[1 - 0.65, 0.6 - 0.75], [0 - 0.45, 0.8 - 0.55]]),
    ("absolute", [[1.0, 0.6], [0.0, 0.8]]),
])
def test_margin_values_match_hand_computation(margin, expected):
    cos = X @ Y.T
    got = margin_scores(cos, np.array([0.8, 0.4])[:, None], np.array([0.5, 0.7])[None, :], margin)
    np.testing.assert_allclose(got, expected, atol=1e-6)


@pytest.mark.parametrize("strategy", ["max", "intersect", "fwd", "bwd"])
def test_mine_on_hand_example(strategy):
    pairs = mine(X, Y, MarginConfig(k=2, margin_kind="ratio", strategy=strategy))
    got = sorted(zip(pairs.src.tolist(), pairs.tgt.tolist()))
    assert got == [(0, 0), (1, 1)]
    by_pair = {(int(s), int(t)): m for s, t, m in zip(pairs.src, pairs.tgt, pairs.margin)}
    assert by_pair[(0, 0)] == pytest.approx(1 / 0.65) and by_pair[(1, 1)] == pytest.approx(0.8 / 0.55)


def test_strategies_differ_when_two_sources_want_one_target():
    # both sources' best target is y0; y1 is nobody's first choice
    x = np.array([[1.0, 0.0], [0.8, 0.6]], dtype=np.float32)
    y = np.array([[0.96, 0.28], [0.0, 1.0]], dtype=np.float32)
    fwd = mine(x, y, MarginConfig(k=1, strategy="fwd"))
    assert fwd.tgt.tolist() == [0, 0]                                  # fwd may reuse a target
    maxed = mine(x, y, MarginConfig(k=1, strategy="max"))
    assert len(set(maxed.tgt.tolist())) == len(maxed)                  # max never does
    inter = mine(x, y, MarginConfig(k=1, strategy="intersect"))
    assert len(inter) == 1


def test_max_never_uses_a_sentence_twice_on_random_vectors():
    rng = np.random.default_rng(0)
    for n_src, n_tgt in ((50, 80), (80, 50), (64, 64)):
        x = rng.standard_normal((n_src, 16)).astype(np.float32)
        y = rng.standard_normal((n_tgt, 16)).astype(np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        y /= np.linalg.norm(y, axis=1, keepdims=True)
        pairs = mine(x, y, MarginConfig(k=4, strategy="max"))
        assert len(set(pairs.src.tolist())) == len(pairs) == len(set(pairs.tgt.tolist()))
        assert len(pairs) >= min(n_src, n_tgt) // 2
        assert np.all(np.diff(pairs.margin) <= 1e-12)                   # greedy: best first


def test_greedy_unique_is_order_independent():
    candidates = [(0.9, "a", "x"), (0.9, "b", "x"), (0.8, "a", "y"), (0.5, "b", "y")]
    assert greedy_unique(candidates) == greedy_unique(list(reversed(candidates))) == [
        (0.9, "a", "x"), (0.5, "b", "y")]


def test_empty_and_one_sided_inputs():
    empty = np.zeros((0, 2), np.float32)
    for x, y in ((empty, Y), (X, empty), (empty, empty)):
        for strategy in ("max", "intersect", "fwd", "bwd"):
            assert len(mine(x, y, MarginConfig(strategy=strategy))) == 0
    sims, ids = knn(X, empty, 4)
    assert sims.shape == (2, 0) and ids.shape == (2, 0)


def test_k_larger_than_the_other_side():
    pairs = mine(X, Y[:1], MarginConfig(k=4, strategy="max"))
    assert pairs.src.tolist() == [0] and pairs.tgt.tolist() == [0]


def test_sharded_search_equals_exact_search():
    rng = np.random.default_rng(1)
    base = rng.standard_normal((300, 32)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    queries = base[:40] + 0.1 * rng.standard_normal((40, 32)).astype(np.float32)
    exact_sims, exact_ids = knn(queries, base, 5, SearchConfig(method="exact"))
    shard_sims, shard_ids = sharded_knn(queries, [base[:100], base[100:130], base[130:]], 5)
    np.testing.assert_array_equal(shard_ids, exact_ids)
    np.testing.assert_allclose(shard_sims, exact_sims, atol=1e-6)
    merged_sims, _ = merge_topk([(exact_sims[:, :2], exact_ids[:, :2]), (exact_sims[:, 2:], exact_ids[:, 2:])], 3)
    np.testing.assert_allclose(merged_sims, exact_sims[:, :3], atol=1e-6)


@pytest.mark.parametrize("method", ["ivf", "hnsw"])
def test_approximate_indexes_find_clustered_neighbours(method):
    rng = np.random.default_rng(2)
    centres = rng.standard_normal((20, 32)).astype(np.float32)
    base = np.repeat(centres, 100, axis=0) + 0.3 * rng.standard_normal((2000, 32)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    queries = base[::10] + 0.05 * rng.standard_normal((200, 32)).astype(np.float32)
    _, exact_ids = knn(queries, base, 1, SearchConfig(method="exact"))
    _, approx_ids = knn(queries, base, 1, SearchConfig(method=method, nprobe=8))
    assert recall_at_1(approx_ids, exact_ids) > 0.9


def test_precision_recall_and_oracle_threshold():
    gold = {(0, 0), (1, 1), (2, 2)}
    assert precision_recall_f1([(0, 0), (1, 2)], gold) == pytest.approx(
        {"precision": 0.5, "recall": 1 / 3, "f1": 0.4, "predicted": 2, "correct": 1, "gold": 3})
    x = np.eye(3, dtype=np.float32)
    pairs = mine(x, x, MarginConfig(k=1, strategy="max"))
    threshold, scores = best_threshold_f1(pairs, gold)
    assert scores["f1"] == 1.0 and np.isfinite(threshold)


def test_threshold_for_fraction_and_precision():
    scores = [0.9, 0.8, 0.7, 0.6, 0.5]
    assert threshold_for_fraction(scores, 0.4).value == 0.8
    assert threshold_for_fraction(scores, 0.0).kept == 0
    # labelled: precision of prefixes 1, 1, .67, .75, .6 -> the longest prefix reaching .75 keeps 4
    labelled = threshold_for_precision(scores, [1, 1, 0, 1, 0], 0.75)
    assert labelled.value == 0.6 and labelled.kept == 4 and labelled.estimated_precision == 0.75
    assert threshold_for_precision(scores, [0, 0, 0, 0, 0], 0.5).kept == 0
    # expected precision from probabilities: means .9, .85, .8, .75, .7
    expected = threshold_for_precision(scores, None, 0.8)
    assert expected.kept == 3 and expected.estimated_precision == pytest.approx(0.8)
    # ties are kept together: never cut between equal scores
    assert threshold_for_precision([0.9, 0.5, 0.5], [1, 1, 0], 0.9).kept == 1


def test_prior_adaptation_recovers_the_share_of_good_pairs():
    rng = np.random.default_rng(3)
    # a classifier calibrated at prior 0.5, applied where only 20% of pairs are good
    labels = rng.random(5000) < 0.2
    logit = np.where(labels, 2.0, -2.0) + rng.standard_normal(5000)
    # posteriors at balanced prior: likelihood ratio of N(2,1) vs N(-2,1) = exp(4*logit)
    probs = 1 / (1 + np.exp(-4 * logit))
    adjusted, prior = adapt_to_prior(probs)
    assert prior == pytest.approx(0.2, abs=0.03)
    assert adjusted.mean() < probs.mean()
