"""BERT-style pre-tokenisation, cased and accent-preserving: text -> words.

These are exactly the rules the tokenizers in `pipelines.text.wordpiece` apply before WordPiece, so the
word counts the vocabulary is learned from match what the model sees at training time:

1. NFC normalisation (TF Text's and HF's BERT tokenizers both leave the form alone; NFC makes
   "e" + U+0301 and "é" one word so they share vocabulary entries).
2. Cleaning as in BERT: U+0000, U+FFFD and control/format characters (Unicode Cc, Cf, except
   tab/newline/carriage return) are removed; every whitespace character (Unicode White_Space,
   e.g. U+3000, U+00A0) becomes a plain space.
3. Every CJK ideograph (the eight CJK Unified/Compatibility Ideograph blocks BERT lists) becomes
   its own word. Kana, Hangul and Thai are not split further: they form words like Latin letters.
4. Split on whitespace, and every punctuation character (ASCII symbols `!-/ :-@ [-` {-~` and
   Unicode category P*) is a word of its own. Case and accents are kept.

Rules 1-3 run through the Rust normaliser of HF `tokenizers` (the object
`pipelines.text.wordpiece.hf_tokenizer` installs); rule 4 is a Python regex equal to its pre-tokeniser
(tests compare them on every code point), so counting and tokenising cannot drift apart;
`pipelines.text.wordpiece.TFTextTokenizer` feeds TF Text text that went through the same cleaning, and
tests/test_vocab_tokenizer.py checks, code point by code point, that the two agree.
"""
from __future__ import annotations

from functools import lru_cache

# HF `tokenizers` classifies characters with older Unicode tables than TF Text's RE2. Found by
# comparing both on every code point (tests/test_vocab_tokenizer.py repeats that comparison):
# characters RE2 treats as punctuation or CJK but HF `tokenizers` as letters -> always their own word;
ISOLATE_RANGES = (
    (0x61D, 0x61D), (0x9FD, 0x9FD), (0xA76, 0xA76), (0xC77, 0xC77), (0xC84, 0xC84),
    (0x1B7D, 0x1B7E), (0x2E43, 0x2E4F), (0x2E52, 0x2E5D), (0x10EAD, 0x10EAD), (0x10F55, 0x10F59),
    (0x10F86, 0x10F89), (0x1144B, 0x1144F), (0x1145A, 0x1145B), (0x1145D, 0x1145D),
    (0x11660, 0x1166C), (0x116B9, 0x116B9), (0x1183B, 0x1183B), (0x11944, 0x11946),
    (0x119E2, 0x119E2), (0x11A3F, 0x11A46), (0x11A9A, 0x11A9C), (0x11A9E, 0x11AA2),
    (0x11B00, 0x11B09), (0x11C41, 0x11C45), (0x11C70, 0x11C71), (0x11EF7, 0x11EF8),
    (0x11F43, 0x11F4F), (0x11FFF, 0x11FFF), (0x12FF1, 0x12FF2), (0x16E97, 0x16E9A),
    (0x16FE2, 0x16FE2), (0x1E95E, 0x1E95F), (0x2B820, 0x2B91F),
)
# format characters RE2 knows (TF Text turns them into spaces) but HF `tokenizers` does not -> space;
SPACE_RANGES = ((0x890, 0x891), (0x8E2, 0x8E2), (0x110CD, 0x110CD), (0x13430, 0x1343F))
# characters HF `tokenizers` still treats as punctuation but current Unicode does not -> own word.
PAD_CHARS = ("\u166d", "\U000111c9")


def _char_class(ranges) -> str:
    return "[" + "".join(f"\\x{{{low:X}}}-\\x{{{high:X}}}" for low, high in ranges) + "]"


@lru_cache(maxsize=None)
def _normalizer(handle_chinese_chars: bool):
    from tokenizers import Regex, normalizers

    return normalizers.Sequence(
        [
            normalizers.NFC(),
            normalizers.Replace(Regex(_char_class(SPACE_RANGES)), " "),
            *[normalizers.Replace(char, f" {char} ") for char in PAD_CHARS],
            normalizers.BertNormalizer(
                clean_text=True,
                handle_chinese_chars=handle_chinese_chars,
                strip_accents=False,
                lowercase=False,
            ),
        ]
    )


@lru_cache(maxsize=None)
def _pre_tokenizer():
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.BertPreTokenizer(),
            pre_tokenizers.Split(Regex(_char_class(ISOLATE_RANGES)), behavior="isolated"),
        ]
    )


def bert_pre_tokenizer():
    """The HF `tokenizers` pre-tokeniser of the rules above (whitespace and punctuation splits)."""
    return _pre_tokenizer()


def bert_normalizer():
    """The HF `tokenizers` normaliser of the rules above (NFC, BERT cleaning, CJK spacing)."""
    return _normalizer(True)


def clean_text(text: str) -> str:
    """Rules 1-2 only: NFC, control characters removed, all whitespace to a plain space.

    This is what `TFTextTokenizer` applies before TF Text, whose own cleaning differs (it turns
    Cc/Cf into spaces instead of removing them, and its `\\s` is ASCII-only).
    """
    return _normalizer(False).normalize_str(text)


@lru_cache(maxsize=None)
def _word_pattern():
    """Rule 4 as a Python regex: a punctuation character, or a run of anything but space and
    punctuation. It is faster than calling HF's `pre_tokenize_str` from Python (BENCHMARKS.md,
    section vocab, "Pre-tokenisation") and, tests check, splits every code point the same way."""
    import re
    import sys
    import unicodedata

    punctuation = [
        code
        for code in range(sys.maxunicode + 1)
        if unicodedata.category(chr(code)).startswith("P")
        or 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126
    ]
    punctuation += [code for low, high in ISOLATE_RANGES for code in range(low, high + 1)]
    punctuation += [ord(char) for char in PAD_CHARS]
    ranges: list[list[int]] = []
    for code in sorted(set(punctuation)):
        if ranges and ranges[-1][1] == code - 1:
            ranges[-1][1] = code
        else:
            ranges.append([code, code])
    char_class = "".join(
        re.escape(chr(low)) if low == high else f"{re.escape(chr(low))}-{re.escape(chr(high))}" for low, high in ranges
    )
    # after normalisation the only whitespace left is " "
    return re.compile(f"[{char_class}]|[^ {char_class}]+")


def pretokenize(text: str) -> list[str]:
    """Words of one text: cased, accents kept, punctuation and CJK ideographs split off."""
    return _word_pattern().findall(_normalizer(True).normalize_str(text))
