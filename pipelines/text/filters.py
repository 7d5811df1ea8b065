"""Sentence quality filters: each a pure function returning a drop reason, or None to keep.

Rules follow C4 (TFDS `c4_utils.py`) and Gopher (Rae et al. 2021), applied per sentence:
- `length`: LaBSE kept sentences of 10 to 5,000 characters.
- `terminal_punctuation`: C4 keeps lines ending in terminal punctuation; language-aware
  (。！？, ।, ؟, ።, ។ ...). Thai and Lao are exempt: they write no sentence-final mark.
- `javascript`, `lorem_ipsum`, `policy`: C4's bad-phrase rules (plus cookie banners in a few languages).
- `symbols`: Gopher's symbol-to-word rule, as a ratio of symbol characters to non-space characters.
- `digits`: mostly digits (tables, phone numbers, prices).
- `repeated_characters`: a run of one character (`!!!!!!!!!!`, `----------`).
- `replacement_character`: U+FFFD, the mark of a wrong charset.
- `gbk_mojibake`: UTF-8 Chinese decoded as GBK upstream, in pages that are mojibake as sent.
- `script`: the letters are mostly not in the script(s) of the sentence's language.
"""
from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Sequence

import numpy as np


@dataclass(frozen=True)
class FilterConfig:
    min_chars: int = 10
    max_chars: int = 5000
    max_symbol_ratio: float = 0.1
    max_digit_ratio: float = 0.3
    max_repeated_run: int = 9          # a run longer than this of one character drops the sentence
    min_script_ratio: float = 0.5      # share of letters that must be in the language's script(s)


TERMINAL_PUNCTUATION = frozenset(
    ".!?…"            # Latin, Cyrillic, Greek (Greek also uses ; as question mark)
    ";\u037E"
    "。！？｡．"        # CJK full-width
    "\u0964\u0965"    # Devanagari and other Indic danda
    "\u061F\u06D4"    # Arabic question mark, Urdu full stop
    "\u1362\u1367\u1368"  # Ethiopic
    "\u17D4\u17D5"    # Khmer
    "\u104A\u104B"    # Myanmar
    "\u0F0D\u0F0E"    # Tibetan
    "\u0589"          # Armenian
    "\u055C\u055E"    # Armenian exclamation, question
)
# Closing quotes and brackets may follow the terminal mark: `He said "yes."` or `(see above.)`.
_CLOSERS = "\"'”’»›)]}」』）】〉》"
NO_TERMINAL_PUNCTUATION_LANGUAGES = frozenset({"th", "lo"})

POLICY_PHRASES = (
    # C4's list
    "terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies",
    # cookie banners and legal boilerplate in a few large languages
    "accept cookies", "datenschutzerklärung", "verwendet cookies", "utilise des cookies",
    "politique de confidentialité", "política de privacidad", "политика конфиденциальности",
    "использует cookie", "隐私政策", "隱私權政策", "プライバシーポリシー",
)

_REPEATED = {}


def length(text: str, lang: str, config: FilterConfig) -> str | None:
    n = len(text)
    if n < config.min_chars:
        return "too_short"
    if n > config.max_chars:
        return "too_long"
    return None


def terminal_punctuation(text: str, lang: str, config: FilterConfig) -> str | None:
    if lang in NO_TERMINAL_PUNCTUATION_LANGUAGES:
        return None
    end = text.rstrip().rstrip(_CLOSERS)
    if end and end[-1] in TERMINAL_PUNCTUATION:
        return None
    return "no_terminal_punctuation"


def javascript(text: str, lang: str, config: FilterConfig) -> str | None:
    return "javascript" if "javascript" in text.casefold() else None


def lorem_ipsum(text: str, lang: str, config: FilterConfig) -> str | None:
    return "lorem_ipsum" if "lorem ipsum" in text.casefold() else None


