"""Sentence quality filters: each a rule that returns one of its drop reasons, or None to keep.

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
- `script`: the letters are mostly not in the script(s) of the sentence's language (by the
  Unicode Script_Extensions property, through the `regex` package).

Each rule is declared once (`@rule`: its reasons, its check, and for the rare ones a page-wide
test), as datatrove's filters are: `first_failure_reference` runs the checks one sentence at a
time, counting characters one by one (the definition); `first_failures` runs the same checks on a
page of sentences at once, with the counts taken from per-code-point tables built from the same
character classes, and skips a rare rule for the whole page when its page-wide test says that no
sentence can fail it. `REASONS` is derived from the rules.
"""
from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Callable, Sequence

import numpy as np
import regex


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

# ----------------------------------------------------------------------------- character classes
# ASCII punctuation used as decoration or markup, and CJK lenticular brackets (spam that wraps
# every character: 【随】【着】...), count as symbols too.
_EXTRA_SYMBOLS = frozenset("#|•·*_~<>{}[]\\/@=+^`【】")
DIGIT, SPACE, SYMBOL, LETTER = 1, 2, 4, 8
# Planes 0-1 hold every S* and P* code point (tests/test_text_fast_paths.py checks the whole
# range), so the per-code-point tables stop there; a page with a code point beyond is counted one
# character at a time.
UNICODE_PUNCTUATION_AND_SYMBOLS_END = 0x20000


def _character_class(ch: str) -> int:
    """DIGIT | SPACE | SYMBOL | LETTER flags of one character."""
    flags = 0
    if ch.isdecimal():  # re's \d
        flags |= DIGIT
    if ch.isspace():  # str.split()'s whitespace
        flags |= SPACE
    if ch in _EXTRA_SYMBOLS or unicodedata.category(ch)[0] == "S":
        flags |= SYMBOL
    if ch.isalpha():
        flags |= LETTER
    return flags


# Cached for the one-character-at-a-time path; the tables call the plain function (their 131,072
# code points would only flush the cache).
character_class = lru_cache(maxsize=65536)(_character_class)


# Scripts (Unicode Script property values) per lid.176 language; unlisted languages are written
# in Latin script.
_SCRIPTS: dict[str, frozenset[str]] = {}
for _langs, _scripts in [
    ("ru uk bg be mk kk ky tg mn tt ba cv ce sah os av krc kv lez mhr mrj myv rue tyv xal bxr udm", {"Cyrillic"}),
    ("sr sh", {"Cyrillic", "Latin"}),
    ("uz az tk", {"Latin", "Cyrillic"}),
    ("ar arz fa ur ps ckb ug sd azb mzn lrc pnb ks", {"Arabic"}),
    ("ku", {"Latin", "Arabic"}),
    ("hi mr ne sa new bh mai gom dty", {"Devanagari"}),
    ("bn as bpy", {"Bengali"}),
    ("he yi", {"Hebrew"}),
    ("el", {"Greek"}),
    ("th", {"Thai"}),
    ("lo", {"Lao"}),
    ("km", {"Khmer"}),
    ("my", {"Myanmar"}),
    ("ka xmf", {"Georgian"}),
    ("hy", {"Armenian"}),
    ("am ti", {"Ethiopic"}),
    ("ta", {"Tamil"}),
    ("te", {"Telugu"}),
    ("kn", {"Kannada"}),
    ("ml", {"Malayalam"}),
    ("gu", {"Gujarati"}),
    ("pa", {"Gurmukhi"}),
    ("or", {"Oriya"}),
    ("si", {"Sinhala"}),
    ("bo", {"Tibetan"}),
    ("dv", {"Thaana"}),
    ("zh wuu yue", {"Han"}),
    ("ja", {"Han", "Hiragana", "Katakana"}),
    ("ko", {"Hangul", "Han"}),
]:
    for _lang in _langs.split():
        _SCRIPTS[_lang] = frozenset(_scripts)
LATIN = frozenset({"Latin"})


def expected_scripts(lang: str) -> frozenset[str]:
    return _SCRIPTS.get(lang, LATIN)


@lru_cache(maxsize=None)
def script_pattern(scripts: frozenset[str]) -> regex.Pattern:
    """A run of characters of `scripts` by their Unicode Script_Extensions, not their Script: the
    prolonged sound mark ー (Script Common) is written in Hiragana and Katakana, the iteration
    mark 々 is Han, the tatweel ـ is Arabic."""
    return regex.compile("[%s]+" % "".join(r"\p{Script_Extensions=%s}" % name for name in sorted(scripts)))


