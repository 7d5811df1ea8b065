"""SIGTERM as a request to stop at the next step boundary, agreed by every rank.

Kubernetes, Slurm and preemptible VMs send SIGTERM some seconds before they kill a job. Dying at
once loses every step since the last checkpoint; instead the training loop asks `StopRequest`
after each step whether to stop, checkpoints that step and returns, and the command exits 0.

Under torchrun the signal may reach the ranks at different moments (one during step 7, another
during step 8), so the flag is all-reduced (MAX) after every step: every rank stops after the
same step and the checkpoint is collective. The cost is one one-element all_reduce per step.

Only the process that installed the handler stops gently: a process forked from it (a DataLoader
worker) gets the default action back, so its parent can still end it with SIGTERM.

Outside the steps (start-up: reading the run, the data, a checkpoint; wrap-up after the loop) there
is no step to finish, so `stop_at_once` makes SIGTERM stop the command at once but cleanly: the
exception `StoppedOutsideSteps` unwinds the run (its lock released, staged files removed), the
command says so in one line and exits 128 + the signal's number (143), as a process ended by it.
Nothing trained is lost: no step was in progress, and every finished one was checkpointed by the
loop before it returned.
"""
from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from types import FrameType
from typing import Iterator

import torch
import torch.distributed as dist

from labse_model.distributed import get_world_size


class StopRequest:
    """`with StopRequest(device) as stop: ... if stop.agreed(): checkpoint and return`, after each step."""

    def __init__(self, device: torch.device, signals: tuple[signal.Signals, ...] = (signal.SIGTERM,)):
        self.device = device
        self.signals = signals
        self.received: signal.Signals | None = None
        self._owner = os.getpid()
        self._previous: dict[signal.Signals, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if not _in_owner(self._owner, signum):
            return
        self.received = signal.Signals(signum)

    def __enter__(self) -> "StopRequest":
        self._previous = _install(self.signals, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        _restore(self._previous)
        self._previous = {}

    def agreed(self) -> str | None:
        """The name of the signal any rank received, or None (collective: every rank calls it after
        every step, and all get the same answer)."""
        flag = torch.tensor([0 if self.received is None else int(self.received)], dtype=torch.int32,
                            device=self.device)
        if get_world_size() > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return signal.Signals(int(flag.item())).name if flag.item() else None


class StoppedOutsideSteps(BaseException):
    """A stop signal arrived while no training step was running (see `stop_at_once`). A
    BaseException, as KeyboardInterrupt is, so that no `except Exception` on its way (a checkpoint
    reader that skips a damaged file) takes it for an error and carries on."""

    def __init__(self, received: signal.Signals):
        super().__init__(received.name)
        self.received = received

    @property
    def exit_status(self) -> int:
        return 128 + int(self.received)  # what a shell reports for a process this signal ended

    def line(self) -> str:
        return (f"{self.received.name} outside the training steps (start-up or wrap-up): stopped at once; no step "
                "was in progress and every finished step is checkpointed, so nothing trained is lost; run the "
                "same command again to continue (with --resume once the run has a checkpoint)")


@contextmanager
def stop_at_once(signals: tuple[signal.Signals, ...] = (signal.SIGTERM,)) -> Iterator[None]:
    """Within the block, `signals` raise `StoppedOutsideSteps` in the main thread (the training
    loop's `StopRequest` takes them over while it runs, and gives them back after)."""
    owner = os.getpid()

    def handle(signum: int, frame: FrameType | None) -> None:
        if _in_owner(owner, signum):
            raise StoppedOutsideSteps(signal.Signals(signum))

    previous = _install(signals, handle)
    try:
        yield
    finally:
        _restore(previous)


def _in_owner(owner: int, signum: int) -> bool:
    """False in a process forked from the owner (a DataLoader worker), which then gets the default
    action, as if no handler had been set: its parent can still end it with the signal."""
    if os.getpid() == owner:
        return True
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    return False


def _install(signals: tuple[signal.Signals, ...], handler) -> dict[signal.Signals, object]:
    """Set `handler` for `signals`; the handlers it replaced. signal.signal works only in the main
    thread; elsewhere (a test calling the loop from a thread) the default action stays."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, handler) for sig in signals}


def _restore(previous: dict[signal.Signals, object]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)  # type: ignore[arg-type]
