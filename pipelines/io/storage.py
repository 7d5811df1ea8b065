"""Paths on local disk and on object storage (gs://, s3://, any fsspec protocol): the one layer the
pipelines' launchers and workers, the trainer and the exporter read and write through.

A path is remote when it holds "://"; every other path is local and handled with the standard
library. Remote paths go through fsspec (gcsfs for gs://, installed by the `gcp` extra) with the
usual credentials (Application Default Credentials). Beam is never imported here: the trainer runs
on GPU hosts without it. Beam's sinks and `MatchFiles` keep Beam's FileSystems where Dataflow needs
them; everything else (markers, stats, locks, listings, run mirrors) comes through here.

Reads stream: `open_input` gives a file object that fetches `READ_BLOCK` bytes at a time and keeps
them (fsspec's "readahead" cache), so a reader that seeks forward through a shard or reads records
near each other costs one request per block, never a copy of the whole object first.

Names listed in a bucket (or read from a marker) become local paths only through `local_child`,
which refuses a name that would leave its folder (an absolute name, `..`, empty segments).
"""
from __future__ import annotations

import glob as local_glob
import gzip
import hashlib
import io
import os
import posixpath
import shutil
import uuid
from pathlib import Path
from typing import IO, Iterator

from pipelines.io.config_options import UsageError

READ_BLOCK = 8 << 20  # bytes fetched per request when reading an object


class UnsafeNameError(UsageError):
    """A name from a bucket or a marker that would become a path outside its local folder."""


def is_remote(path: str | os.PathLike) -> bool:
    return "://" in str(path)


def strip(path: str | os.PathLike) -> str:
    """The path without trailing slashes (a lone "/" stays)."""
    text = str(path)
    return text.rstrip("/") or text


def path_argument(text: str) -> str | Path:
    """argparse type for a path that may be a URL: `Path` would fold gs://b into gs:/b."""
    return text.rstrip("/") if is_remote(text) else Path(text)


def join(base: str | os.PathLike, *parts: str) -> str:
    """`os.path.join` for local paths; "/" between the parts of a URL."""
    if not is_remote(base):
        return os.path.join(base, *parts)
    return "/".join([str(base).rstrip("/"), *parts])


def parent(path: str) -> str | None:
    """The folder holding `path`; None above a bucket's root or the filesystem's root."""
    if is_remote(path):
        scheme, _, rest = path.partition("://")
        return f"{scheme}://{rest.rsplit('/', 1)[0]}" if "/" in rest.strip("/") else None
    folder = os.path.dirname(path)
    return folder if folder != path else None