@lru_cache(maxsize=65536)
def in_scripts(ch: str, scripts: frozenset[str]) -> bool:
    """Is `ch` a letter of one of `scripts`?"""
    return ch.isalpha() and script_pattern(scripts).match(ch) is not None


# ----------------------------------------------------------------------------- sentences and pages
class Sentence:
    """A sentence, its language, and the character counts that the counting rules read."""

    __slots__ = ("text", "lang", "visible", "digits", "symbols", "letters", "in_script")

    def __init__(self, text: str, lang: str, visible: int, digits: int, symbols: int, letters: int, in_script: int):
        self.text = text
        self.lang = lang
        self.visible = visible      # characters that are not whitespace
        self.digits = digits
        self.symbols = symbols
        self.letters = letters
        self.in_script = in_script  # letters in one of the language's scripts

    @classmethod
    def counted(cls, text: str, lang: str) -> "Sentence":
        """Counted one character at a time: the definition the page tables must agree with."""
        visible = digits = symbols = letters = in_script = 0
        scripts = expected_scripts(lang)
        for ch, n in Counter(text).items():
            flags = character_class(ch)
            if not flags & SPACE:
                visible += n
            if flags & DIGIT:
                digits += n
            if flags & SYMBOL:
                symbols += n
            if flags & LETTER:
                letters += n
                if in_scripts(ch, scripts):
                    in_script += n
        return cls(text, lang, visible, digits, symbols, letters, in_script)


