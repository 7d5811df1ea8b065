"""Pair features for the quality scorer: pure functions over (src, tgt) text plus mining scores.

Each feature is a float, named in `FEATURE_NAMES` (the scorer's saved column order). Language ID
uses lid.176 through `pipelines.text.langid.LanguageIdentifier`, loaded once by the caller.

Feature sets (a scorer records the one it was trained with; `QualityScorer.feature_set`):
1. lengths in characters and tokens split at whitespace: a Chinese, Japanese, Thai or Khmer sentence
   has a few "tokens" and (Chinese, Japanese) a third of the characters of its English translation,
   so a true pair looks like a truncated one to a scorer fitted on European pairs;
2. script-aware lengths (`word_count`, `latin_equivalent_length`): a run of a script written without
   spaces counts as its letters / `CHARACTERS_PER_WORD` words, and each of its letters (and each
   Hangul syllable) as as many characters as the Latin letters it stands for. Text with none of
   these scripts has the same features in both sets;
   and sentence-final punctuation of other scripts (Khmer ។, Devanagari ।, Urdu ۔, ...) is recognised,
   so a Khmer sentence ending in ។ agrees with its English translation's full stop.
"""
from __future__ import annotations

import math
import re
import unicodedata
from difflib import SequenceMatcher
from typing import Sequence

import numpy as np

from pipelines.text.normalise import is_blank

FEATURE_NAMES = (
    "cosine",
    "margin",
    "log_len_ratio",        # |log(length_src / length_tgt)|, length as the feature set measures it
    "log_token_ratio",      # |log(words_src / words_tgt)|
    "log_min_chars",
    "src_lid_prob",         # lid.176's probability of the declared source language
    "tgt_lid_prob",
    "numbers_agree",        # Jaccard of the digit sequences (1 when neither has any)
    "urls_agree",           # Jaccard of URLs / e-mail addresses (1 when neither has any)
    "punct_agree",          # same sentence-final punctuation class
    "punct_count_diff",     # |#punct_src - #punct_tgt| / (1 + max)
    "brackets_quotes_agree",
    "copy_similarity",      # character similarity of the two sides (near 1 for copies)
    "same_script",          # dominant scripts equal
    "script_purity",        # min over sides of the share of letters in the side's dominant script
)

FEATURE_SETS = (1, 2)
CURRENT_FEATURE_SET = 2

# Letters (marks included) per word in scripts written without spaces between words, measured as
# letters per English word of their Tatoeba translations (lines 300 on, which the BUCC-style
# benchmark does not use): cmn 1.46, jpn 2.26 (kanji and kana), tha 4.20, khm 4.08 (Khmer puts a
# space between phrases, which counts as well). Lao is Thai's close relative; Myanmar and Tibetan
# (no Tatoeba file here) get the abugida value, not measured.
CHARACTERS_PER_WORD = {"han": 1.5, "kana": 2.5, "thai": 4.0, "lao": 4.0, "khmer": 4.0, "myanmar": 4.0,
                       "tibetan": 4.0}
# A word of a spaced script takes about 5 characters with its space (Multi30k English 5.1, Tatoeba
# English 5.2): one word-equivalent of an unspaced script is as long.
CHARACTERS_PER_SPACED_WORD = 5.0
# A Hangul syllable block writes 2-3 letters (jamo); Korean is spaced, so only its length changes.
CHARACTERS_PER_HANGUL_SYLLABLE = 2.5
_UNSPACED_BLOCKS = (  # (first, last code point, script)
    (0x0E00, 0x0E7F, "thai"), (0x0E80, 0x0EFF, "lao"), (0x0F00, 0x0FFF, "tibetan"), (0x1000, 0x109F, "myanmar"),
    (0x1780, 0x17FF, "khmer"), (0x19E0, 0x19FF, "khmer"), (0x3040, 0x30FF, "kana"), (0x31F0, 0x31FF, "kana"),
    (0x3400, 0x4DBF, "han"), (0x4E00, 0x9FFF, "han"), (0xA9E0, 0xA9FF, "myanmar"), (0xAA60, 0xAA7F, "myanmar"),
    (0xF900, 0xFAFF, "han"), (0xFF66, 0xFF9F, "kana"), (0x20000, 0x323AF, "han"),
)

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
# RFC 5321's longest local part, domain label and domain: bounds on what an e-mail match looks at.
MAX_EMAIL_LOCAL, MAX_DOMAIN_LABEL, MAX_DOMAIN = 64, 63, 255
# Linear on any text (issue 34 item 3): an unbounded `[\w.+-]+@` is tried from every position of a run
# of word characters and rescans the rest of the run each time (10^6 Han letters: never finishes);
# bounded, each position looks at most MAX_EMAIL_LOCAL characters ahead.
_URL = re.compile(r"(?:https?://|www\.)\S+|[\w.+-]{1,%d}@[\w-]{1,%d}\.[\w.]{1,%d}"
                  % (MAX_EMAIL_LOCAL, MAX_DOMAIN_LABEL, MAX_DOMAIN), re.IGNORECASE)