def dirname(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[0] if is_remote(path) else os.path.dirname(os.path.abspath(path))


def local_child(root: str | os.PathLike, name: str, *, source: str | None = None) -> Path:
    """`root / name` for a `name` that came from outside (an object listed in a bucket, a key of a
    marker, a file named in modules.json): refused (UnsafeNameError, one line naming `source` or
    the name) when it is absolute, has an empty, `.` or `..` segment, or resolves outside `root`.
    Call it before anything is written."""
    shown = source or name
    text = str(name)
    parts = text.replace("\\", "/").split("/")
    if (not text or text.startswith(("/", "\\")) or os.path.isabs(text) or (len(text) > 1 and text[1] == ":")
            or any(part in ("", ".", "..") for part in parts) or "\x00" in text):
        raise UnsafeNameError(f"{shown}: the name {text!r} would leave its folder {root} (absolute, empty, "
                              "'.' or '..' segments); refusing to write it")
    base = os.path.realpath(root)
    target = os.path.realpath(os.path.join(base, *parts))
    if os.path.commonpath([base, target]) != base:
        raise UnsafeNameError(f"{shown}: the name {text!r} resolves outside its folder {root}; refusing to write it")
    return Path(root).joinpath(*parts)


# How long one request to a storage endpoint may take to connect, and how often it is tried. gcsfs
# tries a request 6 times (about 35 s of back-off between tries); with aiohttp's own 30 s to connect,
# an unreachable endpoint took over 200 s to report. 4 tries wait 1, 2 and 4 s (plus up to 1 s each)
# between them, 7-10 s in all, so an endpoint that refuses is reported after about 10 s and one that
# never answers after at most 4 x 10 + 10 = 50 s. LABSE_STORAGE_CONNECT_TIMEOUT (seconds) and
# LABSE_STORAGE_TRIES set them (more tries for a flaky network).
CONNECT_TIMEOUT_SECONDS = 10.0
STORAGE_TRIES = 4


def filesystem(url: str):
    """(fsspec filesystem, path without the protocol) for `url`; listings are never cached, since
    other processes write the same bucket. On gs:// a request that cannot connect gives up after
    `CONNECT_TIMEOUT_SECONDS` (each of gcsfs's tries), so an unreachable endpoint is reported in
    bounded time (`unreachable_endpoint` names it)."""
    import fsspec

    options = {"use_listings_cache": False}
    if str(url).startswith(("gs://", "gcs://")):
        import logging

        import aiohttp

        # gcsfs logs each request that ran out of tries with its traceback, then raises it: the
        # raise is what a command reports (in one line), so the log's copy is not shown.
        logging.getLogger("gcsfs").setLevel(logging.CRITICAL)
        seconds = float(os.environ.get("LABSE_STORAGE_CONNECT_TIMEOUT", CONNECT_TIMEOUT_SECONDS))
        options["requests_timeout"] = aiohttp.ClientTimeout(total=None, sock_connect=seconds, sock_read=300)
        tries = storage_tries()
        bound_gcsfs_tries(tries)
        options["retry_timeout"] = tries * seconds  # gcsfs's bucket-type lookup (Storage Control API), 60 s otherwise
    return fsspec.core.url_to_fs(str(url), **options)


def storage_tries() -> int:
    """How often one request to object storage is tried: `STORAGE_TRIES`, or LABSE_STORAGE_TRIES."""
    text = os.environ.get("LABSE_STORAGE_TRIES", str(STORAGE_TRIES))
    if not text.strip().isdigit() or int(text) < 1:
        raise UsageError(f"LABSE_STORAGE_TRIES={text}: expected a whole number of tries, at least 1")
    return int(text)


_GCSFS_RETRIED = ("_request", "_get_file_request", "_get_file_concurrent")


def bound_gcsfs_tries(tries: int) -> None:
    """Make gcsfs try each request `tries` times. gcsfs fixes its count (6) when its class is defined
    (`@retry_request(retries=6)` on these methods; its `retries` attribute is never read again), so
    the methods are decorated anew from the functions they wrap; every gcsfs filesystem of the
    process, and the subclasses that call them through super(), then use the new count."""
    from gcsfs.core import GCSFileSystem
    from gcsfs.retry import retry_request

    for name in _GCSFS_RETRIED:
        method = GCSFileSystem.__dict__.get(name)
        if method is None or getattr(method, "labse_tries", None) == tries or not hasattr(method, "__wrapped__"):
            continue
        bounded = retry_request(retries=tries)(method.__wrapped__)
        bounded.labse_tries = tries
        setattr(GCSFileSystem, name, bounded)


# Exceptions that mean the storage endpoint (or the network) could not be reached: aiohttp's,
# requests', google-auth's and fsspec's names, matched by name so none of them must be importable.
_UNREACHABLE = {"ClientConnectorError", "ClientConnectionError", "ServerDisconnectedError", "ServerTimeoutError",
                "ConnectionError", "ConnectTimeout", "TransportError", "FSTimeoutError", "RefreshError"}


def unreachable_endpoint(error: BaseException) -> str | None:
    """One line saying that the storage endpoint could not be reached, or None when `error` (and
    its causes) is something else."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if any(kind.__name__ in _UNREACHABLE for kind in type(error).__mro__):
            first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
            endpoint = os.environ.get("STORAGE_EMULATOR_HOST", "https://storage.googleapis.com")
            return (f"the storage endpoint {endpoint} could not be reached ({type(error).__name__}: {first}); "
                    "check the network and credentials, then rerun")
        error = error.__cause__ or error.__context__
    return None


def _to_url(fs, path: str) -> str:
    return fs.unstrip_protocol(path)


def glob(pattern: str) -> list[str]:
    """Paths matching `pattern` (a local glob or a URL glob), files and folders, sorted; URLs keep
    their protocol."""
    if not is_remote(pattern):
        return sorted(local_glob.glob(pattern))
    fs, path = filesystem(pattern)
    return sorted(_to_url(fs, p) for p in fs.glob(path))


def glob_files(pattern: str) -> list[str]:
    """The files among `glob(pattern)` (one listing on object storage, no request per object)."""
    if not is_remote(pattern):
        return [p for p in glob(pattern) if os.path.isfile(p)]
    fs, path = filesystem(pattern)
    found = fs.glob(path, detail=True)
    return sorted(_to_url(fs, p) for p, info in found.items() if info.get("type") == "file")


def exists(path: str | os.PathLike) -> bool:
    """A file, folder or link (locally, even a dangling one); an object or prefix (remote)."""
    if not is_remote(path):
        return os.path.lexists(path)
    fs, stripped = filesystem(str(path))
    return fs.exists(stripped)


def isfile(path: str | os.PathLike) -> bool:
    if not is_remote(path):
        return os.path.isfile(path)
    return _remote_type(str(path)) == "file"


def isdir(path: str | os.PathLike) -> bool:
    """A local directory, or a URL prefix with at least one object below it."""
    if not is_remote(path):
        return os.path.isdir(path)
    return _remote_type(str(path)) == "directory"


def _remote_type(url: str) -> str | None:
    """"file", "directory" or None (nothing there) for a URL. fsspec's isfile/isdir answer False to
    any error; here an endpoint that cannot be reached raises (`unreachable_endpoint`), so that
    "not found" never stands for "not asked"."""
    fs, stripped = filesystem(url)
    try:
        return fs.info(stripped).get("type")
    except FileNotFoundError:
        return None
    except Exception as error:  # noqa: BLE001 - fsspec's answer for the others (a forbidden path ...)
        if unreachable_endpoint(error) is not None:
            raise
        return None


def listdir(path: str | os.PathLike) -> list[str]:
    """Names directly below a local directory or a URL prefix."""
    if not is_remote(path):
        return sorted(os.listdir(path))
    fs, stripped = filesystem(str(path))
    return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(stripped, detail=False))


def walk(path: str | os.PathLike) -> dict[str, int]:
    """{path relative to `path`: size} of every file (object) below a local folder or a URL prefix."""
    if not is_remote(path):
        root = str(path)
        if not os.path.isdir(root):
            return {}
        return {os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/"):
                os.path.getsize(os.path.join(folder, name))
                for folder, _, names in os.walk(root) for name in names}
    if not isdir(path):
        return {}
    fs, stripped = filesystem(str(path))
    stripped = stripped.rstrip("/")
    return {name[len(stripped) + 1:]: int(info.get("size") or 0)
            for name, info in fs.find(stripped, detail=True).items() if info.get("type") != "directory"}


def open_input(path: str | os.PathLike) -> IO[bytes]:
    """A binary file object for reading; on object storage it streams in READ_BLOCK requests."""
    if not is_remote(path):
        return open(path, "rb", buffering=1 << 20)
    fs, stripped = filesystem(str(path))
    return fs.open(stripped, "rb", block_size=READ_BLOCK, cache_type="readahead")


def iter_lines(path: str | os.PathLike) -> Iterator[str]:
    """`pipelines.io.text_lines.iter_lines` (UTF-8, .gz decompressed, no line ends), also for URLs."""
    from pipelines.io import text_lines

    if not is_remote(path):
        yield from text_lines.iter_lines(path)
        return
    with open_input(path) as raw:
        stream = gzip.GzipFile(fileobj=raw) if str(path).endswith(".gz") else raw
        yield from text_lines.lines_of(path, io.TextIOWrapper(stream, encoding="utf-8"), lambda: _raw_text(path))


def _raw_text(path: str) -> IO[bytes]:
    """The decompressed bytes of a remote text file (for naming the line a decoder failed on)."""
    raw = open_input(path)
    return gzip.GzipFile(fileobj=raw) if str(path).endswith(".gz") else raw


def parquet_file(path: str | os.PathLike):
    """A `pyarrow.parquet.ParquetFile`; on object storage it reads the footer and row groups in blocks."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(open_input(path) if is_remote(path) else path)


def size(path: str | os.PathLike) -> int:
    if not is_remote(path):
        return os.path.getsize(path)
    fs, stripped = filesystem(str(path))
    return int(fs.size(stripped))


def read_range(path: str | os.PathLike, start: int, length: int) -> bytes:
    """`length` bytes of a file or object from byte `start` (fewer at its end): one ranged request
    on object storage, so a reader takes the rows it needs from a large object, never the object."""
    if not is_remote(path):
        with open(path, "rb") as handle:
            return os.pread(handle.fileno(), length, start)
    fs, stripped = filesystem(str(path))
    return fs.cat_file(stripped, start=start, end=start + length)


def read_heads(paths: list[str], length: int) -> list[bytes]:
    """The first `length` bytes of each file or object (for their headers): on object storage the
    requests run concurrently, so a folder of a thousand shards is not a thousand round trips."""
    remote = [path for path in paths if is_remote(path)]
    heads = {path: read_range(path, 0, length) for path in paths if not is_remote(path)}
    if remote:
        fs, _ = filesystem(remote[0])
        stripped = [filesystem(path)[1] for path in remote]
        heads.update(zip(remote, fs.cat_ranges(stripped, [0] * len(remote), [length] * len(remote),
                                               on_error="raise")))
    return [heads[path] for path in paths]


def object_version(path: str | os.PathLike) -> str:
    """A token that changes when the file or object at `path` is rewritten: its size and its
    generation (gs://; else its ETag or update time) or, locally, its modification time."""
    if not is_remote(path):
        stat = os.stat(path)
        return f"{stat.st_size}-{stat.st_mtime_ns}"
    fs, stripped = filesystem(str(path))
    info = fs.info(stripped)
    tag = next((info[key] for key in ("generation", "etag", "ETag", "updated", "mtime", "LastModified")
                if info.get(key)), "")
    return f"{info.get('size')}-{tag}"


def cached_copy(url: str) -> Path:
    """A local copy of the object `url` on this host (`cache_dir("objects", ...)`, one folder per
    object and version), downloaded the first time a process asks for it; processes of one host
    that ask at the same time wait for one download (a file lock) instead of each fetching it."""
    import fcntl

    name = url.rsplit("/", 1)[-1]
    local_child(cache_dir("objects"), name, source=url)  # a name from a bucket: checked before any request
    version = hashlib.sha256(object_version(url).encode()).hexdigest()[:12]
    folder = cache_dir("objects", url_key(url), version)
    local = folder / name
    if local.is_file():
        return local
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not local.is_file():
            download(url, local)
    return local


def read_bytes(path: str | os.PathLike) -> bytes:
    if not is_remote(path):
        return Path(path).read_bytes()
    fs, stripped = filesystem(str(path))
    return fs.cat_file(stripped)


def write_bytes(url: str, data: bytes, *, create_only: bool = False) -> None:
    """One object, whole: an object store shows an object only once its upload completes.
    `create_only`: FileExistsError when the object exists (on gs://, the upload's precondition
    `ifGenerationMatch=0`: atomic, two writers never both succeed). Local files: use `atomic.py`."""
    fs, path = filesystem(url)
    fs.pipe_file(path, data, mode="create" if create_only else "overwrite")


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


def remove(path: str | os.PathLike) -> None:
    """Delete one file or object."""
    if not is_remote(path):
        os.unlink(path)
        return
    fs, stripped = filesystem(str(path))
    fs.rm_file(stripped)


def remove_tree(path: str | os.PathLike) -> None:
    """Delete a folder (or a URL prefix) and everything below it; nothing when it is absent."""
    if not is_remote(path):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)
        return
    fs, stripped = filesystem(str(path))
    if fs.isdir(stripped):
        fs.rm(stripped, recursive=True)
    elif fs.exists(stripped):
        fs.rm_file(stripped)


