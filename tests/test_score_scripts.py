"""The scorer's length features on scripts written without spaces (feature set 2), and scorers saved
before it (feature set 1) scoring exactly as they did."""
import dataclasses
import gzip
import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest

from pipelines.mine.margin import MinedPairs
from pipelines.score.bucc import score_mined
from pipelines.score.features import latin_equivalent_length, text_features, word_count
from pipelines.score.scorer import QualityScorer, ScorerError
from pipelines.text.langid import LanguageIdentifier
from tests.conftest import require_file

# e5-small's benchmark scorer (BENCHMARKS.md, issue 24 item 2), written by the code before feature sets
OLD_SCORER = Path(__file__).parent / "data" / "scorer_feature_set_1.json"


def tatoeba_pairs(root, code: str, n: int = 300) -> list[tuple[str, str]]:
    def lines(suffix):
        path = require_file(root, f"tatoeba/tatoeba.{code}-eng.{suffix}")
        return [line.rstrip("\n") for line in path.open(encoding="utf-8")][:n]

    return [(xx, en) for xx, en in zip(lines(code), lines("eng")) if xx.strip() and en.strip()]


def log_ratios(pairs, measure) -> list[float]:
    return [math.log(measure(xx) / measure(en)) for xx, en in pairs]


@pytest.fixture(scope="module")
def lid():
    return LanguageIdentifier()


@pytest.mark.parametrize("code", ["cmn", "jpn", "tha", "khm"])
def test_unspaced_scripts_measure_like_german_against_english(labse_data, code):
    german = tatoeba_pairs(labse_data, "deu")
    pairs = tatoeba_pairs(labse_data, code)
    for measure in (word_count, latin_equivalent_length):
        reference = statistics.mean(map(abs, log_ratios(german, measure)))
        ratios = log_ratios(pairs, measure)
        assert abs(statistics.median(ratios)) < 0.2, (code, measure.__name__, statistics.median(ratios))
        assert statistics.mean(map(abs, ratios)) < reference + 0.2, (code, measure.__name__, reference)
    # what the scorer saw before: whitespace tokens, 2-7 times fewer than the English words
    old_token_ratio = statistics.median(text_features(xx, en, feature_set=1)[1] for xx, en in pairs)
    assert old_token_ratio > 0.6


def test_spaced_text_has_the_same_features_in_both_sets(labse_data):
    """Scorers are trained on Multi30k (de, fr, cs, en): retrained with set 2 they are the same model."""
    def lines(lang):
        with gzip.open(require_file(labse_data, f"multi30k/train.{lang}.gz"), "rt", encoding="utf-8") as f:
            return [next(f).rstrip("\n") for _ in range(300)]

    for lang in ("de", "fr", "cs"):
        for src, tgt in zip(lines(lang), lines("en")):
            assert text_features(src, tgt, feature_set=1) == text_features(src, tgt, feature_set=2)
    assert word_count("她是我的朋友。") == pytest.approx(6 / 1.5)
    assert word_count("I use Linux 系统") == pytest.approx(3 + 2 / 1.5)


def _score(labse_data, scorer, lid, code, lang):
    pairs = tatoeba_pairs(labse_data, code, 4)
    n = len(pairs)
    # cosine and margin of a weakly found pair, where the text features decide
    mined = MinedPairs(np.arange(n), np.arange(n), np.full(n, 1.03), np.full(n, 0.86))
    return score_mined([p[0] for p in pairs], [p[1] for p in pairs], mined, lang, "en", scorer, lid)


