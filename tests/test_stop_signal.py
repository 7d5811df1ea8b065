"""SIGTERM (preemption, Kubernetes, Slurm) checkpoints at the next step boundary and exits 0 (issue 26, item 10).

The signal is sent to a running tiny training; the checkpoint must exist at the step reached, the
command must say how to resume, and --resume must continue from it. Under torchrun only one rank
is signalled: the other must stop after the same step (else it would wait in a collective forever).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labse_model import checkpoint as ckpt
from labse_model.cli import child_processes
from labse_model.run_log import read_metrics

REPO = Path(__file__).resolve().parents[1]
WAIT_S = 240  # generous: the machine is shared; a healthy run needs a few seconds


def _command(module: str, output: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", module, "--output", str(output), "--config", "tiny", "--log-every", "1",
            "--save-every", "0", "--warmup-steps", "2", *extra]


def _train_args(pair_inputs) -> list[str]:
    vocab, shards = pair_inputs
    return ["--data", shards, "--vocab", str(vocab), "--global-batch-size", "8", "--max-steps", "100000"]


def _start(command: list[str]) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_steps(run: Path, steps: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"training ended before it was signalled: {process.communicate()[1][-3000:]}")
        if (run / "metrics.jsonl").is_file() and len(read_metrics(run)) >= steps:
            return
        time.sleep(0.2)
    process.kill()
    pytest.fail(f"training did not reach step {steps} within {WAIT_S} s")


def _finish(process: subprocess.Popen) -> tuple[int, str]:
    try:
        _, stderr = process.communicate(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"the signalled training did not stop: {process.communicate()[1][-3000:]}")
    return process.returncode, stderr


def _check_stopped_run(run: Path, stderr: str, summary_file: str, world_size: int) -> int:
    """The step the run stopped at, after checking the checkpoint and the metrics end there."""
    summary = json.loads((run / summary_file).read_text())
    step = summary["step"]
    assert summary["stopped_by"] == "SIGTERM" and not summary["finished"]
    assert [s for s, _ in ckpt.list_checkpoints(run)] == [step]
    state = ckpt.load_training_state(ckpt.checkpoint_dir(run, step))
    assert state["step"] == step and state["world_size"] == world_size
    assert all(ckpt.rng_file(ckpt.checkpoint_dir(run, step), r).is_file() for r in range(world_size))
    assert max(m["step"] for m in read_metrics(run)) == step
    assert f"SIGTERM: stopped after step {step}" in stderr and "again with --resume" in stderr
    return step


def _environment(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


@pytest.mark.slow
def test_sigterm_checkpoints_the_step_reached_exits_0_and_resume_continues(pair_inputs, tmp_path):
    from labse_model.train import main as train_main

    run = tmp_path / "run"
    process = _start(_command("labse_model.train", run, *_train_args(pair_inputs)))
    _wait_for_steps(run, 2, process)
    process.send_signal(signal.SIGTERM)
    returncode, stderr = _finish(process)
    assert returncode == 0, stderr[-3000:]
    step = _check_stopped_run(run, stderr, "train_summary.json", 1)
    assert step >= 2

    vocab, shards = pair_inputs
    assert train_main(["--data", shards, "--vocab", str(vocab), "--output", str(run), "--resume",
                       "--stop-after-steps", "2"]) == 0
    assert [m["step"] for m in read_metrics(run)] == list(range(1, step + 3))
    assert [s for s, _ in ckpt.list_checkpoints(run)] == [step, step + 2]


@pytest.mark.slow
def test_sigterm_to_one_rank_stops_both_after_the_same_step(pair_inputs, tmp_path):
    """Only rank 1 gets the signal (as when ranks are signalled at different moments): both ranks
    agree to stop after the same step, write one collective checkpoint and exit 0."""
    run = tmp_path / "run"
    launcher = _start(_command("labse_model.train", run, *_train_args(pair_inputs), "--nproc-per-node", "2"))
    _wait_for_steps(run, 2, launcher)
    torchrun = child_processes(launcher.pid)
    workers = [pid for parent in torchrun for pid in child_processes(parent)]
    rank_one = [pid for pid in workers if _environment(pid).get("RANK") == "1"]
    assert len(rank_one) == 1, (torchrun, workers)
    os.kill(rank_one[0], signal.SIGTERM)
    returncode, stderr = _finish(launcher)
    assert returncode == 0, stderr[-3000:]
    _check_stopped_run(run, stderr, "train_summary.json", 2)


@pytest.mark.slow
def test_sigterm_to_the_launcher_reaches_the_workers_and_pretrain_stops_gently(labse_data, tmp_path):
    """labse-pretrain --nproc-per-node 2, the signal sent to the command the user started: it is
    forwarded to the training processes (not to torchrun, which would exit 1), which checkpoint."""
    from model_helpers import build_vocab

    vocab = build_vocab(labse_data, tmp_path / "vocab")
    mono = [arg for lang in ("de", "en") for arg in ("--mono", f"{lang}:{labse_data / 'multi30k' / f'train.{lang}.gz'}")]
    run = tmp_path / "pt"
    launcher = _start(_command("labse_model.pretrain", run, "--vocab", str(vocab), *mono,
                               "--global-batch-size", "8", "--max-steps", "100000", "--max-seq-length", "32",
                               "--heldout-rate", "0", "--stage-layers", "2", "--stage-fractions", "1", "--nproc-per-node", "2"))
    _wait_for_steps(run, 2, launcher)
    launcher.send_signal(signal.SIGTERM)
    returncode, stderr = _finish(launcher)
    assert returncode == 0, stderr[-3000:]
    _check_stopped_run(run, stderr, "pretrain_summary.json", 2)


# The trainer with a start-up that lasts (a slow object store, a large checkpoint to read): after
# the run directory is prepared it touches MARKER and sleeps, so the signal surely arrives before
# the first step.
SLOW_START_UP = """
import sys, time
from pathlib import Path
import labse_model.train as train

