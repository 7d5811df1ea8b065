"""Process-group setup from torchrun's environment, and an all-gather that carries gradients.

Nothing here keeps state of its own: rank and world size always come from `torch.distributed`
(or, before it is initialised, from torchrun's environment variables).
"""
from __future__ import annotations

import datetime
import gc
import os
import re
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
from pipelines.io.config_options import UsageError


@dataclass(frozen=True)
class DistributedContext:
    """Where this process sits: its rank among `world_size`, and the device it computes on."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    """True when torchrun (or any launcher setting the same variables) started this process."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


DEVICE_NAME = re.compile(r"^(cpu|cuda)(?::(\d+))?$")


def resolve_device(requested: str | None, local_rank: int, processes_on_host: int) -> torch.device:
    """The device a process computes on, or ValueError (one line) when this host cannot give it.

    None: cuda:LOCAL_RANK when CUDA is available, else the CPU. "cuda": cuda:LOCAL_RANK, one GPU
    per process on the host. "cuda:N": GPU N, for a single process only (several processes would
    share it). "cpu". Checked before any work starts, so a missing GPU is one line, not a
    traceback from deep inside torch once data has been read.
    """
    match = DEVICE_NAME.match(requested or "")
    if requested is not None and match is None:
        raise UsageError(f"--device {requested}: the trainers run on cpu, cuda (one GPU per process) or cuda:N")
    if (match is not None and match.group(1) == "cpu") or (requested is None and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise UsageError(f"--device {requested}: no CUDA GPU is available on this host (torch {torch.__version__}, "
                         f"{build}); use --device cpu")
    count = torch.cuda.device_count()
    index = match.group(2) if match is not None else None
    if index is not None:
        if processes_on_host > 1:
            raise UsageError(f"--device {requested} names one GPU for {processes_on_host} processes on this host: "
                             "pass --device cuda (each process takes cuda:LOCAL_RANK)")
        if int(index) >= count:
            raise UsageError(f"--device {requested}: this host has {count} GPU{'s' if count != 1 else ''} "
                             f"(cuda:0 to cuda:{count - 1})")
        return torch.device("cuda", int(index))
    if max(processes_on_host, local_rank + 1) > count:
        how = "--device cuda" if requested else "the default device, cuda (CUDA is available)"
        raise UsageError(f"{processes_on_host} processes on this host need one GPU each with {how}, and it has "
                         f"{count}: lower --nproc-per-node, or pass --device cpu")
    return torch.device("cuda", local_rank)


def processes_on_this_host(nproc_per_node: int) -> tuple[int, int]:
    """(local rank, processes on this host): torchrun's variables in a process it started, else
    what `--nproc-per-node` will start."""
    if launched_by_torchrun():
        return int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return 0, nproc_per_node


def init_distributed(device: str | None = None, timeout_s: float = 1800.0) -> DistributedContext:
    """Join the process group described by torchrun's environment (or run alone without one).

    NCCL on CUDA, gloo on CPU. A single process (no torchrun variables) gets world size 1 and no
    process group, so the same training code runs with or without torchrun.
    """
    local_rank, processes = processes_on_this_host(1)
    target = resolve_device(device, local_rank, processes)
    use_cuda = target.type == "cuda"
    if use_cuda:
        torch.cuda.set_device(target)
    if not launched_by_torchrun() or int(os.environ["WORLD_SIZE"]) == 1:
        return DistributedContext(rank=0, world_size=1, local_rank=0, device=target)
    if not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if use_cuda else "gloo",
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=target if use_cuda else None,
        )
    return DistributedContext(
        rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local_rank, device=target
    )


def shutdown_distributed() -> None:
    """Destroy the process group while the interpreter is whole.

    Objects that hold the group's work (DistributedDataParallel's reducer and its comm-hook
    futures, whose Python callbacks run on gloo's threads) often sit in reference cycles, which
    only the garbage collector frees: left to interpreter shutdown, a gloo thread destroying one
    needs the GIL of a finalizing interpreter, which ends the thread inside a noexcept destructor
    ("terminate called without an active exception", SIGABRT). Collecting first frees them now."""
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


def get_world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so wall-clock timings measure the work and not its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def get_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def barrier() -> None:
    if get_world_size() > 1:
        dist.barrier()


def all_gather_with_grad(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate `tensor` from every rank along dim 0, keeping gradients to every rank's input.

    In backward each rank receives the SUM over ranks of the gradients flowing into its own slice
    (reduce-scatter on NCCL, all-to-all + sum on gloo), which is what makes gathered negatives give
    the single-big-batch gradient once DDP averages (see `labse_model.loss`).

    `torch.distributed.nn.functional.all_gather` emits a FutureWarning pointing at
    `torch.distributed._functional_collectives`, a private module whose autograd support differs
    between backends and versions. The public function still works exactly on gloo and NCCL (the
    equivalence test in tests/test_distributed.py checks the gradients), so we keep it and silence
    only that one warning, here, rather than globally.
    """
    if get_world_size() == 1:
        return tensor
    from torch.distributed.nn.functional import all_gather

    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore",
            message=r"torch\.distributed\.nn\.functional\.all_gather is deprecated",
            category=FutureWarning,
        )
        parts = all_gather(tensor)
    return torch.cat(parts, dim=0)


def all_reduce_mean(value: torch.Tensor) -> torch.Tensor:
    """Mean of a (detached) tensor over ranks, for logging."""
    if get_world_size() == 1:
        return value
    value = value.detach().clone()
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value / get_world_size()
