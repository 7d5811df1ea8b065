"""When a stage's output is complete, and what it counted: ONE completion marker, ONE stats file,
strict JSON, and every reader's check of its input.

A stage that writes OUT, under `output_lock(OUT)` and after `prepare_output` (overlap.py), writes
its data, then `OUT/stats.json`, then `OUT/_SUCCESS` LAST (`finish_output`). The stage that reads OUT
calls `require_stage_output(PATH, "...")` before any work, however PATH is spelt (OUT itself, a glob
or sub-folder inside it, a symlink): it finds OUT and requires its marker.

- The marker is `OUT/_SUCCESS` (Hadoop's and Spark's name) holding JSON: the stage, the completion
  time and the stage's stats. pyarrow's datasets skip names starting with `_` or `.`. With
  `--overwrite` the old marker is removed FIRST, so an interrupted replacement is never complete.
- The stats file is `stats.json`, or `_stats.json` where Parquet shards sit directly in the output
  (a `stats.json` there breaks `pyarrow.dataset.dataset(OUT)`); `read_output_stats` finds either.
- While a run writes OUT, `OUT/_STARTED` says so (`mark_started`, right after the output is
  prepared; `mark_complete` removes it just before `_SUCCESS`). A run that failed leaves it beside
  what it wrote, so a reader that also takes hand-made folders (`vectors:DIR`) can tell an
  unfinished output from one (`unfinished_traces`); the kit's own readers need `_SUCCESS` anyway.
- Non-finite numbers in stats are written as JSON `null` (a warning names each key): JSON has no
  NaN or Infinity, and an infinite value can be legitimate (an infinite threshold keeps nothing).
"""
from __future__ import annotations

import datetime
import json
import logging
import math
import os
import sys
from typing import Any, Mapping

from pipelines.io import storage
from pipelines.io.atomic import write_bytes_atomic
from pipelines.io.config_options import UsageError
from pipelines.io.locks import json_object, lock_path_of

logger = logging.getLogger(__name__)

SUCCESS_MARKER = "_SUCCESS"
STARTED_MARKER = "_STARTED"
STATS_FILE = "stats.json"
# A stage whose Parquet shards sit directly in its output (labse-mine, labse-score) cannot put a
# `stats.json` beside them: `pyarrow.dataset.dataset(DIR)`, the documented read, would take it for
# a Parquet file; names starting with `_` are skipped. `read_output_stats` reads either.
STATS_BESIDE_SHARDS = "_stats.json"


class IncompleteOutputError(UsageError):
    """A stage's output without its completion marker: interrupted, or still being written."""


def marker_path_of(path: str | os.PathLike) -> str:
    return storage.strip(path) + "/" + SUCCESS_MARKER


# --------------------------------------------------------------------------- strict JSON
def _finite_or_null(value: Any, key: str, bad: list[str]) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        bad.append(f"{key}={value}")
        return None
    if isinstance(value, Mapping):
        return {k: _finite_or_null(v, f"{key}.{k}" if key else str(k), bad) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_null(v, f"{key}[{i}]", bad) for i, v in enumerate(value)]
    if hasattr(value, "item") and hasattr(value, "dtype"):  # numpy scalars
        return _finite_or_null(value.item(), key, bad)
    return value


def strict_json(payload: Any, *, indent: int | None = 2) -> str:
    """JSON that every parser reads: non-finite floats become null (a warning names them), and
    `allow_nan=False` makes sure none slips through."""
    bad: list[str] = []
    clean = _finite_or_null(payload, "", bad)
    if bad:
        logger.warning("non-finite numbers written as null: %s", ", ".join(bad))
    return json.dumps(clean, indent=indent, ensure_ascii=False, allow_nan=False)


def write_stats_json(path: str | os.PathLike, stats: Mapping[str, Any]) -> None:
    """A stats file, strict JSON, written atomically (local or object store)."""
    write_bytes_atomic(path, (strict_json(stats) + "\n").encode("utf-8"))


def read_stats_json(path: str | os.PathLike) -> dict[str, Any]:
    """A stats file a stage (or its Beam workers) wrote, local or on an object store."""
    return json.loads(storage.read_bytes(path).decode("utf-8"))


def read_output_stats(output: str | os.PathLike) -> dict[str, Any]:
    """The stats of the stage output `output`: `stats.json`, else `_stats.json` (shards beside it)."""
    plain = f"{storage.strip(output)}/{STATS_FILE}"
    if storage.exists(plain):
        return read_stats_json(plain)
    return read_stats_json(f"{storage.strip(output)}/{STATS_BESIDE_SHARDS}")


def finish_output(output: str | os.PathLike, stats: Mapping[str, Any], *, stage: str,
                  shards_in_root: bool = False) -> None:
    """The last two writes of a stage: its stats (`stats.json`; `_stats.json` when its Parquet
    shards sit directly in `output`), then the completion marker."""
    name = STATS_BESIDE_SHARDS if shards_in_root else STATS_FILE
    write_stats_json(f"{storage.strip(output)}/{name}", stats)
    mark_complete(output, stats, stage=stage)


# --------------------------------------------------------------------------- the marker
def started_path_of(path: str | os.PathLike) -> str:
    return f"{storage.strip(path)}/{STARTED_MARKER}"


