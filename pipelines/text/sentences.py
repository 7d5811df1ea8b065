"""Sentence splitting for every language, including scripts without spaces between words.

Chosen by measurement (`benchmarks/sentence_split.py`, BENCHMARKS.md section clean): sentencex
(C-backed, language-aware abbreviation lists, handles 。！？, ।, ؟, ። out of the box) had the best
mean boundary F1 of blingfire, pysbd, syntok, sentencex and a regex baseline, and the highest speed.
Two additions on top of it:
- Thai and Lao write no sentence-final punctuation; a space between two letters of the script
  is where a sentence (or clause) ends, so we split there.
- Terminators sentencex does not know (Khmer ។, Myanmar ။, Tibetan །, Armenian ։, Urdu ۔) end a
  sentence too.
"""
from __future__ import annotations

import re
from typing import Sequence

import sentencex

# A space between two Thai or Lao letters is a sentence boundary in running text.
_SPACE_SEPARATED_SCRIPTS = {
    "th": re.compile(r"(?<=[\u0E01-\u0E5B])\s+(?=[\u0E01-\u0E5B])"),
    "lo": re.compile(r"(?<=[\u0E81-\u0EDF])\s+(?=[\u0E81-\u0EDF])"),
}
_EXTRA_TERMINATORS = re.compile(r"(?<=[\u17D4\u17D5\u104A\u104B\u0F0D\u0589\u06D4])\s*")


def split_sentences(text: str, lang: str | None) -> list[str]:
    """Sentences of one block of text (one line of a document), stripped, empty ones removed."""
    if not text or text.isspace():
        return []
    return _split(text, lang, _EXTRA_TERMINATORS.search(text) is not None)


def _split(text: str, lang: str | None, extra_terminators: bool) -> list[str]:
    pieces = sentencex.segment(lang or "en", text)
    if extra_terminators:
        pieces = [q for p in pieces for q in _EXTRA_TERMINATORS.split(p)]
    space_rule = _SPACE_SEPARATED_SCRIPTS.get(lang or "")
    if space_rule is not None:
        pieces = [q for p in pieces for q in space_rule.split(p)]
    # strip() leaves a piece empty exactly when it was empty or all whitespace
    return list(filter(None, map(str.strip, pieces)))


_TERMINATOR_CHARACTERS = "\u17D4\u17D5\u104A\u104B\u0F0D\u0589\u06D4"


def split_sentences_many(texts: Sequence[str], langs: Sequence[str | None]) -> list[list[str] | Exception]:
    """`split_sentences` of each (text, lang), for the lines of a bundle of documents: the rare
    terminators are looked for once in all texts. A text whose splitting raises gets the exception
    instead of its sentences (a splitter bug costs that line only)."""
    joined = "\n".join(texts)
    if any(map(joined.__contains__, _TERMINATOR_CHARACTERS)) or any(map(_SPACE_SEPARATED_SCRIPTS.__contains__, langs)):
        split = _split_one
    else:  # the common case, _split without the two rules that cannot apply
        split = _segment_and_strip
    out: list[list[str] | Exception] = []
    append = out.append
    for text, lang in zip(texts, langs):
        try:
            append(split(text, lang))
        except Exception as exc:
            append(exc)
    return out


def _split_one(text: str, lang: str | None) -> list[str]:
    if not text or text.isspace():
        return []
    return _split(text, lang, _EXTRA_TERMINATORS.search(text) is not None)


def _segment_and_strip(text: str, lang: str | None) -> list[str]:
    if not text or text.isspace():
        return []
    return list(filter(None, map(str.strip, sentencex.segment(lang or "en", text))))
