"""pipelines.score.features.pair_problem and labse-score's batch step on NaN / infinite pairs (pure,
no Beam pipeline): a pair the scorer cannot rate is dropped as `invalid`, counted, never scored."""
import math

import numpy as np
import pytest

from pipelines.score.features import FEATURE_NAMES, is_valid_pair, pair_problem

GOOD = {"src": "Ein Hund rennt.", "tgt": "A dog runs.", "src_lang": "de", "tgt_lang": "en", "cosine": 0.8,
        "margin": 1.2}


@pytest.mark.parametrize("field, value", [
    ("cosine", float("nan")), ("cosine", float("inf")), ("cosine", float("-inf")), ("cosine", None),
    ("margin", float("nan")), ("margin", float("inf")), ("margin", float("-inf")), ("margin", None),
    ("margin", "1.2"), ("cosine", True), ("src", None), ("tgt", 3),
])
def test_a_pair_with_a_value_the_scorer_cannot_use_is_invalid(field, value):
    assert pair_problem({**GOOD, field: value}) == "invalid"
    assert not is_valid_pair({**GOOD, field: value})


@pytest.mark.parametrize("text", ["", "   ", "\u200b\u00a0", "\t\n"])
def test_a_side_of_nothing_visible_is_empty_text(text):
    assert pair_problem({**GOOD, "src": text}) == "empty_text"
    assert pair_problem({**GOOD, "tgt": text}) == "empty_text"


def test_finite_numbers_of_any_kind_are_rated():
    assert pair_problem(GOOD) is None and is_valid_pair(GOOD)
    assert pair_problem({**GOOD, "cosine": 0, "margin": 1}) is None  # ints, as a hand-made file may hold
    assert pair_problem({**GOOD, "margin": 1e300}) is None  # large but finite: the scorer decides


@pytest.mark.parametrize("kind", [np.float16, np.float32, np.float64, np.int32, np.int64, np.uint8])
def test_numpy_scalars_are_numbers_and_their_non_finite_values_are_not(kind):
    """Scores computed with numpy (a row built from an array, not read back from Parquet) are
    numpy scalars: np.float32 is no Python float, yet a finite one is a number to rate."""
    assert pair_problem({**GOOD, "cosine": kind(0), "margin": kind(1)}) is None
    if np.issubdtype(kind, np.floating):
        for bad in (np.nan, np.inf, -np.inf):
            assert pair_problem({**GOOD, "margin": kind(bad)}) == "invalid"
            assert pair_problem({**GOOD, "cosine": kind(bad)}) == "invalid"
    assert pair_problem({**GOOD, "cosine": np.bool_(True)}) == "invalid"  # a flag, as Python's True
    assert pair_problem({**GOOD, "cosine": np.array([0.5, 0.5], dtype=kind)}) == "invalid"  # no scalar


class _Lid:
    def probability_of(self, texts, lang):
        return np.full(len(texts), 0.9)


class _ScorerThatOverflowsOnTheSecondPair:
    feature_set = 2

    def components(self, features):
        assert features.shape[1] == len(FEATURE_NAMES) and np.isfinite(features).all()
        ranker = np.full(len(features), 0.7)
        ranker[1] = np.nan
        return ranker, np.full(len(features), 0.9)


def test_the_batch_step_drops_and_counts_invalid_pairs_and_scores_the_rest():
    import apache_beam as beam

    from pipelines.score.transforms import _ScoreBatch

    step = _ScoreBatch("unused")
    step.scorer, step.lid = _ScorerThatOverflowsOnTheSecondPair(), _Lid()
    counted = []
    step.dropped.inc = lambda name, n=1: counted.append(name)
    rows = [GOOD, {**GOOD, "margin": float("nan")}, {**GOOD, "src": "Zwei Katzen."}, {**GOOD, "cosine": math.inf},
            {**GOOD, "tgt": " "}]
    out = list(step.process(rows))
    scored = [o for o in out if not isinstance(o, beam.pvalue.TaggedOutput)]
    dropped = [o.value for o in out if isinstance(o, beam.pvalue.TaggedOutput)]
    assert [(r["src"], r["ranker"], r["sanity"]) for r in scored] == [("Ein Hund rennt.", 0.7, 0.9)]
    assert sorted(dropped) == ["empty_text", "invalid", "invalid", "invalid"]
    assert sorted(counted) == ["pairs.dropped.empty_text"] + ["pairs.dropped.invalid"] * 3
    assert len(scored) + len(dropped) == len(rows)  # every pair kept or dropped with a reason
