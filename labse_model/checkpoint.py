"""Atomic checkpoints: model weights as safetensors, training state as a weights-only torch file.

Layout (contract 9):

    RUN_DIR/checkpoints/step-00001000/
        model.safetensors      the SentenceEncoder's state dict (BERT + head), nothing pickled
        training_state.pt      optimizer, scheduler, step, data position   (torch.load weights_only=True)
        rng-rank00000.pt       each rank's torch / CUDA / Python / NumPy RNG states (and data position)

A checkpoint is written into a hidden temporary folder beside the final one, flushed to the disk and
renamed into place (`durable_replace`), so a `step-*` folder is always complete; a crash leaves at
most a `.tmp-*` folder, which is ignored.

Reading one back never trusts it: a file that does not parse (truncated by a full disk, overwritten)
or weights whose bytes no longer match the sha256 recorded in them raise `CorruptCheckpointError`
naming the file, and nothing is unpickled (torch files are read with `weights_only=True`; a file that holds
other objects is refused without PyTorch's advice to load it unsafely). Without an explicit step,
readers take the newest checkpoint whose files all read back (`choose_checkpoint`) and say in one
line which ones they skipped; a resume then renames those out of the way (`set_aside_after`).
"""
from __future__ import annotations

import hashlib
import logging
import os
import pickle
import random
import re
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Generic, TypeVar

import numpy as np
import torch

from pipelines.io.write_errors import writing
from pipelines.io.atomic import atomic_path, durable_replace
from pipelines.io.config_options import UsageError

logger = logging.getLogger(__name__)

STEP_DIR = re.compile(r"^step-(\d{8})$")
MODEL_FILE = "model.safetensors"
STATE_FILE = "training_state.pt"
# What every training_state.pt holds (labse_model.loop.save_checkpoint); tasks add their own keys.
STATE_KEYS = ("step", "world_size", "optimizer", "scheduler")
RNG_KEYS = ("torch", "python", "numpy")

Loaded = TypeVar("Loaded")


class CorruptCheckpointError(UsageError):
    """A checkpoint or weights file that does not read back: truncated, damaged, or holding more than
    tensors and plain values (refused, never unpickled). The message names the file, on one line."""


def rng_file(checkpoint: Path, rank: int) -> Path:
    return Path(checkpoint) / f"rng-rank{rank:05d}.pt"


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


# The safetensors metadata key holding `tensors_digest` of the file's tensors (safetensors itself
# has no checksum: it only checks that the header parses and that the tensors cover the file).
DIGEST_KEY = "labse_sha256"


