"""Stage outputs (contract 11): one lock, one overwrite rule, one completion marker and strict
stats JSON, shared by every stage (the Beam pipelines and the trainer).

A stage that writes OUT does, in this order:

    with output_lock(OUT):                     # 1. exclusive: a second run into OUT fails at once
        prepare_output(OUT, overwrite=...)     # 2. refuse an existing output unless overwrite
        ... write the data ...                 # 3. shards, each written atomically
        write_stats_json(OUT + "/stats.json", stats)
        mark_complete(OUT, stats)              # 4. OUT/_SUCCESS, atomically, the very last write

and the stage that reads OUT calls `require_stage_output(PATH, "...")` before any work, however
PATH is spelt (OUT itself, a glob or sub-folder inside it, a symlink): it finds OUT and requires
its marker. Before step 2 removes anything, `check_output_apart(OUT, inputs)` refuses an OUT that
equals, contains or lies inside one of the run's inputs (`prepare_output(..., inputs=...)`). A
Beam stage's parser (`stage_parser`) refuses an option that neither it nor Beam knows.

Choices (docs/reliability.md):
- The lock is a file BESIDE the output, `OUT.lock`, never inside it: nothing inside OUT changes
  for readers (pyarrow datasets, `*.parquet` / `*.tfrecord` globs), `--overwrite` can remove OUT
  whole while the lock is held, and a file output (vocab.txt) locks the same way (vocab.txt.lock).
  Locally it is `fcntl.flock` (released by the kernel when the process dies, so a crash never
  leaves a stale lock); the file holds the holder (pid, host, command, start time) for the error
  message and is removed on release. Object stores (gs://, s3://, through Beam's FileSystems)
  have no lock and Beam exposes no create-if-absent, so the lock there is best effort: the lock
  object must be absent before, we write it with a random token, wait
  OBJECT_STORE_LOCK_SETTLE_SECONDS and read it back: another token means another run won.
  Two runs starting within the same moment can still both pass, and a run that crashed leaves its
  lock object behind: a later run on the same host whose process is gone takes it over (pid
  reuse aside); from another host the error names it (delete it when that run is gone).
- The completion marker is `OUT/_SUCCESS` (Hadoop's and Spark's name) holding JSON: the stage,
  the completion time and the stage's stats. pyarrow's datasets skip names starting with `_` or
  `.` by default, so it never breaks `pyarrow.dataset.dataset(OUT...)`. With `--overwrite` the
  old marker is removed FIRST, so an interrupted replacement is never taken for complete.
- Non-finite numbers in stats are written as JSON `null` (with a warning naming each key):
  JSON has no NaN or Infinity, and an infinite value can be legitimate (an infinite threshold
  keeps nothing), so refusing would throw away a finished run; the inputs that made NaN
  (scorer coefficients, options) are validated before a stage starts instead.

No Beam, TensorFlow or torch import at module level: `labse_model` uses this on GPU hosts.
"""
from __future__ import annotations

import argparse
import datetime
import json
import logging
import math
import os
import shutil
import socket
import sys
import time
import uuid
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Sequence

from pipelines.io.atomic import write_bytes_atomic
from pipelines.io.config_options import UsageError

logger = logging.getLogger(__name__)

LOCK_SUFFIX = ".lock"
SUCCESS_MARKER = "_SUCCESS"
# A stage whose Parquet shards sit directly in its output directory (labse-mine, labse-score) names
# its stats `_stats.json`: a plain `stats.json` there breaks `pyarrow.dataset.dataset(DIR)`
# ("Parquet magic bytes not found"), while names starting with `_` are skipped by pyarrow.
STATS_BESIDE_SHARDS = "_stats.json"
EXIT_USAGE = 2  # what every CLI returns for a refused output or a bad argument
# How long the object-store lock waits before reading its lock object back (see the module doc).
OBJECT_STORE_LOCK_SETTLE_SECONDS = 2.0