_FINAL = {".": "stop", "!": "exclaim", "?": "question", "？": "question", "。": "stop", "！": "exclaim",
          "…": "stop", ":": "colon", ";": "colon"}
# Sentence-final marks of other scripts (feature set 2): Devanagari / Bengali danda, Khmer khan and
# koomuut, Myanmar section, Tibetan shad, Urdu full stop, Ethiopic full stop and question, Arabic question.
_FINAL_OTHER_SCRIPTS = {**_FINAL, "।": "stop", "॥": "stop", "។": "stop", "៕": "stop", "။": "stop", "།": "stop",
                        "۔": "stop", "።": "stop", "፧": "question", "؟": "question"}


def numbers(text: str) -> set[str]:
    """Digit sequences with separators removed, so 1,000 (en) and 1.000 (de) agree."""
    return {re.sub(r"[.,]", "", m) for m in _NUMBER.findall(text)}


def urls(text: str) -> set[str]:
    """URLs and e-mail addresses, lower-cased, trailing punctuation removed (an address's local part
    to its last MAX_EMAIL_LOCAL characters)."""
    return {u.lower().rstrip(".,;:!?)") for u in _URL.findall(text)}


def jaccard(a: set, b: set) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def final_punctuation(text: str, feature_set: int = CURRENT_FEATURE_SET) -> str:
    stripped = text.rstrip(" \"'»«“”’)")
    marks = _FINAL if feature_set == 1 else _FINAL_OTHER_SCRIPTS
    return marks.get(stripped[-1:], "none") if stripped else "none"


def punctuation_count(text: str) -> int:
    return sum(1 for ch in text if unicodedata.category(ch).startswith("P"))


def brackets_quotes(text: str) -> tuple[bool, bool]:
    return (any(c in text for c in "()[]{}（）"), any(c in text for c in "\"'«»“”„‘’「」"))


def script_of(ch: str) -> str:
    """First word of the Unicode name (LATIN, CYRILLIC, CJK, ...) for letters, else ''."""
    if not ch.isalpha():
        return ""
    try:
        return unicodedata.name(ch).split(" ", 1)[0]
    except ValueError:
        return "UNKNOWN"


def dominant_script(text: str) -> tuple[str, float]:
    counts: dict[str, int] = {}
    for ch in text:
        script = script_of(ch)
        if script:
            counts[script] = counts.get(script, 0) + 1
    if not counts:
        return "", 1.0
    script, count = max(counts.items(), key=lambda kv: kv[1])
    return script, count / sum(counts.values())


def unspaced_script(ch: str) -> str:
    """The script written without spaces that the letter or mark `ch` belongs to, else ''."""
    code = ord(ch)
    if code < 0x0E00 or unicodedata.category(ch)[0] not in "LM":
        return ""
    for first, last, script in _UNSPACED_BLOCKS:
        if first <= code <= last:
            return script
    return ""


def _all_below_unspaced(text: str) -> bool:
    # Latin, Cyrillic, Greek, Arabic, Devanagari...: every code point below the first unspaced
    # script (Thai, U+0E00) and Hangul, so both lengths are the plain ones; one C-level scan.
    return not text or max(text) < "\u0e00"


def word_count(text: str) -> float:
    """Whitespace tokens, where letters of unspaced scripts count as word-equivalents instead
    (a token of Latin and Han letters mixed: 1 + its Han letters / 1.5)."""
    if _all_below_unspaced(text):
        return float(len(text.split()))
    count = 0.0
    for token in text.split():
        equivalents = sum(1 / CHARACTERS_PER_WORD[s] for s in map(unspaced_script, token) if s)
        spaced = any(ch.isalnum() and not unspaced_script(ch) for ch in token)
        count += equivalents + 1 if spaced or not equivalents else equivalents
    return count


def latin_equivalent_length(text: str) -> float:
    """Characters, where a letter of an unspaced script counts as its share of a spaced word's
    characters and a Hangul syllable as the letters it writes."""
    if _all_below_unspaced(text):
        return float(len(text))
    length = 0.0
    for ch in text:
        script = unspaced_script(ch)
        if script:
            length += CHARACTERS_PER_SPACED_WORD / CHARACTERS_PER_WORD[script]
        elif 0xAC00 <= ord(ch) <= 0xD7A3:
            length += CHARACTERS_PER_HANGUL_SYLLABLE
        else:
            length += 1
    return length


def copy_similarity(src: str, tgt: str) -> float:
    a, b = src.lower().strip(), tgt.lower().strip()
    if not a or not b:
        return 0.0
    if a == b:
        return 1.0
    # quick_ratio is an upper bound; the exact ratio only where it matters (long texts are costly)
    matcher = SequenceMatcher(None, a[:300], b[:300], autojunk=False)
    upper_bound = matcher.quick_ratio()
    return matcher.ratio() if upper_bound > 0.5 else upper_bound


