"""Environment errors while writing (a full disk, a read-only file system, a file size limit) as
one line naming the path and the cause, instead of a traceback.

Writes stay atomic (a checkpoint is staged and renamed, an export staged beside its output), so a
failed write never leaves a damaged result where a reader would take it; what was there before is
kept. What the user needs is which path could not be written and why.

torch.save reports a short write as `RuntimeError: ... unexpected pos 9600 vs 9492` and
safetensors as `SafetensorError: ... (os error 28)`; `writing(path)` turns both into an OSError
with the errno (for the short write: ENOSPC when the file system has no space left, else EIO).
"""
from __future__ import annotations

import errno
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

CAUSES = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EFBIG: "file too large (a file size limit of this process or file system)",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EIO: "the write stopped short (device error)",
}
_OS_ERROR = re.compile(r"\(os error (\d+)\)")
# Errnos that only a write gives (EACCES, EIO can come from reading too: those keep their message).
_WRITE_ONLY_CAUSES = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG)
# Below this, a short write is taken to be the disk filling up.
_FULL_BELOW_BYTES = 1 << 20


class WriteError(OSError):
    """A write that failed for a reason of the environment; str() is the one line to show."""

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {CAUSES.get(self.errno, self.strerror)}"


def free_bytes(path: Path) -> int | None:
    for candidate in (Path(path), *Path(path).parents):
        try:
            stats = os.statvfs(candidate)
        except OSError:
            continue
        return stats.f_bavail * stats.f_frsize
    return None


def as_write_error(path: Path, exc: BaseException) -> WriteError | None:
    """The WriteError `exc` (raised while writing `path`) stands for, or None when it is not one."""
    code = exc.errno if isinstance(exc, OSError) else None
    if code is None:
        match = _OS_ERROR.search(str(exc))
        if match:
            code = int(match.group(1))
        elif "unexpected pos" in str(exc):  # torch.save's short write
            free = free_bytes(Path(path).parent)
            code = errno.ENOSPC if free is not None and free < _FULL_BELOW_BYTES else errno.EIO
    if code not in CAUSES:
        return None
    return WriteError(code, os.strerror(code), str(path))


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """Run a write of `path`; an environment failure is re-raised as a WriteError naming it."""
    from safetensors import SafetensorError

    try:
        yield
    except (OSError, RuntimeError, SafetensorError) as exc:
        translated = as_write_error(path, exc)
        if translated is None:
            raise
        raise translated from exc


def environment_error_line(exc: OSError) -> str | None:
    """One line for an OSError the environment caused (WriteError, or an OSError with a known
    errno and a file name), or None for any other, which keeps its traceback."""
    if isinstance(exc, WriteError):
        return str(exc)
    if exc.errno in _WRITE_ONLY_CAUSES and exc.filename is not None:
        return str(WriteError(exc.errno, exc.strerror, exc.filename))
    return None
