"""`labse-main-content train`: fastText supervised training on `build-data` output, then evaluation.

    labse-main-content train --data DIR --output model.bin [--quantize]

Trains on ``DIR/train.txt`` (shuffled with a fixed seed), writes the model atomically, and reports
precision / recall / F1 of "main content" and the agreement with the teacher on the page-disjoint
test split (``DIR/test.pages.jsonl``; dev too when present), scoring whole pages exactly as
``labse-clean`` does (``MainContentModel.score_lines``). The report is printed and written to
``OUTPUT.metrics.json``. ``--quantize`` writes a compressed ``.ftz`` model instead.
"""
from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from typing import Iterator

from pipelines.io.atomic import atomic_path
from pipelines.io.config_options import UsageError
from pipelines.main_content.config import MainContentTrainConfig
from pipelines.main_content.evaluate import evaluate_pages
from pipelines.main_content.labels import LabelledPage

logger = logging.getLogger(__name__)


# fastText keeps state across trainings in one process (a second train_supervised in the same
# process can fail with "Encountered NaN" on data the first one trained on fine), so every training
# runs in a fresh interpreter. It also keeps a crash in C++ from taking the caller down.
# fastText can also stop with "Encountered NaN" at random (fasttext-numpy2 0.10: same file and
# arguments, one thread; on a small repetitive file about half the runs fail, at any learning rate,
# and once it happened every later training in that process fails too; not seen on the real sample
# data). So each attempt is a fresh process: up to 8, halving the learning rate every second one.
_NAN_ATTEMPTS = 8
_CHILD = r"""
import json, sys
import fasttext
job = json.loads(sys.argv[1])
try:
    model = fasttext.train_supervised(job["input"], verbose=0, **job["args"])
except RuntimeError as exc:
    if "NaN" in str(exc):
        sys.exit(3)
    raise
if job["quantize"]:
    model.quantize(input=job["input"], qnorm=True, retrain=True, cutoff=job["cutoff"], thread=job["args"]["thread"])
model.save_model(job["output"])
"""


def train_fasttext(train_file: str, output: str, config: MainContentTrainConfig) -> None:
    """Train on a fastText-format file and write the model to ``output`` atomically."""
    with atomic_path(output) as tmp:
        job = {"input": train_file, "output": tmp, "args": config.fasttext_args(),
               "quantize": config.quantize, "cutoff": 50_000}
        for attempt in range(_NAN_ATTEMPTS):
            done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(job)], capture_output=True, text=True)
            if done.returncode != 3:
                break
            if attempt % 2:
                job["args"]["lr"] /= 2
            logger.warning("fastText stopped on NaN (attempt %d); retrying with lr=%g", attempt + 1, job["args"]["lr"])
        if done.returncode != 0:
            raise RuntimeError(f"fastText training failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")


def read_pages(path: str) -> Iterator[LabelledPage]:
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield LabelledPage.from_json(json.loads(line))


def _shuffled_copy(train_file: str, seed: int) -> tuple[str, int]:
    with open(train_file, encoding="utf-8") as handle:
        rows = [row for row in handle if row.strip()]
    # build-data writes in worker order; SGD wants the classes and pages mixed.
    random.Random(seed).shuffle(rows)
    fd, path = tempfile.mkstemp(prefix="main-content-train-", suffix=".txt")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.writelines(rows)
    return path, len(rows)


def train(data_dir: str, output: str, config: MainContentTrainConfig = MainContentTrainConfig()) -> dict:
    """Train, save, evaluate on dev/test pages; returns (and writes beside the model) the metrics.
    `data_dir` and `output` may be on an object store (gs://...)."""
    from pipelines.main_content.model import MainContentModel

    from pipelines.io.completion import require_stage_output
    from pipelines.io.storage import is_remote

    if is_remote(data_dir) or is_remote(output):
        return _train_through_local_copies(data_dir, output, config)
    train_file = os.path.join(data_dir, "train.txt")
    if not os.path.isfile(train_file):
        raise FileNotFoundError(f"{train_file} not found: run `labse-main-content build-data` first")
    require_stage_output(data_dir, f"--data {data_dir} (labse-main-content build-data output)")
    shuffled, rows = _shuffled_copy(train_file, config.seed)
    if rows == 0:
        os.unlink(shuffled)
        raise UsageError(f"{train_file} has no training examples")
    try:
        started = time.perf_counter()
        logger.info("training fastText on %d examples from %s", rows, train_file)
        train_fasttext(shuffled, output, config)
        seconds = time.perf_counter() - started
    finally:
        os.unlink(shuffled)
    model = MainContentModel.load(output)
    report = {"model": output, "train_examples": rows, "train_seconds": round(seconds, 2),
              "model_bytes": os.path.getsize(output), "config": asdict(config)}
    for split in ("dev", "test"):
        pages_file = os.path.join(data_dir, f"{split}.pages.jsonl")
        if os.path.isfile(pages_file):
            report[split] = evaluate_pages(model, read_pages(pages_file), config.threshold)
            report[f"{split}_text_only"] = evaluate_pages(model, read_pages(pages_file), config.threshold,
                                                          use_html=False)
    from pipelines.io.atomic import write_json_atomic

    write_json_atomic(output + ".metrics.json", report)
    return report


DATA_FILES = ("train.txt", "dev.pages.jsonl", "test.pages.jsonl")


def _train_through_local_copies(data_dir: str, output: str, config: MainContentTrainConfig) -> dict:
    """fastText reads and writes local files only: a remote `data_dir` (complete: its marker is
    checked first) is copied down, a remote `output` is trained locally and uploaded, the model
    before its metrics, each object written whole (an interrupted upload leaves no model)."""
    from apache_beam.io.filesystems import FileSystems

    from pipelines.io.atomic import write_bytes_atomic, write_json_atomic
    from pipelines.io.completion import SUCCESS_MARKER, require_stage_output
    from pipelines.io.storage import is_remote

    require_stage_output(data_dir, f"--data {data_dir} (labse-main-content build-data output)")
    with tempfile.TemporaryDirectory(prefix="main-content-train-") as local:
        local_data = data_dir
        if is_remote(data_dir):
            local_data = os.path.join(local, "data")
            os.makedirs(local_data)
            for name in (*DATA_FILES, SUCCESS_MARKER):
                remote = f"{data_dir.rstrip('/')}/{name}"
                if FileSystems.exists(remote):
                    with FileSystems.open(remote, compression_type="uncompressed") as source, \
                            open(os.path.join(local_data, name), "wb") as target:
                        while chunk := source.read(1 << 20):
                            target.write(chunk)
        local_output = os.path.join(local, os.path.basename(output)) if is_remote(output) else output
        report = train(local_data, local_output, config)
        if is_remote(output):
            with open(local_output, "rb") as model:
                write_bytes_atomic(output, model.read())
            report["model"] = output
            write_json_atomic(output + ".metrics.json", report)
    return report