def test_scorer_saved_before_feature_sets_loads_and_scores_as_before(labse_data, lid):
    scorer = QualityScorer.load(OLD_SCORER)
    assert scorer.feature_set == 1
    # (ranker, sanity) computed by the code before feature sets (commit 750d9b9) on the same input
    before = {
        ("cmn", "zh"): ([0.01010446, 0.01971657, 0.03357602, 0.16863423],
                        [0.93895544, 0.98219728, 0.99776146, 0.99941722]),
        ("tha", "th"): ([0.53322068, 0.45017525, 0.12636588, 0.97259469],
                        [0.86922939, 0.99089176, 0.5435576, 0.9592163]),
        ("deu", "de"): ([0.99888772, 0.98964704, 0.9921541, 0.9819835],
                        [0.98969519, 0.98152381, 0.97592202, 0.99145751]),
    }
    for (code, lang), (ranker, sanity) in before.items():
        components = _score(labse_data, scorer, lid, code, lang)
        np.testing.assert_allclose(components[:, 0], ranker, atol=1e-7)
        np.testing.assert_allclose(components[:, 1], sanity, atol=1e-7)


def test_feature_set_is_saved_and_decides_the_features(labse_data, lid, tmp_path):
    old = QualityScorer.load(OLD_SCORER)
    new = dataclasses.replace(old, feature_set=2)
    reloaded = QualityScorer.load(new.save(tmp_path / "new"))
    assert reloaded.feature_set == 2
    assert json.loads((tmp_path / "new" / "scorer.json").read_text())["feature_set"] == 2
    # the same model: Chinese pairs leave the range the old features put them in, German ones stay
    assert _score(labse_data, reloaded, lid, "cmn", "zh")[:, 0].min() > 0.9
    assert _score(labse_data, old, lid, "cmn", "zh")[:, 0].max() < 0.2
    np.testing.assert_array_equal(_score(labse_data, reloaded, lid, "deu", "de"), _score(labse_data, old, lid, "deu", "de"))

    payload = json.loads(OLD_SCORER.read_text())
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "scorer.json").write_text(json.dumps({**payload, "feature_set": 3}))
    with pytest.raises(ScorerError, match="unknown feature set 3"):
        QualityScorer.load(tmp_path / "bad")


# One letter of each unspaced script (Unicode block's first letter) and its letters per word-equivalent.
UNSPACED_LETTERS = [("\u4e2d", 1.5), ("\u3042", 2.5), ("\u30ab", 2.5), ("\u0e01", 4.0), ("\u0e81", 4.0),
                    ("\u1780", 4.0), ("\u1000", 4.0), ("\u0f40", 4.0)]


@pytest.mark.parametrize("letter,per_word", UNSPACED_LETTERS,
                         ids=["han", "hiragana", "katakana", "thai", "lao", "khmer", "myanmar", "tibetan"])
def test_each_unspaced_script_has_its_letters_per_word(letter, per_word):
    """Fast and exact (the Tatoeba test above measures the factors only in aggregate)."""
    text = letter * 6
    assert word_count(text) == pytest.approx(6 / per_word)
    assert latin_equivalent_length(text) == pytest.approx(6 * 5.0 / per_word)
    # feature set 1 saw one whitespace token of six characters
    assert text_features(text, "a b c d e f", feature_set=1)[1] == pytest.approx(math.log(6))
    assert text_features(text, "a b c d e f", feature_set=2)[1] == pytest.approx(abs(math.log(6 / per_word / 6)))


def test_hangul_counts_its_letters_not_its_words():
    """Korean is spaced: its words are whitespace tokens, a syllable block writes 2.5 letters."""
    assert word_count("\ud55c\uad6d\uc5b4 \ubb38\uc7a5") == 2
    assert latin_equivalent_length("\ud55c\uad6d\uc5b4 \ubb38\uc7a5") == pytest.approx(5 * 2.5 + 1)


@pytest.mark.parametrize("mark,kind", [("\u0964", "stop"), ("\u0965", "stop"), ("\u17d4", "stop"),
                                       ("\u17d5", "stop"), ("\u104b", "stop"), ("\u0f0d", "stop"),
                                       ("\u06d4", "stop"), ("\u1362", "stop"), ("\u1367", "question"),
                                       ("\u061f", "question")])
def test_sentence_final_marks_of_other_scripts(mark, kind):
    from pipelines.score.features import final_punctuation
    assert final_punctuation("text" + mark, feature_set=2) == kind
    assert final_punctuation("text" + mark + "\u201d ", feature_set=2) == kind
    assert final_punctuation("text" + mark, feature_set=1) == "none"