class Page:
    """The sentences of one document, counted all at once: their code points go through the
    per-code-point tables with numpy and are summed per sentence. Also what the rare rules'
    page-wide tests read: the text of all sentences joined, its casefolded form, runs of one
    character."""

    def __init__(self, texts: Sequence[str], langs: Sequence[str], text: str, codes: np.ndarray,
                 tables: "_CharacterTables"):
        self.text = text
        lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        self._starts = starts = np.zeros(len(texts), dtype=np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        self._codes = codes
        classes = tables.classes[codes]

        def per_sentence(flags: np.ndarray) -> list[int]:
            return np.add.reduceat(flags.astype(np.int32), starts).tolist()

        visible = (lengths - np.add.reduceat((classes & SPACE != 0).astype(np.int32), starts)).tolist()
        digits, symbols, letters = (per_sentence(classes & flag != 0) for flag in (DIGIT, SYMBOL, LETTER))
        by_lang = {lang: per_sentence(tables.in_scripts(expected_scripts(lang))[codes]) for lang in set(langs)}
        in_script = by_lang[langs[0]] if len(by_lang) == 1 else [by_lang[lang][i] for i, lang in enumerate(langs)]
        self.sentences = list(map(Sentence, texts, langs, visible, digits, symbols, letters, in_script))

    @classmethod
    def counted(cls, texts: Sequence[str], langs: Sequence[str]) -> "Page | None":
        """None where the tables cannot count the page: an empty sentence (per-sentence sums need
        every sentence non-empty) or a code point beyond the tabled planes (rare)."""
        if not all(texts):
            return None
        text = "".join(texts)
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        tables = _character_tables()
        if int(codes.max()) >= len(tables.classes):
            return None
        return cls(texts, langs, text, codes, tables)

    @cached_property
    def folded(self) -> str:
        return self.text.casefold()

    def has_run(self, run: int) -> bool:
        """Does any sentence hold `run` equal characters in a row? (runs across sentences do not count)"""
        codes = self._codes
        if len(codes) < run:
            return False
        same = codes[1:] == codes[:-1]
        same[self._starts[1:] - 1] = False  # the last character of a sentence and the first of the next
        steps = run - 1
        total = np.concatenate(([0], np.cumsum(same, dtype=np.int64)))
        return bool((total[steps:] - total[:-steps] == steps).any())


class _CharacterTables:
    """Per code point of planes 0-1: its `character_class` flags; per set of scripts, whether it is
    a letter of one of them (`in_scripts`)."""

    def __init__(self):
        size = UNICODE_PUNCTUATION_AND_SYMBOLS_END
        self.classes = np.fromiter((_character_class(chr(cp)) for cp in range(size)), dtype=np.uint8, count=size)
        self._in_scripts: dict[frozenset[str], np.ndarray] = {}

    def in_scripts(self, scripts: frozenset[str]) -> np.ndarray:
        table = self._in_scripts.get(scripts)
        if table is None:
            table = np.zeros(len(self.classes), dtype=bool)
            for run in script_pattern(scripts).finditer(_tabled_characters()):
                table[run.start():run.end()] = True
            table &= (self.classes & LETTER) != 0
            self._in_scripts[scripts] = table
        return table


@lru_cache(maxsize=1)
def _tabled_characters() -> str:
    return "".join(map(chr, range(UNICODE_PUNCTUATION_AND_SYMBOLS_END)))


@lru_cache(maxsize=1)
def _character_tables() -> _CharacterTables:
    return _CharacterTables()


# ----------------------------------------------------------------------------- rules
Check = Callable[[Sentence, FilterConfig], "str | None"]
PageTest = Callable[[Page, FilterConfig], bool]


@dataclass(frozen=True)
class Rule:
    """One filter: `check` returns one of `reasons` for a sentence that fails, None to keep it.

    `page_test`, for rules that rarely fire, is True whenever `check` could fail some sentence of
    the page (it may also be True when none does): on a page where it is False, `first_failures`
    skips the rule for every sentence.
    """
    check: Check
    reasons: tuple[str, ...]
    page_test: PageTest | None = None

    @property
    def name(self) -> str:
        return self.check.__name__

    def __call__(self, text: str, lang: str, config: FilterConfig = FilterConfig()) -> str | None:
        """The rule on one sentence, for a REPL or a test."""
        return self.check(Sentence.counted(text, lang), config)


def rule(*reasons: str, page_test: PageTest | None = None) -> Callable[[Check], Rule]:
    """Declares a filter: `@rule("reason", ...)` over its check function makes it a Rule."""
    def declare(check: Check) -> Rule:
        return Rule(check, reasons, page_test)
    return declare


@rule("too_short", "too_long")
def length(sentence: Sentence, config: FilterConfig) -> str | None:
    n = len(sentence.text)
    if n < config.min_chars:
        return "too_short"
    if n > config.max_chars:
        return "too_long"
    return None


@rule("no_terminal_punctuation")
def terminal_punctuation(sentence: Sentence, config: FilterConfig) -> str | None:
    if sentence.lang in NO_TERMINAL_PUNCTUATION_LANGUAGES:
        return None
    end = sentence.text.rstrip().rstrip(_CLOSERS)
    if end and end[-1] in TERMINAL_PUNCTUATION:
        return None
    return "no_terminal_punctuation"


def substring_rule(reason: str, substrings: tuple[str, ...], casefold: bool) -> Rule:
    """A rule that drops a sentence holding one of `substrings` (in its casefolded form if
    `casefold`). A substring of a sentence is a substring of the page's joined text, and
    casefolding goes character by character, so the same test on the page is its page test."""
    def holds_one(text: str) -> bool:
        return any(map(text.__contains__, substrings))

    def check(sentence: Sentence, config: FilterConfig) -> str | None:
        return reason if holds_one(sentence.text.casefold() if casefold else sentence.text) else None

    check.__name__ = check.__qualname__ = reason
    return Rule(check, (reason,), lambda page, config: holds_one(page.folded if casefold else page.text))


replacement_character = substring_rule("replacement_character", ("\uFFFD",), casefold=False)
javascript = substring_rule("javascript", ("javascript",), casefold=True)
lorem_ipsum = substring_rule("lorem_ipsum", ("lorem ipsum",), casefold=True)
policy = substring_rule("policy", POLICY_PHRASES, casefold=True)


@lru_cache(maxsize=None)
def _repeated_pattern(max_repeated_run: int) -> re.Pattern:
    # `.` does not match a newline, so a run of line breaks is not a run of repeated characters
    return re.compile(r"(.)\1{%d,}" % max_repeated_run)


@rule("repeated_characters", page_test=lambda page, config: page.has_run(config.max_repeated_run + 1))
def repeated_characters(sentence: Sentence, config: FilterConfig) -> str | None:
    return "repeated_characters" if _repeated_pattern(config.max_repeated_run).search(sentence.text) else None


_HAN_RUN = re.compile(r"[\u3400-\u9fff]{2,}")
_HAN_PAIR = re.compile(r"[\u4e00-\u9fff]{2,}")


@rule("gbk_mojibake", page_test=lambda page, config: _HAN_RUN.search(page.text) is not None)
def gbk_mojibake(sentence: Sentence, config: FilterConfig) -> str | None:
    """UTF-8 Chinese that was decoded as GBK before it reached us ("澳洲" became "婢虫床"): a run
    of Han characters whose GBK bytes, read as UTF-8, give two or more Han characters in a row.
    Pages that are mojibake themselves (no charset decision can repair them) pass every other rule.
    No real Chinese or Japanese line of the UDHR, Tatoeba or WARC samples matches."""
    for match in _HAN_RUN.finditer(sentence.text):
        try:
            raw = match.group(0).encode("gbk")
        except UnicodeEncodeError:
            continue
        if _HAN_PAIR.search(raw.decode("utf-8", "replace")):
            return "gbk_mojibake"
    return None


@rule("digits")
def digits(sentence: Sentence, config: FilterConfig) -> str | None:
    if not sentence.visible or sentence.digits / sentence.visible > config.max_digit_ratio:
        return "digits"
    return None


@rule("symbols")
def symbols(sentence: Sentence, config: FilterConfig) -> str | None:
    visible = sentence.visible
    if not visible:
        return "symbols"
    ratio = sentence.symbols / visible
    text = sentence.text
    if "..." in text and sentence.lang not in ("zh", "ja"):
        # Gopher: ellipses stand for cut-off teasers ("Read more..."); count each as symbols.
        ratio += 3 * text.count("...") / visible
    return "symbols" if ratio > config.max_symbol_ratio else None


@rule("no_letters", "script_mismatch")
def script(sentence: Sentence, config: FilterConfig) -> str | None:
    if not sentence.letters:
        return "no_letters"
    if sentence.text.isascii():  # ASCII letters are Latin, whatever min_script_ratio says
        return None if sentence.in_script else "script_mismatch"
    return "script_mismatch" if sentence.in_script / sentence.letters < config.min_script_ratio else None


# Cheapest first: the first reason found is the one counted.
FILTERS: tuple[Rule, ...] = (
    length, replacement_character, gbk_mojibake, javascript, lorem_ipsum, policy, repeated_characters,
    terminal_punctuation, digits, symbols, script,
)
# Every reason a rule can return, in the order the rules run. stats.json lists only the reasons
# that occurred (a tally drops zero counts).
REASONS = tuple(reason for filter_rule in FILTERS for reason in filter_rule.reasons)


def _first_reasons(checks: Sequence[Check], sentences: Sequence[Sentence], config: FilterConfig) -> list[str | None]:
    reasons = []
    for sentence in sentences:
        for check in checks:
            reason = check(sentence, config)
            if reason is not None:
                break
        else:
            reason = None
        reasons.append(reason)
    return reasons


_DEFAULT_CONFIG = FilterConfig()


def first_failure_reference(text: str, lang: str, config: FilterConfig = _DEFAULT_CONFIG) -> str | None:
    """The first rule's drop reason for one sentence, every rule run and every character counted
    one by one: the definition `first_failures` must agree with (tests compare the two on every
    sentence of the samples)."""
    return _first_reasons([filter_rule.check for filter_rule in FILTERS], [Sentence.counted(text, lang)], config)[0]


def first_failure(text: str, lang: str, config: FilterConfig = _DEFAULT_CONFIG) -> str | None:
    """The first filter's drop reason for a sentence in language `lang`, or None when it passes all.

    Same result as `first_failure_reference`. For many sentences use `first_failures`, which this calls.
    """
    return first_failures([text], [lang], config)[0]


def first_failures(texts: Sequence[str], langs: Sequence[str], config: FilterConfig = _DEFAULT_CONFIG) -> list[str | None]:
    """`first_failure` for each of many sentences (one document's); equal to calling it one by one.

    This runs on every sentence of the corpus, so the characters of all the sentences are counted
    at once (`Page`), and a rare rule whose page test finds nothing is skipped for all of them.
    """
    if not texts:
        return []
    page = Page.counted(texts, langs)
    if page is None:
        return [first_failure_reference(text, lang, config) for text, lang in zip(texts, langs)]
    checks = [filter_rule.check for filter_rule in FILTERS
              if filter_rule.page_test is None or filter_rule.page_test(page, config)]
    return _first_reasons(checks, page.sentences, config)