def mark_started(path: str | os.PathLike, *, stage: str) -> None:
    """Write `path/_STARTED` (strict JSON: stage, start time) as a run begins writing `path`: until
    `mark_complete`, the output is one a run has not finished, whatever it holds."""
    payload = {"stage": stage,
               "started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    write_bytes_atomic(started_path_of(path), (strict_json(payload) + "\n").encode("utf-8"))


def mark_complete(path: str | os.PathLike, stats: Mapping[str, Any], *, stage: str | None = None) -> None:
    """Write `path/_SUCCESS` (strict JSON: stage, completion time, the stats), atomically, after
    removing `path/_STARTED`.

    The LAST write of a stage: everything a reader needs must exist before it."""
    if storage.exists(started_path_of(path)):
        storage.remove(started_path_of(path))
    payload = {
        "complete": True,
        "stage": stage or os.path.basename(sys.argv[0] or "") or "unknown",
        "completed_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "stats": dict(stats),
    }
    write_bytes_atomic(marker_path_of(path), (strict_json(payload) + "\n").encode("utf-8"))


def read_completion(path: str | os.PathLike) -> dict[str, Any] | None:
    """The completion marker of the output `path` as a dict ({} for an empty Hadoop-style
    `_SUCCESS`), or None when there is none."""
    try:
        raw = storage.read_bytes(marker_path_of(path))
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    return json_object(raw) if raw.strip() else {}


def _incomplete(what: str, where: str) -> IncompleteOutputError:
    return IncompleteOutputError(
        f"{what} {where} is not a complete stage output (no {SUCCESS_MARKER}): the run that writes it was "
        "interrupted or is still running: rerun the stage")


def require_complete(path: str | os.PathLike, what: str) -> dict[str, Any]:
    """Raise IncompleteOutputError unless the output `path` carries its completion marker.
    `what` names the input for the message, e.g. "--pairs (labse-mine output)". Returns the marker."""
    marker = read_completion(path)
    if marker is None:
        raise _incomplete(what, storage.strip(path))
    return marker


def stage_output_root(path_or_pattern: str | os.PathLike) -> str | None:
    """The root of the stage output that `path_or_pattern` reads from, however it is spelt: the
    output itself, a glob inside it, a sub-folder (`OUT/sentences/lang=de`), a file in it or a
    symlink to any of these under another name. None when it lies in no stage output.

    From the real location of the fixed part (`storage.real_location`) upwards, the nearest folder
    that is a stage output's root: it holds `_SUCCESS`, or its lock `DIR.lock` lies beside it (a run
    is writing it, or one died), or it holds the labse-clean `sentences/` folder that the path names
    or goes through (the layout of an output interrupted before its marker)."""
    current: str | None = storage.real_location(path_or_pattern)
    if not storage.is_remote(current) and os.path.isfile(current):
        current = os.path.dirname(current)
    child = None
    while current:
        # a bucket's root (gs://BUCKET) can hold a marker but has no name beside it for a lock
        lockable = not storage.is_remote(current) or storage.parent(current) is not None
        if storage.exists(marker_path_of(current)) or (lockable and storage.exists(lock_path_of(current))):
            return current
        if child is None:  # the path names a labse-clean output's root itself
            holds_sentences = not storage.is_remote(current) and os.path.isdir(os.path.join(current, "sentences"))
        else:  # or it went through its sentences/ (an ancestor merely holding one is someone else's folder)
            holds_sentences = child.rsplit("/", 1)[-1] == "sentences"
        if holds_sentences:
            return current
        child, current = current, storage.parent(current)
    return None


def unfinished_traces(folder: str | os.PathLike, *, temporary_files: bool = True) -> list[str]:
    """What the stage kit leaves of an output it has not finished, for a reader whose input may also
    be a hand-made folder (saved vectors, text files): its `_STARTED` (a run began and did not
    finish: it failed, or still runs), its stats file without `_SUCCESS` (the stats
    are written just before the marker, so the marker was lost or removed), its lock beside it (a
    run is writing it, or one was killed), the temporary files of atomic writes (`.NAME.*.tmp`, a
    write that was killed) in it or its sub-folders (with `temporary_files`). Empty for a complete
    output and for a folder no stage wrote (temporary files are looked for on local disk only: an
    object store gets whole objects)."""
    folder = storage.strip(folder)
    if storage.exists(marker_path_of(folder)):
        return []
    traces = [f"{folder}/{name}" for name in (STARTED_MARKER, STATS_FILE, STATS_BESIDE_SHARDS)
              if storage.exists(f"{folder}/{name}")]
    lockable = not storage.is_remote(folder) or storage.parent(folder) is not None
    if lockable and storage.exists(lock_path_of(folder)):
        traces.append(lock_path_of(folder))
    if temporary_files and not storage.is_remote(folder) and os.path.isdir(folder):
        for place in [folder] + [entry.path for entry in os.scandir(folder) if entry.is_dir()]:
            partial = sorted(name for name in os.listdir(place) if name.startswith(".") and name.endswith(".tmp"))
            traces.extend(os.path.join(place, name) for name in partial[:1])
    return traces


def require_stage_output(path_or_pattern: str | os.PathLike, what: str | None = None, *,
                         plain_allowed: bool = False) -> dict[str, Any] | None:
    """Every reader's check of its input: find the stage output `path_or_pattern` reads from
    (`stage_output_root`) and require its `_SUCCESS` (IncompleteOutputError, one line, naming the
    root). Returns the completion marker. Where the input may also be plain files (text, hand-made
    Parquet), `plain_allowed=True` returns None for a path in no stage output instead of refusing;
    `touch DIR/_SUCCESS` marks hand-made data as complete."""
    what = what or str(path_or_pattern)
    root = stage_output_root(path_or_pattern)
    if root is None:
        if plain_allowed:
            return None
        raise IncompleteOutputError(
            f"{what}: {storage.fixed_part(path_or_pattern)} lies in no complete stage output (no {SUCCESS_MARKER} in it "
            "or any folder above): the run that writes it was interrupted or is still running: rerun the stage")
    marker = read_completion(root)
    if marker is None:
        raise _incomplete(f"{what}:", root)
    return marker
