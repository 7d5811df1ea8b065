"""The one lock on a stage's output (a Beam stage, the trainer's run directory, an export).

The lock is a file BESIDE the output, `OUT.lock`, never inside it: nothing inside OUT changes for
readers, `--overwrite` can remove OUT whole while the lock is held, and a file output (vocab.txt)
locks the same way (vocab.txt.lock). It holds its holder (pid, host, command, start time, token)
for the error message, and is removed on release.

- Locally it is `fcntl.flock`, released by the kernel when the process dies, so a crash never
  leaves a stale lock.
- On object storage it is an atomic create-if-absent: on gs:// the upload carries the precondition
  `ifGenerationMatch=0`, so of two runs creating it at once exactly one succeeds (the other gets
  HTTP 412). A run that died leaves its lock object behind.

One takeover rule for both: a lock whose holder ran on THIS host and whose process is gone is taken
over, with one warning line; a holder on another host may be alive, so its lock stands and the
error (OutputLockedError, a UsageError: one line, exit 2) names it and says to delete it when that
run is gone.
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import sys
import uuid
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

from pipelines.io import storage
from pipelines.io.config_options import UsageError

logger = logging.getLogger(__name__)

LOCK_SUFFIX = ".lock"


class OutputLockedError(UsageError):
    """Another run holds the lock on an output; the message names that run and the lock."""

    def __init__(self, output: str, lock_path: str, holder: Mapping[str, Any] | None):
        self.output, self.lock_path, self.holder = output, lock_path, dict(holder or {})
        gone = "; if that run is gone, delete the lock object" if storage.is_remote(lock_path) else ""
        super().__init__(f"{output} is being written by another run ({describe_holder(self.holder)}); "
                         f"lock file {lock_path}{gone}")


def lock_key(output: str | os.PathLike) -> str:
    """The one spelling of an output its lock is keyed on. An object-store URL with doubled or
    trailing slashes or `.` segments (`gs://b//x`, `gs://b/x/`, `gs://b/./x`) gets the lock of
    `gs://b/x`: the tools disagree on whether such spellings are one output, so they share one lock
    rather than let two runs write what may be the same objects. A local path is only stripped here:
    the local lock resolves its real path first."""
    text = str(output)
    if not storage.is_remote(text):
        return storage.strip(text)
    scheme, rest = text.split("://", 1)
    authority, _, path = rest.partition("/")  # the bucket (empty in file:///x)
    parts = [part for part in path.split("/") if part not in ("", ".")]
    return f"{scheme}://{authority}" + "".join("/" + part for part in parts)


def lock_path_of(output: str | os.PathLike) -> str:
    return lock_key(output) + LOCK_SUFFIX


def holder_info() -> dict[str, Any]:
    """Who takes a lock: enough for a person to find (or rule out) the other run."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": " ".join(sys.argv) or sys.executable,
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "token": uuid.uuid4().hex,
    }


def describe_holder(holder: Mapping[str, Any]) -> str:
    if not holder:
        return "holder unknown: the lock was just taken"
    return (f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started {holder.get('started', '?')}, "
            f"command: {holder.get('command', '?')}")


def json_object(raw: bytes) -> dict[str, Any]:
    """`raw` as a JSON object, or {} when it is not one (a torn or foreign file)."""
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def holder_is_gone(holder: Mapping[str, Any]) -> bool:
    """True only when the run that wrote a lock is known to be dead: it ran on this host and its
    process no longer exists. A holder on another host can be alive."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # exists, under another user
        return False
    return False


@contextmanager
def output_lock(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """Hold the exclusive lock on the output `path` (a directory or a file) for the `with` block.

    Take it BEFORE looking at what the output holds, so that the check and the writes that follow
    cannot interleave with another run's. A second run fails at once with OutputLockedError;
    nothing waits. Yields the holder info written into the lock. A local lock lies beside the
    output's real path (symlinks resolved), however the output is spelt."""
    if storage.is_remote(path):
        with _object_lock(lock_key(path)) as holder:
            yield holder
    else:
        # The real path: a run into OUT and one into a symlink to OUT are runs into one output.
        with _local_lock(os.path.realpath(storage.strip(path))) as holder:
            yield holder


@contextmanager
def _local_lock(output: str) -> Iterator[dict[str, Any]]:
    import fcntl

    lock_path = lock_path_of(output)
    os.makedirs(os.path.dirname(os.path.abspath(lock_path)), exist_ok=True)
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = json_object(os.pread(fd, 65536, 0))
            os.close(fd)
            raise OutputLockedError(output, lock_path, holder) from None
        # The previous holder unlinks the file when it releases; if it did so between our open
        # and our flock, we hold a lock on a file nobody else will see: take the new one instead.
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(lock_path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    previous = json_object(os.pread(fd, 65536, 0))
    if previous:  # flock free, file still there: its holder died without unlinking it
        logger.warning("taking over the lock %s of a run that is gone (%s)", lock_path, describe_holder(previous))
    holder = holder_info()
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode("utf-8"), 0)
        yield holder
    finally:
        # Unlink while still holding the lock, then release: a waiter that opened the old file
        # sees it is gone (the samestat check above) and creates a fresh one.
        try:
            os.unlink(lock_path)
        except FileNotFoundError:
            pass
        os.close(fd)


def _read_holder(lock_path: str) -> dict[str, Any]:
    try:
        return json_object(storage.read_bytes(lock_path))
    except FileNotFoundError:
        return {}


@contextmanager
def _object_lock(output: str) -> Iterator[dict[str, Any]]:
    lock_path = lock_path_of(output)
    holder = holder_info()
    payload = (json.dumps(holder) + "\n").encode("utf-8")
    for attempt in range(2):
        try:
            # Looked at first as well: a store that ignores the upload's precondition (the
            # gcp-storage-emulator the tests' chain runs on) must still refuse a live holder.
            if storage.exists(lock_path):
                raise FileExistsError(lock_path)
            storage.write_bytes(lock_path, payload, create_only=True)
            break
        except FileExistsError:
            current = _read_holder(lock_path)
            if attempt or not holder_is_gone(current):
                raise OutputLockedError(output, lock_path, current) from None
            logger.warning("taking over the lock %s of a run that is gone (%s)", lock_path, describe_holder(current))
            storage.remove(lock_path)
    try:
        yield holder
    finally:
        try:
            if _read_holder(lock_path).get("token") == holder["token"]:
                storage.remove(lock_path)
        except Exception as error:  # never mask the stage's own error with a clean-up failure
            logger.warning("lock %s not removed (%s): delete it by hand", lock_path, error)
