"""Wikipedia `pages-articles` XML dumps (`.xml`, `.xml.bz2`, `.xml.gz`) to text Documents.

Streams with `xml.etree.ElementTree.iterparse`, clearing each page once handled, so memory holds
one page at a time. The edition's language comes from `<siteinfo>` (`<dbname>`, else the base
URL's host) and labels every page. Only articles (namespace 0) that are not redirects become
Documents; `offset` is the page's ordinal in the dump (0-based).
"""
from __future__ import annotations

import bz2
import gzip
import xml.etree.ElementTree as ET
from collections import Counter
from typing import BinaryIO, Iterator
from urllib.parse import quote

from pipelines.io.documents import (
    KIND_TEXT,
    SOURCE_WIKI,
    Document,
    Dropped,
    ReaderLimits,
    ReadError,
    ReadResult,
)
from pipelines.read.warc import _Prefixed
from pipelines.text.languages import edition_from_url, edition_to_lang
from pipelines.text.wikitext import wikitext_to_text

FILE_NAMESPACE_KEY = "6"
CATEGORY_NAMESPACE_KEY = "14"


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


class _Site:
    """What `<siteinfo>` tells about the edition."""

    def __init__(self) -> None:
        self.lang: str | None = None
        self.url_prefix = ""
        self.file_namespaces: frozenset[str] = frozenset()
        self.category_namespaces: frozenset[str] = frozenset()
        self.other_namespaces: frozenset[str] = frozenset()

    def read(self, siteinfo: ET.Element) -> None:
        dbname = base = ""
        names: dict[str, set[str]] = {}
        for child in siteinfo.iter():
            tag = _local(child.tag)
            if tag == "dbname":
                dbname = (child.text or "").strip()
            elif tag == "base":
                base = (child.text or "").strip()
            elif tag == "namespace" and child.text:
                names.setdefault(child.get("key", ""), set()).add(child.text.strip().lower())
        self.lang = (edition_to_lang(dbname) if dbname else None) or (edition_from_url(base) if base else None)
        if base:
            self.url_prefix = base.rsplit("/", 1)[0] + "/"
        self.file_namespaces = frozenset(names.get(FILE_NAMESPACE_KEY, ()))
        self.category_namespaces = frozenset(names.get(CATEGORY_NAMESPACE_KEY, ()))
        self.other_namespaces = frozenset(
            name for key, group in names.items() if key not in ("0", FILE_NAMESPACE_KEY, CATEGORY_NAMESPACE_KEY) for name in group
        )


def _open_decompressed(raw: BinaryIO, head: bytes):
    stream = _Prefixed(head, raw)
    if head.startswith(b"BZh"):
        return bz2.BZ2File(stream), "bz2"
    if head.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=stream), "gzip"
    return stream, "xml"


def read_wikipedia_stream(
    raw: BinaryIO,
    path: str,
    *,
    limits: ReaderLimits = ReaderLimits(),
    stats: Counter | None = None,
) -> Iterator[ReadResult]:
    stats = stats if stats is not None else Counter()
    head = raw.read(3)
    if not head:
        yield ReadError("empty_file", path, 0, "the file has no bytes")
        return
    stream, compression = _open_decompressed(raw, head)
    site = _Site()
    ordinal = 0  # pages finished so far = the ordinal of the page being parsed
    root = None
    try:
        for event, elem in ET.iterparse(stream, events=("start", "end")):
            if root is None:
                root = elem
            if event == "start":
                continue
            tag = _local(elem.tag)
            if tag == "siteinfo":
                site.read(elem)
                if site.lang is None:
                    stats["wikipedia_edition_unknown"] += 1
                root.clear()
            elif tag == "page":
                yield _page(elem, path, ordinal, site, limits)
                ordinal += 1
                root.clear()  # drop the finished page (and any whitespace) from the tree
    except ET.ParseError as exc:
        line, column = exc.position
        yield ReadError("malformed_xml", path, ordinal, f"line {line}, column {column}: {exc}")
    except EOFError as exc:  # bz2/gzip: the compressed stream ends early
        yield ReadError(f"truncated_{compression}", path, ordinal, f"{type(exc).__name__}: {exc}")
    except (OSError, ValueError) as exc:  # corrupt compressed data
        yield ReadError(f"corrupt_{compression}", path, ordinal, f"{type(exc).__name__}: {exc}")
    else:
        if root is None:
            yield ReadError("malformed_xml", path, 0, "no XML element in the file")


def _child_text(elem: ET.Element, name: str) -> str | None:
    for child in elem:
        if _local(child.tag) == name:
            return child.text
    return None


def _page(page: ET.Element, path: str, ordinal: int, site: _Site, limits: ReaderLimits) -> ReadResult:
    title = (_child_text(page, "title") or "").strip()
    namespace = (_child_text(page, "ns") or "").strip()
    page_id = (_child_text(page, "id") or "").strip()
    # Redirects first: a redirect has no text whatever its namespace, and counts as one.
    if any(_local(child.tag) == "redirect" for child in page):
        return Dropped("redirect", path, ordinal)
    if namespace != "0":
        return Dropped("namespace", path, ordinal)
    wikitext = ""
    for child in page:
        if _local(child.tag) == "revision":
            wikitext = _child_text(child, "text") or ""
    if wikitext.lstrip()[:9].upper() == "#REDIRECT":
        return Dropped("redirect", path, ordinal)
    if len(wikitext) > limits.max_page_chars:
        return Dropped("too_large", path, ordinal)
    try:
        text = wikitext_to_text(
            wikitext,
            file_namespaces=site.file_namespaces,
            category_namespaces=site.category_namespaces,
            other_namespaces=site.other_namespaces,
        )
    except Exception as exc:  # mwparserfromhell on pathological markup
        return ReadError("wikitext_parse", path, ordinal, f"{title!r}: {type(exc).__name__}: {exc}")
    if not text:
        return Dropped("empty_text", path, ordinal)
    url = site.url_prefix + quote(title.replace(" ", "_"), safe="/:()',!*;@$~") if site.url_prefix else title
    doc_id = f"wiki:{site.lang or 'unknown'}:{page_id or ordinal}"
    return Document(SOURCE_WIKI, url, doc_id, path, ordinal, KIND_TEXT, text, site.lang)
