"""Heuristic main-content scores for a document's lines: the fallback when no model is given.

`labse-clean` without `--main-content-model` scores each line with these rules (the score is a
rough P(main content); sentences inherit their line's score and are dropped as `main_content`
below `--main-content-threshold`, default 0.5):

1. A line with a boilerplate phrase (copyright, "all rights reserved", sign in, subscribe, share
   on, cookies, skip to content, ...) scores 0.05.
2. A line made of separated items (two or more of `|`, `·`, `»`, `›`, `•`, ` - `) scores 0.1: menus,
   breadcrumbs, tag lists.
3. A long line (at least 100 characters, or 40 in Chinese, Japanese, Korean and Thai text) ending in
   terminal punctuation scores 0.95; long without terminal punctuation 0.7.
4. A medium line (at least 40 characters, 15 in CJK/Thai) ending in terminal punctuation scores 0.8;
   without it 0.4 (captions, teasers, headings).
5. A short line (under 40 characters, 15 in CJK/Thai) scores 0.2 (menu items, buttons, dates),
   raised to 0.6 when it ends in terminal punctuation and both neighbours score at least 0.8: a
   short sentence inside an article.

Wikipedia text (`kind == "text"` documents from the wiki reader) is already main content; the
pipeline scores it 1.0 without these rules.
"""
from __future__ import annotations

import re

from pipelines.text.filters import TERMINAL_PUNCTUATION

# Matched as substrings of the casefolded line by one regex alternation (faster than a
# case-insensitive regex, and than a loop of `in` tests).
BOILERPLATE_PHRASES = (
    "©", "copyright", "all rights reserved", "alle rechte vorbehalten", "tous droits réservés",
    "все права защищены", "版权所有", "著作権", "sign in", "sign up", "log in", "login", "register",
    "subscribe", "newsletter", "share on", "share this", "follow us", "skip to", "cookie", "read more",
    "weiterlesen", "mehr lesen", "click here", "back to top", "related posts", "related articles",
    "advertisement", "anzeige", "impressum",
)
_BOILERPLATE = re.compile("|".join(re.escape(phrase) for phrase in BOILERPLATE_PHRASES))
_COPYRIGHT_YEAR = re.compile(r"\(c\)\s*\d{4}")
_SEPARATORS = re.compile(r"\s[|·»›•/]\s|\s-\s|\s–\s")
_DENSE_SCRIPT = re.compile(r"[\u3040-\u30FF\u3400-\u9FFF\uAC00-\uD7AF\u0E00-\u0E7F]")
_CLOSERS = "\"'”’»)]」』）"


def _ends_with_terminal(line: str) -> bool:
    end = line.rstrip().rstrip(_CLOSERS)
    return bool(end) and end[-1] in TERMINAL_PUNCTUATION


def line_score(line: str) -> float:
    """Rules 1 to 4 and rule 5's base score for one line, without context."""
    folded = line.casefold()
    if _BOILERPLATE.search(folded) or ("(c)" in folded and _COPYRIGHT_YEAR.search(folded)):
        return 0.05
    if len(_SEPARATORS.findall(line)) >= 2:
        return 0.1
    dense = len(_DENSE_SCRIPT.findall(line[:200])) > min(len(line), 200) // 3
    long_chars, medium_chars = (40, 15) if dense else (100, 40)
    terminal = _ends_with_terminal(line)
    if len(line) >= long_chars:
        return 0.95 if terminal else 0.7
    if len(line) >= medium_chars:
        return 0.8 if terminal else 0.4
    return 0.2


def heuristic_main_content_scores(lines: list[str]) -> list[float]:
    """P(main content) per line of ONE document, in order (contract 3's fallback)."""
    scores = [line_score(line) for line in lines]
    out = list(scores)
    for i, line in enumerate(lines):
        if scores[i] == 0.2 and _ends_with_terminal(line):
            before = scores[i - 1] if i > 0 else 0.0
            after = scores[i + 1] if i + 1 < len(lines) else 0.0
            if before >= 0.8 and after >= 0.8:
                out[i] = 0.6
    return out
