"""Pair features for the quality scorer: pure functions over (src, tgt) text plus mining scores.

Each feature is a float, named in `FEATURE_NAMES` (the scorer's saved column order). Language ID
uses lid.176 through `pipelines.text.langid.LanguageIdentifier`, loaded once by the caller.
"""
from __future__ import annotations

import math
import re
import unicodedata
from difflib import SequenceMatcher
from typing import Sequence

import numpy as np

FEATURE_NAMES = (
    "cosine",
    "margin",
    "log_len_ratio",        # |log(chars_src / chars_tgt)|
    "log_token_ratio",      # |log(tokens_src / tokens_tgt)|
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

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_URL = re.compile(r"(?:https?://|www\.)\S+|[\w.+-]+@[\w-]+\.[\w.]+", re.IGNORECASE)
_FINAL = {".": "stop", "!": "exclaim", "?": "question", "？": "question", "。": "stop", "！": "exclaim",
          "…": "stop", ":": "colon", ";": "colon"}


def numbers(text: str) -> set[str]:
    """Digit sequences with separators removed, so 1,000 (en) and 1.000 (de) agree."""
    return {re.sub(r"[.,]", "", m) for m in _NUMBER.findall(text)}


def urls(text: str) -> set[str]:
    return {u.lower().rstrip(".,;:!?)") for u in _URL.findall(text)}


def jaccard(a: set, b: set) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def final_punctuation(text: str) -> str:
    stripped = text.rstrip(" \"'»«“”’)")
    return _FINAL.get(stripped[-1:], "none") if stripped else "none"


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


def text_features(src: str, tgt: str) -> list[float]:
    """Every feature that needs only the two texts (not cosine, margin or language ID)."""
    src, tgt = src or "", tgt or ""
    chars_src, chars_tgt = max(len(src), 1), max(len(tgt), 1)
    tokens_src, tokens_tgt = max(len(src.split()), 1), max(len(tgt.split()), 1)
    punct_src, punct_tgt = punctuation_count(src), punctuation_count(tgt)
    script_src, purity_src = dominant_script(src)
    script_tgt, purity_tgt = dominant_script(tgt)
    return [
        abs(math.log(chars_src / chars_tgt)),
        abs(math.log(tokens_src / tokens_tgt)),
        math.log(min(chars_src, chars_tgt)),
        jaccard(numbers(src), numbers(tgt)),
        jaccard(urls(src), urls(tgt)),
        float(final_punctuation(src) == final_punctuation(tgt)),
        abs(punct_src - punct_tgt) / (1 + max(punct_src, punct_tgt)),
        float(brackets_quotes(src) == brackets_quotes(tgt)),
        copy_similarity(src, tgt),
        float(script_src == script_tgt),
        min(purity_src, purity_tgt),
    ]


def pair_features(src: Sequence[str], tgt: Sequence[str], src_lang: Sequence[str], tgt_lang: Sequence[str],
                  cosine: Sequence[float], margin: Sequence[float], lid=None) -> np.ndarray:
    """Feature matrix [n, len(FEATURE_NAMES)] for n pairs.

    `lid` is a `LanguageIdentifier` (lid.176); without one the LID features are 1.0 (unknown,
    i.e. no evidence against the pair) — the scorer is always trained and applied with one.
    """
    n = len(src)
    if not (len(tgt) == len(src_lang) == len(tgt_lang) == len(cosine) == len(margin) == n):
        raise ValueError("pair_features: all columns must have the same length")
    out = np.zeros((n, len(FEATURE_NAMES)), dtype=np.float64)
    if n == 0:
        return out
    out[:, 0] = np.asarray(cosine, dtype=np.float64)
    out[:, 1] = np.asarray(margin, dtype=np.float64)
    out[:, [2, 3, 4, 7, 8, 9, 10, 11, 12, 13, 14]] = [text_features(s, t) for s, t in zip(src, tgt)]
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
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_valid_pair(row: dict) -> bool:
    """A pair the scorer can rate: text on both sides, a finite cosine and margin. Anything else
    (a null, NaN or infinite value) is dropped as `invalid`: one NaN would poison its language
    pair's share estimate and threshold, and an infinite margin would score 1.0."""
    return (isinstance(row.get("src"), str) and isinstance(row.get("tgt"), str)
            and _is_finite_number(row.get("cosine")) and _is_finite_number(row.get("margin")))