def tensors_digest(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over the names, dtypes, shapes and bytes of `tensors` (CPU, contiguous), in name order."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name]
        digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def save_weights(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Write `tensors` as a safetensors file, atomically, with their `tensors_digest` in its metadata."""
    from safetensors.torch import save_file

    tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in tensors.items()}
    with writing(path), atomic_path(path) as tmp:
        save_file(tensors, tmp, metadata={"format": "pt", DIGEST_KEY: tensors_digest(tensors)})


def save_model_weights(model: torch.nn.Module, path: Path) -> None:
    save_weights(model.state_dict(), path)


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, on CPU; CorruptCheckpointError when the file does not parse
    or its tensors do not match the digest it was written with.

    safetensors checks that its header is valid JSON and that the tensors it lists cover the file
    exactly, so a truncated, zero-filled or overwritten file is caught by it; damage inside the
    tensor bytes that keeps the size (a flipped bit on disk or in a copy) is caught by the digest
    that `save_weights` records. Files from elsewhere (a Hugging Face model) have no digest and are
    read as they are.
    """
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            recorded = (handle.metadata() or {}).get(DIGEST_KEY)
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    except SafetensorError as exc:
        raise CorruptCheckpointError(f"{path} is not a valid safetensors file (truncated or damaged: {exc})") from None
    if recorded is not None and tensors_digest(tensors) != recorded:
        raise CorruptCheckpointError(f"{path} is damaged: its tensors do not match the sha256 recorded when it "
                                     "was written (a changed byte of the same size)")
    return tensors


def records_digest(path: Path) -> bool:
    """Whether a safetensors file carries the digest `save_weights` records (files written before
    it was recorded, or by other tools, do not: their tensor bytes cannot be checked)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt", device="cpu") as handle:
        return DIGEST_KEY in (handle.metadata() or {})


def read_torch_file(path: Path) -> Any:
    """A file written by `torch.save`, read with `weights_only=True`: tensors and plain values only.

    A file holding other objects (a pickle that would run code when loaded, or anything this
    trainer never writes) is refused with one line naming it; PyTorch's own message advises
    retrying with `weights_only=False`, which must never be done with such a file, so it is not
    shown. Any other failure to read it (torch raises EOFError, OSError, RuntimeError, IndexError,
    UnpicklingError, ... for truncated or overwritten files) is reported as damage.
    """
    try:
        with warnings.catch_warnings():
            # The weights-only unpickler warns about pickle protocols it does not expect before it
            # refuses such a file; the refusal below is the message that matters.
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(path, map_location="cpu", weights_only=True)
    except (FileNotFoundError, PermissionError, IsADirectoryError):
        raise
    except pickle.UnpicklingError as exc:
        if "weights only" in str(exc).lower():
            raise CorruptCheckpointError(
                f"{path} is not a valid or trusted checkpoint file: it holds Python objects other than tensors "
                "and plain values, so it was not loaded (nothing in it was run)") from None
        raise CorruptCheckpointError(f"{path} is not a valid checkpoint file (truncated or damaged: "
                                     f"{_first_line(exc)})") from None
    except Exception as exc:  # noqa: BLE001 - see the docstring: every parse failure means a damaged file
        raise CorruptCheckpointError(f"{path} is not a valid checkpoint file (truncated or damaged: "
                                     f"{_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    """The exception's first sentence: torch's messages go on with general advice over many lines."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0].split('. ')[0][:160]}" if text else type(exc).__name__


def read_checkpoint_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The model weights of one checkpoint folder (`read_weights` of its model.safetensors)."""
    return read_weights(Path(checkpoint) / MODEL_FILE)


def apply_model_weights(model: torch.nn.Module, tensors: dict[str, torch.Tensor], source: Path) -> None:
    """Copy `tensors` into `model`; UsageError naming `source` unless they are exactly its weights
    (a checkpoint of another model than the run's config.json describes: the user picks the right one)."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    wrong_shapes = [f"{k} {tuple(v.shape)} != {tuple(expected[k].shape)}" for k, v in tensors.items()
                    if k in expected and v.shape != expected[k].shape]
    if missing or unexpected or wrong_shapes:
        raise UsageError(
            f"{source} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}, "
            f"other shapes {wrong_shapes[:5]} (was it trained with a different --config?)"
        )
    model.load_state_dict(tensors)


def load_model_weights(model: torch.nn.Module, path: Path) -> None:
    apply_model_weights(model, read_weights(path), path)


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
    with writing(staging / f"rng-rank{rank:05d}.pt"):
        torch.save(own_state, staging / f"rng-rank{rank:05d}.pt")
    barrier()
    if rank != 0:
        barrier()
        return None
    save_model_weights(model, staging / MODEL_FILE)
    with writing(staging / STATE_FILE):
        torch.save({**training_state, "step": step, "world_size": world_size}, staging / STATE_FILE)
    if final.exists():
        shutil.rmtree(final)
    durable_replace(staging, final)
    if keep_last:
        for _, old in list_checkpoints(run_dir)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    barrier()
    return final


def load_training_state(checkpoint: Path, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """training_state.pt, checked to hold what the loop wrote (and the task's `required` keys)."""
    path = Path(checkpoint) / STATE_FILE
    return _dict_with(read_torch_file(path), STATE_KEYS + tuple(required), path, "training state")


def load_rng_state(checkpoint: Path, rank: int) -> dict[str, Any] | None:
    path = rng_file(checkpoint, rank)
    if not path.is_file():
        return None
    return _dict_with(read_torch_file(path), RNG_KEYS, path, "RNG state")


def _dict_with(value: Any, keys: tuple[str, ...], path: Path, what: str) -> dict[str, Any]:
    if not isinstance(value, dict) or any(key not in value for key in keys):
        present = sorted(value) if isinstance(value, dict) else type(value).__name__
        raise CorruptCheckpointError(f"{path} is not a valid checkpoint file: not a {what} (expected keys "
                                     f"{list(keys)}, found {present})")
    return value


# ----------------------------------------------------------------------------------------------
# Reading a checkpoint back whole, and choosing the newest one that reads


@dataclass
class ResumePoint:
    """Everything a resume takes from one checkpoint, read and checked before anything is restored."""

    path: Path
    state: dict[str, Any]  # training_state.pt
    rng: dict[str, Any] | None  # this rank's RNG states; None when another number of processes wrote them
    weights: dict[str, torch.Tensor] = field(repr=False)
    # Newer checkpoints that were skipped because they do not read back (set by `choose_checkpoint`'s caller).
    skipped: list[Path] = field(default_factory=list)

    @property
    def step(self) -> int:
        return int(self.state["step"])

    def restore_model(self, model: torch.nn.Module) -> None:
        """Copy the weights into `model` (exactly its keys and shapes), then drop this copy of them."""
        apply_model_weights(model, self.weights, self.path / MODEL_FILE)
        self.weights = {}

    def restore_rng(self, rank: int, world_size: int, seed: int) -> dict[str, Any] | None:
        """Restore this rank's RNG streams; returns the rank's saved data state.

        A checkpoint written by another number of processes has no stream for every rank: then the
        streams are re-seeded from the run's `seed`, the step and the rank (the run goes on, no
        longer bit-exact) and a warning says so.
        """
        if self.rng is None:
            logger.warning("checkpoint was written by %s processes, now %d: RNG streams are re-seeded",
                           self.state.get("world_size"), world_size)
            torch.manual_seed(seed + 1_000_003 * self.step + rank)
            return None
        set_rng_state(self.rng)
        return self.rng.get("data")


def read_resume_point(checkpoint: Path, rank: int, world_size: int,
                      required_state: tuple[str, ...] = ()) -> ResumePoint:
    """Read every file of `checkpoint`; CorruptCheckpointError naming the first that does not read.

    Every rank reads the RNG files of ALL the ranks that wrote the checkpoint, not only its own, so
    that every rank judges the checkpoint alike and all of them resume from the same one.
    """
    checkpoint = Path(checkpoint)
    state = load_training_state(checkpoint, required_state)
    saved_world_size = int(state["world_size"])
    own = None
    for saved_rank in range(saved_world_size):
        rng = load_rng_state(checkpoint, saved_rank)
        if rng is None:
            raise CorruptCheckpointError(f"{rng_file(checkpoint, saved_rank)} is missing: the checkpoint was "
                                         f"written by {saved_world_size} processes")
        if saved_rank == rank and saved_world_size == world_size:
            own = rng
    return ResumePoint(checkpoint, state, own, read_weights(checkpoint / MODEL_FILE))


@dataclass
class CheckpointChoice(Generic[Loaded]):
    """The checkpoint a reader uses, what it read from it, and the newer ones it skipped (and why)."""

    path: Path
    step: int
    loaded: Loaded
    skipped: list[tuple[Path, str]]


def choose_checkpoint(run_dir: Path, read: Callable[[Path], Loaded], step: int | None = None, *,
                      announce: bool = True, choose_hint: str = "--step N picks another") -> CheckpointChoice[Loaded]:
    """`read(checkpoint)` of the checkpoint of `step`, or by default of the newest one that reads.

    A checkpoint whose `read` raises CorruptCheckpointError is skipped for the next older one, and
    one warning line (when `announce`) names what was skipped, why, and what is used instead. A
    step asked for explicitly is never replaced by another. CorruptCheckpointError when no
    checkpoint reads, FileNotFoundError when there is none (or none of that step).
    """
    if step is not None:
        path = find_checkpoint(run_dir, step)
        return CheckpointChoice(path, step, read(path), [])
    checkpoints = list_checkpoints(run_dir)
    if not checkpoints:
        raise FileNotFoundError(f"no checkpoint under {Path(run_dir) / 'checkpoints'}")
    skipped: list[tuple[Path, str]] = []
    for found_step, path in reversed(checkpoints):
        try:
            loaded = read(path)
        except CorruptCheckpointError as exc:
            skipped.append((path, str(exc)))
            continue
        if skipped and announce:
            logger.warning("%s; using %s, the newest checkpoint that loads (%s)",
                           "; ".join(f"skipped {p.name}: {why}" for p, why in skipped), path, choose_hint)
        return CheckpointChoice(path, found_step, loaded, skipped)
    raise CorruptCheckpointError(f"no checkpoint of {run_dir} loads: "
                                 + "; ".join(f"{p.name}: {why}" for p, why in skipped))


def set_aside_after(run_dir: Path, step: int, corrupt: list[Path]) -> list[Path]:
    """Rename the checkpoints after `step` out of the run's list (`step-N.corrupt`, else `step-N.superseded`).

    A run resumed from an older checkpoint writes the later steps anew. A later checkpoint left in
    place would be pruned instead of the new ones (`keep_last` counts by step), or be taken by the
    next --resume as the newest: two histories of the run mixed. Renamed, its files stay for
    inspection and no reader lists it. Returns the new names.
    """
    corrupt_names = {Path(p).name for p in corrupt}
    moved = []
    for found_step, path in list_checkpoints(run_dir):
        if found_step <= step:
            continue
        reason = "corrupt" if path.name in corrupt_names else "superseded"
        target = path.with_name(f"{path.name}.{reason}")
        suffix = 2
        while target.exists():
            target = path.with_name(f"{path.name}.{reason}-{suffix}")
            suffix += 1
        os.replace(path, target)
        moved.append(target)
    return moved
