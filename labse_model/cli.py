"""What every `labse_model` command line shares: options built from the config dataclasses, help
formatting, the torchrun relaunch, error exits."""
from __future__ import annotations

import argparse
import dataclasses
import logging
import subprocess
import sys
import typing
from typing import Any, Callable, Mapping, Sequence

from contextlib import nullcontext
from pathlib import Path
from typing import ContextManager

from labse_model.checkpoint import CorruptCheckpointError, find_checkpoint
from labse_model.config import CLI, CliOption
from labse_model.distributed import (
    DistributedContext,
    init_distributed,
    launched_by_torchrun,
    processes_on_this_host,
    resolve_device,
    shutdown_distributed,
)
from pipelines.io.stage_output import OutputLockedError, output_lock

logger = logging.getLogger("labse_model.cli")

# Errors a user can fix from the command line: one line on stderr and exit status 2, no traceback.
# CorruptCheckpointError is a ValueError too; it is named for the reader: a damaged checkpoint or
# weights file is reported as one line naming the file (labse_model.checkpoint).
USER_ERRORS: tuple[type[BaseException], ...] = (CorruptCheckpointError, ValueError, FileNotFoundError,
                                                FileExistsError, PermissionError, OutputLockedError)


def run_dir_lock(run_dir: Path, ctx: DistributedContext) -> ContextManager:
    """The run directory's exclusive lock (`RUN_DIR.lock`), held by rank 0 for the whole run.

    A second run into the same directory fails at once naming the holder, instead of both
    writing interleaved logs and checkpoints.
    """
    return output_lock(run_dir) if ctx.is_main else nullcontext()


def run_in_run_dir(args: argparse.Namespace, body: Callable[[argparse.Namespace, DistributedContext], Any]) -> Any:
    """`body(args, ctx)` in this process's distributed context (collective when launched by
    torchrun), with rank 0 holding the lock of the run directory `args.output` throughout; the
    process group is shut down however `body` ends."""
    ctx = init_distributed(args.device)
    try:
        with run_dir_lock(args.output, ctx):
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
    return parser, parser.add_argument_group("data and run")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except the empty ones (None, False) that say nothing; a tuple as the option
    takes it (`2,4,9`)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        if isinstance(action.default, tuple) and action.help and "%(default)" not in action.help:
            return f"{action.help} (default: {_comma_joined(action.default)})"
        return super()._get_help_string(action)


# ----------------------------------------------------------------------------------------------
# Options built from a config dataclass. Each field carries its `CliOption` (labse_model.config.option)
# or is marked `not_an_option`; the option's dest is the field's name.


def config_options(cls: type) -> list[tuple[dataclasses.Field, CliOption | None]]:
    """Every field of the dataclass `cls` with its `CliOption`, None where it is marked not an option.

    TypeError for a field that says neither: every setting is an option or deliberately not one."""
    found = []
    for f in dataclasses.fields(cls):
        if CLI not in f.metadata:
            raise TypeError(f"{cls.__name__}.{f.name} has no command-line metadata: declare it with "
                            "labse_model.config.option(...) or not_an_option(...)")
        found.append((f, f.metadata[CLI]))
    return found


def option_flag(f: dataclasses.Field, spec: CliOption) -> str:
    return spec.flag or "--" + f.name.replace("_", "-")


def resumable_fields(cls: type) -> tuple[str, ...]:
    """The fields of `cls` whose options are marked resumable (they may change on --resume)."""
    return tuple(f.name for f, spec in config_options(cls) if spec is not None and spec.resumable)


def _comma_joined(values: tuple) -> str:
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def _comma_separated(element: type) -> Callable[[str], tuple]:
    kind = "integers" if element is int else "numbers"

    def parse(text: str) -> tuple:
        try:
            return tuple(element(part) for part in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind}, got {text!r}") from None

    parse.__name__ = f"comma-separated {kind}"
    return parse


