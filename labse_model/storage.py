"""Paths on object storage (gs://, s3://, any fsspec protocol) for the trainer, beside local paths.

The trainer runs on GPU hosts where Beam is not installed: everything here goes through fsspec
(gcsfs for gs://, installed by the `gcp` extra) and takes credentials the usual way (Application
Default Credentials: GOOGLE_APPLICATION_CREDENTIALS, `gcloud auth application-default login`, or
the host's service account). A path is a URL when it holds "://"; every other path is local and
handled with the standard library, as before.

Reads stream: `open_input` gives a file object that fetches `READ_BLOCK` bytes at a time and keeps
them (fsspec's "readahead" cache), so a reader that seeks forward through a shard (the record
index) or reads records near each other (a batch) costs one request per block, never a copy of
the whole object first.
"""
from __future__ import annotations

import contextlib
import glob as local_glob
import gzip
import hashlib
import io
import json
import logging
import os
import time
import uuid
from pathlib import Path
from typing import IO, Any, Iterator
from pipelines.io.config_options import UsageError
from pipelines.io.stage_output import lock_path_of

logger = logging.getLogger("labse_model.storage")

READ_BLOCK = 8 << 20  # bytes fetched per request when reading an object
SUCCESS_MARKER = "_SUCCESS"  # a complete stage output (pipelines.io.stage_output) or checkpoint
LOCK_SETTLE_SECONDS = 2.0  # see `object_lock`


def is_url(path: str | os.PathLike) -> bool:
    return "://" in str(path)


def path_argument(text: str) -> str | Path:
    """argparse type for a path that may be a URL: `Path` would fold gs://b into gs:/b."""
    return text.rstrip("/") if is_url(text) else Path(text)


def join(base: str | os.PathLike, *parts: str) -> str:
    """`os.path.join` for local paths; "/" between the parts of a URL."""
    if not is_url(base):
        return os.path.join(base, *parts)
    return "/".join([str(base).rstrip("/"), *parts])


def filesystem(url: str):
    """(fsspec filesystem, path without the protocol) for `url`; listings are never cached, since
    other processes write the same bucket."""
    import fsspec

    return fsspec.core.url_to_fs(str(url), use_listings_cache=False)


def _to_url(fs, path: str) -> str:
    return fs.unstrip_protocol(path)


def glob(pattern: str) -> list[str]:
    """Paths matching `pattern` (a local glob or a URL glob), files and folders, sorted; URLs keep
    their protocol."""
    if not is_url(pattern):
        return sorted(local_glob.glob(pattern))
    fs, path = filesystem(pattern)
    return sorted(_to_url(fs, p) for p in fs.glob(path))


def glob_files(pattern: str) -> list[str]:
    """The files among `glob(pattern)` (one listing on object storage, no request per object)."""
    if not is_url(pattern):
        return [p for p in glob(pattern) if os.path.isfile(p)]
    fs, path = filesystem(pattern)
    found = fs.glob(path, detail=True)
    return sorted(_to_url(fs, p) for p, info in found.items() if info.get("type") == "file")


def exists(url: str) -> bool:
    fs, path = filesystem(url)
    return fs.exists(path)


def isfile(path: str | os.PathLike) -> bool:
    if not is_url(path):
        return os.path.isfile(path)
    fs, stripped = filesystem(str(path))
    return fs.isfile(stripped)


def isdir(path: str | os.PathLike) -> bool:
    """A local directory, or a URL prefix with at least one object below it."""
    if not is_url(path):
        return os.path.isdir(path)
    fs, stripped = filesystem(str(path))
    return fs.isdir(stripped)


def listdir(path: str | os.PathLike) -> list[str]:
    """Names directly below a local directory or a URL prefix."""
    if not is_url(path):
        return sorted(os.listdir(path))
    fs, stripped = filesystem(str(path))
    return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(stripped, detail=False))


