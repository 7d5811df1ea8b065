"""HTTP payloads to text: undo Content-Encoding, recognise HTML, find the charset and decode.

Pure functions (no Beam, no WARC library), so they are unit-tested directly.
"""
from __future__ import annotations

import codecs
import re
import zlib

from resiliparse.parse.encoding import detect_encoding, map_encoding_to_html5

HTML_MIME_TYPES = frozenset({"text/html", "application/xhtml+xml", "application/xml+xhtml"})
_HTML_SNIFF = re.compile(rb"<\s*(!doctype\s+html|html|head|body|title|meta|div|p|a|script)[\s>/]", re.I)
_META_CHARSET = re.compile(
    rb"""<meta[^>]{0,512}?charset\s*=\s*["']?\s*([a-zA-Z0-9_:.+-]{1,40})""", re.I
)
_CONTROL = bytes(b for b in range(32) if b not in (9, 10, 12, 13, 27))


class PayloadError(Exception):
    """The payload cannot be turned into text; `reason` is the counted reason."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class PayloadTooLarge(PayloadError):
    def __init__(self, detail: str):
        super().__init__("too_large", detail)


def _inflate(data: bytes, wbits: int, max_bytes: int) -> bytes:
    z = zlib.decompressobj(wbits=wbits)
    out = z.decompress(data, max_bytes + 1)
    if len(out) > max_bytes:
        raise PayloadTooLarge(f"decoded payload exceeds {max_bytes} bytes")
    out += z.flush()
    return out


def decode_content_encoding(body: bytes, content_encoding: str | None, max_bytes: int) -> tuple[bytes, str]:
    """Undo HTTP Content-Encoding (gzip, deflate, br; stacked codings too).

    Returns (decoded bytes, note) where note is "" or "content_encoding_already_decoded" when the
    header names a coding but the body is plainly not encoded (crawlers often store decoded bodies
    and keep the header). Raises PayloadError("bad_content_encoding") when it cannot be undone.
    """
    if not content_encoding:
        return body, ""
    note = ""
    codings = [c.strip().lower() for c in content_encoding.split(",") if c.strip()]
    for coding in reversed(codings):
        if coding in ("identity", "none", "utf-8", "utf8", "text", "binary", "7bit", "8bit"):
            continue
        try:
            if coding in ("gzip", "x-gzip"):
                if not body.startswith(b"\x1f\x8b"):
                    raise zlib.error("no gzip header")
                body = _inflate(body, 31, max_bytes)
            elif coding in ("deflate", "x-deflate"):
                try:
                    body = _inflate(body, 15, max_bytes)  # zlib-wrapped, as RFC 9110 says
                except zlib.error:
                    body = _inflate(body, -15, max_bytes)  # raw deflate, as many servers send
            elif coding == "br":
                import brotli  # optional: only needed for brotli bodies

                body = brotli.decompress(body)
                if len(body) > max_bytes:
                    raise PayloadTooLarge(f"decoded payload exceeds {max_bytes} bytes")
            else:
                raise PayloadError("bad_content_encoding", f"unsupported Content-Encoding {coding!r}")
        except PayloadError:
            raise
        except Exception as exc:  # zlib.error, brotli.error, ImportError
            if looks_like_html(body) or not looks_binary(body):
                note = "content_encoding_already_decoded"
                continue
            raise PayloadError("bad_content_encoding", f"{coding}: {exc}") from None
    return body, note


_CHUNK_SIZE_LINE = re.compile(rb"[0-9a-fA-F]{1,8}[ \t]*(;[^\r\n]*)?\r?\n")


def decode_chunked(body: bytes) -> bytes | None:
    """Undo HTTP/1.1 chunked Transfer-Encoding; None if `body` is not validly chunked (crawlers
    often store the de-chunked body but keep the header, so the caller then uses `body` as is)."""
    out = []
    position = 0
    while True:
        match = _CHUNK_SIZE_LINE.match(body, position)
        if not match:
            return None
        size = int(match.group(0).split(b";", 1)[0].strip(), 16)
        position = match.end()
        if size == 0:
            return b"".join(out)
        if position + size > len(body):
            return None
        out.append(body[position:position + size])
        position += size
        if body[position:position + 2] == b"\r\n":
            position += 2
        elif body[position:position + 1] == b"\n":
            position += 1
        else:
            return None


def mime_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def looks_like_html(body: bytes) -> bool:
    return _HTML_SNIFF.search(body[:4096]) is not None


def looks_binary(body: bytes) -> bool:
    """True for payloads that are not text in any charset (images, archives, PDFs, random bytes).

    UTF-16 text has NUL bytes too, so a UTF-16 byte-order mark exempts it.
    """
    head = body[:4096]
    if not head or head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return False
    if b"\x00" in head:
        return True
    controls = len(head) - len(head.translate(None, _CONTROL))
    return controls > len(head) * 0.02


def is_html_payload(content_type: str | None, body: bytes) -> bool:
    """HTML by Content-Type; without a usable Content-Type, by sniffing the first bytes."""
    mime = mime_type(content_type)
    if mime in HTML_MIME_TYPES:
        return True
    if mime in ("", "application/octet-stream", "unknown/unknown", "text/plain", "www/unknown"):
        return looks_like_html(body)
    return False


def charset_from_content_type(content_type: str | None) -> str | None:
    if not content_type:
        return None
    match = re.search(r"charset\s*=\s*[\"']?([^\"';\s,]+)", content_type, re.I)
    return match.group(1) if match else None


def charset_from_meta(body: bytes) -> str | None:
    """`<meta charset=...>` or `<meta http-equiv=Content-Type content="...; charset=...">`."""
    match = _META_CHARSET.search(body[:4096])
    return match.group(1).decode("ascii", "replace") if match else None


def _python_codec(label: str | None) -> str | None:
    """The WHATWG mapping of a charset label (iso-8859-1 means cp1252, gb2312 means gbk), as a codec."""
    if not label:
        return None
    mapped = map_encoding_to_html5(label.strip().lower())
    if not mapped:
        return None
    try:
        return codecs.lookup(mapped).name
    except LookupError:
        return None


def decode_html_bytes(body: bytes, http_charset: str | None) -> tuple[str, str]:
    """Decode HTML: a byte-order mark, else valid UTF-8, else the charset from the HTTP header, else
    `<meta>`, else detection (uchardet).

    Bytes with non-ASCII content that decode as strict UTF-8 are UTF-8 whatever a label says or
    detection guesses: text in a legacy charset (GBK, Shift_JIS, windows-125x, ...) practically
    never forms valid UTF-8 by chance, while UTF-8 pages with a stale legacy label (a template's
    `<meta charset=gb2312>`) exist, a legacy codec "decodes" them into mojibake without an error,
    and uchardet calls some UTF-8 pages windows-1252 (mojibake such as "â€™").

    Returns (text, how) with how in "bom", "http" or "meta" (the label that was used), "utf8"
    (valid UTF-8 that no label named: none given, or one naming another charset), "detected", and
    "fallback" when a declared charset was unknown or failed to decode the bytes and detection was
    used instead.
    """
    if body.startswith(codecs.BOM_UTF8):
        return body[3:].decode("utf-8", "replace"), "bom"
    if body.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return body.decode("utf-16", "replace"), "bom"
    labels = (("http", http_charset), ("meta", charset_from_meta(body)))
    if not body.isascii():
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:
            named = next((how for how, label in labels if _python_codec(label) == "utf-8"), "utf8")
            return text, named
    declared_any = False
    for how, label in labels:
        if not label:
            continue
        declared_any = True
        codec = _python_codec(label)
        if codec is None:
            continue
        try:
            return body.decode(codec), how
        except (UnicodeDecodeError, LookupError):
            continue
    detected = _python_codec(detect_encoding(body)) or "utf-8"
    return body.decode(detected, "replace"), ("fallback" if declared_any else "detected")


def decode_text_bytes(body: bytes) -> str:
    """Text that should be UTF-8 (WET conversion records); invalid bytes become U+FFFD."""
    return body.decode("utf-8", "replace")
