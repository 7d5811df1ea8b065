"""Line-oriented text files, plain or gzip: the one reader for parallel text, dev sets and corpora.

No Beam, TensorFlow or torch import: the trainer reads dev sets and pre-training text with it.
"""
from __future__ import annotations

import gzip
import os
import zlib
from typing import IO, Callable, Iterator

from pipelines.io.config_options import UsageError


def open_text(path: str | os.PathLike) -> IO[str]:
    """A UTF-8 text handle on `path`, decompressing `.gz` transparently."""
    if str(path).endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


class UnreadableTextError(UsageError):
    """A text input that is not UTF-8, or a damaged .gz: one line naming the file and where."""


def lines_of(path: str | os.PathLike, handle: IO[str], raw: Callable[[], IO[bytes]] | None = None) -> Iterator[str]:
    """The lines of an open text `handle` on `path` without their line ending (`\\n` or `\\r\\n`).
    Text that is not UTF-8 or a cut-short .gz is an UnreadableTextError naming the file (and,
    given `raw`, an opener of the file's decompressed bytes, the first line that is not UTF-8),
    never a decoder's traceback."""
    try:
        for line in handle:
            yield line.rstrip("\n").rstrip("\r")
    except UnicodeDecodeError as error:
        where = f" (line {_first_undecodable_line(raw):,})" if raw is not None else ""
        raise UnreadableTextError(f"{path}: not UTF-8 text{where}: {error.reason}; convert it to UTF-8") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as error:
        raise UnreadableTextError(f"{path}: a damaged or cut-short gzip file ({error})") from None


def _first_undecodable_line(raw: Callable[[], IO[bytes]]) -> int:
    """Only on the error path: the decoder reads in blocks, so it cannot say which line failed."""
    with raw() as handle:
        for number, line in enumerate(handle, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                return number
    return 0


def iter_lines(path: str | os.PathLike) -> Iterator[str]:
    """The lines of `path` without their line ending, streamed (`lines_of`)."""
    with open_text(path) as handle:
        yield from lines_of(path, handle, lambda: gzip.open(path) if str(path).endswith(".gz") else open(path, "rb"))


def read_lines(path: str | os.PathLike) -> list[str]:
    """All lines of `path` without their line ending (for small files: dev and test sets)."""
    return list(iter_lines(path))
