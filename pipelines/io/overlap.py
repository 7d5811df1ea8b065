"""What a stage may write: the overwrite rule and the overlap rule, for every stage and the exporter.

`fresh_output(OUT, overwrite=..., inputs=...)` holds `output_lock(OUT)` and, inside it,
`prepare_output`: an OUT that could collide with one of the run's inputs is refused first
(`check_output_apart`), then an existing non-empty OUT is refused unless `--overwrite`, which
removes it (its completion marker first). Nothing is removed before every check has passed.

The overlap rule decides on what can actually collide (docs/reliability.md):
- a plain input (a file or a folder): the output equals it, lies inside it or contains it;
- a glob pattern: its fixed folder lies inside (or is) the output, or the pattern could match the
  output, a folder holding it, or a file inside it (`**` matches at any depth, so it always could
  below its folder). A glob's folder alone is not an input: `--input 'crawl/*.warc.gz'` and
  `--output crawl/clean` never collide, as the same file named (`crawl/x.warc.gz`) does not.
Locations are compared real (symlinks resolved; gs:// prefixes normalised).
"""
from __future__ import annotations

import fnmatch
import logging
import os
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from pipelines.io import storage
from pipelines.io.completion import STARTED_MARKER, marker_path_of
from pipelines.io.locks import OutputLockedError, output_lock

logger = logging.getLogger(__name__)


class OutputExistsError(FileExistsError):
    """An output that already holds something (or is a file where a directory belongs)."""


class OutputOverlapsInputError(OutputExistsError):
    """An output that could collide with one of the run's inputs: writing it (or `--overwrite`
    removing it) would destroy or feed back into what the run reads."""


# What a stage's CLI reports as a usage error (exit 2, one line) when `fresh_output` refuses.
OUTPUT_REFUSED: tuple[type[Exception], ...] = (OutputExistsError, OutputLockedError)


def _inside(path: str, folder: str) -> bool:
    return path.startswith(folder.rstrip("/") + "/")


def _pattern_reaches(pattern: list[str], below: list[str]) -> bool:
    """Could the pattern components `pattern` match the path `below` (components), a folder above
    it or something inside it?"""
    if not pattern or not below:  # a match at, above or inside the output
        return True
    if pattern[0] == "**":
        return True
    return fnmatch.fnmatchcase(below[0], pattern[0]) and _pattern_reaches(pattern[1:], below[1:])


def collision(output: str | os.PathLike, source: str | os.PathLike) -> str | None:
    """How `output` would collide with the input `source` (a phrase for the message), or None."""
    target, where = storage.real_location(output), storage.real_location(source)
    if storage.is_remote(target) != storage.is_remote(where):
        return None
    pattern = storage.wildcard_part(source)
    if target == where:
        return "is"
    if _inside(where, target):
        return "contains"
    if not _inside(target, where):
        return None
    if not pattern:
        return "lies inside"
    below = target[len(where.rstrip("/")) + 1:].split("/")
    return "could hold files that match" if _pattern_reaches(pattern, below) else None


class OutputUnwritableError(OutputExistsError):
    """The output cannot be a stage's folder: a bucket's root, or under a folder nobody may write to."""


def check_output_place(output: str | os.PathLike, *, option: str = "--output") -> None:
    """Refuse (OutputUnwritableError, one line) an output that can never be written as a stage's
    folder: a bucket's root (`gs://BUCKET`: no folder to lock, and `--overwrite` would empty the
    bucket), or a local path whose nearest existing folder is read-only (the run would fail after
    all its work)."""
    path = storage.strip(output)
    if storage.is_remote(path):
        if storage.parent(storage.normalise_url(path)) is None:
            raise OutputUnwritableError(f"{option} {path} is a bucket's root: name a folder inside it "
                                        f"(e.g. {path}/run1)")
        return
    existing = os.path.abspath(path)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    folder = existing if os.path.isdir(existing) else os.path.dirname(existing)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputUnwritableError(f"{option} {path}: {folder} is read-only (no permission to write there); "
                                    "choose another location")


