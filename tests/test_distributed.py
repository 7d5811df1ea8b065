"""Gathered negatives: 2 gloo processes x batch B give the gradients and the step of 1 process x 2B.

Two levels: gradients straight from DDP + `all_gather_with_grad` in spawned processes (with
controls showing the check can fail), and the real `labse-train` command under torchrun.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from labse_model.loss import BidirectionalAMSLoss
from model_helpers import (
    build_vocab,
    max_relative_difference,
    multi30k_batch,
    set_torchrun_environment,
    spawn_on_free_port,
    tiny_dual_encoder,
    write_shards,
)
from pipelines.text.wordpiece import hf_tokenizer

REPO = Path(__file__).resolve().parents[1]
GLOBAL_BATCH = 12
MARGIN, SCALE = 0.3, 100.0


@pytest.fixture(scope="module")
def vocab(labse_data, tmp_path_factory) -> Path:
    return build_vocab(labse_data, tmp_path_factory.mktemp("vocab"))


MODES = ("gathered", "local", "summed")


def _rank_gradients(rank: int, world: int, port: int, vocab_size: int, batch_path: str, out_path: str) -> None:
    """One rank: DDP forward on its slice, loss against gathered (or local) embeddings, backward.

    Three variants, one after the other: the trainer's ("gathered"), and two mistakes the check
    must catch: local negatives only, and summing the ranks' losses instead of averaging them.
    """
    set_torchrun_environment(rank, world, port)
    torch.set_num_threads(1)
    from torch.nn.parallel import DistributedDataParallel

    from labse_model.distributed import init_distributed, shutdown_distributed

    init_distributed("cpu")
    model = tiny_dual_encoder(vocab_size)
    ddp = DistributedDataParallel(model)
    batch = torch.load(batch_path, weights_only=True)
    local = GLOBAL_BATCH // world
    rows = slice(rank * local, (rank + 1) * local)
    local_loss = BidirectionalAMSLoss(additive_margin=MARGIN, scale=SCALE)
    gathered_loss = BidirectionalAMSLoss(additive_margin=MARGIN, scale=SCALE, gather_negatives=True)
    gradients = {}
    for mode in MODES:
        model.zero_grad(set_to_none=True)
        src, tgt = ddp(**{name: tensor[rows] for name, tensor in batch.items()})
        if mode == "local":
            loss = local_loss(src, tgt)
        else:
            loss = gathered_loss(src, tgt)
            if mode == "summed":
                loss = loss * world
        loss.backward()
        gradients[mode] = {name: p.grad.clone() for name, p in model.named_parameters()}
    # Finally one real optimizer step with the trainer's AdamW and clipping on the gathered gradients.
    _step(model, gradients["gathered"])
    if rank == 0:
        torch.save({"gradients": gradients, "parameters": model.state_dict()}, out_path)
    shutdown_distributed()


def _step(model: torch.nn.Module, gradients: dict[str, torch.Tensor]) -> None:
    from labse_model.config import TrainConfig
    from labse_model.optim import build_optimizer

    config = TrainConfig(learning_rate=1e-3)
    optimizer = build_optimizer(model, config)
    for name, parameter in model.named_parameters():
        parameter.grad = gradients[name].clone()
    torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
    optimizer.step()


def _two_process_gradients(tmp_path: Path, vocab_size: int, batch: dict) -> dict[str, dict]:
    batch_path, out_path = tmp_path / "batch.pt", tmp_path / "grads.pt"
    torch.save(batch, batch_path)
    spawn_on_free_port(_rank_gradients, lambda port: (2, port, vocab_size, str(batch_path), str(out_path)), nprocs=2)
    return torch.load(out_path, weights_only=True)


def test_gathered_gradients_equal_one_big_batch(labse_data, vocab, tmp_path):
    # float64 (see tiny_dual_encoder): at initialisation all embeddings are nearly parallel and scale 100
    # amplifies float32 rounding to ~5e-4 of the largest gradient; in float64 a real mismatch stands out.
    vocab_size = len(hf_tokenizer(vocab))
    batch = multi30k_batch(labse_data, vocab, GLOBAL_BATCH)
    model = tiny_dual_encoder(vocab_size)
    src, tgt = model(**batch)
    BidirectionalAMSLoss(additive_margin=MARGIN, scale=SCALE)(src, tgt).backward()
    big_batch = {name: p.grad.clone() for name, p in model.named_parameters()}
    initial = {name: t.clone() for name, t in model.state_dict().items()}
    _step(model, big_batch)

    result = _two_process_gradients(tmp_path, vocab_size, batch)
    two_process = result["gradients"]
    assert set(two_process["gathered"]) == set(big_batch)
    assert max_relative_difference(two_process["gathered"], big_batch) < 1e-9
    # Controls: the same check sees the two usual mistakes.
    assert max_relative_difference(two_process["local"], big_batch) > 1e-2
    assert max_relative_difference(two_process["summed"], big_batch) > 0.5
    # One AdamW step from the same init: parameters equal within 1e-5 (they moved by ~1e-3).
    after = model.state_dict()
    assert max((result["parameters"][k] - after[k]).abs().max().item() for k in after) < 1e-5
    assert max((initial[k] - after[k]).abs().max().item() for k in after) > 5e-4


@pytest.mark.slow
@pytest.mark.parametrize("grad_cache_chunk", [0, 3], ids=["uncached", "grad-cache"])
@pytest.mark.timeout(600)  # a rank that dies or never joins leaves the other waiting in a collective
def test_labse_train_two_processes_equal_one_process_with_double_batch(labse_data, vocab, tmp_path,
                                                                       grad_cache_chunk):
    """`labse-train --nproc-per-node 2` (torchrun, gloo) x 8 pairs vs one process x 16, one step;
    the two processes also with gradient caching (chunks of 3, 3 and 2 under DDP's no_sync)."""
    from safetensors.torch import load_file

    from labse_model.run_log import read_metrics
    from labse_model.train import main as train_main

    shards = write_shards(labse_data, vocab, tmp_path / "shards", pairs_per_lang=32)
    common = ["--data", shards, "--vocab", str(vocab), "--config", "tiny", "--global-batch-size", "16",
              "--max-steps", "1", "--log-every", "1", "--dropout", "0", "--lr", "1e-3", "--warmup-steps", "0",
              "--scale", "5"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "labse_model.train", *common, "--output", str(tmp_path / "two"),
         "--nproc-per-node", "2", "--grad-cache-chunk", str(grad_cache_chunk)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((tmp_path / "two" / "train_summary.json").read_text())["grad_cache_chunk"] == grad_cache_chunk
    assert train_main([*common, "--output", str(tmp_path / "one")]) == 0

    two, one = read_metrics(tmp_path / "two")[0], read_metrics(tmp_path / "one")[0]
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-5)
    # Adam's first step is nearly scale-free, so compare the gradient norm too (it sees a factor N).
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)
    weights_two = load_file(tmp_path / "two" / "checkpoints" / "step-00000001" / "model.safetensors")
    weights_one = load_file(tmp_path / "one" / "checkpoints" / "step-00000001" / "model.safetensors")
    start = tiny_dual_encoder(len(hf_tokenizer(vocab)), torch.float32, seed=42).encoder.state_dict()  # labse-train's seed
    assert max((weights_two[k] - start[k]).abs().max().item() for k in start) > 5e-4  # the step moved them
    # In float32 at initialisation every [CLS] embedding is nearly parallel to every other, so the
    # gradients are only defined to ~1e-3 relative, and AdamW's first step (g / (|g| + eps)) turns
    # that into up to ~7% of the step for gradients near eps. The exact check is the float64 one
    # above; here a wrong gradient (local negatives, missing cross-rank terms) moves parameters by
    # up to 2 x lr, far above this bound.
    assert max((weights_two[k] - weights_one[k]).abs().max().item() for k in weights_one) < 0.25 * 1e-3
