"""Atomic file writes: the one way every stage writes a small output file.

A reader either sees the previous complete file or the new complete one, never a half-written
file: data goes to a hidden temporary file in the same directory, then `os.replace` renames it
into place. For remote paths (gs://…) Beam's FileSystems makes the object visible only when the
upload completes, which is atomic for readers already.

No Beam, TensorFlow or torch import at module level: the trainer uses this on GPU hosts too.
"""
from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator


def _is_remote(path: str | os.PathLike) -> bool:
    return "://" in str(path)


def _shareable(tmp: str) -> None:
    # mkstemp creates 0600 files; outputs are ordinary files that other users and jobs read.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[str]:
    """Yield a temporary local path beside `path`; on success it is renamed to `path`.

    For libraries that write to a path themselves (safetensors, fastText, shutil).
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield tmp
        _shareable(tmp)
        os.replace(tmp, final)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    if _is_remote(path):
        from apache_beam.io.filesystems import FileSystems

        with FileSystems.create(str(path)) as handle:
            handle.write(data)
        return
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as handle:
            handle.write(data)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike, payload: Any, indent: int = 2) -> None:
    write_text_atomic(path, json.dumps(payload, indent=indent, ensure_ascii=False) + "\n")