prepare = train.prepare_run_dir

def slowly_prepared(*args, **kwargs):
    config = prepare(*args, **kwargs)
    Path(sys.argv[1]).touch()
    time.sleep(600)
    return config

train.prepare_run_dir = slowly_prepared
sys.exit(train.main(sys.argv[2:]))
"""


@pytest.mark.slow
def test_sigterm_during_start_up_stops_at_once_cleanly_and_says_so(pair_inputs, tmp_path):
    """Before the loop's handler is in place SIGTERM used to kill the trainer outright (no message,
    its run lock left behind). Now it unwinds the run (lock released), says in one line that nothing
    trained is lost and exits 143 (128 + SIGTERM); the same command then runs."""
    run, marker = tmp_path / "run", tmp_path / "starting"
    argv = _command("labse_model.train", run, *_train_args(pair_inputs))[3:]
    process = _start([sys.executable, "-c", SLOW_START_UP, str(marker), *argv])
    deadline = time.monotonic() + WAIT_S
    while not marker.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the trainer never reached its start-up: {process.communicate()[1][-3000:]}")
        time.sleep(0.1)
    assert (tmp_path / "run.lock").exists()  # the run holds its lock while it starts
    process.send_signal(signal.SIGTERM)
    returncode, stderr = _finish(process)

    assert returncode == 128 + signal.SIGTERM, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if "SIGTERM outside the training steps" in line]
    assert len(lines) == 1 and "nothing trained is lost" in lines[0], stderr[-3000:]
    assert "Traceback" not in stderr
    assert not (tmp_path / "run.lock").exists() and not ckpt.list_checkpoints(run)
    from labse_model.train import main as train_main

    assert train_main([*argv[:argv.index("--max-steps")], "--max-steps", "2"]) == 0
    assert [s for s, _ in ckpt.list_checkpoints(run)] == [2]


def test_sigterm_during_a_step_checkpoints_that_step_and_gives_the_handler_back(tmp_path, caplog):
    """Fast, in this process (the tests above run real trainings): the loop finishes the step the
    signal arrived in, checkpoints it, stops, and puts back the handler it replaced."""
    import torch

    from labse_model.config import TrainConfig
    from labse_model.distributed import DistributedContext
    from labse_model.loop import LoopParts, run_loop
    from labse_model.run_log import RunLog

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ctx = DistributedContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    parts = LoopParts(ctx=ctx, run_dir=tmp_path, model=model, trained=model, optimizer=optimizer,
                      scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0),
                      settings=TrainConfig(save_every=0, log_every=1000, keep_checkpoints=0),
                      log=RunLog(tmp_path, enabled=True))
    calls = []

    def loss_sending_sigterm_in_step_3(batch):
        calls.append(len(calls) + 1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # arrives mid-step, as from a scheduler
        return model(batch["x"]).pow(2).mean(), {}

    batches = iter(lambda: {"x": torch.randn(2, 4)}, None)
    received = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        result = run_loop(parts, batches, loss_sending_sigterm_in_step_3, start_step=0, stop_at=100, total_steps=100)
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL and not received
        os.kill(os.getpid(), signal.SIGTERM)  # after the loop: the handler it replaced is back
        assert received == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result.stopped_by == "SIGTERM" and result.step == 3 and calls == [1, 2, 3]
    assert [step for step, _ in ckpt.list_checkpoints(tmp_path)] == [3]
    assert ckpt.load_training_state(ckpt.checkpoint_dir(tmp_path, 3))["step"] == 3
    assert max(m["step"] for m in read_metrics(tmp_path)) == 3  # the stopping step is logged
    assert "SIGTERM: stopped after step 3" in caplog.text and "--resume" in caplog.text
