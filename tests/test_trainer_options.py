"""labse-train's and labse-pretrain's settings, refused in one line (exit 2) before any work: numbers
out of range (the rules of labse_model/config.py's dataclasses, a run's config.json included), a
model over MAX_PARAMETERS before anything is allocated (labse-export once tried 128 GB), and a
device this host lacks (labse_model/distributed.py).

The export of a huge config runs in a child whose address space is bounded, so a regression is a
MemoryError there, never a huge allocation on the test machine.
"""
from __future__ import annotations

import json
import logging
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from labse_model.config import MAX_PARAMETERS, ModelConfig
from labse_model.train import main as train_main

REPO = Path(__file__).resolve().parents[1]








@pytest.mark.parametrize("field, value", [("num_layers", 10**6), ("hidden_size", 10**6), ("vocab_size", 10**9)])
def test_a_model_config_too_large_is_refused_before_building_it(field, value):
    settings = {**{"vocab_size": 2000, "num_layers": 2, "hidden_size": 64, "num_heads": 2}, field: value}
    with pytest.raises(ValueError, match=re.escape(f"over this trainer's limit of {MAX_PARAMETERS:.0e}")) as refused:
        ModelConfig(**settings)
    assert "\n" not in str(refused.value)
    assert ModelConfig.from_preset("base", 501_153).parameter_count() == 470_926_848  # LaBSE's size, allowed


