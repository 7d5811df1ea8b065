"""Atomic checkpoints: model weights as safetensors, training state as a weights-only torch file.

Layout (contract 9):

    RUN_DIR/checkpoints/step-00001000/
        model.safetensors      the SentenceEncoder's state dict (BERT + head), nothing pickled
        training_state.pt      optimizer, scheduler, step, data position   (torch.load weights_only=True)
        rng-rank00000.pt       each rank's torch / CUDA / Python / NumPy RNG states (and data position)

A checkpoint is written into a hidden temporary folder beside the final one and renamed into place,
so a `step-*` folder is always complete; a crash leaves at most a `.tmp-*` folder, which is ignored.
"""
from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipelines.io.atomic import atomic_path

STEP_DIR = re.compile(r"^step-(\d{8})$")
MODEL_FILE = "model.safetensors"
STATE_FILE = "training_state.pt"


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step-{step:08d}"


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = STEP_DIR.match(child.name)
        if match and (child / MODEL_FILE).is_file() and (child / STATE_FILE).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def find_checkpoint(run_dir: Path, step: int | None = None) -> Path:
    """The checkpoint for `step` (default: the latest); FileNotFoundError naming what exists."""
    checkpoints = list_checkpoints(run_dir)
    if not checkpoints:
        raise FileNotFoundError(f"no checkpoint under {Path(run_dir) / 'checkpoints'}")
    if step is None:
        return checkpoints[-1][1]
    for found_step, path in checkpoints:
        if found_step == step:
            return path
    raise FileNotFoundError(
        f"no checkpoint for step {step} in {run_dir}; available steps: {[s for s, _ in checkpoints]}"
    )


def rng_state() -> dict[str, Any]:
    """This process's RNG states, in types `torch.load(weights_only=True)` accepts."""
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": {
            "name": np_state[0],
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = state["numpy"]
    np.random.set_state(
        (
            np_state["name"],
            np_state["keys"].numpy().astype(np.uint32),
            np_state["pos"],
            np_state["has_gauss"],
            np_state["cached_gaussian"],
        )
    )
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_model_weights(model: torch.nn.Module, path: Path) -> None:
    from safetensors.torch import save_file

    tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in model.state_dict().items()}
    with atomic_path(path) as tmp:
        save_file(tensors, tmp, metadata={"format": "pt"})


def load_model_weights(model: torch.nn.Module, path: Path) -> None:
    from safetensors.torch import load_file

    tensors = load_file(str(path), device="cpu")
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{path} does not match the model: missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
            " (was it trained with a different --config?)"
        )


def save_checkpoint(
    run_dir: Path,
    step: int,
    *,
    model: torch.nn.Module,
    training_state: dict[str, Any],
    rank: int,
    world_size: int,
    barrier,
    keep_last: int | None = None,
    rank_state: dict[str, Any] | None = None,
) -> Path | None:
    """Write one checkpoint from every rank (collective: all ranks must call it).

    Rank 0 writes the weights and the shared training state; every rank writes its own RNG
    states, and `rank_state` (the rank's own data position, if the task has one) beside them.
    Returns the final folder on rank 0, None elsewhere.
    """
    final = checkpoint_dir(run_dir, step)
    staging = final.parent / f".tmp-{final.name}"
    if rank == 0:
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir(parents=True)
    barrier()
    own_state = rng_state() if rank_state is None else {**rng_state(), "data": rank_state}
    torch.save(own_state, staging / f"rng-rank{rank:05d}.pt")
    barrier()
    if rank != 0:
        barrier()
        return None
    save_model_weights(model, staging / MODEL_FILE)
    torch.save({**training_state, "step": step, "world_size": world_size}, staging / STATE_FILE)
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)
    if keep_last:
        for _, old in list_checkpoints(run_dir)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    barrier()
    return final


def load_training_state(checkpoint: Path) -> dict[str, Any]:
    return torch.load(Path(checkpoint) / STATE_FILE, map_location="cpu", weights_only=True)


def load_rng_state(checkpoint: Path, rank: int) -> dict[str, Any] | None:
    path = Path(checkpoint) / f"rng-rank{rank:05d}.pt"
    if not path.is_file():
        return None
    return torch.load(path, map_location="cpu", weights_only=True)
