"""A Beam stage's progress on this machine: records per second and an estimate while it runs.

Beam's counters (`pipelines.accounting.ReasonCounters`) are the live view on Dataflow, in its UI;
the DirectRunner shows nothing until the job ends. Its workers, in process or the
`multi_processing` subprocesses, run on the launcher's machine and inherit its environment, so
the stage kit (`pipelines.stage.run_stage`) opens a `ProgressBoard` whose folder it names in
`LABSE_PROGRESS_DIR` for the run; every `<unit>.read` counted through `ReasonCounters` (and a
stage's own `worker_tracker(unit).advance(n)`) writes the worker's running count per unit into one
small file there, and the board reads them once a second: a tqdm bar on a terminal, a plain line
every `LOG_EVERY_SECONDS` elsewhere. Without the variable (a remote runner, a library call) the
trackers do nothing.

Counts are for the eye: a retried bundle counts twice, and the stage's books (stats.json) stay the
one exact account.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from typing import TextIO

import apache_beam as beam
from apache_beam.options.pipeline_options import StandardOptions

WRITE_EVERY_SECONDS = 0.5  # a worker rewrites its count at most this often
REFRESH_SECONDS = 1.0  # the launcher reads the counts this often
LOG_EVERY_SECONDS = 30.0  # without a terminal: one line this often
PROGRESS_ENV = "LABSE_PROGRESS_DIR"
LOCAL_RUNNERS = ("", "direct", "directrunner", "switchingdirectrunner", "bundlebaseddirectrunner")


def runs_locally(pipeline_options) -> bool:
    """Whether the workers of a pipeline with these options run on this machine (DirectRunner)."""
    runner = pipeline_options.view_as(StandardOptions).runner
    name = (runner if isinstance(runner, str) else type(runner).__name__ if runner else "").lower()
    return name in LOCAL_RUNNERS


class ProgressTracker:
    """The worker's side: `advance(n)` after each piece of work. Picklable; one file per copy."""

    def __init__(self, folder: str | None, unit: str = "records"):
        self.folder, self.unit = folder, unit
        self._count = 0
        self._written_at = 0.0
        self._path: str | None = None

    def __getstate__(self):
        return {"folder": self.folder, "unit": self.unit}

    def __setstate__(self, state):
        self.__init__(state["folder"], state["unit"])

    def advance(self, n: int = 1) -> None:
        if self.folder is None:
            return
        self._count += n
        now = time.monotonic()
        if now - self._written_at >= WRITE_EVERY_SECONDS:
            self.flush(now)

    def flush(self, now: float | None = None) -> None:
        if self.folder is None or not os.path.isdir(self.folder):
            return  # the board has closed: the run is over, nobody reads any more
        if self._path is None:
            self._path = os.path.join(self.folder, f"{self.unit}.{os.getpid()}-{uuid.uuid4().hex}")
        temporary = f"{self._path}.tmp"
        try:
            with open(temporary, "w", encoding="ascii") as handle:
                handle.write(str(self._count))
            os.replace(temporary, self._path)
        except OSError:
            return  # progress is for the eye; it never fails a run
        self._written_at = time.monotonic() if now is None else now


class CountInto(beam.DoFn):
    """A pass-through step that advances its tracker once per element, for a stage whose own DoFns
    are not the place to count: `records | "Progress" >> beam.ParDo(CountInto(tracker))`."""

    def __init__(self, tracker: ProgressTracker):
        self.tracker = tracker

    def process(self, element):
        self.tracker.advance()
        yield element

    def finish_bundle(self):
        self.tracker.flush()


_WORKER_TRACKERS: dict[tuple[str, str], ProgressTracker] = {}  # per process, like Beam's counter cells


def worker_tracker(unit: str) -> ProgressTracker:
    """This process's tracker of `unit` for the run the launcher announced in LABSE_PROGRESS_DIR
    (one that does nothing when it announced none)."""
    folder = os.environ.get(PROGRESS_ENV) or None
    key = (folder or "", unit)
    tracker = _WORKER_TRACKERS.get(key)
    if tracker is None:
        tracker = _WORKER_TRACKERS[key] = ProgressTracker(folder, unit)
    return tracker


def read_totals(folder: str) -> dict[str, int]:
    """{unit: the sum of every tracker's last written count} in `folder`."""
    totals: dict[str, int] = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return totals
    for name in names:
        if name.endswith(".tmp"):
            continue
        try:
            with open(os.path.join(folder, name), encoding="ascii") as handle:
                count = int(handle.read().strip() or 0)
        except (OSError, ValueError):
            continue  # replaced while read: the next refresh sees it
        unit = name.split(".", 1)[0]
        totals[unit] = totals.get(unit, 0) + count
    return totals


def read_total(folder: str, unit: str = "records") -> int:
    return read_totals(folder).get(unit, 0)


def describe(stage: str, unit: str, done: int, total: int | None, seconds: float) -> str:
    """'labse-clean: 1,234 / 5,000 documents (25%), 41/s, ~93 s left' (no total: no share, no estimate)."""
    rate = done / seconds if seconds > 0 else 0.0
    line = f"{stage}: {done:,}"
    if total:
        line += f" / {total:,} {unit} ({min(done / total, 1.0):.0%})"
    else:
        line += f" {unit}"
    line += f", {rate:,.0f}/s"
    if total and rate > 0 and done < total:
        line += f", ~{(total - done) / rate:,.0f} s left"
    return line


class ProgressBoard:
    """The launcher's side, a context manager around the run: hands out trackers, shows the sum.

    enabled=False (a remote runner): `tracker()` gives trackers that do nothing and nothing is shown.
    """

    def __init__(self, stage: str, unit: str, *, total: int | None = None, enabled: bool = True,
                 stream: TextIO | None = None):
        self.stage, self.unit, self.total = stage, unit, total
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.folder: str | None = tempfile.mkdtemp(prefix="labse-progress-") if enabled else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._saved_env: str | None = None
        self._started = time.monotonic()

    def tracker(self) -> ProgressTracker:
        return ProgressTracker(self.folder, self.unit)

    def __enter__(self) -> "ProgressBoard":
        if self.enabled:
            self._saved_env = os.environ.get(PROGRESS_ENV)
            os.environ[PROGRESS_ENV] = self.folder  # the workers (in process or children) inherit it
            self._started = time.monotonic()
            self._thread = threading.Thread(target=self._show, name=f"{self.stage}-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            if self._saved_env is None:
                os.environ.pop(PROGRESS_ENV, None)
            else:
                os.environ[PROGRESS_ENV] = self._saved_env
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def _show(self) -> None:
        terminal = hasattr(self.stream, "isatty") and self.stream.isatty()
        bar = None
        if terminal:
            from tqdm.auto import tqdm

            bar = tqdm(total=self.total, unit=f" {self.unit}", desc=self.stage, file=self.stream, leave=False)
        logged_at = time.monotonic()
        while not self._stop.wait(REFRESH_SECONDS):
            done = read_total(self.folder, self.unit)
            if bar is not None:
                bar.n = done
                bar.refresh()
            elif time.monotonic() - logged_at >= LOG_EVERY_SECONDS:
                logged_at = time.monotonic()
                print(describe(self.stage, self.unit, done, self.total, logged_at - self._started),
                      file=self.stream, flush=True)
        if bar is not None:
            bar.close()
