"""Gathered negatives: 2 gloo processes x batch B give the gradients and the step of 1 process x 2B.

Two levels: gradients straight from DDP + `all_gather_with_grad` in spawned processes (with
controls showing the check can fail), and the real `labse-train` command under torchrun.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from labse_model.config import ModelConfig
from labse_model.encoder import DualEncoder
from labse_model.loss import BidirectionalAMSLoss
from model_helpers import build_vocab, read_multi30k, write_shards
from vocab.tokenizer import hf_tokenizer

REPO = Path(__file__).resolve().parents[1]
GLOBAL_BATCH = 12
MARGIN, SCALE = 0.3, 100.0


@pytest.fixture(scope="module")
def vocab(labse_data, tmp_path_factory) -> Path:
    return build_vocab(labse_data, tmp_path_factory.mktemp("vocab"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _model(vocab_size: int, dtype: torch.dtype = torch.float64, seed: int = 0) -> DualEncoder:
    torch.manual_seed(seed)
    config = ModelConfig.from_preset("tiny", vocab_size, hidden_dropout=0.0, attention_dropout=0.0)
    return DualEncoder(config).to(dtype)


def _real_batch(labse_data: Path, vocab: Path) -> dict[str, torch.Tensor]:
    tokenizer = hf_tokenizer(vocab)
    german = read_multi30k(labse_data, "train", "de", GLOBAL_BATCH)
    english = read_multi30k(labse_data, "train", "en", GLOBAL_BATCH)
    src = tokenizer(german, padding=True, return_tensors="pt")
    tgt = tokenizer(english, padding=True, return_tensors="pt")
    return {"src_input_ids": src["input_ids"], "src_attention_mask": src["attention_mask"],
            "tgt_input_ids": tgt["input_ids"], "tgt_attention_mask": tgt["attention_mask"]}


MODES = ("gathered", "local", "summed")


def _rank_gradients(rank: int, world: int, port: int, vocab_size: int, batch_path: str, out_path: str) -> None:
    """One rank: DDP forward on its slice, loss against gathered (or local) embeddings, backward.

    Three variants, one after the other: the trainer's ("gathered"), and two mistakes the check
    must catch: local negatives only, and summing the ranks' losses instead of averaging them.
    """
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from torch.nn.parallel import DistributedDataParallel

    from labse_model.distributed import all_gather_with_grad, init_distributed, shutdown_distributed

    ctx = init_distributed("cpu")
    model = _model(vocab_size)
    ddp = DistributedDataParallel(model)
    batch = torch.load(batch_path, weights_only=True)
    local = GLOBAL_BATCH // world
    rows = slice(rank * local, (rank + 1) * local)
    loss_fn = BidirectionalAMSLoss(margin=MARGIN, scale=SCALE)
    gradients = {}
    for mode in MODES:
        model.zero_grad(set_to_none=True)
        src, tgt = ddp(**{name: tensor[rows] for name, tensor in batch.items()})
        if mode == "local":
            loss = loss_fn(src, tgt)
        else:
            all_src, all_tgt = all_gather_with_grad(src), all_gather_with_grad(tgt)
            loss = loss_fn(src, tgt, all_src, all_tgt, label_offset=ctx.rank * local)
            if mode == "summed":
                loss = loss * world
        loss.backward()
        gradients[mode] = {name: p.grad.clone() for name, p in model.named_parameters()}
    # Finally one real optimizer step with the trainer's AdamW and clipping on the gathered gradients.
    _step(model, gradients["gathered"])
    if rank == 0:
        torch.save({"gradients": gradients, "parameters": model.state_dict()}, out_path)
    shutdown_distributed()


def _step(model: DualEncoder, gradients: dict[str, torch.Tensor]) -> None:
    from labse_model.config import TrainConfig
    from labse_model.train import optimizer_for

    config = TrainConfig(learning_rate=1e-3)
    optimizer = optimizer_for(model, config)
    for name, parameter in model.named_parameters():
        parameter.grad = gradients[name].clone()
    torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
    optimizer.step()


def _two_process_gradients(tmp_path: Path, vocab_size: int, batch: dict) -> dict[str, dict]:
    batch_path, out_path = tmp_path / "batch.pt", tmp_path / "grads.pt"
    torch.save(batch, batch_path)
    mp.spawn(_rank_gradients, args=(2, _free_port(), vocab_size, str(batch_path), str(out_path)), nprocs=2)
    return torch.load(out_path, weights_only=True)


def _max_relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    scale = max(t.abs().max().item() for t in b.values())
    return max((a[name] - b[name]).abs().max().item() for name in b) / scale


def test_gathered_gradients_equal_one_big_batch(labse_data, vocab, tmp_path):
    # float64 (see _model): at initialisation all embeddings are nearly parallel and scale 100
    # amplifies float32 rounding to ~5e-4 of the largest gradient; in float64 a real mismatch stands out.
    vocab_size = len(hf_tokenizer(vocab))
    batch = _real_batch(labse_data, vocab)
    model = _model(vocab_size)
    src, tgt = model(**batch)
    BidirectionalAMSLoss(margin=MARGIN, scale=SCALE)(src, tgt).backward()
    big_batch = {name: p.grad.clone() for name, p in model.named_parameters()}
    initial = {name: t.clone() for name, t in model.state_dict().items()}
    _step(model, big_batch)

    result = _two_process_gradients(tmp_path, vocab_size, batch)
    two_process = result["gradients"]
    assert set(two_process["gathered"]) == set(big_batch)
    assert _max_relative_difference(two_process["gathered"], big_batch) < 1e-9
    # Controls: the same check sees the two usual mistakes.
    assert _max_relative_difference(two_process["local"], big_batch) > 1e-2
    assert _max_relative_difference(two_process["summed"], big_batch) > 0.5
    # One AdamW step from the same init: parameters equal within 1e-5 (they moved by ~1e-3).
    after = model.state_dict()
    assert max((result["parameters"][k] - after[k]).abs().max().item() for k in after) < 1e-5
    assert max((initial[k] - after[k]).abs().max().item() for k in after) > 5e-4


@pytest.mark.slow
def test_labse_train_two_processes_equal_one_process_with_double_batch(labse_data, vocab, tmp_path):
    """`labse-train --nproc-per-node 2` (torchrun, gloo) x 8 pairs vs one process x 16, one step."""
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
         "--nproc-per-node", "2"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert train_main([*common, "--output", str(tmp_path / "one")]) == 0

    two, one = read_metrics(tmp_path / "two")[0], read_metrics(tmp_path / "one")[0]
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-5)
    # Adam's first step is nearly scale-free, so compare the gradient norm too (it sees a factor N).
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)
    weights_two = load_file(tmp_path / "two" / "checkpoints" / "step-00000001" / "model.safetensors")
    weights_one = load_file(tmp_path / "one" / "checkpoints" / "step-00000001" / "model.safetensors")
    start = _model(len(hf_tokenizer(vocab)), torch.float32, seed=42).encoder.state_dict()  # labse-train's seed
    assert max((weights_two[k] - start[k]).abs().max().item() for k in start) > 5e-4  # the step moved them
    # In float32 at initialisation every [CLS] embedding is nearly parallel to every other, so the
    # gradients are only defined to ~1e-3 relative, and AdamW's first step (g / (|g| + eps)) turns
    # that into up to ~7% of the step for gradients near eps. The exact check is the float64 one
    # above; here a wrong gradient (local negatives, missing cross-rank terms) moves parameters by
    # up to 2 x lr, far above this bound.
    assert max((weights_two[k] - weights_one[k]).abs().max().item() for k in weights_one) < 0.25 * 1e-3
