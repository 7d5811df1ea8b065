"""WARC and WET records to Documents, with FastWARC parsing each record.

Layout of the work:
- `.warc.gz` (recognised by its gzip magic, not its name) is split into gzip members by
  `gzip_members`; FastWARC parses the records of each member from a stream. Damage is confined to a
  member: a truncated or corrupt member, or garbage between members, becomes a `ReadError` and
  reading resumes at the next member (Common Crawl writes one record per member). Inside a member
  that holds many records, a malformed header is handled as in a plain file (below).
- plain `.warc` is one stream; FastWARC (strict mode) parses it. At a malformed header the damage
  is reported and parsing restarts at the next line beginning with `WARC/<digit>`, found by seeking
  back to the end of the last good record (FastWARC's own lenient mode skips garbage too, but
  silently swallows the record after it).

Offsets: the compressed offset of the record's gzip member (what the CC index calls `offset`),
or the record's byte offset in a plain file. Records sharing one member (a whole file gzipped
as one member) share its offset; their `doc_id` (WARC-Record-ID) tells them apart.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import BinaryIO, Iterator

from fastwarc.warc import ArchiveIterator, WarcRecord

from pipelines.io.documents import (
    KIND_HTML,
    KIND_TEXT,
    SOURCE_CC,
    Document,
    Dropped,
    ReaderLimits,
    ReadError,
    ReadResult,
)
from pipelines.read.gzip_members import GZIP_MAGIC, ForwardOnlyStream, GzipGap, GzipMember, iter_gzip_members
from pipelines.read.payload import (
    PayloadError,
    charset_from_content_type,
    decode_chunked,
    decode_content_encoding,
    decode_html_bytes,
    decode_text_bytes,
    is_html_payload,
    looks_binary,
)


class _Prefixed(ForwardOnlyStream):
    """A binary stream with some already-read bytes put back in front (for sniffing)."""

    def __init__(self, prefix: bytes, raw: BinaryIO):
        self._prefix = prefix
        self._raw = raw
        self._position = 0

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            data, self._prefix = self._prefix + self._raw.read(), b""
        elif self._prefix:
            data, self._prefix = self._prefix[:size], self._prefix[size:]
            if len(data) < size:
                data += self._raw.read(size - len(data))
        else:
            data = self._raw.read(size)
        self._position += len(data)
        return data


def read_warc_stream(
    raw: BinaryIO,
    path: str,
    *,
    wet: bool = False,
    limits: ReaderLimits = ReaderLimits(),
    stats: Counter | None = None,
) -> Iterator[ReadResult]:
    """Every record of one WARC (`wet=False`: response records to HTML documents) or WET file
    (`wet=True`: conversion records to text documents), as Document, Dropped or ReadError."""
    stats = stats if stats is not None else Counter()
    head = raw.read(len(GZIP_MAGIC))
    if not head:
        yield ReadError("empty_file", path, 0, "the file has no bytes")
        return
    stream = _Prefixed(head, raw)
    if head == GZIP_MAGIC:
        for part in iter_gzip_members(stream):
            if isinstance(part, GzipGap):
                yield ReadError("garbage", path, part.offset, f"{part.length} bytes that are not a gzip member skipped")
                continue
            rewindable = _Rewindable(part)
            yield from _resyncing_records(rewindable, rewindable, path, part, wet, limits, stats)
    else:
        yield from _resyncing_records(raw, stream, path, None, wet, limits, stats)


class _Rewindable(ForwardOnlyStream):
    """A forward-only stream (a gzip member) that can seek back within its last `history` bytes,
    which is what resuming after a malformed record needs: FastWARC reads ahead of the record
    it reports, and the resync seeks back to the end of the last good record."""

    def __init__(self, inner, history: int = 8 << 20):
        self._inner = inner
        self._history = bytearray()
        self._history_start = 0  # stream offset of _history[0]
        self._limit = history
        self._position = 0

    def _history_end(self) -> int:
        return self._history_start + len(self._history)

    def read(self, size: int = -1) -> bytes:
        replay = b""
        if self._position < self._history_end():
            index = self._position - self._history_start
            replay = bytes(self._history[index:] if size is None or size < 0 else self._history[index:index + size])
            self._position += len(replay)
            if size is not None and size >= 0:
                size -= len(replay)
                if size == 0:
                    return replay
        data = self._inner.read(-1 if size is None else size)
        self._history += data
        if len(self._history) > 2 * self._limit:
            # Trimmed only when twice the limit: after a prefix delete, the next append reallocates
            # and copies the whole buffer, so trimming on every read copied 8 MiB per read on a
            # file gzipped as one member. Now the copying is amortised (at most 2x the limit kept).
            excess = len(self._history) - self._limit
            del self._history[:excess]
            self._history_start += excess
        self._position += len(data)
        return replay + data

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        target = offset if whence == 0 else self._position + offset
        if target < self._history_start:
            raise OSError(f"cannot seek back to {target}: only the last {self._limit} bytes are kept")
        self._position = min(target, self._history_end())
        return super().seek(target)  # forward beyond the history: read on


@dataclass(frozen=True)
class _FramingLost:
    """Where FastWARC lost the record framing (offsets in the stream it parsed)."""

    detail: str
    bad_record_at: int | None = None  # a record whose own header is bad (e.g. its Content-Length)
    last_start: int | None = None  # else: the last good record, whose end is where the damage starts
    last_declared: int = 0


_WARC_LINE = re.compile(rb"WARC/[0-9]\.[0-9]{1,2}\r?\n")
_SCAN_CHUNK = 1 << 20


def _resyncing_records(seekable, stream, path, member, wet, limits, stats) -> Iterator[ReadResult]:
    """Parse with FastWARC; at a malformed header, report it and resume at the next line starting
    with `WARC/<version>`. `seekable` is the plain file (local and GCS files seek) or a gzip member
    behind `_Rewindable` (which seeks back within its recent history)."""
    pass_start = 0
    where = "gzip member" if member is not None else "file"
    while True:
        failure = None
        for item in _records(stream, path, member, wet, limits, stats):
            if isinstance(item, _FramingLost):
                failure = item
                break
            yield item
        if failure is None:
            return
        try:
            error_at, scan_from = _damage_start(seekable, failure, pass_start)
            next_start = _find_warc_line(seekable, scan_from)
        except (OSError, ValueError, AttributeError) as exc:  # not seekable (that far back)
            at = member.offset if member is not None else failure.bad_record_at or failure.last_start or 0
            yield ReadError("malformed_warc", path, at, f"{failure.detail}; rest of the {where} skipped (cannot seek: {exc})")
            return
        at = member.offset if member is not None else error_at
        position = f" at byte {error_at} of the gzip member" if member is not None else ""
        if next_start is None:
            yield ReadError("malformed_warc", path, at, f"{failure.detail}{position}; no further record, rest of the {where} skipped")
            if member is not None and member.damaged:
                stats["malformed_before_damage"] += 1
            return
        yield ReadError("malformed_warc", path, at, f"{failure.detail}{position}; {next_start - error_at} bytes skipped to the next record")
        seekable.seek(next_start)
        pass_start = next_start
        stream = seekable  # FastWARC starts counting stream_pos at the stream's tell()


def _damage_start(raw, failure: _FramingLost, base: int) -> tuple[int, int]:
    """(offset where the unreadable bytes start, offset to scan for the next record from)."""
    if failure.bad_record_at is not None:
        return failure.bad_record_at, failure.bad_record_at + 1
    if failure.last_start is None:
        return base, base + 1
    raw.seek(failure.last_start)
    head = raw.read(64 << 10)
    blank = head.find(b"\r\n\r\n")
    header_len = blank + 4 if blank >= 0 else head.find(b"\n\n") + 2
    end = failure.last_start + header_len + failure.last_declared
    raw.seek(end)
    after = raw.read(64)
    end += len(after) - len(after.lstrip(b"\r\n"))
    return end, end + 1


def _find_warc_line(raw, start: int) -> int | None:
    """Offset of the next `WARC/<version>` line at or after `start` (garbage need not end in a newline)."""
    position = start
    raw.seek(position)
    carry = b""
    while True:
        chunk = raw.read(_SCAN_CHUNK)
        if not chunk:
            return None
        window = carry + chunk
        match = _WARC_LINE.search(window)
        if match:
            return position - len(carry) + match.start()
        carry = window[-16:]
        position += len(chunk)


def _damage_reason(member: GzipMember) -> str:
    return "truncated_gzip" if member.truncated else "corrupt_gzip"


def _records(
    stream,
    path: str,
    member: GzipMember | None,
    wet: bool,
    limits: ReaderLimits,
    stats: Counter,
) -> Iterator[ReadResult | _FramingLost]:
    blamed = False  # a record of a damaged member was already reported as the damaged one
    seen = 0
    last_start = 0
    last_declared = 0
    records = ArchiveIterator(stream, parse_http=False, stream_detect=False, quirks_mode=False)
    try:
        for record in records:
            seen += 1
            last_start = record.stream_pos
            declared = (record.headers.get("Content-Length") or "").strip()
            last_declared = int(declared) if declared.isdigit() else 0
            offset = member.offset if member is not None else last_start
            result = _one_record(record, path, offset, member, wet, limits, stats)
            undamaged = member is None or not member.damaged
            if undamaged and isinstance(result, ReadError) and result.reason == "malformed_warc" and not declared.isdigit():
                yield _FramingLost(result.detail, bad_record_at=last_start)
                return
            if isinstance(result, ReadError) and result.reason == "malformed_warc" and member is not None and member.damaged:
                # A header cut off by the end of a truncated member reads as malformed: say why.
                result = ReadError(_damage_reason(member), path, offset, f"{member.error} ({result.detail})")
            if isinstance(result, ReadError) and result.reason in ("truncated_gzip", "corrupt_gzip"):
                blamed = True
            yield result
            if isinstance(result, ReadError) and result.reason == "malformed_warc":
                return  # a Content-Length beyond the member's end: nothing is left to read
    except BaseException as exc:  # FastWARC raises OSError on malformed headers; a PanicException
        # (a BaseException) from its Rust core is treated the same, anything else propagates.
        if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
            raise
        if member is not None and member.damaged:
            if not blamed:
                blamed = True
                yield ReadError(_damage_reason(member), path, member.offset, member.error)
        else:
            yield _FramingLost(f"{type(exc).__name__}: {exc}", last_start=last_start if seen else None, last_declared=last_declared)
        return
    if member is not None and member.damaged and not blamed:
        # Damage before any complete record header: no record was yielded for it.
        yield ReadError(_damage_reason(member), path, member.offset, member.error)
    elif member is not None and seen == 0 and member.total_out > 0:
        stats["gzip_member_without_record"] += 1


def _one_record(
    record: WarcRecord,
    path: str,
    offset: int,
    member: GzipMember | None,
    wet: bool,
    limits: ReaderLimits,
    stats: Counter,
) -> ReadResult:
    headers = record.headers
    declared = headers.get("Content-Length")
    if declared is None or not declared.strip().isdigit():
        return ReadError("malformed_warc", path, offset, f"bad Content-Length {declared!r}")
    warc_type = (headers.get("WARC-Type") or "").strip().lower() or "missing"
    wanted = "conversion" if wet else "response"
    if warc_type != wanted:
        record.consume()
        return _damaged_or(member, record, path, offset, Dropped(f"warc_type:{warc_type}", path, offset))
    if int(declared) > limits.max_record_bytes:
        record.consume()
        return Dropped("too_large", path, offset)

    url = headers.get("WARC-Target-URI") or ""
    doc_id = record.record_id or f"{path}@{offset}"
    try:
        content_type = None
        if not wet:
            if not record.is_http:
                record.consume()
                return Dropped("not_http", path, offset)
            record.parse_http(auto_decode="none")
            content_type = record.http_headers.get("Content-Type")
        expected = record.content_length
        body = record.reader.read()
    except Exception as exc:
        record.consume()
        if member is not None and member.damaged:
            return ReadError(_damage_reason(member), path, offset, member.error)
        return ReadError("malformed_http", path, offset, f"{type(exc).__name__}: {exc}")
    if len(body) < expected:
        if member is not None and member.damaged:
            return ReadError(_damage_reason(member), path, offset, member.error)
        if member is None:
            return ReadError("truncated_record", path, offset, f"the file ends inside the record ({len(body)} of {expected} payload bytes)")
        return ReadError(
            "malformed_warc", path, offset,
            f"Content-Length {declared} runs past the end of the gzip member ({len(body)} of {expected} payload bytes)",
        )

    if wet:
        text = decode_text_bytes(body)
        if not text.strip():
            return Dropped("empty_payload", path, offset)
        return Document(SOURCE_CC, url, doc_id, path, offset, KIND_TEXT, text, None)

    if "chunked" in (record.http_headers.get("Transfer-Encoding") or "").lower():
        dechunked = decode_chunked(body)
        if dechunked is not None:
            body = dechunked
        else:
            stats["transfer_encoding_already_decoded"] += 1
    status = record.http_headers.status_code
    if status is not None and not 200 <= status < 300:
        return Dropped(f"http_status:{status // 100}xx", path, offset)
    try:
        body, note = decode_content_encoding(body, record.http_headers.get("Content-Encoding"), limits.max_record_bytes)
    except PayloadError as exc:
        if exc.reason == "too_large":
            return Dropped("too_large", path, offset)
        return ReadError(exc.reason, path, offset, exc.detail)
    if note:
        stats[note] += 1
    if not body.strip():
        return Dropped("empty_payload", path, offset)
    if not is_html_payload(content_type, body):
        return Dropped("not_html", path, offset)
    if looks_binary(body):
        return Dropped("binary_payload", path, offset)
    html, how = decode_html_bytes(body, charset_from_content_type(content_type))
    stats[f"charset_{how}"] += 1
    return Document(SOURCE_CC, url, doc_id, path, offset, KIND_HTML, html, None)


def _damaged_or(member, record, path, offset, result):
    """A record read up to a truncation point is an error, not a drop, even if unwanted."""
    if member is not None and member.damaged and record.stream_pos + int(record.headers.get("Content-Length", "0") or 0) > member.total_out:
        return ReadError(_damage_reason(member), path, offset, member.error)
    return result
