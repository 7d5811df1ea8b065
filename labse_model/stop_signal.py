"""SIGTERM as a request to stop at the next step boundary, agreed by every rank.

Kubernetes, Slurm and preemptible VMs send SIGTERM some seconds before they kill a job. Dying at
once loses every step since the last checkpoint; instead the training loop asks `StopRequest`
after each step whether to stop, checkpoints that step and returns, and the command exits 0.

Under torchrun the signal may reach the ranks at different moments (one during step 7, another
during step 8), so the flag is all-reduced (MAX) after every step: every rank stops after the
same step and the checkpoint is collective. The cost is one one-element all_reduce per step.

Only the process that installed the handler stops gently: a process forked from it (a DataLoader
worker) gets the default action back, so its parent can still end it with SIGTERM.
"""
from __future__ import annotations

import os
import signal
import threading
from types import FrameType

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
        if os.getpid() != self._owner:  # a forked child: behave as if no handler had been set
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.received = signal.Signals(signum)

    def __enter__(self) -> "StopRequest":
        # signal.signal works only in the main thread; elsewhere (a test calling the loop from a
        # thread) the run simply keeps the default action.
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)  # type: ignore[arg-type]
        self._previous.clear()

    def agreed(self) -> str | None:
        """The name of the signal any rank received, or None (collective: every rank calls it after
        every step, and all get the same answer)."""
        flag = torch.tensor([0 if self.received is None else int(self.received)], dtype=torch.int32,
                            device=self.device)
        if get_world_size() > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return signal.Signals(int(flag.item())).name if flag.item() else None
