"""What every `labse_model` command line shares: the parser (its help formatting, and the options
built from the config dataclasses, come from `pipelines.io.config_options`), the torchrun relaunch,
error exits."""
from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
from typing import Any, Callable, Sequence

from contextlib import nullcontext
from pathlib import Path
from typing import ContextManager

from pipelines.io.console import add_verbose_option, start_logging
from labse_model.checkpoint import find_checkpoint
from labse_model.distributed import (
    DistributedContext,
    init_distributed,
    launched_by_torchrun,
    processes_on_this_host,
    resolve_device,
    shutdown_distributed,
)
from labse_model.stop_signal import StoppedOutsideSteps, stop_at_once
from pipelines.io.storage import unreachable_endpoint
from pipelines.io.write_errors import environment_error_line
from pipelines.io.config_options import HelpFormatter, UsageError
from pipelines.io.locks import OutputLockedError, output_lock

logger = logging.getLogger(__name__)

# Errors a user can fix: one line on stderr and exit status 2, no traceback. UsageError is what the
# code says the user can fix (an option, an input; CorruptCheckpointError and the other input errors
# are UsageErrors); the OS errors name a path. Any other exception is a bug and keeps its traceback.
USER_ERRORS: tuple[type[BaseException], ...] = (UsageError, FileNotFoundError, FileExistsError, PermissionError,
                                                OutputLockedError)


def run_dir_lock(run_dir: Path, ctx: DistributedContext) -> ContextManager:
    """The run directory's exclusive lock (`RUN_DIR.lock`), held by rank 0 for the whole run.

    A second run into the same directory fails at once naming the holder, instead of both
    writing interleaved logs and checkpoints. `output_lock` takes it on the real path (symlinks
    resolved): a run into `ptA` and one into a symlink to it are runs into one directory.
    """
    return output_lock(run_dir) if ctx.is_main else nullcontext()


def run_in_run_dir(args: argparse.Namespace, body: Callable[[argparse.Namespace, DistributedContext], Any]) -> Any:
    """`body(args, ctx)` in this process's distributed context (collective when launched by
    torchrun), with rank 0 holding the lock of the run directory `args.output` throughout; the
    process group is shut down however `body` ends. An `args.output` on object storage is worked
    in through a local mirror (`labse_model.run_store.run_directory`)."""
    from labse_model.run_store import run_directory

    ctx = init_distributed(args.device)
    try:
        with run_directory(args, ctx), run_dir_lock(args.output, ctx):
            return body(args, ctx)
    finally:
        shutdown_distributed()


def check_resumable(run_dir: Path, config_file: str, resume_step: int | None) -> None:
    """--resume: the run directory must hold its config and a checkpoint (`resume_step`'s, or any);
    fails early and clearly when there is none (FileNotFoundError)."""
    if not (run_dir / config_file).is_file():
        raise FileNotFoundError(f"--resume: {run_dir / config_file} not found (nothing to resume)")
    find_checkpoint(run_dir, resume_step)


def new_parser(prog: str, description: str) -> tuple[argparse.ArgumentParser, argparse._ArgumentGroup]:
    """A trainer's parser (HelpFormatter) and its "data and run" group, which the caller fills."""
    parser = argparse.ArgumentParser(prog=prog, description=description, formatter_class=HelpFormatter)
    return add_verbose_option(parser), parser.add_argument_group("data and run")


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"



def relaunch_with_torchrun(module: str, argv: Sequence[str], nproc: int) -> int:
    """Run `python -m module argv` under torchrun with `nproc` processes on this host; its exit code.

    torchrun runs in a session of its own, so a signal sent to this command's process group does
    not reach it twice. SIGTERM sent to this command goes to the training processes themselves
    (`forward_to_workers`): they checkpoint at the next step boundary and exit 0, and torchrun with
    them. (torchrun, when it receives SIGTERM itself, ends its workers with a 30-second grace and
    exits 1 whatever they did.) SIGINT (Ctrl-C) goes to torchrun, which stops its workers.
    """
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        "-m", module, *argv,
    ]
    logger.info("launching %d processes: %s", nproc, " ".join(command))
    launcher = subprocess.Popen(command, start_new_session=True)
    previous = {
        signal.SIGTERM: signal.signal(signal.SIGTERM, lambda *_: forward_to_workers(launcher.pid, signal.SIGTERM)),
        signal.SIGINT: signal.signal(signal.SIGINT, lambda *_: launcher.send_signal(signal.SIGINT)),
    }
    try:
        return launcher.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def forward_to_workers(parent: int, sig: signal.Signals) -> None:
    """Send `sig` to the child processes of `parent` (torchrun's workers); to `parent` itself when
    it has none yet (still starting them) or /proc cannot say."""
    for pid in child_processes(parent) or [parent]:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def child_processes(parent: int) -> list[int]:
    """The pids whose parent is `parent`, from /proc (Linux, where the trainers run)."""
    children = []
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The parent pid is the 2nd field after the parenthesised command name (which may hold spaces).
            if int(entry.read_text().rsplit(")", 1)[1].split()[1]) == parent:
                children.append(int(entry.parent.name))
        except (OSError, IndexError, ValueError):
            continue  # the process ended meanwhile
    return children