def text_features(src: str, tgt: str, feature_set: int = CURRENT_FEATURE_SET) -> list[float]:
    """Every feature that needs only the two texts (not cosine, margin or language ID)."""
    src, tgt = src or "", tgt or ""
    if feature_set == 1:
        chars_src, chars_tgt = max(len(src), 1), max(len(tgt), 1)
        tokens_src, tokens_tgt = max(len(src.split()), 1), max(len(tgt.split()), 1)
    else:
        chars_src, chars_tgt = max(latin_equivalent_length(src), 1), max(latin_equivalent_length(tgt), 1)
        tokens_src, tokens_tgt = word_count(src) or 1, word_count(tgt) or 1
    punct_src, punct_tgt = punctuation_count(src), punctuation_count(tgt)
    script_src, purity_src = dominant_script(src)
    script_tgt, purity_tgt = dominant_script(tgt)
    return [
        abs(math.log(chars_src / chars_tgt)),
        abs(math.log(tokens_src / tokens_tgt)),
        math.log(min(chars_src, chars_tgt)),
        jaccard(numbers(src), numbers(tgt)),
        jaccard(urls(src), urls(tgt)),
        float(final_punctuation(src, feature_set) == final_punctuation(tgt, feature_set)),
        abs(punct_src - punct_tgt) / (1 + max(punct_src, punct_tgt)),
        float(brackets_quotes(src) == brackets_quotes(tgt)),
        copy_similarity(src, tgt),
        float(script_src == script_tgt),
        min(purity_src, purity_tgt),
    ]


def pair_features(src: Sequence[str], tgt: Sequence[str], src_lang: Sequence[str], tgt_lang: Sequence[str],
                  cosine: Sequence[float], margin: Sequence[float], lid=None,
                  feature_set: int = CURRENT_FEATURE_SET) -> np.ndarray:
    """Feature matrix [n, len(FEATURE_NAMES)] for n pairs, lengths as `feature_set` measures them.

    `lid` is a `LanguageIdentifier` (lid.176); without one the LID features are 1.0 (unknown,
    i.e. no evidence against the pair) — the scorer is always trained and applied with one.
    """
    if feature_set not in FEATURE_SETS:
        raise ValueError(f"unknown feature set {feature_set!r} (known: {FEATURE_SETS})")
    n = len(src)
    if not (len(tgt) == len(src_lang) == len(tgt_lang) == len(cosine) == len(margin) == n):
        raise ValueError("pair_features: all columns must have the same length")
    out = np.zeros((n, len(FEATURE_NAMES)), dtype=np.float64)
    if n == 0:
        return out
    out[:, 0] = np.asarray(cosine, dtype=np.float64)
    out[:, 1] = np.asarray(margin, dtype=np.float64)
    out[:, [2, 3, 4, 7, 8, 9, 10, 11, 12, 13, 14]] = [text_features(s, t, feature_set) for s, t in zip(src, tgt)]
    if lid is None:
        out[:, 5] = out[:, 6] = 1.0
    else:
        out[:, 5] = _lid_probabilities(lid, src, src_lang)
        out[:, 6] = _lid_probabilities(lid, tgt, tgt_lang)
    return out


def _lid_probabilities(lid, texts: Sequence[str], langs: Sequence[str]) -> np.ndarray:
    """lid.176's probability of each text's declared language, batched per language."""
    probs = np.zeros(len(texts))
    by_lang: dict[str, list[int]] = {}
    for i, lang in enumerate(langs):
        by_lang.setdefault(lang, []).append(i)
    for lang, rows in by_lang.items():
        probs[rows] = lid.probability_of([texts[i] or "" for i in rows], lang)
    return probs


def _is_finite_number(value) -> bool:
    """A finite int or float, Python's or numpy's (np.float32 is no float); never a bool."""
    return (isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
            and math.isfinite(value))


def pair_problem(row: dict) -> str | None:
    """None for a pair the scorer can rate: text on both sides, a finite cosine and margin; else
    the reason it is dropped. A null, NaN or infinite value is `invalid`: one NaN would poison its
    language pair's share estimate and threshold, and an infinite margin would score 1.0. A text
    of only whitespace or invisible characters is `empty_text` (`is_blank`): there is nothing to
    rate, and a pair of nothing is no translation."""
    src, tgt = row.get("src"), row.get("tgt")
    if not (isinstance(src, str) and isinstance(tgt, str)
            and _is_finite_number(row.get("cosine")) and _is_finite_number(row.get("margin"))):
        return "invalid"
    return "empty_text" if is_blank(src) or is_blank(tgt) else None


def is_valid_pair(row: dict) -> bool:
    """Whether the scorer can rate the pair (`pair_problem` finds nothing)."""
    return pair_problem(row) is None
