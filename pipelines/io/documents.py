"""What readers produce: one `Document`, `Dropped` or `ReadError` per input record.

These three types are the contract between the readers (`pipelines.read.readers`) and every stage
after them (contract 1 in README.md, section Architecture). The invariant a reader keeps is that
each record it meets in a file yields exactly one of them, so that `documents + dropped + errors ==
records seen` holds for every file; a file that cannot be opened, or is empty, yields one
`ReadError` for the whole file.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

SOURCE_CC = "cc"
SOURCE_WIKI = "wiki"
KIND_HTML = "html"
KIND_TEXT = "text"


@dataclass(frozen=True)
class Document:
    source: str  # "cc" or "wiki"
    url: str  # WARC-Target-URI, or the Wikipedia page URL
    doc_id: str  # WARC-Record-ID, or f"wiki:{lang}:{page_id}"
    file: str  # the input file path
    offset: int  # byte offset of the record (gzip member offset for .gz), or the page ordinal for XML
    kind: str  # "html" (decoded HTML str) or "text" (plain text, one block per line: WET, wiki)
    body: str
    lang: str | None  # known language (the Wikipedia edition, as a lid.176 code), else None


@dataclass(frozen=True)
class Dropped:
    """A record read correctly but not wanted, e.g. "warc_type:request", "not_html", "redirect"."""

    reason: str
    file: str
    offset: int


@dataclass(frozen=True)
class ReadError:
    """A record (or a whole file) that could not be read, e.g. "truncated_gzip", "malformed_xml"."""

    reason: str
    file: str
    offset: int
    detail: str


ReadResult = Union[Document, Dropped, ReadError]


@dataclass(frozen=True)
class ReaderLimits:
    """Size limits that keep one bad record from exhausting a worker's memory.

    max_record_bytes: a payload (after HTTP content decoding) larger than this is not decoded but
        dropped as "too_large". The default keeps a 10 MB single-line page and drops 64 MiB+ ones.
    max_page_chars: a Wikipedia page's wikitext longer than this is dropped as "too_large".
    """

    max_record_bytes: int = 64 << 20
    max_page_chars: int = 16 << 20
