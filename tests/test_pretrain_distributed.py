"""labse-pretrain under torchrun: 2 gloo processes, a stage boundary, and a resume that equals one run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from labse_model.run_log import read_metrics
from test_pretrain import _args, inputs  # noqa: F401  (the module-scoped fixture and the command's arguments)

REPO = Path(__file__).resolve().parents[1]


def _pretrain_two_processes(argv: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "labse_model.pretrain", *argv, "--nproc-per-node", "2"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(600)  # a rank that dies or never joins leaves the other waiting in a collective
def test_two_processes_resume_across_the_stage_boundary_equals_one_run(inputs, tmp_path):  # noqa: F811
    vocab, shards, sentences = inputs
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    _pretrain_two_processes(_args(vocab, shards, sentences, straight))
    _pretrain_two_processes(_args(vocab, shards, sentences, interrupted, "--stop-after-steps", "3"))
    _pretrain_two_processes(_args(vocab, shards, sentences, interrupted, "--resume"))

    summary = json.loads((straight / "pretrain_summary.json").read_text())
    assert summary["world_size"] == 2
    # Each rank keeps its own RNG state and data position in every checkpoint.
    assert sorted(p.name for p in (straight / "checkpoints" / "step-00000004").glob("rng-rank*.pt")) == [
        "rng-rank00000.pt", "rng-rank00001.pt"]

    def losses(run: Path) -> dict[int, float]:
        return {m["step"]: m["loss"] for m in read_metrics(run) if "loss" in m}

    assert sorted(losses(straight)) == list(range(1, 9))
    assert len(set(losses(straight).values())) == 8
    assert losses(interrupted) == losses(straight)  # bit-identical through a 2-process resume
    a, b = load_file(interrupted / "encoder.safetensors"), load_file(straight / "encoder.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any("encoder.layer.1." in k for k in b)  # grown to 2 layers at the boundary

