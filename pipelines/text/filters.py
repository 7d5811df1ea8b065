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

Each rule is declared once (`@rule`: its reasons, its check, and its batch form next to it), as
datatrove's filters are: `first_failure_reference` runs the checks one sentence at a time,
counting characters one by one (the definition); `first_failures` runs each rule's batch form over
many sentences at once (a bundle of documents' worth, `SentenceBatch`): numpy arrays of per-sentence
counts taken from per-code-point tables built from the same character classes, substrings found in
the joined text, and the first failing rule's reason kept per sentence. Tests compare each batch
form with its check, and `first_failures` with the reference, on every sentence of the samples.
`REASONS` is derived from the rules.
"""
from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from functools import cached_property, lru_cache
from operator import itemgetter
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
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


# ----------------------------------------------------------------------------- sentences
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
        """Counted one character at a time: the definition the batch tables must agree with."""
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


class _BatchCount:
    """A read-only SentenceBatch attribute: its per-sentence count of that name, from the counts the
    batch computes together on first use (`_counts`)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, batch: "SentenceBatch | None", owner: type | None = None):
        return self if batch is None else batch._counts[self.name]

    def __set__(self, batch: "SentenceBatch", value) -> None:
        raise AttributeError(f"SentenceBatch.{self.name} is computed from the sentences")


class SentenceBatch:
    """Many sentences (a bundle of documents' worth), held as arrays: the rules' batch forms read
    these instead of looking at one sentence at a time.

    `text` is the sentences joined by "\\n", plus a final "\\n" (no sentence holds one: the caller
    checks), and `codes` its code points; `starts[i]` is where sentence i begins in `text`. The
    counts (`visible`, `digits`, `symbols`, `letters`, `in_script`) come from per-code-point tables
    built from the same character classes as `Sentence.counted`, summed per sentence with
    `np.add.reduceat`; a sentence with a code point beyond the tables is counted one character at a
    time. Everything is computed on first use.
    """

    def __init__(self, texts: Sequence[str], langs: Sequence[str], text: str):
        self.texts = texts
        self.langs = langs
        self.n = len(texts)
        self.text = text
        self.lengths = np.fromiter(map(len, texts), dtype=np.int64, count=self.n)
        self.starts = np.zeros(self.n, dtype=np.int64)
        np.cumsum(self.lengths[:-1] + 1, out=self.starts[1:])
        self.codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)

    @classmethod
    def of(cls, texts: Sequence[str], langs: Sequence[str]) -> "SentenceBatch | None":
        """None where the batch form does not apply: a sentence with a newline inside."""
        text = "\n".join(texts) + "\n"
        if text.count("\n") != len(texts):
            return None
        return cls(texts, langs, text)

    def per_sentence(self, flags: np.ndarray) -> np.ndarray:
        """Sum of `flags` (one per code point of `text`) over each sentence (its "\\n" included)."""
        return np.add.reduceat(flags, self.starts)

    def sentence_of(self, offsets: np.ndarray) -> np.ndarray:
        """Index of the sentence holding each offset of `text`."""
        return np.searchsorted(self.starts, offsets, side="right") - 1

    def containing(self, offsets: Sequence[int]) -> np.ndarray:
        """Per sentence: does one of `offsets` (of `text`) fall in it?"""
        out = np.zeros(self.n, dtype=bool)
        if len(offsets):
            out[np.searchsorted(self.starts, np.asarray(offsets, dtype=np.int64), side="right") - 1] = True
        return out

    @cached_property
    def folded(self) -> str:
        return self.text.casefold()  # per character: sentence i is the i-th line of it

    def arrow(self, folded: bool = False) -> pa.Array:
        """The sentences (casefolded if `folded`) as an Arrow string array."""
        key = "_arrow_folded" if folded else "_arrow"
        array = self.__dict__.get(key)
        if array is None:
            text = self.folded if folded else self.text
            array = self.__dict__[key] = pc.split_pattern(pa.array([text[:-1]]), "\n").flatten()
            if len(array) != self.n:
                raise ValueError("a sentence holds a newline")  # of() let no such batch through
        return array

    @cached_property
    def _tabled(self) -> tuple[np.ndarray, np.ndarray]:
        """Code points clipped into the tables, and per sentence whether one lay beyond them."""
        codes = self.codes
        limit = UNICODE_PUNCTUATION_AND_SYMBOLS_END
        if self.n and int(codes.max()) >= limit:
            beyond = np.maximum.reduceat(codes, self.starts) >= limit
            return np.minimum(codes, limit - 1), beyond
        return codes, np.zeros(self.n, dtype=bool)

    @cached_property
    def _counts(self) -> dict[str, np.ndarray]:
        codes, beyond = self._tabled
        tables = _character_tables()
        classes = tables.classes[codes]

        def count(flag: int) -> np.ndarray:
            return self.per_sentence(((classes & flag) != 0).astype(np.int32))

        counts = {
            "visible": self.lengths - (count(SPACE) - 1),  # each sentence's "\n" is a space
            "digits": count(DIGIT),
            "symbols": count(SYMBOL),
            "letters": count(LETTER),
        }
        # In-script letters: each code point's scripts as bits, each sentence's language as a mask.
        mask_of = {lang: tables.script_mask(expected_scripts(lang)) for lang in set(self.langs)}
        if len(mask_of) == 1:
            in_script = (tables.script_bits[codes] & mask_of[self.langs[0]]) != 0
        else:
            masks = np.fromiter(map(mask_of.__getitem__, self.langs), dtype=np.uint32, count=self.n)
            in_script = (tables.script_bits[codes] & np.repeat(masks, self.lengths + 1)) != 0
        counts["in_script"] = self.per_sentence(in_script.astype(np.int32))
        for i in np.flatnonzero(beyond).tolist():  # rare: counted one character at a time
            counted = Sentence.counted(self.texts[i], self.langs[i])
            for name in counts:
                counts[name][i] = getattr(counted, name)
        return counts

    visible = _BatchCount()
    digits = _BatchCount()
    symbols = _BatchCount()
    letters = _BatchCount()
    in_script = _BatchCount()

    @cached_property
    def ascii(self) -> np.ndarray:
        return np.maximum.reduceat(self.codes, self.starts) < 128

    def lang_in(self, langs: frozenset[str]) -> np.ndarray:
        return np.fromiter(map(langs.__contains__, self.langs), dtype=bool, count=self.n)


