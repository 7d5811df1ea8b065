"""The optimisation loop shared by `labse-train` (dual encoder) and `labse-pretrain` (MLM + TLM).

A task hands the loop its model, optimizer, schedule, batches and a `compute_loss(batch)`; the loop
owns what every run does the same way: bf16 autocast on CUDA, backward, clipping, the optimizer and
schedule steps, logging (all-reduced loss, learning rate, gradient norm, the task's own scalars),
the progress bar, periodic evaluation and atomic checkpoints, and the exact resume from one.

    result = run_loop(LoopParts(...), batches, compute_loss, start_step=s, stop_at=e, ...)

A task whose step must run its own backward passes (gradient caching re-encodes the batch in
chunks, labse_model.grad_cache) wraps it as `BackpropagatedStep(step)`: the loop then neither
autocasts nor back-propagates, and clips, steps and logs as for a plain loss.
"""
from __future__ import annotations

import inspect
import logging
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator

import torch

from labse_model import checkpoint as ckpt
from labse_model.config import TrainerSettings
from labse_model.distributed import DistributedContext, all_reduce_mean, barrier, synchronize
from labse_model.run_log import RunLog
from labse_model.stop_signal import StopRequest

logger = logging.getLogger(__name__)

Batch = dict[str, torch.Tensor]
# The loss to back-propagate and detached scalars to log beside it (averaged over ranks).
LossFn = Callable[[Batch], tuple[torch.Tensor, dict[str, torch.Tensor]]]


@dataclass(frozen=True)
class BackpropagatedStep:
    """A step that has already back-propagated its loss into the parameters' `.grad` when it returns
    `(detached loss, scalars)`; it applies autocast itself, where it wants it."""

    run: LossFn


