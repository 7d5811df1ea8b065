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
    pieces = [p for p in sentencex.segment(lang or "en", text)]
    if _EXTRA_TERMINATORS.search(text):
        pieces = [q for p in pieces for q in _EXTRA_TERMINATORS.split(p)]
    space_rule = _SPACE_SEPARATED_SCRIPTS.get(lang or "")
    if space_rule is not None:
        pieces = [q for p in pieces for q in space_rule.split(p)]
    return [p.strip() for p in pieces if p and not p.isspace()]