def _argparse_settings(cls: type, f: dataclasses.Field, annotation: Any, spec: CliOption) -> dict[str, Any]:
    """add_argument's keywords for one field: its action or type, default, help and metavar."""
    flag = option_flag(f, spec)
    settings: dict[str, Any] = {"dest": f.name, "help": spec.help}
    if spec.choices is not None:
        settings["choices"] = spec.choices
    if annotation is bool:
        # --flag / --no-flag, e.g. --gather-negatives / --no-gather-negatives, --bf16 / --no-bf16.
        return {**settings, "action": argparse.BooleanOptionalAction, "default": f.default}
    if typing.get_origin(annotation) is tuple:
        settings["type"] = _comma_separated(typing.get_args(annotation)[0])
    elif annotation in (int, float, str):
        settings["type"] = annotation
    else:
        raise TypeError(f"{cls.__name__}.{f.name}: no command-line form for a {annotation!r} field")
    settings["metavar"] = spec.metavar or flag.lstrip("-").replace("-", "_").upper()
    if spec.derived is not None:
        # None = not given: the command derives the value (`config_from_args(..., derived=)`).
        settings["default"] = None
        settings["help"] = f"{spec.help} (default {spec.derived.format(default=f.default)})"
    elif spec.resumable:
        # None = not given: a new run takes the field's default, a resumed run keeps the run's value.
        settings["default"] = None
        settings["help"] = f"{spec.help} (default {f.default})"
    else:
        settings["default"] = f.default
    return settings


def add_config_options(group: argparse._ActionsContainer, cls: type,
                       groups: Mapping[str, argparse._ActionsContainer] | None = None) -> None:
    """Add an option for every field of the dataclass `cls` that has one, to `group`, or to
    `groups[name]` for a field whose `CliOption.group` is `name`."""
    annotations = typing.get_type_hints(cls)
    for f, spec in config_options(cls):
        if spec is None:
            continue
        target = group if spec.group is None else (groups or {})[spec.group]
        target.add_argument(option_flag(f, spec), **_argparse_settings(cls, f, annotations[f.name], spec))


def config_from_args(cls: type, args: argparse.Namespace,
                     derived: Mapping[str, Callable[[], Any]] | None = None) -> Any:
    """The dataclass `cls` from the options `add_config_options` added (its `__post_init__` checks
    every value: ValueError naming the setting). An option not given (None) takes the field's
    default, or for a `derived` field `derived[name]()` (called only then: deriving a default may
    itself fail, e.g. a depth without L/4 stages); a field that is not an option keeps its default."""
    values = {}
    for f, spec in config_options(cls):
        if spec is None:
            continue
        value = getattr(args, f.name)
        if value is None and spec.derived is not None:
            if derived is None or f.name not in derived:
                raise TypeError(f"{cls.__name__}.{f.name} is derived by the command: pass it in derived=")
            value = derived[f.name]()
        elif value is None and spec.resumable:
            value = f.default
        values[f.name] = value
    return cls(**values)


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
    """The options `add_run_arguments` adds, checked before any work: ValueError naming the option.

    The config's options (--eval-every, --save-every, ...) are checked by the config dataclasses.
    --device is checked against this host's GPUs (`resolve_device`)."""
    if args.nproc_per_node < 1:
        raise ValueError(f"--nproc-per-node must be an integer >= 1, got {args.nproc_per_node}")
    if args.stop_after_steps is not None and args.stop_after_steps < 1:
        raise ValueError(f"--stop-after-steps must be an integer >= 1, got {args.stop_after_steps}")
    if args.resume_step is not None and not args.resume:
        raise ValueError("--resume-step needs --resume")
    if args.resume_step is not None and args.resume_step < 1:
        raise ValueError(f"--resume-step must be an integer >= 1, got {args.resume_step}")
    resolve_device(args.device, *processes_on_this_host(args.nproc_per_node))


def command_main(module: str, parser: argparse.ArgumentParser, argv: list[str] | None,
                 run: Callable[[argparse.Namespace], object],
                 check: Callable[[argparse.Namespace], None] | None = None) -> int:
    """Parse, set up logging, and run `run(args)` here or under torchrun (`--nproc-per-node`).

    `check(args)` (with `check_run_arguments`) runs first, in this process, before anything is read
    or launched: a bad option is one line and exit 2 here, not once per torchrun child.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    configure_logging()
    try:
        check_run_arguments(args)
        if check is not None:
            check(args)
    except USER_ERRORS as exc:
        logger.error("%s", exc)
        return 2
    return run_distributed_command(module, argv, args.nproc_per_node, lambda: run(args))
