"""Heuristic main-content scores for a document's lines: the fallback when no model is given.

`labse-clean` without `--main-content-model` scores each line with these rules (the score is a
rough P(main content); sentences inherit their line's score and are dropped as `main_content`
below `--main-content-threshold`, default `MAIN_CONTENT_THRESHOLD`, 0.5):

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

import bisect
import itertools
import re
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.text.filters import TERMINAL_PUNCTUATION, ends_with_terminal

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


# Document-level forms of the rules above, run once over the page's lines joined by "\n"
# instead of a casefold, a search and a findall per line. The phrases are found with `str.find`
# (C substring search, several times faster than sre trying a 30-way alternation at every
# position). `[^\S\n]` is `\s` that cannot cross a line boundary, so no match spans two lines.
_COPYRIGHT_YEAR_DOC = re.compile(r"\(c\)[^\S\n]*\d{4}")
_SEPARATORS_DOC = re.compile(r"[^\S\n][|·»›•/\-–][^\S\n]")


def _line_index(starts: list[int], offset: int) -> int:
    return bisect.bisect_right(starts, offset) - 1


def _line_starts(lines: list[str]) -> list[int]:
    """Offsets of each line in "\n".join(lines)."""
    return [0, *itertools.accumulate(len(line) + 1 for line in lines)][:-1]


def _boilerplate_lines(folded: str, starts: list[int]) -> set[int]:
    """Indices of the lines of `folded` (casefolded lines joined by "\n") with a boilerplate phrase."""
    found: set[int] = set()
    find = folded.find
    for phrase in BOILERPLATE_PHRASES:
        at = find(phrase)
        while at >= 0:
            line = _line_index(starts, at)
            found.add(line)
            # The next occurrence that could be on another line starts after this line.
            next_start = starts[line + 1] if line + 1 < len(starts) else len(folded)
            at = find(phrase, next_start)
    if "(c)" in folded:
        found.update(_line_index(starts, m.start()) for m in _COPYRIGHT_YEAR_DOC.finditer(folded))
    return found


def line_scores(lines: list[str]) -> list[float]:
    """`line_score` for every line of a document, computed page-wide (same values)."""
    n = len(lines)
    if n == 0:
        return []
    joined = "\n".join(lines)
    if joined.count("\n") != n - 1:  # not a document's lines: score one by one
        return [line_score(line) for line in lines]
    scores: list[float | None] = [None] * n
    starts = _line_starts(lines)
    folded = joined.casefold()  # casefold never adds or removes a "\n"
    # Casefolding maps a character to one or more: the same total length means the same lines.
    folded_starts = starts if len(folded) == len(joined) else _line_starts(folded.split("\n"))
    for i in _boilerplate_lines(folded, folded_starts):
        scores[i] = 0.05
    separators = list(_SEPARATORS_DOC.finditer(joined))
    if separators:
        seen: dict[int, int] = {}
        for match in separators:
            i = _line_index(starts, match.start())
            seen[i] = seen.get(i, 0) + 1
        for i, count in seen.items():
            if count >= 2 and scores[i] is None:
                scores[i] = 0.1
    out: list[float] = []
    for line, fixed in zip(lines, scores):
        if fixed is not None:
            out.append(fixed)
            continue
        size = len(line)
        if line.isascii():
            long_chars, medium_chars = 100, 40
        else:
            head = line[:200]
            dense = _DENSE_SCRIPT.search(head) is not None and \
                len(_DENSE_SCRIPT.findall(head)) > min(size, 200) // 3
            long_chars, medium_chars = (40, 15) if dense else (100, 40)
        if size >= medium_chars:
            terminal = _ends_with_terminal(line)
            if size >= long_chars:
                out.append(0.95 if terminal else 0.7)
            else:
                out.append(0.8 if terminal else 0.4)
        else:
            out.append(0.2)
    return out


def heuristic_main_content_scores(lines: list[str]) -> list[float]:
    """P(main content) per line of ONE document, in order (contract 3's fallback).

    The page-wide form (`line_scores` and a loop for rule 5); `heuristic_scores_of_documents` gives
    the same scores for many documents at once (labse-clean uses it), with a fixed cost per call
    that one page does not repay."""
    scores = line_scores(lines)
    out = list(scores)
    last = len(lines) - 1
    for i, score in enumerate(scores):
        if score == 0.2 and 0 < i < last and scores[i - 1] >= 0.8 and scores[i + 1] >= 0.8 \
                and _ends_with_terminal(lines[i]):
            out[i] = 0.6
    return out


def _arrow_lines(joined: str, n: int) -> pa.Array:
    """The n lines of `joined` ("\n" between them) as an Arrow string array."""
    lines = pc.split_pattern(pa.array([joined]), "\n").flatten()
    assert len(lines) == n
    return lines


def _re2_class(characters) -> str:
    return "[" + "".join(f"\\x{{{ord(ch):x}}}" for ch in sorted(characters)) + "]"


# The RE2 forms (Arrow compute) of BOILERPLATE_PHRASES, _SEPARATORS_DOC and _DENSE_SCRIPT. RE2's
# \s is ASCII only, so Python's \s (str.isspace) is spelled out; no "\n" is inside a line.
_BOILERPLATE_RE2 = "|".join(re.escape(phrase) for phrase in BOILERPLATE_PHRASES)
_LINE_SPACE_RE2 = _re2_class(chr(cp) for cp in range(0x3001) if chr(cp).isspace() and cp != 0x0A)
_SEPARATORS_RE2 = _LINE_SPACE_RE2 + _re2_class("|·»›•/-–") + _LINE_SPACE_RE2
_DENSE_RE2 = r"[\x{3040}-\x{30FF}\x{3400}-\x{9FFF}\x{AC00}-\x{D7AF}\x{0E00}-\x{0E7F}]"


def heuristic_scores_of_documents(lines: Sequence[str], bounds: Sequence[int]) -> np.ndarray:
    """`heuristic_main_content_scores` for the lines of many documents at once.

    `lines` are the documents' lines one after the other; document d has lines[bounds[d]:bounds[d + 1]]
    (`bounds` starts at 0 and ends at len(lines)). Returns the scores as one float array. The
    phrases, separators and dense-script characters are found by RE2 (Arrow compute) in all lines at
    once, the lengths and end punctuation are arrays, and rule 5 looks at neighbours inside each
    document only.
    """
    n = len(lines)
    bounds = np.asarray(bounds, dtype=np.int64)
    if n == 0:
        return np.zeros(0)
    joined = "\n".join(lines)
    if joined.count("\n") != n - 1:  # not lines of documents: score one by one
        return np.array([s for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist())
                         for s in heuristic_main_content_scores(list(lines[lo:hi]))], dtype=np.float64)
    lengths = np.fromiter(map(len, lines), dtype=np.int64, count=n)
    starts = np.zeros(n, dtype=np.int64)
    np.cumsum(lengths[:-1] + 1, out=starts[1:])

    # Rule 1: boilerplate phrases, in the casefolded lines (casefold never adds or removes a "\n").
    # The phrases, separators and dense-script characters are found per line by RE2 over Arrow
    # arrays of the lines (one pass each, C++), not by a Python loop per occurrence.
    folded = joined.casefold()
    folded_lines = _arrow_lines(folded, n)
    boilerplate = pc.match_substring_regex(folded_lines, _BOILERPLATE_RE2).to_numpy(zero_copy_only=False)
    if "(c)" in folded:
        if len(folded) == len(joined):  # the same total length means the same lines
            folded_starts = starts
        else:
            folded_starts = np.zeros(n, dtype=np.int64)
            folded_lengths = np.fromiter(map(len, folded.split("\n")), dtype=np.int64, count=n)
            np.cumsum(folded_lengths[:-1] + 1, out=folded_starts[1:])
        years = [match.start() for match in _COPYRIGHT_YEAR_DOC.finditer(folded)]
        if years:
            boilerplate = boilerplate.copy()
            boilerplate[np.searchsorted(folded_starts, years, side="right") - 1] = True

    # Rule 2: two or more separators on a line. Casefolding maps no character to or from a space,
    # separator or dense-script character, nor to nothing; when it changed no length (most
    # bundles), each folded line has those characters where its line has them, so the folded
    # lines serve for rules 2 and 3 as well.
    arrow_lines = folded_lines if len(folded) == len(joined) else _arrow_lines(joined, n)
    menu = (pc.count_substring_regex(arrow_lines, _SEPARATORS_RE2).to_numpy() >= 2) & ~boilerplate

    # Rules 3 to 5: length (shorter limits for dense scripts) and end punctuation.
    long_chars = np.full(n, 100)
    medium_chars = np.full(n, 40)
    maybe_dense = ~np.fromiter(map(str.isascii, lines), dtype=bool, count=n) & (lengths >= 15)  # else short anyway
    if maybe_dense.any():
        heads = pc.utf8_slice_codeunits(arrow_lines, 0, 200)
        dense_counts = pc.count_substring_regex(heads, _DENSE_RE2).to_numpy()
        dense = maybe_dense & (dense_counts > np.minimum(lengths, 200) // 3)
        long_chars[dense] = 40
        medium_chars[dense] = 15
    terminal = ends_with_terminal(lines, _CLOSERS)
    scores = np.where(lengths >= long_chars, np.where(terminal, 0.95, 0.7),
                      np.where(lengths >= medium_chars, np.where(terminal, 0.8, 0.4), 0.2))
    scores[menu] = 0.1
    scores[boilerplate] = 0.05

    # Rule 5: a short line ending in terminal punctuation between two lines of at least 0.8, in
    # the same document (not a document's first or last line).
    inner = np.ones(n, dtype=bool)
    inner[bounds[:-1][bounds[:-1] < n]] = False
    inner[bounds[1:][bounds[1:] > 0] - 1] = False
    strong = scores >= 0.8
    raised = np.zeros(n, dtype=bool)
    if n > 2:
        raised[1:-1] = (scores[1:-1] == 0.2) & inner[1:-1] & strong[:-2] & strong[2:] & terminal[1:-1]
    scores[raised] = 0.6
    return scores