def test_export_of_a_run_config_with_a_huge_hidden_size_is_one_line_without_allocating(pair_inputs, tmp_path):
    from labse_model.train import main as train_main

    vocab, shards = pair_inputs
    run = tmp_path / "run"
    assert train_main(["--data", shards, "--vocab", str(vocab), "--output", str(run), "--config", "tiny",
                       "--global-batch-size", "8", "--max-steps", "1"]) == 0
    config = json.loads((run / "config.json").read_text())
    config["model"].update(hidden_size=10**6, num_heads=1)
    (run / "config.json").write_text(json.dumps(config))

    limit = 3 << 30  # 3 GiB of address space: enough for Python and torch, far from 128 GB
    result = subprocess.run(
        [sys.executable, "-m", "labse_model.export", "--run", str(run), "--output", str(tmp_path / "model")],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "config.json" in errors[0] and "parameters" in errors[0]
    assert not (tmp_path / "model").exists()


def _errors(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]


def _assert_refused_before_any_work(status: int, caplog, tmp_path: Path, expected: str) -> None:
    """Exit 2 with one error line about the option. The data, vocabulary and output named on the
    command line do not exist: an error about them would mean work started before the check."""
    assert status == 2
    errors = _errors(caplog)
    assert len(errors) == 1 and "\n" not in errors[0], errors
    assert expected in errors[0], errors[0]
    assert not list(tmp_path.iterdir())  # no run directory, no lock file


NO_INPUTS = ["--data", "/no/such/shards/*.tfrecord", "--vocab", "/no/such/vocab.txt"]


BAD_TRAIN_OPTIONS = [
    (("--max-steps", "-1"), "max_steps must be an integer >= 1, got -1"),
    (("--max-steps", "0"), "max_steps must be an integer >= 1"),
    (("--global-batch-size", "0"), "global_batch_size must be an integer >= 2"),
    (("--lr", "nan"), "learning_rate (--lr) must be a finite number"),
    (("--lr", "inf"), "learning_rate (--lr) must be a finite number"),
    (("--lr", "-0.001"), "learning_rate (--lr) must be a finite number in [0, inf)"),
    (("--weight-decay", "-0.1"), "weight_decay must be"),
    (("--warmup-steps", "-1"), "warmup_steps must be an integer >= 0"),
    (("--max-grad-norm", "nan"), "max_grad_norm must be"),
    (("--dropout", "1"), "--dropout must be a finite number in [0, 1)"),
    (("--dropout", "nan"), "--dropout must be"),
    (("--margin", "inf"), "margin must be a finite number"),
    (("--margin", "-0.3"), "margin must be a finite number in [0, inf)"),
    (("--scale", "0"), "scale must be a finite number in (0, inf)"),
    (("--scale", "nan"), "scale must be"),
    (("--max-seq-length", "1"), "max_seq_length must be an integer >= 2"),
    (("--seed", "-1"), "seed must be an integer in [0, 2**63)"),
    (("--shuffle-window", "0"), "shuffle_window must be"),
    (("--grad-cache-chunk", "-2"), "grad_cache_chunk must be"),
    (("--log-every", "0"), "log_every must be an integer >= 1"),
    (("--save-every", "-1"), "save_every must be"),
    (("--eval-every", "-1"), "eval_every must be"),
    (("--keep-checkpoints", "-1"), "keep_checkpoints must be"),
    (("--num-workers", "-1"), "num_workers must be"),
    (("--dev-max-pairs", "0"), "--dev-max-pairs must be an integer >= 1"),
    (("--nproc-per-node", "0"), "--nproc-per-node must be an integer >= 1"),
    (("--stop-after-steps", "0"), "--stop-after-steps must be an integer >= 1"),
    (("--resume", "--resume-step", "0"), "--resume-step must be an integer >= 1"),
    (("--resume", "--max-steps", "-5"), "max_steps must be an integer >= 1"),  # checked on resume too
]


@pytest.mark.parametrize("option,expected", BAD_TRAIN_OPTIONS, ids=[" ".join(o) for o, _ in BAD_TRAIN_OPTIONS])
def test_train_refuses_numbers_out_of_range_before_any_work(tmp_path, caplog, option, expected):
    status = train_main([*NO_INPUTS, "--output", str(tmp_path / "run"), "--config", "tiny", *option])
    _assert_refused_before_any_work(status, caplog, tmp_path, expected)


BAD_PRETRAIN_OPTIONS = [
    (("--max-steps", "-1"), "max_steps must be an integer >= 1, got -1"),
    (("--global-batch-size", "0"), "global_batch_size must be an integer >= 1"),
    (("--lr", "0"), "learning_rate (--lr) must be a finite number in (0, inf)"),
    (("--lr", "nan"), "learning_rate (--lr) must be"),
    (("--warmup-steps", "-1"), "warmup_steps must be"),
    (("--dropout", "1.5"), "--dropout must be"),
    (("--mask-prob", "0"), "mask_prob must be a finite number in (0, 1)"),
    (("--mask-prob", "nan"), "mask_prob must be"),
    (("--max-predictions", "0"), "max_predictions must be"),
    (("--tlm-fraction", "1.5"), "tlm_fraction must be a finite number in [0, 1]"),
    (("--lang-alpha", "-1"), "lang_alpha must be"),
    (("--lang-alpha", "inf"), "lang_alpha must be"),
    (("--stage-layers", "1,0", "--stage-fractions", "1,1"), "stage_layers entry must be an integer >= 1"),
    (("--stage-fractions", "1,inf"), "stage_fractions entry must be a finite number in (0, inf)"),
    (("--heldout-rate", "1"), "heldout_rate must be a finite number in [0, 1)"),
    (("--heldout-per-language", "0"), "heldout_per_language must be"),
    (("--max-seq-length", "4"), "max_seq_length must be an integer >= 5"),
    (("--max-steps", "6000"), "--warmup-steps 10000 is not shorter than stage 1 (3000 steps): every stage warms "
                              "up anew; give --warmup-steps <= 2999"),
    (("--max-grad-norm", "-1"), "max_grad_norm must be"),
    (("--seed", "-1"), "seed must be"),
    (("--log-every", "0"), "log_every must be"),
    (("--nproc-per-node", "-2"), "--nproc-per-node must be"),
]


@pytest.mark.parametrize("option,expected", BAD_PRETRAIN_OPTIONS,
                         ids=[" ".join(o) for o, _ in BAD_PRETRAIN_OPTIONS])
def test_pretrain_refuses_numbers_out_of_range_before_any_work(tmp_path, caplog, option, expected):
    from labse_model.pretrain import main as pretrain_main

    status = pretrain_main(["--mono", "/no/such/sentences", "--vocab", "/no/such/vocab.txt", "--output",
                            str(tmp_path / "pt"), "--config", "tiny", "--stage-layers", "1,2", "--stage-fractions",
                            "1,1", *option])
    _assert_refused_before_any_work(status, caplog, tmp_path, expected)


NO_GPU = "no CUDA GPU is available on this host"


@pytest.mark.parametrize("device,expected", [
    ("cuda:7", NO_GPU), ("cuda", NO_GPU), ("tpu", "the trainers run on cpu, cuda"),
    ("mps", "the trainers run on cpu, cuda"), ("cuda:x", "the trainers run on cpu, cuda"),
])
def test_a_device_this_cpu_host_lacks_is_refused_before_any_work(tmp_path, caplog, monkeypatch, device, expected):
    from labse_model.pretrain import main as pretrain_main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # this host has no GPU, whatever torch sees
    status = train_main([*NO_INPUTS, "--output", str(tmp_path / "run"), "--config", "tiny", "--device", device])
    _assert_refused_before_any_work(status, caplog, tmp_path, f"--device {device}: {expected}")
    caplog.clear()
    status = pretrain_main(["--mono", "/no/such/sentences", "--vocab", "/no/such/vocab.txt", "--output",
                            str(tmp_path / "pt"), "--config", "tiny", "--stage-layers", "1,2", "--stage-fractions",
                            "1,1", "--device", device])
    _assert_refused_before_any_work(status, caplog, tmp_path, f"--device {device}: {expected}")


@pytest.mark.parametrize("options,expected", [
    (("--device", "cuda:7"), "--device cuda:7: this host has 1 GPU (cuda:0 to cuda:0)"),
    (("--device", "cuda", "--nproc-per-node", "2"), "2 processes on this host need one GPU each with --device cuda"),
    (("--nproc-per-node", "2"), "2 processes on this host need one GPU each with the default device"),
    (("--device", "cuda:0", "--nproc-per-node", "2"), "--device cuda:0 names one GPU for 2 processes"),
])
def test_a_gpu_this_one_gpu_host_lacks_is_refused_before_any_work(tmp_path, caplog, monkeypatch, options, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    status = train_main([*NO_INPUTS, "--output", str(tmp_path / "run"), "--config", "tiny", *options])
    _assert_refused_before_any_work(status, caplog, tmp_path, expected)


def test_the_one_gpu_of_a_one_gpu_host_passes_the_device_check(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for device in ("cuda:0", "cuda", "cpu"):
        caplog.clear()
        status = train_main([*NO_INPUTS, "--output", str(tmp_path / "run"), "--device", device])
        # Past the device check, the first thing train() looks at is the missing data.
        _assert_refused_before_any_work(status, caplog, tmp_path, "matches no files")