class _CharacterTables:
    """Per code point of planes 0-1: its `character_class` flags, and as bits the scripts (of those
    asked for so far) whose Script_Extensions hold it when it is a letter (`in_scripts`)."""

    def __init__(self):
        size = UNICODE_PUNCTUATION_AND_SYMBOLS_END
        self.classes = np.fromiter((_character_class(chr(cp)) for cp in range(size)), dtype=np.uint8, count=size)
        self.script_bits = np.zeros(size, dtype=np.uint32)
        self._bit: dict[str, int] = {}
        self._masks: dict[frozenset[str], int] = {}

    def script_mask(self, scripts: frozenset[str]) -> int:
        mask = self._masks.get(scripts)
        if mask is None:
            mask = 0
            for name in sorted(scripts):
                mask |= self._script_bit(name)
            self._masks[scripts] = mask
        return mask

    def _script_bit(self, name: str) -> int:
        bit = self._bit.get(name)
        if bit is None:
            if len(self._bit) == 32:
                raise ValueError("more than 32 scripts in the language table")
            bit = self._bit[name] = 1 << len(self._bit)
            table = np.zeros(len(self.classes), dtype=bool)
            for run in script_pattern(frozenset({name})).finditer(_tabled_characters()):
                table[run.start():run.end()] = True
            table &= (self.classes & LETTER) != 0
            self.script_bits[table] |= np.uint32(bit)
        return bit


@lru_cache(maxsize=1)
def _tabled_characters() -> str:
    return "".join(map(chr, range(UNICODE_PUNCTUATION_AND_SYMBOLS_END)))


@lru_cache(maxsize=1)
def _character_tables() -> _CharacterTables:
    return _CharacterTables()


# Whitespace characters (`str.isspace`; none lies beyond U+3000).
_WHITESPACE = frozenset(chr(cp) for cp in range(0x3001) if chr(cp).isspace())


def ends_with_terminal(texts: Sequence[str], closers: str) -> np.ndarray:
    """Per text: does it end, after trailing whitespace and then `closers`, in TERMINAL_PUNCTUATION?
    (`text.rstrip().rstrip(closers)[-1:]`, for many texts: only a text that ends in whitespace or a
    closer is stripped one by one.)"""
    lasts = list(map(itemgetter(slice(-1, None)), texts))
    out = np.fromiter(map(TERMINAL_PUNCTUATION.__contains__, lasts), dtype=bool, count=len(texts))
    special = _WHITESPACE.union(closers).__contains__
    for i in [i for i, last in enumerate(lasts) if special(last)]:
        end = texts[i].rstrip().rstrip(closers)
        out[i] = bool(end) and end[-1] in TERMINAL_PUNCTUATION
    return out


# ----------------------------------------------------------------------------- rules
Check = Callable[[Sentence, FilterConfig], "str | None"]
# The batch form of a rule: per sentence, the index in `reasons` of the reason it fails with, or -1.
BatchCheck = Callable[[SentenceBatch, FilterConfig], np.ndarray]


