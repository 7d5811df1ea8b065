"""What every `labse_model` command line shares: help formatting, the torchrun relaunch, error exits."""
from __future__ import annotations

import argparse
import logging
import subprocess
import sys
from typing import Callable, Sequence

from contextlib import nullcontext
from pathlib import Path
from typing import ContextManager

from labse_model.distributed import DistributedContext, launched_by_torchrun
from pipelines.io.stage_output import OutputLockedError, output_lock

logger = logging.getLogger("labse_model.cli")

# Errors a user can fix from the command line: one line on stderr and exit status 2, no traceback.
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError, FileExistsError, OutputLockedError)


def run_dir_lock(run_dir: Path, ctx: DistributedContext) -> ContextManager:
    """The run directory's exclusive lock (`RUN_DIR.lock`), held by rank 0 for the whole run.

    A second run into the same directory fails at once naming the holder, instead of both
    writing interleaved logs and checkpoints.
    """
    return output_lock(run_dir) if ctx.is_main else nullcontext()


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except the empty ones (None, False) that say nothing."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def relaunch_with_torchrun(module: str, argv: Sequence[str], nproc: int) -> int:
    """Run `python -m module argv` under torchrun with `nproc` processes on this host; its exit code."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        "-m", module, *argv,
    ]
    logger.info("launching %d processes: %s", nproc, " ".join(command))
    return subprocess.call(command)


def run_distributed_command(module: str, argv: Sequence[str], nproc_per_node: int,
                            run: Callable[[], object]) -> int:
    """Relaunch through torchrun when more than one process is asked for, else `run()` here.

    A user error (bad option, missing file) is logged as one line and gives exit status 2.
    """
    if nproc_per_node > 1 and not launched_by_torchrun():
        return relaunch_with_torchrun(module, argv, nproc_per_node)
    try:
        run()
    except USER_ERRORS as exc:
        logger.error("%s", exc)
        return 2
    return 0
