"""Line-oriented text files, plain or gzip: the one reader for parallel text, dev sets and corpora.

No Beam, TensorFlow or torch import: the trainer reads dev sets and pre-training text with it.
"""
from __future__ import annotations

import gzip
import os
from typing import IO, Iterator


def open_text(path: str | os.PathLike) -> IO[str]:
    """A UTF-8 text handle on `path`, decompressing `.gz` transparently."""
    if str(path).endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def iter_lines(path: str | os.PathLike) -> Iterator[str]:
    """The lines of `path` without their line ending (`\\n` or `\\r\\n`), streamed."""
    with open_text(path) as handle:
        for line in handle:
            yield line.rstrip("\n").rstrip("\r")


def read_lines(path: str | os.PathLike) -> list[str]:
    """All lines of `path` without their line ending (for small files: dev and test sets)."""
    return list(iter_lines(path))