class OutputLockedError(RuntimeError):
    """Another run holds the lock on an output; the message names that run and the lock file."""

    def __init__(self, output: str, lock_path: str, holder: Mapping[str, Any] | None):
        self.output, self.lock_path, self.holder = output, lock_path, dict(holder or {})
        super().__init__(f"{output} is being written by another run ({describe_holder(self.holder)}); "
                         f"lock file {lock_path}")


class OutputExistsError(FileExistsError):
    """An output that already holds something (or is a file where a directory belongs)."""


class IncompleteOutputError(UsageError):
    """A stage's output without its completion marker: interrupted, or still being written."""


class OutputOverlapsInputError(OutputExistsError):
    """An output whose real path equals, contains or lies inside one of the run's inputs: writing
    it (or `--overwrite` removing it) would destroy or feed back into what the run reads."""


# What a stage's CLI reports as a usage error (exit 2, one line) when `fresh_output` refuses.
OUTPUT_REFUSED: tuple[type[Exception], ...] = (OutputExistsError, OutputLockedError)


BEAM_OPTIONS_HELP = ("Options the command does not know are passed to Apache Beam, e.g. --runner DataflowRunner "
                     "--project P --region R --temp_location gs://B/tmp --setup_file ./setup.py --requirements_file "
                     "dataflow/requirements.txt --requirements_cache skip (docs/guides/cloud.md), or "
                     "--direct_running_mode multi_processing --direct_num_workers 2. An option that neither "
                     "the command nor Beam knows is refused.")


class StageArgumentParser(argparse.ArgumentParser):
    """A Beam stage's parser: `parse_known_args` returns (the command's options, Beam's options)
    and refuses, in one line with exit 2, anything neither knows. Beam itself would only log
    "Discarding unparseable args" and run with the default of the option the user misspelt."""

    def parse_known_args(self, args=None, namespace=None):
        parsed, rest = super().parse_known_args(args, namespace)
        unknown = unknown_beam_args(rest)
        if unknown:
            ours = [option for action in self._actions for option in action.option_strings]
            self.exit(EXIT_USAGE, f"{self.prog}: error: unrecognized arguments: {' '.join(unknown)} "
                                  f"(neither {self.prog} nor Apache Beam knows them{_suggestion(unknown, ours)})\n")
        return parsed, rest


def _beam_option_parser() -> argparse.ArgumentParser:
    """Every option Beam's PipelineOptions knows, built the way PipelineOptions.get_all_options does."""
    import apache_beam  # noqa: F401  (imports the runners' option classes too)
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

    parser = _BeamArgumentParser(allow_abbrev=False)
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)  # pylint: disable=protected-access
    return parser


def unknown_beam_args(beam_args: Sequence[str]) -> list[str]:
    """The arguments among `beam_args` that Beam's PipelineOptions does not know (empty when all are)."""
    if not beam_args:
        return []
    _, unknown = _beam_option_parser().parse_known_args(list(beam_args))
    return unknown


def _suggestion(unknown: Sequence[str], ours: Sequence[str]) -> str:
    import difflib

    known = list(ours) + [o for a in _beam_option_parser()._actions for o in a.option_strings]
    hints = []
    for arg in unknown:
        if arg.startswith("--"):
            close = difflib.get_close_matches(arg.split("=", 1)[0], known, n=1)
            if close:
                hints.append(f"{arg.split('=', 1)[0]} -> {close[0]}?")
    return f"; did you mean {', '.join(hints)}" if hints else ""


def replace_help(where: str) -> str:
    """The help of --overwrite for an output named `where` (a path's name or --output)."""
    return f"replace an earlier run's output in {where} (without it an existing output is refused)"