def policy(text: str, lang: str, config: FilterConfig) -> str | None:
    folded = text.casefold()
    return "policy" if any(phrase in folded for phrase in POLICY_PHRASES) else None


# ASCII punctuation used as decoration or markup, and CJK lenticular brackets (spam that wraps
# every character: 【随】【着】...), count as symbols too.
_EXTRA_SYMBOLS = frozenset("#|•·*_~<>{}[]\\/@=+^`【】")


@lru_cache(maxsize=1)
def _symbol_deletions() -> dict[int, None]:
    # Unicode symbols (S*) plus the ASCII/CJK marks above, built once per process;
    # `len(text) - len(text.translate(table))` counts them in C. Planes 0-1 hold every S* and
    # P* code point (tests/test_text_fast_paths.py checks the whole range), so the scan stops
    # there: 8x less start-up work per worker.
    return {cp: None for cp in range(UNICODE_PUNCTUATION_AND_SYMBOLS_END)
            if chr(cp) in _EXTRA_SYMBOLS or unicodedata.category(chr(cp))[0] == "S"}


UNICODE_PUNCTUATION_AND_SYMBOLS_END = 0x20000


_DIGIT = re.compile(r"\d")
_ASCII_LETTER = re.compile(r"[A-Za-z]")


def symbols(text: str, lang: str, config: FilterConfig) -> str | None:
    visible = len("".join(text.split()))
    if not visible:
        return "symbols"
    ratio = (len(text) - len(text.translate(_symbol_deletions()))) / visible
    if "..." in text and lang not in ("zh", "ja"):
        # Gopher: ellipses stand for cut-off teasers ("Read more..."); count each as symbols.
        ratio += 3 * text.count("...") / visible
    return "symbols" if ratio > config.max_symbol_ratio else None


def digits(text: str, lang: str, config: FilterConfig) -> str | None:
    visible = len("".join(text.split()))
    if not visible:
        return "digits"
    return "digits" if len(_DIGIT.findall(text)) / visible > config.max_digit_ratio else None


def _repeated_pattern(config: FilterConfig) -> re.Pattern:
    pattern = _REPEATED.get(config.max_repeated_run)
    if pattern is None:  # `.` does not match a newline: no run spans two newline-joined sentences
        pattern = _REPEATED.setdefault(config.max_repeated_run, re.compile(r"(.)\1{%d,}" % config.max_repeated_run))
    return pattern


def repeated_characters(text: str, lang: str, config: FilterConfig) -> str | None:
    return "repeated_characters" if _repeated_pattern(config).search(text) else None


def replacement_character(text: str, lang: str, config: FilterConfig) -> str | None:
    return "replacement_character" if "\uFFFD" in text else None


_HAN_RUN = re.compile(r"[\u3400-\u9fff]{2,}")
_HAN_PAIR = re.compile(r"[\u4e00-\u9fff]{2,}")


def gbk_mojibake(text: str, lang: str, config: FilterConfig) -> str | None:
    """UTF-8 Chinese that was decoded as GBK before it reached us ("澳洲" became "婢虫床"): a run
    of Han characters whose GBK bytes, read as UTF-8, give two or more Han characters in a row.
    Pages that are mojibake themselves (no charset decision can repair them) pass every other rule.
    No real Chinese or Japanese line of the UDHR, Tatoeba or WARC samples matches."""
    for match in _HAN_RUN.finditer(text):
        try:
            raw = match.group(0).encode("gbk")
        except UnicodeEncodeError:
            continue
        if _HAN_PAIR.search(raw.decode("utf-8", "replace")):
            return "gbk_mojibake"
    return None