@dataclass(frozen=True)
class Rule:
    """One filter: `check` returns one of `reasons` for a sentence that fails, None to keep it.

    `batch` is the same rule over a `SentenceBatch`: per sentence, the index in `reasons` of the
    reason `check` returns, or -1 (tests compare the two on every sentence of the samples).
    """
    check: Check
    reasons: tuple[str, ...]
    batch: BatchCheck

    @property
    def name(self) -> str:
        return self.check.__name__

    def __call__(self, text: str, lang: str, config: FilterConfig = FilterConfig()) -> str | None:
        """The rule on one sentence, for a REPL or a test."""
        return self.check(Sentence.counted(text, lang), config)


def rule(*reasons: str, batch: BatchCheck) -> Callable[[Check], Rule]:
    """Declares a filter: `@rule("reason", ..., batch=...)` over its check function makes it a Rule."""
    def declare(check: Check) -> Rule:
        return Rule(check, reasons, batch)
    return declare


def _fails(failing: np.ndarray) -> np.ndarray:
    """A one-reason rule's batch result from its per-sentence failure flags."""
    return np.where(failing, 0, -1)


@rule("too_short", "too_long",
      batch=lambda b, config: np.where(b.lengths < config.min_chars, 0, np.where(b.lengths > config.max_chars, 1, -1)))
def length(sentence: Sentence, config: FilterConfig) -> str | None:
    n = len(sentence.text)
    if n < config.min_chars:
        return "too_short"
    if n > config.max_chars:
        return "too_long"
    return None


@rule("no_terminal_punctuation",
      batch=lambda b, config: _fails(~ends_with_terminal(b.texts, _CLOSERS) & ~b.lang_in(NO_TERMINAL_PUNCTUATION_LANGUAGES)))
def terminal_punctuation(sentence: Sentence, config: FilterConfig) -> str | None:
    if sentence.lang in NO_TERMINAL_PUNCTUATION_LANGUAGES:
        return None
    end = sentence.text.rstrip().rstrip(_CLOSERS)
    if end and end[-1] in TERMINAL_PUNCTUATION:
        return None
    return "no_terminal_punctuation"


def substring_rule(reason: str, substrings: tuple[str, ...], casefold: bool) -> Rule:
    """A rule that drops a sentence holding one of `substrings` (in its casefolded form if
    `casefold`). In a batch, RE2 (Arrow compute) looks for all substrings at once in every
    sentence of an Arrow array of the (casefolded) sentences: one C++ pass."""
    def holds_one(text: str) -> bool:
        return any(map(text.__contains__, substrings))

    def check(sentence: Sentence, config: FilterConfig) -> str | None:
        return reason if holds_one(sentence.text.casefold() if casefold else sentence.text) else None

    pattern = "|".join(re.escape(substring) for substring in substrings)  # an RE2 alternation of literals

    def batch(b: SentenceBatch, config: FilterConfig) -> np.ndarray:
        if not casefold and not holds_one(b.text):  # (the casefolded text is searched whatever it holds)
            return np.full(b.n, -1)
        found = pc.match_substring_regex(b.arrow(casefold), pattern)
        return _fails(found.to_numpy(zero_copy_only=False))

    check.__name__ = check.__qualname__ = reason
    return Rule(check, (reason,), batch)


replacement_character = substring_rule("replacement_character", ("\uFFFD",), casefold=False)
javascript = substring_rule("javascript", ("javascript",), casefold=True)
lorem_ipsum = substring_rule("lorem_ipsum", ("lorem ipsum",), casefold=True)
policy = substring_rule("policy", POLICY_PHRASES, casefold=True)


@lru_cache(maxsize=None)
def _repeated_pattern(max_repeated_run: int) -> re.Pattern:
    # `.` does not match a newline, so a run of line breaks is not a run of repeated characters
    return re.compile(r"(.)\1{%d,}" % max_repeated_run)


def _has_run(b: SentenceBatch, config: FilterConfig) -> np.ndarray:
    """Per sentence: does it hold max_repeated_run + 1 equal characters (not newlines) in a row?"""
    codes = b.codes
    steps = config.max_repeated_run
    if len(codes) <= steps:
        return np.zeros(b.n, dtype=bool)
    # run[i]: codes[i] equals each of the `width` characters after it (a newline ends every sentence)
    run = (codes[1:] == codes[:-1]) & (codes[:-1] != 10)
    width = 1
    while width < steps:  # doubling: runs of width 2, 4, ... then the rest
        step = min(width, steps - width)
        run = run[:-step] & run[step:]
        width += step
    return b.containing(np.flatnonzero(run))