def dirname(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[0] if is_url(path) else os.path.dirname(os.path.abspath(path))


def open_input(path: str | os.PathLike) -> IO[bytes]:
    """A binary file object for reading; on object storage it streams in READ_BLOCK requests."""
    if not is_url(path):
        return open(path, "rb", buffering=1 << 20)
    fs, stripped = filesystem(str(path))
    return fs.open(stripped, "rb", block_size=READ_BLOCK, cache_type="readahead")


def iter_lines(path: str | os.PathLike) -> Iterator[str]:
    """`pipelines.io.text_lines.iter_lines` (UTF-8, .gz decompressed, no line ends), also for URLs."""
    from pipelines.io import text_lines

    if not is_url(path):
        yield from text_lines.iter_lines(path)
        return
    with open_input(path) as raw:
        stream = gzip.GzipFile(fileobj=raw) if str(path).endswith(".gz") else raw
        for line in io.TextIOWrapper(stream, encoding="utf-8"):
            yield line.rstrip("\n").rstrip("\r")


def parquet_file(path: str | os.PathLike):
    """A `pyarrow.parquet.ParquetFile`; on object storage it reads the footer and row groups in blocks."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(open_input(path) if is_url(path) else path)


def size(path: str | os.PathLike) -> int:
    if not is_url(path):
        return os.path.getsize(path)
    fs, stripped = filesystem(str(path))
    return int(fs.size(stripped))


def read_bytes(url: str) -> bytes:
    fs, path = filesystem(url)
    return fs.cat_file(path)


def write_bytes(url: str, data: bytes) -> None:
    """One object, whole: an object store shows an object only once its upload completes."""
    fs, path = filesystem(url)
    fs.pipe_file(path, data)


def upload(local: Path, url: str) -> None:
    fs, path = filesystem(url)
    fs.put_file(str(local), path)


def download(url: str, local: Path) -> None:
    """Copy one object to `local`, atomically (a temporary name, then a rename)."""
    fs, path = filesystem(url)
    local.parent.mkdir(parents=True, exist_ok=True)
    tmp = local.with_name(f".{local.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        fs.get_file(path, str(tmp))
        os.replace(tmp, local)
    finally:
        tmp.unlink(missing_ok=True)


def walk(url: str) -> dict[str, int]:
    """{path relative to `url`: size} of every object below the prefix `url`."""
    fs, path = filesystem(url)
    path = path.rstrip("/")
    if not fs.isdir(path):
        return {}
    return {name[len(path) + 1:]: int(info.get("size") or 0)
            for name, info in fs.find(path, detail=True).items() if info.get("type") != "directory"}


def remove(url: str) -> None:
    fs, path = filesystem(url)
    fs.rm_file(path)


def remove_tree(url: str) -> None:
    fs, path = filesystem(url)
    if fs.isdir(path):
        fs.rm(path, recursive=True)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cache_dir(*parts: str) -> Path:
    """Where downloads and run mirrors live on this host: $LABSE_CACHE, else ~/.cache/labse."""
    root = Path(os.environ.get("LABSE_CACHE") or Path.home() / ".cache" / "labse")
    return root.joinpath(*parts)


def url_key(url: str) -> str:
    """A short, stable folder name for `url` (its last part, readable, and a hash)."""
    tail = "".join(c if c.isalnum() or c in "-_." else "_" for c in url.rstrip("/").rsplit("/", 1)[-1])
    return f"{tail[:40]}-{hashlib.sha256(url.encode()).hexdigest()[:12]}"


# --------------------------------------------------------------------------- completion
def require_complete(url: str, what: str) -> None:
    """ValueError unless the output `url` holds its `_SUCCESS` (written last by every stage)."""
    if not exists(join(url, SUCCESS_MARKER)):
        raise UsageError(f"{what} {url} is not a complete stage output (no {SUCCESS_MARKER}): the run that writes "
                         "it was interrupted, is still running, or the copy to the bucket is unfinished")


# --------------------------------------------------------------------------- lock
class ObjectLockedError(UsageError):
    """Another run holds the lock object beside an output on object storage."""


@contextlib.contextmanager
def object_lock(url: str) -> Iterator[dict[str, Any]]:
    """Hold `URL.lock` for the `with` block: the rule of pipelines.io.stage_output, over fsspec.

    Object stores have no create-if-absent through fsspec, so the lock is best effort, as for the
    pipelines: the lock object must be absent, we write it with a random token, wait
    LOCK_SETTLE_SECONDS and read it back: another token means another run won. A run killed
    while holding it leaves the object behind; the error names it (delete it when that run is gone).
    """
    lock = lock_path_of(url)  # however the URL is spelt (gs://b//x, gs://b/x/): one lock
    if exists(lock):
        raise ObjectLockedError(f"{url} is in use by another run (lock {lock}: {_holder(lock)}); "
                                "if that run is gone, delete the lock object")
    holder = {"token": uuid.uuid4().hex, "pid": os.getpid(), "host": os.uname().nodename,
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    write_bytes(lock, json.dumps(holder).encode())
    time.sleep(LOCK_SETTLE_SECONDS)
    if _holder(lock).get("token") != holder["token"]:
        raise ObjectLockedError(f"{url} was locked by another run at the same moment (lock {lock})")
    try:
        yield holder
    finally:
        try:
            if _holder(lock).get("token") == holder["token"]:
                remove(lock)
        except Exception as error:  # noqa: BLE001 - never mask the run's own error with a clean-up failure
            logger.warning("lock %s not removed (%s): delete it by hand", lock, error)


def _holder(lock: str) -> dict[str, Any]:
    try:
        value = json.loads(read_bytes(lock))
    except (FileNotFoundError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
