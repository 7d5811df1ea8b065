"""Atomic file writes: the one way every stage writes a small output file.

A reader either sees the previous complete file or the new complete one, never a half-written
file: data goes to a hidden temporary file in the same directory, then `durable_replace` renames it
into place. The data is flushed to the disk (fsync) before the rename and the directory after it,
so a power cut or kernel crash cannot leave a renamed but empty or partly written file behind: on
many filesystems (ext4 with delalloc, XFS) the rename can reach the disk before the data does.
For remote paths (gs://…) fsspec (`storage.write_bytes`) makes the object visible only when the
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


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _shareable(tmp: str) -> None:
    # mkstemp creates 0600 files; outputs are ordinary files that other users and jobs read.
    os.chmod(tmp, 0o666 & ~_umask())


def make_tree_shareable(folder: str | os.PathLike) -> None:
    """Give a staging folder (mkdtemp: 0700) and everything below it the permissions a plain
    mkdir/open would under the umask (folders 0777, files 0666, less the umask), as every other
    output has, before it is renamed into place."""
    umask = _umask()
    for current, _, files in os.walk(folder):
        os.chmod(current, 0o777 & ~umask)
        for name in files:
            os.chmod(os.path.join(current, name), 0o666 & ~umask)


def _fsync_path(path: str | os.PathLike) -> None:
    """fsync one file or directory. Directories cannot be opened or fsynced everywhere (Windows);
    there the rename's durability is the filesystem's business and nothing more can be done."""
    is_dir = os.path.isdir(path)
    try:
        fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if is_dir else 0))
    except OSError:
        if is_dir:
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not is_dir:
            raise
    finally:
        os.close(fd)


def durable_replace(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """`os.replace(source, target)` that survives a crash of the machine right after it returns.

    ``source``: a file, or a staging folder (a checkpoint, an exported model): every file and
    folder under it is flushed first. Then the rename, then the directory that holds ``target``.
    """
    if os.path.isdir(source):
        for folder, _, files in os.walk(source):
            for name in files:
                _fsync_path(os.path.join(folder, name))
            _fsync_path(folder)
    else:
        _fsync_path(source)
    os.replace(source, target)
    _fsync_path(os.path.dirname(os.path.abspath(target)))


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
        durable_replace(tmp, final)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    if _is_remote(path):
        from pipelines.io import storage

        storage.write_bytes(str(path), data)
        return
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as handle:
            handle.write(data)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike, payload: Any, indent: int = 2) -> None:
    write_text_atomic(path, json.dumps(payload, indent=indent, ensure_ascii=False) + "\n")


@contextmanager
def published_file(path: str | os.PathLike) -> Iterator[str]:
    """A local file for the block to write that becomes `path` when the block succeeds: renamed into
    place beside it (`atomic_path`), or for an object store uploaded whole (an object appears only
    when its upload completes). A failed block leaves nothing at `path`."""
    if not _is_remote(path):
        with atomic_path(path) as tmp:
            yield tmp
        return
    from pipelines.io import storage

    with tempfile.TemporaryDirectory(prefix="labse-publish-") as folder:
        local = os.path.join(folder, str(path).rstrip("/").rsplit("/", 1)[-1])
        yield local
        storage.upload(Path(local), str(path))