def normalise_url(url: str) -> str:
    """`scheme://bucket/a/b` for any spelling of a URL (`gs://b//a/./b/`): the bucket as given, the
    path's doubled slashes and `.` segments gone (`..` resolved)."""
    scheme, _, rest = str(url).partition("://")
    authority, _, path = rest.partition("/")
    clean = posixpath.normpath("/" + path).lstrip("/") if path.strip("/") else ""
    return f"{scheme}://{authority}" + (f"/{clean}" if clean and clean != "." else "")


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


WILDCARDS = "*?["


def has_wildcard(part: str) -> bool:
    return any(ch in part for ch in WILDCARDS)


def fixed_part(path_or_pattern: str | os.PathLike) -> str:
    """The part of a path or glob pattern before its first wildcard component: the folder a glob
    reads from (`d/*.warc.gz` -> `d`, `d/x/part-*` -> `d/x`), or the path itself."""
    text = str(path_or_pattern)
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "", text
    parts = rest.split("/")
    for index, part in enumerate(parts):
        if has_wildcard(part):
            parts = parts[:index]
            break
    fixed = "/".join(parts)
    if sep:
        return f"{scheme}://{fixed}"
    return fixed or ("/" if text.startswith("/") else ".")


def wildcard_part(pattern: str | os.PathLike) -> list[str]:
    """The components of a glob pattern from its first wildcard on (`d/x/*/a.gz` -> ["*", "a.gz"]);
    empty for a plain path."""
    parts = str(pattern).partition("://")[2].split("/") if is_remote(pattern) else str(pattern).split("/")
    for index, part in enumerate(parts):
        if has_wildcard(part):
            return [p for p in parts[index:] if p not in ("", ".")]
    return []


def real_location(path_or_pattern: str | os.PathLike) -> str:
    """What a path or pattern really names, for comparing locations: the fixed part with symlinks
    resolved (locally), or a normalised `scheme://bucket/prefix` (object stores)."""
    fixed = fixed_part(path_or_pattern)
    if is_remote(fixed):
        scheme, _, rest = fixed.partition("://")
        return f"{scheme.lower()}://{posixpath.normpath(rest).strip('/')}"
    return os.path.realpath(fixed)
