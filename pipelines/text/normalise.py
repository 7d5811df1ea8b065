"""Text normalisation: cleaning a sentence for output, and the key for exact deduplication."""
from __future__ import annotations

import hashlib
import re
import unicodedata
from functools import lru_cache

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
