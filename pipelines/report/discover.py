"""Find the outputs of a run under one root, local or on an object store, by the files each stage leaves.

A stage output is a folder with a `_SUCCESS` marker (the marker names its stage); the vocabulary is a
folder with `vocab.stats.json`; a main-content model is a `*.metrics.json` beside its model file; a
training or pre-training run is a folder with `train_summary.json` / `pretrain_summary.json`; an
evaluation is a JSON file with a `task` of `tatoeba` or `multi30k` (what `labse-eval --output` writes).
The walk does not descend into a stage output (its shards are the stage's business) nor follow more
than `max_depth` folders down, so a bucket with millions of shards is listed folder by folder only
where the run's layout is.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pipelines.io import storage
from pipelines.io.completion import SUCCESS_MARKER
from pipelines.io.locks import LOCK_SUFFIX

VOCAB_STATS = "vocab.stats.json"
TRAIN_SUMMARY = "train_summary.json"
PRETRAIN_SUMMARY = "pretrain_summary.json"
EVALUATION_TASKS = ("tatoeba", "multi30k")
# folders whose names say they hold a stage's own working files, never another output; a stage's
# `OUTPUT.work` folder (labse-vocab, labse-distill) holds what a rerun reuses, e.g. the teacher's pass
_SKIPPED = {"checkpoints", "tensorboard", "errors", "tmp", "temp"}
_WORK_SUFFIX = ".work"


@dataclass
class Found:
    """One output of the run: its kind, where it is, and what was read to recognise it."""

    kind: str  # stage name (labse-clean, ...), "vocab", "main-content-model", "train", "pretrain", "eval"
    path: str
    meta: dict[str, Any] = field(default_factory=dict)


# the order a reader follows a run in: the page lists outputs in it (unknown kinds last, by path)
DATA_FLOW = ("labse-main-content build-data", "main-content-model", "labse-clean", "vocab", "labse-mine",
             "labse-score", "labse-tfrecords", "pretrain", "train", "eval")


def data_flow_position(found: "Found") -> tuple[int, str]:
    kind = found.kind
    return (DATA_FLOW.index(kind) if kind in DATA_FLOW else len(DATA_FLOW), found.path)


class RunRoot:
    """A run's root folder, local or on an object store, read through the storage floor
    (`pipelines.io.storage`); every path it hands out is a full one (gs://b/x, or a local path)."""

    def __init__(self, root: str):
        self.root = storage.strip(root)

    def exists(self, path: str) -> bool:
        return storage.exists(path)

    def read_bytes(self, path: str) -> bytes:
        return storage.read_bytes(path)

    def read_json(self, path: str) -> Any:
        return json.loads(self.read_bytes(path).decode("utf-8"))

    def listing(self, folder: str) -> tuple[list[str], list[str]]:
        """(sub-folders, files) of `folder`, names only, sorted: one listing request on a bucket."""
        fs, stripped = storage.filesystem(folder)
        folders, files = [], []
        for entry in fs.ls(stripped, detail=True):
            name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
            (folders if entry["type"] == "directory" else files).append(name)
        return sorted(folders), sorted(files)

    def open(self, path: str):
        return storage.open_input(path)


def _marker(root: RunRoot, path: str) -> dict[str, Any]:
    raw = root.read_bytes(path).strip()
    if not raw:
        return {}  # a Hadoop-style empty marker: complete, nothing more known
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {"unreadable": True}
    return value if isinstance(value, dict) else {"unreadable": True}


def _evaluation(root: RunRoot, path: str) -> dict[str, Any] | None:
    try:
        value = root.read_json(path)
    except (UnicodeDecodeError, ValueError, OSError):
        return None
    if isinstance(value, dict) and value.get("task") in EVALUATION_TASKS:
        return value
    return None


def discover(root: RunRoot, max_depth: int = 6) -> list[Found]:
    """Every recognised output under the root, in walk order (folders sorted by name)."""
    found: list[Found] = []
    pending = [(root.root, 0)]
    while pending:
        folder, depth = pending.pop(0)
        folders, files = root.listing(folder)
        names = set(files)
        if SUCCESS_MARKER in names:
            marker = _marker(root, f"{folder}/{SUCCESS_MARKER}")
            found.append(Found(str(marker.get("stage") or "unknown stage"), folder, {"marker": marker}))
            continue
        if VOCAB_STATS in names:
            found.append(Found("vocab", folder, {"files": sorted(names)}))
        if TRAIN_SUMMARY in names:
            found.append(Found("train", folder))
        if PRETRAIN_SUMMARY in names:
            found.append(Found("pretrain", folder))
        for name in files:
            if name.endswith(".metrics.json"):
                found.append(Found("main-content-model", f"{folder}/{name}"))
            elif name.endswith(".json") and name not in (VOCAB_STATS, TRAIN_SUMMARY, PRETRAIN_SUMMARY):
                evaluation = _evaluation(root, f"{folder}/{name}")
                if evaluation is not None:
                    found.append(Found("eval", f"{folder}/{name}", {"results": evaluation}))
        if depth < max_depth:
            pending.extend((f"{folder}/{name}", depth + 1) for name in folders if name not in _SKIPPED
                           and not name.startswith((".", "beam-temp")) and not name.endswith((LOCK_SUFFIX, _WORK_SUFFIX)))
    return found
