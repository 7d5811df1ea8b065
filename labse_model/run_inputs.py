"""What a run read, recorded in its config, so that `--resume` refuses other inputs in one line.

A resumed run continues the data order of the run it resumes (labse-train computes step s's pairs
from the shards; labse-pretrain keeps each language stream's file and row). Given other files
the same positions point at other text: the run would go on, silently, on data it never planned.
So each trainer records its inputs when it starts (`inputs` in its config file) and compares them
on --resume.

Each file is recorded by a key (the shard's name; `lang/name` for monolingual text), its size,
and the sha256 of its first 64 KiB. Locations are not compared: a run may resume from a copy of
its shards elsewhere (another disk, a bucket). Reading only the head keeps the check to one small
read per file however large the data; a file rewritten with other data almost always changes in
size or in its first records.
"""
from __future__ import annotations

import hashlib
from pathlib import Path, PurePosixPath
from typing import Any, Iterable

from pipelines.io.config_options import UsageError

HEAD_BYTES = 1 << 16


def file_key(path: str, prefix: str = "") -> str:
    return f"{prefix}{PurePosixPath(str(path)).name}"


def fingerprint(files: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """{"files": {key: bytes}, "sha256": digest of every key, size and head} of (key, path) pairs."""
    from pipelines.io import storage

    sizes: dict[str, int] = {}
    digest = hashlib.sha256()
    for key, path in sorted(files):
        key = _unique(key, sizes)
        sizes[key] = storage.size(str(path))
        with storage.open_input(str(path)) as handle:
            head = handle.read(HEAD_BYTES)
        digest.update(f"{key}\0{sizes[key]}\0".encode())
        digest.update(hashlib.sha256(head).digest())
    return {"files": sizes, "sha256": digest.hexdigest()}


def _unique(key: str, taken: dict[str, int]) -> str:
    """`key`, or `key#2`, `key#3`... for files of the same name in different folders."""
    candidate, count = key, 1
    while candidate in taken:
        count += 1
        candidate = f"{key}#{count}"
    return candidate


def check_same_inputs(option: str, recorded: dict[str, Any] | None, now: dict[str, Any], run_dir: Path) -> None:
    """UsageError (one line) when `now` is not the `recorded` fingerprint of what `run_dir` read.

    A run written before inputs were recorded (`recorded` None) has nothing to compare with."""
    if recorded is None or recorded["sha256"] == now["sha256"]:
        return
    before, after = recorded["files"], now["files"]
    missing = sorted(set(before) - set(after))
    added = sorted(set(after) - set(before))
    resized = sorted(key for key in set(before) & set(after) if before[key] != after[key])
    parts = []
    if missing:
        parts.append(f"{len(missing)} of its files are not given ({_names(missing)})")
    if added:
        parts.append(f"{len(added)} files are new ({_names(added)})")
    if resized:
        parts.append(f"{len(resized)} files changed size ({_names(resized)})")
    if not parts:
        parts.append("same files and sizes, other content")
    raise UsageError(f"--resume: {option} is not what {run_dir} was trained on ({len(before)} files): "
                     f"{'; '.join(parts)}. Give the run's own {option}, or start a new --output")


def _names(keys: list[str], shown: int = 3) -> str:
    more = f", +{len(keys) - shown} more" if len(keys) > shown else ""
    return ", ".join(keys[:shown]) + more
