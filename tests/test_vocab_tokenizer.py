"""pipelines.text.wordpiece / pipelines.text.pretokenize: TF Text and HF transformers give identical ids.

The vocabulary is learned by our learner from real UDHR + Multi30k text; the sentences come from
Tatoeba (never trained on) in six scripts, and every Unicode code point of planes 0-1 (plus the
CJK extension blocks) is checked on its own.
"""
import gzip
from collections import Counter

import pytest

from tests.conftest import require_file
from vocab.learn import LearnerConfig, learn_from_counts, write_vocab
from pipelines.text.pretokenize import clean_text, pretokenize
from pipelines.text.wordpiece import SPECIAL_TOKENS, TFTextTokenizer, VocabError, hf_tokenizer, load_vocab

UDHR = ["eng", "deu", "fra", "rus", "cmn_hans", "cmn_hant", "jpn", "kor", "arb", "hin", "tha", "ell_monotonic", "heb"]
TATOEBA = ["deu", "fra", "rus", "cmn", "jpn", "ara", "hin", "tha", "kor"]


@pytest.fixture(scope="module")
def vocab_path(labse_data, tmp_path_factory):
    counts = Counter()
    for name in UDHR:
        text = require_file(labse_data, f"udhr/{name}.txt").read_text(encoding="utf-8")
        for line in text.splitlines():
            counts.update(pretokenize(line))
    with gzip.open(require_file(labse_data, "multi30k/train.de.gz"), "rt", encoding="utf-8") as handle:
        for i, line in enumerate(handle):
            if i == 5000:
                break
            counts.update(pretokenize(line))
    result = learn_from_counts(counts, LearnerConfig(vocab_size=6000, char_min_count=1, progress=False))
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    write_vocab(result.vocab, str(path))
    return path


@pytest.fixture(scope="module")
def tokenizers(vocab_path):
    return TFTextTokenizer(vocab_path), hf_tokenizer(vocab_path)


def hf_ids(hf, texts):
    return [e.ids for e in hf.backend_tokenizer.encode_batch(texts, add_special_tokens=False)]


def test_load_vocab_and_hf_size(vocab_path, tokenizers):
    vocab = load_vocab(vocab_path)
    assert vocab[:5] == SPECIAL_TOKENS
    tf_tok, hf = tokenizers
    # transformers 5: `vocab=` (vocab_file= would silently give 5 tokens); hf_tokenizer checks it
    assert len(hf) == len(vocab) == len(tf_tok) == 6000
    assert hf.convert_tokens_to_ids(SPECIAL_TOKENS) == [0, 1, 2, 3, 4]
    encoded = hf("Hallo Welt")["input_ids"]
    assert encoded[0] == 2 and encoded[-1] == 3  # [CLS] ... [SEP]


