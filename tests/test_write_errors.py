"""Environment errors while writing are one line naming the path and the cause (issue 26, item 8).

A full disk during a checkpoint was `RuntimeError: ... unexpected pos 9600 vs 9492`, a read-only
file system an OSError traceback, exporting over a symlink an rmtree traceback. A full disk cannot
be made in a test without mounting one, so the real write failure here is a file size limit
(RLIMIT_FSIZE, errno EFBIG) in a child process; the full-disk diagnosis of torch's short write is
checked with the free space reported as zero.
"""
from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from labse_model import checkpoint as ckpt
from pipelines.io import write_errors
from pipelines.io.write_errors import WriteError, environment_error_line, writing

REPO = Path(__file__).resolve().parents[1]
TORCH_SHORT_WRITE = "[enforce fail at inline_container.cc:672] . unexpected pos 9600 vs 9492"


def test_a_short_torch_write_on_a_full_disk_names_the_file_and_the_cause(tmp_path, monkeypatch):
    target = tmp_path / "training_state.pt"
    monkeypatch.setattr(write_errors, "free_bytes", lambda path: 0)
    with pytest.raises(WriteError) as full:
        with writing(target):
            raise RuntimeError(TORCH_SHORT_WRITE)
    assert str(full.value) == f"cannot write {target}: no space left on the device"
    monkeypatch.setattr(write_errors, "free_bytes", lambda path: 10 << 30)
    with pytest.raises(WriteError, match="the write stopped short"):
        with writing(target):
            raise RuntimeError(TORCH_SHORT_WRITE)


def test_safetensors_and_os_errors_of_the_environment_are_one_line_and_others_keep_their_traceback(tmp_path):
    from safetensors import SafetensorError

    target = tmp_path / "model.safetensors"
    with pytest.raises(WriteError, match=f"cannot write {target}: no space left on the device"):
        with writing(target):
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    read_only = OSError(errno.EROFS, os.strerror(errno.EROFS), str(tmp_path / "run"))
    assert environment_error_line(read_only) == f"cannot write {tmp_path / 'run'}: read-only file system"
    assert environment_error_line(OSError(errno.EIO, "I/O error", "x")) is None  # could be a read: unchanged
    with pytest.raises(RuntimeError, match="a bug"):  # not an environment error: untouched
        with writing(target):
            raise RuntimeError("a bug")


def _ignore_xfsz_and_limit_files(limit: int):
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_checkpoint_that_cannot_be_written_is_one_line_and_no_checkpoint(pair_inputs, tmp_path):
    vocab, shards = pair_inputs
    run = tmp_path / "run"
    # 300 KB a file: the config, vocabulary and logs fit; the tiny model's ~1 MB weights do not.
    result = subprocess.run(
        [sys.executable, "-m", "labse_model.train", "--data", shards, "--vocab", str(vocab), "--output", str(run),
         "--config", "tiny", "--global-batch-size", "8", "--max-steps", "1"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300,
        preexec_fn=_ignore_xfsz_and_limit_files(300_000))
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "model.safetensors: file too large" in errors[0], errors
    assert ckpt.list_checkpoints(run) == []  # nothing half-written is taken for a checkpoint


def test_export_over_a_symlink_is_refused_in_one_line(pair_inputs, tmp_path, caplog):
    from labse_model.export import main as export_main
    from labse_model.train import main as train_main

    vocab, shards = pair_inputs
    run = tmp_path / "run"
    assert train_main(["--data", shards, "--vocab", str(vocab), "--output", str(run), "--config", "tiny",
                       "--global-batch-size", "8", "--max-steps", "1"]) == 0
    target, link = tmp_path / "models", tmp_path / "model-link"
    target.mkdir()
    link.symlink_to(target)
    caplog.clear()
    assert export_main(["--run", str(run), "--output", str(link)]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "is a symbolic link" in errors[0] and str(target) in errors[0]
    assert link.is_symlink() and not any(target.iterdir())  # the link and its directory are as they were