def forward_backward(compute_loss: LossFn | BackpropagatedStep, batch: Batch,
                     autocast: Callable[[], ContextManager]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Fill the parameters' `.grad` for `batch`; returns the loss and the scalars to log."""
    if isinstance(compute_loss, BackpropagatedStep):
        return compute_loss.run(batch)
    with autocast():
        loss, scalars = compute_loss(batch)
    loss.backward()
    return loss, scalars


@dataclass
class LoopParts:
    """What the loop steps: `model` is what checkpoints hold, `trained` what is called. `trained` is
    given as the plain module and wrapped in DistributedDataParallel here when the run has several
    processes (`wrap_ddp`)."""

    ctx: DistributedContext
    run_dir: Path
    model: torch.nn.Module
    trained: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    settings: TrainerSettings  # the trainer's config: clipping, bf16, log/eval/save cadence
    log: RunLog
    # Called with the step after each checkpoint is written (e.g. its upload: labse_model.run_store).
    after_checkpoint: Callable[[int], None] | None = None

    def __post_init__(self) -> None:
        self.trained = wrap_ddp(self.trained, self.ctx)
        if self.settings.compile:
            # After DDP, as PyTorch recommends: DDP's bucketing then splits the compiled graph at its hooks.
            self.trained = torch.compile(self.trained)


@dataclass
class LoopResult:
    step: int
    last_loss: float = float("nan")
    seconds: float = 0.0
    steps_timed: int = 0
    last_eval: dict[str, float] | None = None
    last_eval_step: int | None = None
    extra: dict[str, float] = field(default_factory=dict)
    stopped_by: str | None = None  # the signal that ended this invocation early (labse_model.stop_signal)

    @property
    def steps_per_second(self) -> float:
        return self.steps_timed / max(self.seconds, 1e-9)


def autocast_context(device: torch.device, bf16: bool) -> Callable[[], ContextManager]:
    """bf16 autocast on CUDA when asked; a no-op elsewhere (CPU runs stay in float32)."""
    if device.type == "cuda" and bf16:
        return lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext


def move_batch(batch: Batch, device: torch.device) -> Batch:
    return {name: tensor.to(device, non_blocking=True) for name, tensor in batch.items()}


def wrap_ddp(model: torch.nn.Module, ctx: DistributedContext) -> torch.nn.Module:
    """DistributedDataParallel over `model` when there are several processes, else `model`."""
    if ctx.world_size == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel

    # BERT's buffers (position ids) are constants: no need to sync them on every forward. The
    # option was renamed in torch 2.13 (older torch on GPU hosts only knows broadcast_buffers).
    no_buffer_sync = ({"forward_sync_buffers": False}
                      if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
                      else {"broadcast_buffers": False})
    return DistributedDataParallel(
        model, device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None, **no_buffer_sync
    )


def save_checkpoint(parts: LoopParts, step: int, extra_state: dict[str, Any] | None = None,
                    rank_state: dict[str, Any] | None = None) -> None:
    """Checkpoint `parts.model` with the optimizer and schedule (collective: every rank calls it)."""
    ckpt.save_checkpoint(
        parts.run_dir, step, model=parts.model,
        training_state={"optimizer": parts.optimizer.state_dict(), "scheduler": parts.scheduler.state_dict(),
                        "data_position": step, **(extra_state or {})},
        rank=parts.ctx.rank, world_size=parts.ctx.world_size, barrier=barrier,
        keep_last=parts.settings.keep_checkpoints or None, rank_state=rank_state,
    )
    if parts.after_checkpoint is not None:
        parts.after_checkpoint(step)


def resume_point(run_dir: Path, ctx: DistributedContext, step: int | None,
                 required_state: tuple[str, ...] = ()) -> ckpt.ResumePoint:
    """The checkpoint a --resume continues from, read whole by every rank before anything is restored.

    `step` None takes the newest checkpoint that reads back (one warning line names any corrupt
    newer one); a step given with --resume-step is that one or an error. Every rank reads the same
    files and so makes the same choice. Nothing is written: see `set_aside_later_checkpoints`.
    """
    def read(path: Path) -> ckpt.ResumePoint:
        return ckpt.read_resume_point(path, ctx.rank, ctx.world_size, required_state)

    choice = ckpt.choose_checkpoint(run_dir, read, step, announce=ctx.is_main,
                                    choose_hint="--resume-step N picks another")
    choice.loaded.skipped = [path for path, _ in choice.skipped]
    return choice.loaded


def set_aside_later_checkpoints(run_dir: Path, ctx: DistributedContext, resumed: ckpt.ResumePoint) -> None:
    """Rank 0 renames the checkpoints after the resumed step (`step-N.corrupt` / `step-N.superseded`,
    `checkpoint.set_aside_after`): this run writes those steps anew, and must neither prune its new
    checkpoints in their favour nor resume from them later. Collective; call it once the run's
    inputs are checked, just before training, so a run refused for bad input renames nothing."""
    barrier()  # every rank has read its checkpoint before rank 0 renames any
    if ctx.is_main:
        moved = ckpt.set_aside_after(run_dir, resumed.step, resumed.skipped)
        if moved:
            logger.warning("resuming from step %d: set aside the later checkpoints %s (kept, no longer used)",
                           resumed.step, ", ".join(path.name for path in moved))
    barrier()


def run_loop(
    parts: LoopParts,
    batches: Iterator[Batch],
    compute_loss: LossFn | BackpropagatedStep,
    *,
    start_step: int,
    stop_at: int,
    total_steps: int,
    evaluate: Callable[[int], dict[str, float] | None] | None = None,
    checkpoint_state: Callable[[int], dict[str, Any]] | None = None,
    rank_state: Callable[[], dict[str, Any]] | None = None,
    log_values: Callable[[int], dict[str, float]] | None = None,
    description: str = "train",
) -> LoopResult:
    """Optimise from `start_step` up to `stop_at` (exclusive of later steps); checkpoint at `stop_at`.

    `evaluate(step)` runs on the main process every `eval_every` steps; `checkpoint_state(step)` and
    `rank_state()` add the task's shared and per-rank state to each checkpoint (a data position, a
    stage); `log_values(step)` adds constant scalars (such as the stage) to every logged line.

    SIGTERM ends the run early, gently: the step in progress finishes, every rank agrees to stop
    after it, it is checkpointed, and the result says `stopped_by` (labse_model.stop_signal).
    """
    from tqdm.auto import tqdm

    ctx = parts.ctx
    progress = tqdm(total=total_steps, initial=start_step, disable=not ctx.is_main, desc=description,
                    unit="step", dynamic_ncols=True)
    result = LoopResult(step=start_step)
    parts.model.train()
    with StopRequest(ctx.device) as stop:
        _steps(parts, batches, compute_loss, stop, result, progress, stop_at=stop_at, evaluate=evaluate,
               checkpoint_state=checkpoint_state, rank_state=rank_state, log_values=log_values)
    progress.close()
    if result.stopped_by is not None and ctx.is_main:
        logger.warning("%s: stopped after step %d and checkpointed it in %s; to continue, run the same "
                       "command again with --resume", result.stopped_by, result.step,
                       ckpt.checkpoint_dir(parts.run_dir, result.step))
    return result


def _steps(parts: LoopParts, batches: Iterator[Batch], compute_loss: LossFn | BackpropagatedStep,
           stop: StopRequest, result: LoopResult, progress: Any, *, stop_at: int,
           evaluate: Callable[[int], dict[str, float] | None] | None,
           checkpoint_state: Callable[[int], dict[str, Any]] | None,
           rank_state: Callable[[], dict[str, Any]] | None,
           log_values: Callable[[int], dict[str, float]] | None) -> None:
    """`run_loop`'s steps, ending at `stop_at` or after the step at which the ranks agree to stop."""
    ctx, settings = parts.ctx, parts.settings
    autocast = autocast_context(ctx.device, settings.bf16)
    step = result.step
    while step < stop_at:
        batch = move_batch(next(batches), ctx.device)
        synchronize(ctx.device)
        started = time.perf_counter()
        loss, scalars = forward_backward(compute_loss, batch, autocast)
        grad_norm = (
            torch.nn.utils.clip_grad_norm_(parts.model.parameters(), settings.max_grad_norm)
            if settings.max_grad_norm > 0 else torch.tensor(float("nan"))
        )
        lr = parts.scheduler.get_last_lr()[0]  # the rate this step used
        parts.optimizer.step()
        parts.scheduler.step()
        parts.optimizer.zero_grad(set_to_none=True)
        synchronize(ctx.device)
        result.seconds += time.perf_counter() - started
        result.steps_timed += 1
        step += 1
        result.step = step
        stopping = stop.agreed()  # the signal's name, the same on every rank

        if step % settings.log_every == 0 or step == stop_at or stopping:
            # The mean of the ranks' losses is the global-batch loss (each is a mean over its rows).
            result.last_loss = all_reduce_mean(loss.detach().float()).item()
            logged = {name: all_reduce_mean(value.detach().float()).item() for name, value in scalars.items()}
            values = {"loss": result.last_loss, "lr": lr, "grad_norm": float(grad_norm), **logged,
                      **(log_values(step) if log_values else {})}
            parts.log.record(step, values, "train")
            if ctx.is_main:
                progress.set_postfix(loss=f"{result.last_loss:.4f}", lr=f"{lr:.2e}")
        progress.update(1)
        if evaluate is not None and ctx.is_main and settings.eval_every and step % settings.eval_every == 0:
            result.last_eval, result.last_eval_step = evaluate(step), step
            if result.last_eval:
                progress.write(f"step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in result.last_eval.items()))
        if (settings.save_every and step % settings.save_every == 0) or step == stop_at or stopping:
            save_checkpoint(parts, step, checkpoint_state(step) if checkpoint_state else None,
                            rank_state() if rank_state else None)
        if stopping:
            result.stopped_by = stopping
            return