def test_load_vocab_rejects_foreign_files(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("[UNK]\n[PAD]\n[CLS]\n[SEP]\n[MASK]\na\n", encoding="utf-8")
    with pytest.raises(VocabError):
        load_vocab(bad)
    with pytest.raises(VocabError):
        load_vocab(tmp_path / "missing.txt")


def test_same_ids_on_real_sentences_in_many_scripts(labse_data, tokenizers):
    tf_tok, hf = tokenizers
    for lang in TATOEBA:
        path = require_file(labse_data, f"tatoeba/tatoeba.{lang}-eng.{lang}")
        lines = path.read_text(encoding="utf-8").splitlines()[:300]
        assert lines, path
        tf_ids = tf_tok.tokenize_ids(lines)
        assert tf_ids == hf_ids(hf, lines), lang
        flat = [i for row in tf_ids for i in row]
        if lang in ("deu", "fra", "rus", "hin", "tha"):  # alphabets: UDHR has all their letters
            assert flat.count(1) / len(flat) < 0.05, lang


def test_a_word_as_long_as_the_longest_token_is_that_token_on_both_sides(tmp_path):
    """TF Text is told the longest token's length (`max_chars_per_token`); one short of it, a word
    spelt like the longest token falls apart into characters in TFRecord shards while the exported
    HF tokenizer keeps it whole."""
    letters = list("abcdef")
    path = tmp_path / "vocab.txt"
    write_vocab(SPECIAL_TOKENS + ["abcdef"] + letters + ["##" + c for c in letters], str(path))
    vocab = load_vocab(path)
    ids = {token: i for i, token in enumerate(vocab)}
    texts = ["abcdef", "abcdefab fedcba", "xabcdef"]
    expected = [[ids["abcdef"]], [ids["abcdef"], ids["##a"], ids["##b"]] + [ids[c] for c in "f"] +
                [ids["##" + c] for c in "edcba"], [1]]
    assert TFTextTokenizer(path).tokenize_ids(texts) == expected
    assert hf_ids(hf_tokenizer(path), texts) == expected


def test_same_ids_on_hard_cases(tokenizers):
    tf_tok, hf = tokenizers
    texts = [
        "[MASK] and [CLS] typed in text are text",
        "control\x00chars\x07and\u200bformat\ufeffmarks\tand\u3000ideographic\u00a0spaces",
        "décomposé: e\u0301te\u0301 vs été",
        "x" * 101 + " short",
        "\U00010330" * 60 + " gothic",  # 60 characters, 240 bytes: not over the 100-character limit
        "漢字かなカナ한국어 ไทย हिन्दी عربى",
        "",
        "   ",
    ]
    tf_ids = tf_tok.tokenize_ids(texts)
    assert tf_ids == hf_ids(hf, texts)
    assert tf_ids[3] == [1] + tf_tok.tokenize_ids(["short"])[0]  # a 101-character word is one [UNK]
    assert tf_ids[6] == [] and tf_ids[7] == []
    assert tf_tok.tokenize_ids([]) == []
    nfc, nfd = tf_tok.tokenize_ids(["été", "e\u0301te\u0301"])
    assert nfc == nfd


def test_every_code_point_splits_the_same(tokenizers):
    tf_tok, hf = tokenizers
    code_points = [c for c in range(0x20000) if not 0xD800 <= c <= 0xDFFF]
    code_points += list(range(0x20000, 0x20100)) + list(range(0x2B700, 0x2B940)) + list(range(0x2CE00, 0x2CF00))
    code_points += list(range(0xE0000, 0xE0080))
    texts = ["a" + chr(c) + "a" for c in code_points]
    tf_ids = tf_tok.tokenize_ids(texts)
    hf_all = hf_ids(hf, texts)
    mismatched = [hex(c) for c, a, b in zip(code_points, tf_ids, hf_all) if a != b]
    assert mismatched == []


def test_pretokenize_rules():
    assert pretokenize("Hello, World!") == ["Hello", ",", "World", "!"]
    assert pretokenize("中文字") == ["中", "文", "字"]
    assert pretokenize("Ünïcödé stays") == ["Ünïcödé", "stays"]  # cased, accents kept
    assert pretokenize("a\u3000b\u00a0c") == ["a", "b", "c"]
    assert pretokenize("can't") == ["can", "'", "t"]
    assert pretokenize("ひらがなカタカナ") == ["ひらがなカタカナ"]  # kana are not ideographs
    assert clean_text("a\x00b\u200bc\td") == "abc d"


def test_saved_tokenizer_reloads_with_the_same_rules(tokenizers, tmp_path):
    """save_pretrained -> AutoTokenizer (what a sentence-transformers export does) keeps the ids."""
    from transformers import AutoTokenizer

    tf_tok, hf = tokenizers
    hf.save_pretrained(tmp_path / "tok")
    reloaded = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    texts = ["[MASK] e\u0301te\u0301 a\u3000b a\x00b", "x" * 101, "a\u061db a\u0890b", "Hallo Welt 漢字 ไทย"]
    for text in texts:
        ids = reloaded(text)["input_ids"]
        assert ids == hf(text)["input_ids"]
        assert ids == [2] + tf_tok.tokenize_ids([text])[0] + [3]
    batch = reloaded(["a b", "c"], padding=True)
    assert batch["input_ids"][1][-1] == 0 and "token_type_ids" in batch


def test_pretokenize_equals_the_hf_pre_tokenizer_on_every_code_point():
    """The counting regex splits exactly like the tokenizer's Rust pre-tokeniser."""
    from pipelines.text.pretokenize import bert_normalizer, bert_pre_tokenizer

    normalizer, pre_tokenizer = bert_normalizer(), bert_pre_tokenizer()
    code_points = [c for c in range(0x20000) if not 0xD800 <= c <= 0xDFFF]
    code_points += list(range(0x2B700, 0x2B940)) + list(range(0xE0000, 0xE0080))
    mismatched = []
    for c in code_points:
        text = "a" + chr(c) + "b c"
        expected = [w for w, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))]
        if pretokenize(text) != expected:
            mismatched.append(hex(c))
    assert mismatched == []