# Scripts (the first word of a letter's Unicode name) per lid.176 language; unlisted languages are
# written in Latin script.
_SCRIPTS: dict[str, frozenset[str]] = {}
for _langs, _scripts in [
    ("ru uk bg be mk kk ky tg mn tt ba cv ce sah os av krc kv lez mhr mrj myv rue tyv xal bxr udm", {"CYRILLIC"}),
    ("sr sh", {"CYRILLIC", "LATIN"}),
    ("uz az tk", {"LATIN", "CYRILLIC"}),
    ("ar arz fa ur ps ckb ug sd azb mzn lrc pnb ks", {"ARABIC"}),
    ("ku", {"LATIN", "ARABIC"}),
    ("hi mr ne sa new bh mai gom dty", {"DEVANAGARI"}),
    ("bn as bpy", {"BENGALI"}),
    ("he yi", {"HEBREW"}),
    ("el", {"GREEK"}),
    ("th", {"THAI"}),
    ("lo", {"LAO"}),
    ("km", {"KHMER"}),
    ("my", {"MYANMAR"}),
    ("ka xmf", {"GEORGIAN"}),
    ("hy", {"ARMENIAN"}),
    ("am ti", {"ETHIOPIC"}),
    ("ta", {"TAMIL"}),
    ("te", {"TELUGU"}),
    ("kn", {"KANNADA"}),
    ("ml", {"MALAYALAM"}),
    ("gu", {"GUJARATI"}),
    ("pa", {"GURMUKHI"}),
    ("or", {"ORIYA"}),
    ("si", {"SINHALA"}),
    ("bo", {"TIBETAN"}),
    ("dv", {"THAANA"}),
    ("zh wuu yue", {"CJK"}),
    ("ja", {"CJK", "HIRAGANA", "KATAKANA"}),
    ("ko", {"HANGUL", "CJK"}),
]:
    for _lang in _langs.split():
        _SCRIPTS[_lang] = frozenset(_scripts)
LATIN = frozenset({"LATIN"})


@lru_cache(maxsize=65536)
def letter_script(ch: str) -> str | None:
    """The script of a letter (first word of its Unicode name, CJK for ideographs), None for non-letters."""
    if not ch.isalpha():
        return None
    name = unicodedata.name(ch, "")
    if not name:
        return None
    first = name.split(" ", 1)[0]
    if first in ("CJK", "KANGXI"):
        return "CJK"
    if first == "HALFWIDTH" or first == "FULLWIDTH":
        parts = name.split(" ")
        return parts[1] if len(parts) > 1 else first
    return first


def expected_scripts(lang: str) -> frozenset[str]:
    return _SCRIPTS.get(lang, LATIN)


def script(text: str, lang: str, config: FilterConfig) -> str | None:
    wanted = expected_scripts(lang)
    if text.isascii():  # the common case, decided without looking at characters one by one
        if not _ASCII_LETTER.search(text):
            return "no_letters"
        return None if "LATIN" in wanted else "script_mismatch"
    letters = matching = 0
    for ch, n in Counter(text).items():
        found = letter_script(ch)
        if found is not None:
            letters += n
            if found in wanted:
                matching += n
    if not letters:
        return "no_letters"
    return "script_mismatch" if matching / letters < config.min_script_ratio else None


SentenceFilter = Callable[[str, str, FilterConfig], "str | None"]
# Cheapest first: the first reason found is the one counted.
FILTERS: tuple[SentenceFilter, ...] = (
    length, replacement_character, gbk_mojibake, javascript, lorem_ipsum, policy, repeated_characters,
    terminal_punctuation, digits, symbols, script,
)
# Every reason a filter can return, so counters and stats list them even at zero.
REASONS = (
    "too_short", "too_long", "replacement_character", "gbk_mojibake", "javascript", "lorem_ipsum", "policy",
    "repeated_characters", "no_terminal_punctuation", "digits", "symbols", "no_letters", "script_mismatch",
)


def first_failure_reference(text: str, lang: str, config: FilterConfig = FilterConfig()) -> str | None:
    """`first_failure` written as the plain loop over FILTERS: the definition the fast version
    must agree with (tests compare the two on every sentence of the samples)."""
    for rule in FILTERS:
        reason = rule(text, lang, config)
        if reason is not None:
            return reason
    return None


