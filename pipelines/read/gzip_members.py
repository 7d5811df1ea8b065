"""Stream a gzip file member by member, surviving truncation, corruption and garbage between members.

Common Crawl's `.warc.gz` files compress each WARC record as its own gzip member, and the CC index
addresses records by the compressed offset of their member. Python's `gzip` module hides members
and stops at the first damaged byte; here each member is a separate file-like object, so a reader
can attribute damage to a member (and the record in it) and carry on with the next member.

Only a bounded amount of data is held at a time (one compressed chunk plus one decompressed
chunk), whatever the size of a member: a whole file gzipped as one member streams too.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO, Iterator, Union

# ISA-L's inflate (python-isal) is a drop-in for zlib's decompressobj (same streaming and errors);
# with it read_records of a .warc.gz takes less CPU time (BENCHMARKS.md, section clean, "WARC
# reader choice"; benchmarks/warc_readers.py).
from isal import isal_zlib as zlib

GZIP_MAGIC = b"\x1f\x8b\x08"
_CHUNK = 1 << 20
_OUT_CHUNK = 1 << 20
_FEED = 64 << 10


@dataclass(frozen=True)
class GzipGap:
    """Bytes between members that do not start a gzip member (skipped while resynchronising)."""

    offset: int
    length: int


class _CompressedBuffer:
    """Sequential reader over the raw file with a window of not-yet-used bytes.

    The window is `buf[pos:]`; consuming moves `pos` instead of copying, so a file of many small
    members does not copy the read-ahead chunk once per member.
    """

    def __init__(self, raw: BinaryIO, chunk_size: int = _CHUNK):
        self._raw = raw
        self._chunk_size = chunk_size
        self.buf = b""
        self.pos = 0
        self.start = 0  # file offset of buf[pos]
        self.eof = False

    def available(self) -> int:
        return len(self.buf) - self.pos

    def fill(self, minimum: int = 1) -> bool:
        """Make at least `minimum` bytes available if the file has them; False if it has fewer."""
        while self.available() < minimum and not self.eof:
            data = self._raw.read(self._chunk_size)
            if not data:
                self.eof = True
                break
            self.buf = self.buf[self.pos:] + data
            self.pos = 0
        return self.available() >= minimum

    def piece(self, size: int) -> memoryview:
        return memoryview(self.buf)[self.pos:self.pos + size]

    def startswith(self, prefix: bytes) -> bool:
        return self.buf.startswith(prefix, self.pos)

    def find(self, needle: bytes, index: int = 0) -> int:
        """Index of `needle` relative to the window start, or -1."""
        found = self.buf.find(needle, self.pos + index)
        return found - self.pos if found >= 0 else -1

    def consume(self, n: int) -> None:
        self.pos += n
        self.start += n

    def unread(self, data: bytes) -> None:
        self.buf = data + self.buf[self.pos:]
        self.pos = 0
        self.start -= len(data)


class ForwardOnlyStream:
    """A read-only byte stream that cannot rewind (compressed data, or a socket-like source).

    Subclasses implement `read` and advance `_position` by what they return; `seek` moves forward
    by reading and discarding, which is all a reader library needs to skip a payload.
    """

    _position = 0
    _SKIP_CHUNK = 1 << 20

    def read(self, size: int = -1) -> bytes:
        raise NotImplementedError

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = 0) -> int:
        target = offset if whence == 0 else self._position + offset if whence == 1 else -1
        while self._position < target:
            if not self.read(min(target - self._position, self._SKIP_CHUNK)):
                break
        return self._position

    def close(self) -> None:  # the underlying file belongs to whoever opened it
        pass


class GzipMember(ForwardOnlyStream):
    """One gzip member as a read-only stream of its decompressed bytes.

    After the member has been read to its end, exactly one of these describes how it ended:
    `complete` (the gzip trailer was reached), `truncated` (the file ended inside the member) or
    `corrupt` (zlib rejected the data; `error` says why).
    """

    def __init__(self, source: _CompressedBuffer, offset: int):
        self._src = source
        self.offset = offset
        self._z = zlib.decompressobj(wbits=31)
        self._out = bytearray()
        self.total_out = 0  # decompressed bytes produced so far
        self._position = 0  # decompressed bytes handed to the caller
        self.complete = False
        self.truncated = False
        self.corrupt = False
        self.error = ""

    @property
    def finished(self) -> bool:
        return self.complete or self.truncated or self.corrupt

    @property
    def damaged(self) -> bool:
        return self.truncated or self.corrupt

    def _pump(self) -> None:
        """Decompress one more bounded piece into the output buffer (or finish the member)."""
        src = self._src
        if self._z.unconsumed_tail:
            data = self._z.unconsumed_tail
            fresh = False
        else:
            if not src.fill(1):
                self.truncated = True
                self.error = "file ends inside a gzip member"
                return
            # Small pieces: what follows the member's end is copied into unused_data.
            data = src.piece(_FEED)
            fresh = True
        try:
            out = self._z.decompress(data, _OUT_CHUNK)
        except zlib.error as exc:
            self.corrupt = True
            self.error = f"zlib: {exc}"
            return
        if fresh:
            # Bytes the decompressor took in (including its unconsumed tail, kept inside zlib's
            # object) leave the shared buffer; the unused remainder after the member stays.
            used = len(data) - len(self._z.unused_data) if self._z.eof else len(data)
            src.consume(used)
        elif self._z.eof and self._z.unused_data:
            # The member ended inside data we had already handed over: give the rest back.
            src.unread(self._z.unused_data)
        self._out += out
        self.total_out += len(out)
        if self._z.eof:
            self.complete = True

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            while not self.finished:
                self._pump()
            data = bytes(self._out)
            self._out.clear()
            self._position += len(data)
            return data
        while len(self._out) < size and not self.finished:
            self._pump()
        data = bytes(self._out[:size])
        del self._out[:size]
        self._position += len(data)
        return data

    def drain(self) -> None:
        """Skip the rest of the member (to reach the next one)."""
        while not self.finished:
            self._pump()
            self._out.clear()
        self._out.clear()


def _plausible_member_at(src: _CompressedBuffer, index: int) -> bool:
    """Does a gzip member really start at window index `index`? (magic bytes occur by chance.)"""
    probe = 64 << 10
    src.fill(index + probe)
    z = zlib.decompressobj(wbits=31)
    try:
        z.decompress(src.piece(index + probe)[index:], 1)
    except zlib.error:
        return False
    return True


def iter_gzip_members(raw: BinaryIO, chunk_size: int = _CHUNK) -> Iterator[Union[GzipMember, GzipGap]]:
    """Yield each member (read it, or let it be drained) and each run of non-gzip bytes skipped.

    A corrupt member's remaining bytes are scanned for the next member like any garbage.
    """
    src = _CompressedBuffer(raw, chunk_size)
    while True:
        if not src.fill(len(GZIP_MAGIC)):
            if src.available():  # fewer bytes than a gzip header at the end of the file
                yield GzipGap(src.start, src.available())
                src.consume(src.available())
            return
        if src.startswith(GZIP_MAGIC):
            member = GzipMember(src, src.start)
            yield member
            member.drain()
            if member.corrupt:
                # Resynchronise: step past this member's magic and scan for the next one. The
                # skipped bytes belong to the corrupt member, which the caller reports.
                if src.start == member.offset:
                    src.consume(1)
                _skip_to_next_member(src)
            continue
        gap_start = src.start
        _skip_to_next_member(src)
        yield GzipGap(gap_start, src.start - gap_start)


def _skip_to_next_member(src: _CompressedBuffer) -> None:
    """Advance to the next plausible member start, or to the end of the file."""
    while True:
        src.fill(len(GZIP_MAGIC))
        index = src.find(GZIP_MAGIC)
        while index >= 0 and not _plausible_member_at(src, index):
            index = src.find(GZIP_MAGIC, index + 1)
        if index >= 0:
            src.consume(index)
            return
        if src.eof:
            src.consume(src.available())
            return
        # Keep the last bytes: the magic might straddle the chunk boundary.
        src.consume(max(0, src.available() - (len(GZIP_MAGIC) - 1)))
        src.fill(src.available() + 1)