def stage_parser(prog: str, description: str, *, output: str, overwrite: str = replace_help("--output"),
                 output_metavar: str | None = None, **parser_settings: Any) -> argparse.ArgumentParser:
    """The command line of a Beam stage: `prog`'s own options, with an epilog saying that any
    other option goes to Beam (the command parses with `parse_known_args` and gives the rest to
    `PipelineOptions`); an option neither knows is refused (StageArgumentParser). Every stage
    writes one output: `--output` (help `output`) and `--overwrite` (help `overwrite`)."""
    parser = StageArgumentParser(prog=prog, description=description, epilog=BEAM_OPTIONS_HELP, **parser_settings)
    parser.add_argument("--output", required=True, metavar=output_metavar, help=output)
    parser.add_argument("--overwrite", action="store_true", help=overwrite)
    return parser


def is_remote(path: str | os.PathLike) -> bool:
    return "://" in str(path)


def _strip(path: str | os.PathLike) -> str:
    text = str(path)
    return text.rstrip("/") or text


def lock_key(output: str | os.PathLike) -> str:
    """The one spelling of an output its lock is keyed on. An object-store URL with doubled or
    trailing slashes or `.` segments (`gs://b//x`, `gs://b/x/`, `gs://b/./x`) gets the lock of
    `gs://b/x`: the tools disagree on whether such spellings are one output (Beam's FileSystems.join
    turns `gs://b//x` into `gs://b/x/...`, its GCS client reads `/x` as its own object), so they
    share one lock rather than let two runs write what may be the same objects. The bucket part
    stays as given; a local path is only stripped here: the local lock resolves its real path first."""
    text = str(output)
    if not is_remote(text):
        return _strip(text)
    scheme, rest = text.split("://", 1)
    authority, _, path = rest.partition("/")  # the bucket (empty in file:///x)
    parts = [part for part in path.split("/") if part not in ("", ".")]
    return f"{scheme}://{authority}" + "".join("/" + part for part in parts)


def lock_path_of(output: str | os.PathLike) -> str:
    return lock_key(output) + LOCK_SUFFIX


def marker_path_of(output: str | os.PathLike) -> str:
    return _strip(output) + "/" + SUCCESS_MARKER


# --------------------------------------------------------------------------- holder of a lock
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


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        holder = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