_DEFAULT_CONFIG = FilterConfig()
_PHRASES = ("javascript", "lorem ipsum") + POLICY_PHRASES


def first_failure(text: str, lang: str, config: FilterConfig = _DEFAULT_CONFIG) -> str | None:
    """The first filter's drop reason for a sentence in language `lang`, or None when it passes all.

    Same result as running FILTERS in order (`first_failure_reference`). For many sentences use
    `first_failures`, which this calls.
    """
    return first_failures([text], [lang], config)[0]


def first_failures(texts: Sequence[str], langs: Sequence[str], config: FilterConfig = _DEFAULT_CONFIG) -> list[str | None]:
    """`first_failure` for each of many sentences (one document's); equal to calling it one by one.

    This runs on every sentence of the corpus, so the character counting is done for all the
    sentences at once: their code points go through per-code-point tables (digit, whitespace,
    symbol, letter script) with numpy and are summed per sentence. The rules that rarely fire
    (U+FFFD, GBK mojibake, the phrase rules, repeated characters) are first tested on all
    sentences together, as a superset, and per sentence only when that finds something.
    """
    if not texts:
        return []
    if not all(texts):  # per-sentence sums (reduceat) need every sentence non-empty
        return [first_failure_reference(text, lang, config) for text, lang in zip(texts, langs)]
    joined = "".join(texts)
    codes = np.frombuffer(joined.encode("utf-32-le"), dtype=np.uint32)
    tables = _char_tables()
    if int(codes.max()) >= len(tables.classes):  # beyond the tabled planes (rare): one by one
        return [first_failure_reference(text, lang, config) for text, lang in zip(texts, langs)]
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    starts = np.zeros(len(texts), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    classes = tables.classes[codes]
    counts = {flag: np.add.reduceat((classes & flag).astype(bool).astype(np.int32), starts).tolist()
              for flag in (_DIGIT_FLAG, _SPACE_FLAG, _SYMBOL_FLAG, _NON_ASCII_FLAG)}
    digits, spaces, symbols_, non_ascii = (counts[f] for f in (_DIGIT_FLAG, _SPACE_FLAG, _SYMBOL_FLAG, _NON_ASCII_FLAG))
    scripts = tables.scripts[codes]
    letters = np.add.reduceat((scripts != 0).astype(np.int32), starts).tolist()
    matching_by_lang = {}
    for lang in set(langs):
        wanted = tables.wanted(expected_scripts(lang))
        matching_by_lang[lang] = np.add.reduceat(wanted[scripts].astype(np.int32), starts).tolist()
    # Rare rules, tested on all sentences at once: a match here may span two sentences, so it
    # only says that the per-sentence test is needed.
    folded = joined.casefold()
    phrases = any(map(folded.__contains__, _PHRASES))
    replacement = "\uFFFD" in joined
    han = _HAN_RUN.search(joined) is not None
    repeated = _has_run(codes, starts, config.max_repeated_run + 1)
    ellipsis = "..." in joined

    out: list[str | None] = []
    for i, (text, lang) in enumerate(zip(texts, langs)):
        reason = _rules_before_counting(text, lang, config, replacement, han, phrases, repeated)
        if reason is None:
            reason = _counted_rules(text, lang, config, int(lengths[i]) - spaces[i], digits[i], symbols_[i],
                                    ellipsis, letters[i], matching_by_lang[lang][i], non_ascii[i] == 0)
        out.append(reason)
    return out


def _rules_before_counting(text: str, lang: str, config: FilterConfig, replacement: bool, han: bool, phrases: bool,
                           repeated: bool) -> str | None:
    """The rules up to terminal punctuation, in FILTERS order; a False flag skips a rule known not
    to fire on this sentence."""
    n = len(text)
    if n < config.min_chars:
        return "too_short"
    if n > config.max_chars:
        return "too_long"
    if replacement and "\uFFFD" in text:
        return "replacement_character"
    if han and gbk_mojibake(text, lang, config):
        return "gbk_mojibake"
    if phrases:
        folded = text.casefold()
        if any(map(folded.__contains__, _PHRASES)):
            if "javascript" in folded:
                return "javascript"
            if "lorem ipsum" in folded:
                return "lorem_ipsum"
            return "policy"
    if repeated and repeated_characters(text, lang, config):
        return "repeated_characters"
    if lang not in NO_TERMINAL_PUNCTUATION_LANGUAGES:
        end = text.rstrip().rstrip(_CLOSERS)
        if not end or end[-1] not in TERMINAL_PUNCTUATION:
            return "no_terminal_punctuation"
    return None


def _counted_rules(text: str, lang: str, config: FilterConfig, visible: int, digit_count: int, symbol_count: int,
                   page_has_ellipsis: bool, letters: int, matching: int, ascii_only: bool) -> str | None:
    """digits, symbols and script from the sentence's character counts."""
    if not visible:
        return "digits"
    if digit_count / visible > config.max_digit_ratio:
        return "digits"
    ratio = symbol_count / visible
    if page_has_ellipsis and "..." in text and lang not in ("zh", "ja"):
        ratio += 3 * text.count("...") / visible
    if ratio > config.max_symbol_ratio:
        return "symbols"
    if not letters:
        return "no_letters"
    if ascii_only:  # as `script`: ASCII letters are Latin, whatever min_script_ratio says
        return None if matching else "script_mismatch"
    return "script_mismatch" if matching / letters < config.min_script_ratio else None


def _has_run(codes: np.ndarray, starts: np.ndarray, run: int) -> bool:
    """Does any sentence hold `run` equal characters in a row? (runs across sentences do not count)"""
    if len(codes) < run:
        return False
    same = codes[1:] == codes[:-1]
    same[starts[1:] - 1] = False  # the last character of a sentence and the first of the next
    steps = run - 1
    total = np.concatenate(([0], np.cumsum(same, dtype=np.int64)))
    return bool((total[steps:] - total[:-steps] == steps).any())


_DIGIT_FLAG, _SPACE_FLAG, _SYMBOL_FLAG, _NON_ASCII_FLAG = 1, 2, 4, 8


class _CharTables:
    """Per code point of planes 0-1: class flags and the letter's script id (0: not a letter)."""

    def __init__(self):
        size = UNICODE_PUNCTUATION_AND_SYMBOLS_END
        symbol_points = _symbol_deletions()
        classes = np.zeros(size, dtype=np.uint8)
        scripts = np.zeros(size, dtype=np.uint16)
        self.script_ids: dict[str, int] = {}
        for cp in range(size):
            ch = chr(cp)
            flags = _NON_ASCII_FLAG if cp >= 128 else 0
            if ch.isdecimal():  # re's \d
                flags |= _DIGIT_FLAG
            if ch.isspace():  # str.split()'s whitespace
                flags |= _SPACE_FLAG
            if cp in symbol_points:
                flags |= _SYMBOL_FLAG
            classes[cp] = flags
            name = letter_script(ch) if ch.isalpha() else None
            if name is not None:
                scripts[cp] = self.script_ids.setdefault(name, len(self.script_ids) + 1)
        self.classes = classes
        self.scripts = scripts
        self._wanted: dict[frozenset, np.ndarray] = {}

    def wanted(self, names: frozenset[str]) -> np.ndarray:
        """Per script id: is it one of `names`? (index 0, not a letter, is False)"""
        table = self._wanted.get(names)
        if table is None:
            table = np.zeros(len(self.script_ids) + 1, dtype=bool)
            for name in names:
                if name in self.script_ids:
                    table[self.script_ids[name]] = True
            self._wanted[names] = table
        return table


@lru_cache(maxsize=1)
def _char_tables() -> _CharTables:
    return _CharTables()
