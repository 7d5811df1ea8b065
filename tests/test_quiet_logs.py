"""Quiet by default (pipelines.io.console): a Beam command run by hand, as a subprocess, prints its own
lines but not Beam's INFO chatter (job service, workers) nor TensorFlow's cuInit error; `-v` shows them."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_file
from tests.test_tfrecords import read_lines, write_multi30k_vocab

ROOT = Path(__file__).resolve().parent.parent


def _tfrecords(tmp_path: Path, name: str, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # as a user's shell has it
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "pipelines.tfrecords.cli", "--parallel-text",
                           f"de:{tmp_path / 'de.txt'},en:{tmp_path / 'en.txt'}", "--vocab", str(tmp_path / "vocab.txt"),
                           "--output", str(tmp_path / name), "--num-shards", "1", *extra],
                          capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.slow
def test_a_beam_command_is_quiet_by_default_and_chatty_with_v(labse_data, tmp_path):
    for lang in ("de", "en"):
        lines = read_lines(require_file(labse_data, f"multi30k/val.{lang}.gz"), 30)
        (tmp_path / f"{lang}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    write_multi30k_vocab(labse_data, tmp_path / "vocab.txt")

    quiet = _tfrecords(tmp_path, "quiet", "--direct_running_mode=multi_processing", "--direct_num_workers=2")
    assert quiet.returncode == 0, quiet.stderr
    assert "labse-tfrecords: 30 pairs read, 30 kept" in quiet.stdout
    assert "writing TFRecords" in quiet.stderr  # the command's own lines stay
    for noise in ("INFO apache_beam", "local_job_service", "semi_persistent_directory", "cuInit", "INFO root"):
        assert noise not in quiet.stderr, quiet.stderr

    verbose = _tfrecords(tmp_path, "verbose", "-v")
    assert verbose.returncode == 0, verbose.stderr
    assert "INFO apache_beam" in verbose.stderr