def run_distributed_command(module: str, argv: Sequence[str], nproc_per_node: int,
                            run: Callable[[], object]) -> int:
    """Relaunch through torchrun when more than one process is asked for, else `run()` here.

    A user error (bad option, missing file) is logged as one line and gives exit status 2.
    """
    if nproc_per_node > 1 and not launched_by_torchrun():
        return relaunch_with_torchrun(module, argv, nproc_per_node)
    return exit_status(run)


def exit_status(run: Callable[[], object]) -> int:
    """`run()`'s exit status: 0, or 2 after one line for an error the user can fix (USER_ERRORS)
    or that the environment caused (a full disk, a read-only file system: `write_errors`; a storage
    endpoint that cannot be reached: `storage.unreachable_endpoint`, after its bounded tries).
    Any other exception is a bug and keeps its traceback."""
    try:
        run()
    except USER_ERRORS as exc:
        logger.error("%s", exc)
        return 2
    except Exception as exc:  # noqa: BLE001 - only the environment's own faults are answered here
        line = unreachable_endpoint(exc) or (environment_error_line(exc) if isinstance(exc, OSError) else None)
        if line is None:
            raise
        logger.error("%s", line)
        return 2
    return 0


def add_run_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The launch options both trainers take, in the group where their config's logging and
    checkpoint settings (`CliOption.group == "run"`) go too."""
    run = parser.add_argument_group("launch, logging and checkpoints")
    run.add_argument("--nproc-per-node", type=int, default=1,
                     help="processes on this host (GPUs, or CPU processes with gloo); >1 relaunches via torchrun")
    run.add_argument("--stop-after-steps", type=int, default=None,
                     help="stop this invocation after N steps (checkpointing first), e.g. to fit a job time "
                     "limit; continue later with --resume. The schedule still follows --max-steps")
    run.add_argument("--resume-step", type=int, default=None, metavar="N",
                     help="with --resume: continue from the checkpoint of step N, not the newest one that loads; "
                     "the later checkpoints are renamed step-N.superseded and no longer used")
    run.add_argument("--device", default=None,
                     help="cpu, cuda (each process takes cuda:LOCAL_RANK) or cuda:N (one process); "
                     "default: cuda when available")
    return run


def check_run_arguments(args: argparse.Namespace) -> None:
    """The options `add_run_arguments` adds, checked before any work: UsageError naming the option.

    The config's options (--eval-every, --save-every, ...) are checked by the config dataclasses.
    --device is checked against this host's GPUs (`resolve_device`)."""
    if args.nproc_per_node < 1:
        raise UsageError(f"--nproc-per-node must be an integer >= 1, got {args.nproc_per_node}")
    if args.stop_after_steps is not None and args.stop_after_steps < 1:
        raise UsageError(f"--stop-after-steps must be an integer >= 1, got {args.stop_after_steps}")
    if args.resume_step is not None and not args.resume:
        raise UsageError("--resume-step needs --resume")
    if args.resume_step is not None and args.resume_step < 1:
        raise UsageError(f"--resume-step must be an integer >= 1, got {args.resume_step}")
    resolve_device(args.device, *processes_on_this_host(args.nproc_per_node))


class _NotGiven:
    """The value of an option `argv` does not give (see `given_options`)."""


def given_options(parser: argparse.ArgumentParser, argv: Sequence[str]) -> frozenset[str]:
    """The destinations of the options `argv` gives, whatever their values (a default given
    explicitly included): what --resume compares with the run's settings.

    argparse sets an option's default only where the namespace lacks the attribute, so parsing
    into a namespace pre-filled with a marker leaves the marker exactly on the options not given.
    An option whose default is None is given when its value is not None (no marker there: an
    append action, such as --mono, adds to what the namespace holds)."""
    marker = _NotGiven()
    actions = [action for action in parser._actions if action.dest != argparse.SUPPRESS]
    prefilled = {action.dest: marker for action in actions if action.default is not None}
    parsed = parser.parse_args(list(argv), argparse.Namespace(**prefilled))
    return frozenset(action.dest for action in actions
                     if getattr(parsed, action.dest) is not (marker if action.dest in prefilled else None))


def command_main(module: str, parser: argparse.ArgumentParser, argv: list[str] | None,
                 run: Callable[[argparse.Namespace], object],
                 check: Callable[[argparse.Namespace], None] | None = None) -> int:
    """Parse, set up logging, and run `run(args)` here or under torchrun (`--nproc-per-node`).

    `check(args)` (with `check_run_arguments`) runs first, in this process, before anything is read
    or launched: a bad option is one line and exit 2 here, not once per torchrun child.
    """
    argv = start_logging(argv, LOG_FORMAT)
    args = parser.parse_args(argv)
    args.given_options = given_options(parser, argv)
    try:
        with stop_at_once():  # SIGTERM before (or after) the steps: stop now, cleanly (stop_signal)
            try:
                check_run_arguments(args)
                if check is not None:
                    check(args)
            except USER_ERRORS as exc:
                logger.error("%s", exc)
                return 2
            return run_distributed_command(module, argv, args.nproc_per_node, lambda: run(args))
    except StoppedOutsideSteps as stopped:
        logger.warning("%s", stopped.line())
        return stopped.exit_status
