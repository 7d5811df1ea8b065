"""Text normalisation: cleaning a sentence for output, and the key for exact deduplication."""
from __future__ import annotations

import hashlib
import re
import unicodedata
from functools import lru_cache
from itertools import repeat
from typing import Sequence

import numpy as np

_CONTROL = re.compile(r"[\x00-\x08\x0B-\x1F\x7F-\x9F\u200B\u200E\u200F\u202A-\u202E\u2066-\u2069\uFEFF]")
_SPACES = re.compile(r"\s+")


def clean_text(text: str) -> str:
    """NFC, control and invisible direction characters removed, whitespace collapsed to one space."""
    text = unicodedata.normalize("NFC", text)
    if text.isprintable():
        # Every _CONTROL character and every whitespace character but " " is non-printable, so
        # printable text only needs collapsing for double, leading or trailing spaces (most
        # lines come from html_to_lines, which collapsed them already).
        if "  " not in text and not text.startswith(" ") and not text.endswith(" "):
            return text
    else:
        text = _CONTROL.sub("", text)
    return " ".join(text.split())


def is_blank(text: object) -> bool:
    """Whether `text` carries no text at all: not a string, or only whitespace, control and
    invisible format characters (zero-width space, BOM, direction marks). Such a pair is dropped
    as `empty_text`. Stops at the first visible character, so it is quick on ordinary text."""
    if not isinstance(text, str):
        return True
    return all(ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf") for ch in text)


def normalise_for_dedup(text: str) -> str:
    """NFKC, casefolded, punctuation removed, whitespace collapsed.

    "Hello, World!" and "hello world" are the same sentence for deduplication; full-width and
    half-width forms (NFKC) too. Letters, digits, marks and symbols are kept.
    """
    text = _punctuation_to_spaces(unicodedata.normalize("NFKC", text).casefold())
    return " ".join(text.split())  # == _SPACES.sub(" ", text).strip(): both use str.isspace


def normalise_for_dedup_reference(text: str) -> str:
    """`normalise_for_dedup` written directly (the definition; tests compare the two)."""
    text = unicodedata.normalize("NFKC", text).casefold().translate(_punctuation_to_space())
    return _SPACES.sub(" ", text).strip()


_NON_ASCII = re.compile(r"[^\x00-\x7f]")


@lru_cache(maxsize=1)
def _ascii_punctuation_bytes_table() -> bytes:
    table = bytearray(range(256))
    for cp in range(128):
        if cp in _punctuation_to_space():
            table[cp] = 0x20
    return bytes(table)


def _punctuation_to_spaces(text: str) -> str:
    """Every Unicode punctuation character replaced by a space, like `str.translate` with
    `_punctuation_to_space()` but without its per-character dictionary lookups: ASCII bytes go
    through a 256-byte table (UTF-8 multi-byte sequences have no ASCII bytes), and the few
    distinct non-ASCII punctuation marks of a sentence are replaced with `str.replace`."""
    if text.isascii():
        return text.encode("ascii").translate(_ascii_punctuation_bytes_table()).decode("ascii")
    table = _punctuation_to_space()
    out = text.encode("utf-8").translate(_ascii_punctuation_bytes_table()).decode("utf-8")
    for ch in set(_NON_ASCII.findall(out)):
        if ord(ch) in table:
            out = out.replace(ch, " ")
    return out


@lru_cache(maxsize=1)
def _punctuation_to_space() -> dict[int, str]:
    # Every Unicode punctuation code point (category P*), built once per process; all lie in
    # planes 0-1 (see pipelines.text.filters.UNICODE_PUNCTUATION_AND_SYMBOLS_END).
    from pipelines.text.filters import UNICODE_PUNCTUATION_AND_SYMBOLS_END

    return {cp: " " for cp in range(UNICODE_PUNCTUATION_AND_SYMBOLS_END)
            if unicodedata.category(chr(cp)).startswith("P")}


def dedup_key(text: str) -> str:
    """A 128-bit hex digest of `normalise_for_dedup(text)`: a small, fixed-size shuffle key."""
    return hashlib.blake2b(normalise_for_dedup(text).encode("utf-8"), digest_size=16).hexdigest()


def normalise_many_for_dedup(texts: Sequence[str]) -> list[str]:
    """`normalise_for_dedup` of each text, as much as possible done once for all of them.

    NFKC and casefolding run per text (NFKC's quick check skips the texts that are normalised
    already, most of them, which one call on the joined texts could not do once any is not); then
    the texts are joined by "\n" (no character's NFKC or casefold holds one) and the punctuation
    and whitespace are handled on the code points with numpy: punctuation becomes a space, a
    whitespace run inside a text one space, at a text's start or end nothing. Texts with a "\n"
    inside are normalised one by one.
    """
    if not texts:
        return []
    folded = "\n".join(map(str.casefold, map(unicodedata.normalize, repeat("NFKC"), texts)))
    if folded.count("\n") != len(texts) - 1:
        return [normalise_for_dedup(text) for text in texts]
    codes = np.frombuffer(folded.encode("utf-32-le"), dtype=np.uint32).copy()
    tables = _dedup_tables()
    flags = tables[np.minimum(codes, len(tables) - 1)]
    codes[(flags & _PUNCTUATION) != 0] = 0x20
    space = (flags & (_PUNCTUATION | _WHITESPACE)) != 0  # punctuation is a space now; "\n" is neither
    n = len(codes)
    if space.any():
        before = np.empty(n, dtype=bool)  # the previous code point is a space too
        before[0] = False
        np.logical_and(space[1:], space[:-1], out=before[1:])
        run_starts = np.flatnonzero(space & ~before)
        after = np.empty(n, dtype=bool)  # the next code point is a space too
        after[-1] = False
        np.logical_and(space[:-1], space[1:], out=after[:-1])
        run_ends = np.flatnonzero(space & ~after)
        # A run stays (as one space) when a character other than "\n" is on both sides of it.
        left = run_starts - 1
        right = run_ends + 1
        inside = (left >= 0) & (right < n)
        inside[inside] = (codes[left[inside]] != 0x0A) & (codes[np.minimum(right[inside], n - 1)] != 0x0A)
        keep = ~space
        keep[run_starts[inside]] = True
        codes[run_starts[inside]] = 0x20
        codes = codes[keep]
    return codes.tobytes().decode("utf-32-le").split("\n")


_PUNCTUATION, _WHITESPACE = 1, 2


@lru_cache(maxsize=1)
def _dedup_tables() -> np.ndarray:
    """Per code point of planes 0-1 (all punctuation and whitespace lie there): _PUNCTUATION
    (category P*) and _WHITESPACE (`str.isspace`, what `str.split` splits on; "\n" left out)."""
    from pipelines.text.filters import UNICODE_PUNCTUATION_AND_SYMBOLS_END

    table = np.zeros(UNICODE_PUNCTUATION_AND_SYMBOLS_END, dtype=np.uint8)
    table[list(_punctuation_to_space())] |= _PUNCTUATION
    table[[cp for cp in range(0x3001) if chr(cp).isspace() and cp != 0x0A]] |= _WHITESPACE
    return table


def dedup_keys(texts: Sequence[str], langs: Sequence[str]) -> list[bytes]:
    """The deduplication key of each (text, language): a 128-bit digest of the language and
    `normalise_for_dedup(text)`. Two sentences share a key when they have the same language and
    the same normalised text (as the pair (lang, dedup_key(text)) tells), up to hash collisions."""
    blake2b = hashlib.blake2b
    return [blake2b(f"{lang}\n{normalised}".encode("utf-8"), digest_size=16).digest()
            for lang, normalised in zip(langs, normalise_many_for_dedup(texts))]