# --------------------------------------------------------------------------- locks
@contextmanager
def output_lock(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """Hold an exclusive lock on the output `path` (a directory or a file) for the `with` block.

    Take it BEFORE looking at what the output holds (`prepare_output`), so that the check and the
    writes that follow cannot interleave with another run's. A second run fails at once with
    OutputLockedError; nothing waits. Yields the holder info written into the lock. A local lock
    lies beside the output's real path (symlinks resolved), however the output is spelt.
    """
    if is_remote(path):
        with _object_store_lock(lock_key(path)) as holder:
            yield holder
    else:
        # The real path: a run into OUT and one into a symlink to OUT are runs into one output.
        with _local_lock(os.path.realpath(_strip(path))) as holder:
            yield holder


@contextmanager
def fresh_output(path: str | os.PathLike, *, overwrite: bool,
                 inputs: Sequence[str | os.PathLike] = ()) -> Iterator[dict[str, Any]]:
    """Steps 1 and 2 of the module doc together: hold `output_lock(path)` for the `with` block and
    `prepare_output(path, overwrite=..., inputs=...)` inside it. Raises one of OUTPUT_REFUSED when
    the output cannot be had (a CLI reports it with `usage_error`). Yields the holder info."""
    with output_lock(path) as holder:
        prepare_output(path, overwrite=overwrite, inputs=inputs)
        yield holder


@contextmanager
def _local_lock(output: str) -> Iterator[dict[str, Any]]:
    import fcntl

    lock_path = lock_path_of(output)
    parent = os.path.dirname(os.path.abspath(lock_path))
    os.makedirs(parent, exist_ok=True)
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _json_object(os.pread(fd, 65536, 0))
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


def _filesystems():
    from apache_beam.io.filesystems import FileSystems

    return FileSystems


def _read_object(path: str) -> bytes:
    with _filesystems().open(path, compression_type="uncompressed") as handle:
        return handle.read()


def _holder_is_gone(holder: Mapping[str, Any]) -> bool:
    """True only when the run that wrote a lock object is known to be dead: it ran on this host and
    its process no longer exists (a run killed on this machine). A holder on another host can be
    alive, so its lock stands until a person deletes it."""
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
def _object_store_lock(output: str) -> Iterator[dict[str, Any]]:
    filesystems = _filesystems()
    lock_path = lock_path_of(output)
    if filesystems.exists(lock_path):  # checked before ...
        holder = _json_object(_read_object(lock_path))
        if not _holder_is_gone(holder):
            raise OutputLockedError(output, lock_path, holder)
        logger.warning("removing the lock %s of a run that is gone (%s)", lock_path, describe_holder(holder))
        filesystems.delete([lock_path])
    holder = holder_info()
    with filesystems.create(lock_path, mime_type="application/json") as handle:
        handle.write((json.dumps(holder) + "\n").encode("utf-8"))
    time.sleep(OBJECT_STORE_LOCK_SETTLE_SECONDS)
    current = _json_object(_read_object(lock_path))  # ... and after: the last writer won
    if current.get("token") != holder["token"]:
        raise OutputLockedError(output, lock_path, current)
    try:
        yield holder
    finally:
        try:
            if _json_object(_read_object(lock_path)).get("token") == holder["token"]:
                filesystems.delete([lock_path])
        except Exception as error:  # never mask the stage's own error with a clean-up failure
            logger.warning("lock %s not removed (%s): delete it by hand", lock_path, error)


# --------------------------------------------------------------------------- existing outputs
def _entries(path: str) -> list[str]:
    """What the output `path` holds: names inside a local directory, object paths below a prefix."""
    if is_remote(path):
        filesystems = _filesystems()
        try:
            results = filesystems.match([path + "/**"])
        except Exception:  # BeamIOError when nothing is there
            return []
        return sorted(m.path for r in results for m in r.metadata_list)
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


def _refusal(path: str, entries: Sequence[str]) -> OutputExistsError:
    shown = ", ".join(e.rsplit("/", 1)[-1] if is_remote(path) else e for e in entries[:5])
    more = f" and {len(entries) - 5} more" if len(entries) > 5 else ""
    return OutputExistsError(f"{path} already holds output ({shown}{more}); pass --overwrite to replace it "
                             "or choose another --output")


def remove_output(path: str | os.PathLike) -> None:
    """Delete an output (a directory and everything below it, or a file), completion marker first."""
    path = _strip(path)
    marker = marker_path_of(path)
    if is_remote(path):
        filesystems = _filesystems()
        if filesystems.exists(marker):
            filesystems.delete([marker])
        entries = _entries(path)
        if entries:
            filesystems.delete(entries)
        if filesystems.exists(path):
            filesystems.delete([path])
        return
    if os.path.lexists(marker):
        os.unlink(marker)
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def fixed_part(path_or_pattern: str | os.PathLike) -> str:
    """The part of a path or glob pattern before its first wildcard component: the folder a glob
    reads from (`d/*.warc.gz` -> `d`, `d/x/part-*` -> `d/x`), or the path itself."""
    text = str(path_or_pattern)
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "", text
    parts = rest.split("/")
    for index, part in enumerate(parts):
        if any(ch in part for ch in "*?["):
            parts = parts[:index]
            break
    fixed = "/".join(parts)
    if sep:
        return f"{scheme}://{fixed}"
    return fixed or ("/" if text.startswith("/") else ".")


def real_location(path_or_pattern: str | os.PathLike) -> str:
    """What a path or pattern really names, for comparing locations: the fixed part with symlinks
    resolved (locally), or a normalised `scheme://bucket/prefix` (object stores)."""
    import posixpath

    fixed = fixed_part(path_or_pattern)
    if is_remote(fixed):
        scheme, _, rest = fixed.partition("://")
        return f"{scheme.lower()}://{posixpath.normpath(rest).strip('/')}"
    return os.path.realpath(fixed)


def _overlap(output: str, source: str) -> bool:
    if is_remote(output) != is_remote(source):
        return False
    if output == source:
        return True
    return source.startswith(output.rstrip("/") + "/") or output.startswith(source.rstrip("/") + "/")


def check_output_apart(output: str | os.PathLike, inputs: Sequence[str | os.PathLike], *,
                       option: str = "--output") -> None:
    """Refuse (OutputOverlapsInputError, one line) an output whose real location equals, contains
    or lies inside any input's: a glob by its fixed folder, symlinks resolved, gs:// prefixes
    normalised. Called before anything is removed, so `--overwrite` never deletes the run's own
    input (and a rerun never reads the previous output as input). Beam-free: the trainer's export
    calls it with the run directory as the input."""
    target = real_location(output)
    for source in inputs:
        if source is None or str(source) == "":
            continue
        where = real_location(source)
        if _overlap(target, where):
            relation = ("is" if target == where else
                        "lies inside" if target.startswith(where.rstrip("/") + "/") else "contains")
            raise OutputOverlapsInputError(
                f"{option} {_strip(output)} {relation} the input {source} (real path {where}): a stage never "
                "writes over, into or around what it reads (--overwrite would delete it); choose another "
                f"{option}")


def prepare_output(path: str | os.PathLike, *, overwrite: bool,
                   inputs: Sequence[str | os.PathLike] = ()) -> None:
    """The one rule for a stage's output directory, local or on an object store.

    An output that overlaps one of the run's `inputs` is refused first (`check_output_apart`).
    An existing non-empty output is refused (OutputExistsError, CLIs exit 2) unless `overwrite`,
    which removes it (its completion marker first). A path naming an existing file is refused
    either way: a directory belongs there, and a file is never removed on a guess. Locally the
    directory exists afterwards. Call it while holding `output_lock(path)`.
    """
    check_output_apart(path, inputs)
    path = _strip(path)
    if not is_remote(path) and os.path.lexists(path) and not os.path.isdir(path):
        raise OutputExistsError(f"{path} is an existing file, not a directory: choose a directory for --output")
    entries = _entries(path)
    if entries and not overwrite:
        raise _refusal(path, entries)
    if entries:
        logger.info("--overwrite: removing the previous output %s (%d entries)", path, len(entries))
        remove_output(path)
    if not is_remote(path):
        os.makedirs(path, exist_ok=True)


def prepare_output_files(paths: Sequence[str | os.PathLike], *, overwrite: bool,
                         inputs: Sequence[str | os.PathLike] = ()) -> None:
    """`prepare_output` for a stage whose output is a set of files beside each other (labse-vocab:
    vocab.txt, its report, stats and work directory): refuse any that overlaps an input, then
    refuse if any exists, unless `overwrite`."""
    for path in paths:
        check_output_apart(path, inputs)
    filesystems = _filesystems() if any(is_remote(p) for p in paths) else None
    existing = [str(p) for p in paths
                if (filesystems.exists(str(p)) if is_remote(p) else os.path.lexists(p))]
    if not existing:
        return
    if not overwrite:
        raise _refusal(", ".join(existing), [e.rsplit("/", 1)[-1] for e in existing])
    for path in existing:
        remove_output(path)


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
    """A stage's stats file, strict JSON, written atomically (local or object store)."""
    write_bytes_atomic(path, (strict_json(stats) + "\n").encode("utf-8"))


def finish_shard_output(output: str | os.PathLike, stats: Mapping[str, Any], *, stage: str) -> None:
    """Step 4 of the module doc for a stage whose Parquet shards sit directly in `output`
    (labse-mine, labse-score): its stats as `output/_stats.json`, then the completion marker."""
    write_stats_json(f"{output}/{STATS_BESIDE_SHARDS}", stats)
    mark_complete(output, stats, stage=stage)


def read_stats_json(path: str | os.PathLike) -> dict[str, Any]:
    """A stats file a stage (or its Beam workers) wrote, local or on an object store."""
    if is_remote(path):
        return json.loads(_read_object(str(path)).decode("utf-8"))
    with open(path, encoding="utf-8") as f:
        return json.loads(f.read())


def read_shard_stats(output: str | os.PathLike) -> dict[str, Any]:
    """The stats `finish_shard_output` wrote into `output` (local or on an object store)."""
    return read_stats_json(f"{_strip(output)}/{STATS_BESIDE_SHARDS}")


# --------------------------------------------------------------------------- completion
def mark_complete(path: str | os.PathLike, stats: Mapping[str, Any], *, stage: str | None = None) -> None:
    """Write `path/_SUCCESS` (strict JSON: stage, completion time, the stats), atomically.

    The LAST write of a stage: everything a reader needs must exist before it.
    """
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
    marker = marker_path_of(path)
    if is_remote(marker):
        filesystems = _filesystems()
        if not filesystems.exists(marker):
            return None
        raw = _read_object(marker)
    else:
        try:
            with open(marker, "rb") as handle:
                raw = handle.read()
        except (FileNotFoundError, NotADirectoryError):
            return None
    return _json_object(raw) if raw.strip() else {}


def require_complete(path: str | os.PathLike, what: str) -> dict[str, Any]:
    """Raise IncompleteOutputError unless the output `path` carries its completion marker.

    `what` names the input for the message, e.g. "--pairs (labse-mine output)". Returns the marker.
    """
    marker = read_completion(path)
    if marker is None:
        raise IncompleteOutputError(
            f"{what} {_strip(path)} is not a complete stage output (no {SUCCESS_MARKER}): the run that writes "
            "it was interrupted or is still running: rerun the stage")
    return marker


def _exists(path: str) -> bool:
    return _filesystems().exists(path) if is_remote(path) else os.path.lexists(path)


def _parent(path: str) -> str | None:
    if is_remote(path):
        scheme, _, rest = path.partition("://")
        return f"{scheme}://{rest.rsplit('/', 1)[0]}" if "/" in rest.strip("/") else None
    parent = os.path.dirname(path)
    return parent if parent != path else None


def stage_output_root(path_or_pattern: str | os.PathLike) -> str | None:
    """The root of the stage output that `path_or_pattern` reads from, however it is spelt: the
    output itself, a glob inside it, a sub-folder (`OUT/sentences/lang=de`), a file in it or a
    symlink to any of these under another name. None when it lies in no stage output.

    From the real location of the fixed part (`real_location`) upwards, the nearest folder that is
    a stage output's root: it holds `_SUCCESS`, or its lock `DIR.lock` lies beside it (a run is
    writing it, or one died), or it holds the labse-clean `sentences/` folder that the path names or
    goes through (the layout of an output interrupted before its marker)."""
    current: str | None = real_location(path_or_pattern)
    if not is_remote(current) and os.path.isfile(current):
        current = os.path.dirname(current)
    child = None
    while current:
        # a bucket's root (gs://BUCKET) can hold a marker but has no name beside it for a lock
        lockable = not is_remote(current) or _parent(current) is not None
        if _exists(marker_path_of(current)) or (lockable and _exists(lock_path_of(current))):
            return current
        if child is None:  # the path names a labse-clean output's root itself
            holds_sentences = not is_remote(current) and os.path.isdir(os.path.join(current, "sentences"))
        else:  # or it went through its sentences/ (an ancestor merely holding one is someone else's folder)
            holds_sentences = child.rsplit("/", 1)[-1] == "sentences"
        if holds_sentences:
            return current
        child, current = current, _parent(current)
    return None


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
            f"{what}: {fixed_part(path_or_pattern)} lies in no complete stage output (no {SUCCESS_MARKER} in it "
            "or any folder above): the run that writes it was interrupted or is still running: rerun the stage")
    marker = read_completion(root)
    if marker is None:
        raise IncompleteOutputError(
            f"{what}: {root} is not a complete stage output (no {SUCCESS_MARKER}): the run that writes it was "
            "interrupted or is still running: rerun the stage")
    return marker


def usage_error(prog: str, message: str) -> int:
    """One line on stderr, the exit status for a refused argument or output."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return EXIT_USAGE