def check_output_apart(output: str | os.PathLike, inputs: Sequence[str | os.PathLike], *,
                       option: str = "--output") -> None:
    """Refuse (OutputOverlapsInputError, one line) an output that could collide with any input
    (the module doc's rule), or one that can never be written (`check_output_place`). Called before
    anything is removed, so `--overwrite` never deletes the run's own input (and a rerun never
    reads the previous output as input)."""
    check_output_place(output, option=option)
    for source in inputs:
        if source is None or str(source) == "":
            continue
        relation = collision(output, source)
        if relation:
            raise OutputOverlapsInputError(
                f"{option} {storage.strip(output)} {relation} the input {source} (real path "
                f"{storage.real_location(source)}): a stage never writes over, into or around what it reads "
                f"(--overwrite would delete it); choose another {option}")


def _entries(path: str) -> list[str]:
    """What the output `path` holds: names inside a local directory, object paths below a prefix."""
    if storage.is_remote(path):
        return sorted(storage.join(path, name) for name in storage.walk(path))
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


def _refusal(path: str, entries: Sequence[str]) -> OutputExistsError:
    shown = ", ".join(e.rsplit("/", 1)[-1] if storage.is_remote(path) else e for e in entries[:5])
    more = f" and {len(entries) - 5} more" if len(entries) > 5 else ""
    return OutputExistsError(f"{path} already holds output ({shown}{more}); pass --overwrite to replace it "
                             "or choose another --output")


def remove_output(path: str | os.PathLike) -> None:
    """Delete an output (a directory and everything below it, or a file), completion marker first."""
    path = storage.strip(path)
    marker = marker_path_of(path)
    if storage.exists(marker):
        storage.remove(marker)
    storage.remove_tree(path)


def prepare_output(path: str | os.PathLike, *, overwrite: bool, inputs: Sequence[str | os.PathLike] = ()) -> None:
    """The one rule for a stage's output directory, local or on an object store.

    An output that could collide with one of the run's `inputs` is refused first. An existing
    non-empty output is refused (OutputExistsError, CLIs exit 2) unless `overwrite`, which removes
    it (its completion marker first). A path naming an existing file is refused either way: a
    directory belongs there, and a file is never removed on a guess. Locally the directory exists
    afterwards. Call it while holding `output_lock(path)`."""
    check_output_apart(path, inputs)
    path = storage.strip(path)
    if not storage.is_remote(path) and os.path.lexists(path) and not os.path.isdir(path):
        raise OutputExistsError(f"{path} is an existing file, not a directory: choose a directory for --output")
    entries = _entries(path)
    if entries and all(entry.rsplit("/", 1)[-1] == STARTED_MARKER for entry in entries):
        entries = []  # a run that failed before it wrote anything: nothing to keep (its marker is rewritten)
    if entries and not overwrite:
        raise _refusal(path, entries)
    if entries:
        logger.info("--overwrite: removing the previous output %s (%d entries)", path, len(entries))
        remove_output(path)
    if not storage.is_remote(path):
        os.makedirs(path, exist_ok=True)


def prepare_output_files(paths: Sequence[str | os.PathLike], *, overwrite: bool,
                         inputs: Sequence[str | os.PathLike] = ()) -> None:
    """`prepare_output` for a stage whose output is a set of files beside each other (labse-vocab:
    vocab.txt, its report, stats and work directory): refuse any that overlaps an input, then
    refuse if any exists, unless `overwrite`."""
    for path in paths:
        check_output_apart(path, inputs)
    existing = [str(p) for p in paths if storage.exists(p)]
    if not existing:
        return
    if not overwrite:
        raise _refusal(", ".join(existing), [e.rsplit("/", 1)[-1] for e in existing])
    for path in existing:
        remove_output(path)


@contextmanager
def fresh_output(path: str | os.PathLike, *, overwrite: bool,
                 inputs: Sequence[str | os.PathLike] = ()) -> Iterator[dict[str, Any]]:
    """Hold `output_lock(path)` for the `with` block and `prepare_output(path, ...)` inside it.
    Raises one of OUTPUT_REFUSED when the output cannot be had. Yields the holder info."""
    with output_lock(path) as holder:
        prepare_output(path, overwrite=overwrite, inputs=inputs)
        yield holder
