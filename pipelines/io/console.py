"""What every command prints while it works: its own INFO lines, quiet libraries, `-v` for the rest.

`start_logging(argv, format)` is the first call of every console entry point (`labse-*`), before
TensorFlow, Beam's workers or FAISS are loaded, so a command run by hand is as quiet as one run by
the Makefile. Without `-v`/`--verbose`: TensorFlow's C++ log lines are off (`TF_CPP_MIN_LOG_LEVEL=3`
unless the environment sets it; its few lines from before it reads that, after "All log messages
before absl::InitializeLog()", cannot be turned off from outside), the INFO chatter of Beam (its
job service and SDK workers), FAISS (which instruction set it loaded, and the `ModuleNotFoundError`
of those it tried first), absl and TensorFlow's Python side is held back to warnings, and a few
known lines with nothing to act on (KNOWN_NOISE) are dropped. With `-v` all of it shows. Log
records are written through tqdm, so they never break a progress bar's line.
"""
from __future__ import annotations

import logging
import os
import sys
from typing import Sequence

VERBOSE_FLAGS = ("-v", "--verbose")
CHATTY_LIBRARIES = ("apache_beam", "faiss", "absl", "tensorflow", "h5py", "urllib3", "fsspec", "filelock")


# Lines that say nothing a user can act on, from libraries whose other lines of the same level matter
# (a worker's forwarded warnings include the stages' own): held back by message, unless -v.
KNOWN_NOISE = ("No semi_persistent_directory found", "Missing pipeline option (runner)", "Discarding unparseable args")


class _WithoutKnownNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(noise in message for noise in KNOWN_NOISE)


class _ThroughTqdm(logging.StreamHandler):
    """A stderr handler that prints above any live tqdm bar (tqdm.write) instead of through it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)


VERBOSE_HELP = "also show the libraries' log lines held back by default (Beam workers, TensorFlow, FAISS)"


def add_verbose_option(parser):
    """`-v`/`--verbose` in a command's --help (start_logging reads and removes it before parsing)."""
    parser.add_argument(*VERBOSE_FLAGS, action="store_true", help=VERBOSE_HELP)
    return parser


def start_logging(argv: Sequence[str] | None, format: str) -> list[str]:
    """Set up logging for a command; returns its arguments without -v/--verbose (argv None: sys.argv[1:])."""
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = any(arg in VERBOSE_FLAGS for arg in argv)
    if not verbose:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # 3: also the cuInit error line on a CPU host
    if not logging.getLogger().handlers:
        handler = _ThroughTqdm(sys.stderr)
        handler.setFormatter(logging.Formatter(format))
        if not verbose:
            handler.addFilter(_WithoutKnownNoise())
        logging.basicConfig(level=logging.INFO, handlers=[handler])
    for name in CHATTY_LIBRARIES:
        logging.getLogger(name).setLevel(logging.INFO if verbose else logging.WARNING)
    return [arg for arg in argv if arg not in VERBOSE_FLAGS]
