"""Training across hosts and restarts (issue 22, item 6), on localhost with gloo.

* torchrun with 2 nodes x 1 process (separate node ranks, c10d rendezvous) gives the losses and
  weights of 1 node x 2 processes.
* labse-train stopped at 2 processes, resumed at 1, then at 2 again: every step trains on the
  global batch an uninterrupted run trains on, and the epoch sees each pair exactly once. Which
  pairs each step saw is recorded by the real trainer, run through a script that wraps the
  loader's `PairBatchStream.pairs`.
* labse-pretrain refuses in one line to resume on another number of processes (its monolingual
  streams are split per process; their positions cannot be re-dealt).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from labse_model.run_log import read_metrics
from model_helpers import free_port

REPO = Path(__file__).resolve().parents[1]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}

RECORDING_TRAINER = '''
import json, os, sys
from labse_model import data
from labse_model.train import main

original = data.PairBatchStream.pairs


def recording(self, step):
    src, tgt = original(self, step)
    with open(os.path.join(os.environ["PAIRS_LOG"], f"pairs-{os.getpid()}.jsonl"), "a") as log:
        log.write(json.dumps({"step": step, "rank": self.rank, "pairs": [[s, t] for s, t in zip(src, tgt)]}) + "\\n")
    return src, tgt


data.PairBatchStream.pairs = recording
sys.exit(main())
'''


def _train_args(pair_inputs, output: Path, *extra: str) -> list[str]:
    vocab, shards = pair_inputs
    # 96 pairs, 16 a step: an epoch of 6 steps.
    return ["--data", shards, "--vocab", str(vocab), "--output", str(output), "--config", "tiny",
            "--global-batch-size", "16", "--max-steps", "6", "--log-every", "1", "--save-every", "0",
            "--warmup-steps", "0", "--dropout", "0", "--lr", "1e-3", *extra]


def _check(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]


@pytest.mark.slow
def test_two_nodes_of_one_process_equal_one_node_of_two(pair_inputs, tmp_path):
    one_node = subprocess.run([*TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "labse_model.train",
                               *_train_args(pair_inputs, tmp_path / "one_node", "--max-steps", "2")],
                              cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    _check(one_node)

    endpoint = f"127.0.0.1:{free_port()}"
    nodes = [
        subprocess.Popen([*TORCHRUN, "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node),
                          "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "two-nodes",
                          "--rdzv-conf", f"is_host={int(node == 0)}", "--local-addr", "127.0.0.1",
                          "-m", "labse_model.train", *_train_args(pair_inputs, tmp_path / "two_nodes", "--max-steps", "2")],
                         cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for node in (0, 1)
    ]
    for node in nodes:
        stdout, stderr = node.communicate(timeout=300)
        assert node.returncode == 0, (stdout + stderr)[-4000:]

    summary = json.loads((tmp_path / "two_nodes" / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["step"] == 2
    one, two = read_metrics(tmp_path / "one_node"), read_metrics(tmp_path / "two_nodes")
    assert [m["step"] for m in two] == [1, 2]
    for a, b in zip(one, two):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-6)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-6)
    weights = [load_file(run / "checkpoints" / "step-00000002" / "model.safetensors")
               for run in (tmp_path / "one_node", tmp_path / "two_nodes")]
    assert max((weights[0][k] - weights[1][k]).abs().max().item() for k in weights[0]) < 1e-6


def _recorded(log_dir: Path) -> dict[int, list]:
    """Step -> the global batch it trained on (each rank's rows in rank order), from every process's log."""
    rows: dict[int, dict[int, list]] = {}
    for path in log_dir.glob("pairs-*.jsonl"):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            assert entry["rank"] not in rows.setdefault(entry["step"], {}), "a step's rank slice was read twice"
            rows[entry["step"]][entry["rank"]] = entry["pairs"]
    return {step: [pair for rank in sorted(ranks) for pair in ranks[rank]] for step, ranks in rows.items()}


@pytest.mark.slow
def test_stop_at_two_processes_resume_at_one_and_back_trains_each_pair_once(pair_inputs, tmp_path):
    script = tmp_path / "recording_trainer.py"
    script.write_text(RECORDING_TRAINER)

    def train(log_dir: Path, run: Path, processes: int, *extra: str) -> subprocess.CompletedProcess:
        log_dir.mkdir(exist_ok=True)
        launch = [*TORCHRUN, "--standalone", "--nproc-per-node", str(processes)] if processes > 1 else [sys.executable]
        result = subprocess.run([*launch, str(script), *_train_args(pair_inputs, run, *extra)], cwd=REPO,
                                env={**ENV, "PAIRS_LOG": str(log_dir)}, capture_output=True, text=True, timeout=300)
        _check(result)
        return result

    train(tmp_path / "straight_log", tmp_path / "straight", 1)
    train(tmp_path / "log", tmp_path / "run", 2, "--stop-after-steps", "2")
    resumed_at_one = train(tmp_path / "log", tmp_path / "run", 1, "--resume", "--stop-after-steps", "2")
    train(tmp_path / "log", tmp_path / "run", 2, "--resume")

    straight, interrupted = _recorded(tmp_path / "straight_log"), _recorded(tmp_path / "log")
    assert sorted(straight) == sorted(interrupted) == list(range(6))
    epoch = Counter(tuple(map(tuple, pair)) for step in straight.values() for pair in step)
    assert len(epoch) == 96 and set(epoch.values()) == {1}  # the control: one epoch holds each pair once
    for step in range(6):
        assert interrupted[step] == straight[step], f"step {step} trained on another global batch"
    assert [m["step"] for m in read_metrics(tmp_path / "run")] == list(range(1, 7))
    assert "checkpoint was written by 2 processes, now 1" in resumed_at_one.stderr
    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["finished"]


def test_pretrain_refuses_to_resume_on_another_number_of_processes(labse_data, tmp_path, caplog):
    from labse_model import checkpoint as ckpt
    from labse_model.pretrain import main as pretrain_main
    from model_helpers import build_vocab

    vocab = build_vocab(labse_data, tmp_path / "vocab")
    args = ["--vocab", str(vocab), "--output", str(tmp_path / "pt"), "--config", "tiny",
            *(arg for lang in ("de", "en") for arg in ("--mono", f"{lang}:{labse_data / 'multi30k' / f'train.{lang}.gz'}")),
            "--global-batch-size", "4", "--max-steps", "4", "--max-seq-length", "32", "--heldout-rate", "0",
            "--stage-layers", "2", "--stage-fractions", "1", "--warmup-steps", "0"]
    _check(subprocess.run([*TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "labse_model.pretrain", *args,
                           "--stop-after-steps", "1"], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300))
    before = sorted(p.name for p in (tmp_path / "pt").rglob("*"))

    assert pretrain_main([*args, "--resume"]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "\n" not in errors[0]
    assert "written by 2 processes" in errors[0] and "--nproc-per-node 2" in errors[0]
    assert sorted(p.name for p in (tmp_path / "pt").rglob("*")) == before  # nothing written or renamed
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path / "pt")] == [1]