@rule("repeated_characters", batch=lambda b, config: _fails(_has_run(b, config)))
def repeated_characters(sentence: Sentence, config: FilterConfig) -> str | None:
    return "repeated_characters" if _repeated_pattern(config.max_repeated_run).search(sentence.text) else None


_HAN_RUN = re.compile(r"[\u3400-\u9fff]{2,}")
_HAN_PAIR = re.compile(r"[\u4e00-\u9fff]{2,}")


def _gbk_batch(b: SentenceBatch, config: FilterConfig) -> np.ndarray:
    out = np.full(b.n, -1)
    if _HAN_RUN.search(b.text) is None:
        return out
    codes = b.codes
    han = (codes >= 0x3400) & (codes <= 0x9FFF)
    with_run = b.containing(np.flatnonzero(han[1:] & han[:-1]))  # two Han characters in a row
    for i in np.flatnonzero(with_run).tolist():  # the check itself, on the sentences with a Han run
        if gbk_mojibake.check(Sentence(b.texts[i], b.langs[i], 0, 0, 0, 0, 0), config) is not None:
            out[i] = 0
    return out


@rule("gbk_mojibake", batch=_gbk_batch)
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


def _ratio_above(part: np.ndarray, whole: np.ndarray, limit: float) -> np.ndarray:
    """part / whole > limit where whole > 0 (IEEE division, as Python's)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return (whole > 0) & (part / np.maximum(whole, 1) > limit)


@rule("digits", batch=lambda b, config: _fails((b.visible == 0) | _ratio_above(b.digits, b.visible, config.max_digit_ratio)))
def digits(sentence: Sentence, config: FilterConfig) -> str | None:
    if not sentence.visible or sentence.digits / sentence.visible > config.max_digit_ratio:
        return "digits"
    return None


_NO_ELLIPSIS_RULE = frozenset({"zh", "ja"})


def _symbols_batch(b: SentenceBatch, config: FilterConfig) -> np.ndarray:
    visible = np.maximum(b.visible, 1)
    ratio = b.symbols / visible
    if "..." in b.text:
        # str.count("...") per sentence: non-overlapping from the left, and a "\n" ends every run.
        ellipses = np.bincount(b.sentence_of(np.fromiter((m.start() for m in _ELLIPSIS.finditer(b.text)),
                                                         dtype=np.int64)), minlength=b.n)
        counted = (ellipses > 0) & ~b.lang_in(_NO_ELLIPSIS_RULE)
        ratio = np.where(counted, ratio + 3 * ellipses / visible, ratio)
    return _fails((b.visible == 0) | (ratio > config.max_symbol_ratio))


_ELLIPSIS = re.compile(r"\.\.\.")


@rule("symbols", batch=_symbols_batch)
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


def _script_batch(b: SentenceBatch, config: FilterConfig) -> np.ndarray:
    letters, in_script = b.letters, b.in_script
    with np.errstate(divide="ignore", invalid="ignore"):
        low = in_script / np.maximum(letters, 1) < config.min_script_ratio
    mismatch = np.where(b.ascii, in_script == 0, low)
    return np.where(letters == 0, 0, np.where(mismatch, 1, -1))


@rule("no_letters", "script_mismatch", batch=_script_batch)
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


def first_failure_codes(texts: Sequence[str], langs: Sequence[str], config: FilterConfig = _DEFAULT_CONFIG) -> np.ndarray:
    """`first_failures` as indices into REASONS (-1: kept), one array for many sentences."""
    n = len(texts)
    batch = SentenceBatch.of(texts, langs) if n else None
    if batch is None:
        index = {reason: i for i, reason in enumerate(REASONS)}
        return np.fromiter((-1 if r is None else index[r] for r in
                            (first_failure_reference(t, l, config) for t, l in zip(texts, langs))),
                           dtype=np.int64, count=n)
    out = np.full(n, -1, dtype=np.int64)
    offset = 0
    for filter_rule in FILTERS:
        found = filter_rule.batch(batch, config)
        first = (out < 0) & (found >= 0)
        out[first] = found[first] + offset
        offset += len(filter_rule.reasons)
    return out


def first_failures(texts: Sequence[str], langs: Sequence[str], config: FilterConfig = _DEFAULT_CONFIG) -> list[str | None]:
    """`first_failure` for each of many sentences (a bundle of documents'); equal to calling it one
    by one.

    This runs on every sentence of the corpus, so the sentences are checked all at once: each
    rule's batch form (`Rule.batch`) over a `SentenceBatch` (characters counted with per-code-point
    tables, substrings found in the joined text), the first failing rule's reason kept.
    """
    names = (None,) + REASONS  # index -1 + 1 = 0: None
    return [names[code + 1] for code in first_failure_codes(texts, langs, config).tolist()]
