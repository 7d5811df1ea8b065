"""The stage kit: how every Beam stage runs (`run_stage`, the one way; `execute_stage` for library
callers). First the inputs are checked and kept apart from the output, then the pipeline is built
and all its options validated (runner, Dataflow options, staged files) and its transforms wired;
only then is the output locked and refused when it exists without --overwrite (or removed with
it), so a mistake a user can fix never costs the old output. The pipeline runs to completion on
every runner, or is only built for a `--dry_run` (`run_to_completion`); its last step writes the
stats and `_SUCCESS` last; the stats must satisfy the accounting identity (`report_identity`).
Sharded Parquet outputs are written by `WriteParquetShards`.
The Beam-free pieces it uses (locks, `_SUCCESS`, stats JSON, atomic Parquet files) are
`pipelines.io`; the counting is `pipelines.accounting`."""
from __future__ import annotations

import errno
import logging
import math
import os
import sys
import threading
import uuid
import weakref
import zlib
from contextlib import contextmanager
from typing import Callable, Iterable, Mapping, Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa

from pipelines.accounting import identity_violations
from pipelines.io import storage
from pipelines.io.atomic import write_bytes_atomic
from pipelines.io.completion import mark_started
from pipelines.io.parquet import DEFAULT_ROWS_PER_FILE, release_freed_memory, write_parquet_atomic
from pipelines.io.config_options import UsageError
from pipelines.io.locks import output_lock
from pipelines.io.overlap import (OUTPUT_REFUSED, check_output_apart, check_output_place, prepare_output,
                                   prepare_output_files, remove_output)
from pipelines.io.sorted_parquet import RUN_BYTES, merge_sorted_runs, spill_sorted_runs
from pipelines.progress import ProgressBoard, runs_locally
from pipelines.stage_options import usage_error

MAX_LISTED_ERRORS = 100  # errors a stage's stats list one by one (all are counted)
# What `wire` returns when the stage's Beam work is already done (labse-distill's teacher pass,
# complete in its work folder): the output is still locked and prepared, no job is run, `finish` runs.
NOTHING_TO_RUN = object()


def report_identity(stage: str, stats: Mapping, more: Sequence[str] = ()) -> int:
    """A command's exit status for its finished stats: 0 when every unit balances (and `more`, a
    stage's own findings in its books, is empty); else one line on stderr naming the units (a
    counting bug, never the data's fault) and 1."""
    problems = identity_violations(stats) + list(more)
    if problems:
        print(f"{stage}: accounting identity read = kept + dropped + errored broken (a bug, please report): "
              + "; ".join(problems), file=sys.stderr)
        return 1
    return 0


def run_stage(stage: str, output: str, *, overwrite: bool, beam_args: Sequence[str],
              wire: Callable[[beam.Pipeline], object], finish: Callable[[], Mapping],
              inputs: Sequence[str | None] = (), check_inputs: Callable[[], object] | None = None,
              output_files: Sequence[str] = (), summarise: Callable[[Mapping], str] | None = None,
              problems: Callable[[Mapping], list[str]] | None = None, progress_unit: str | None = None) -> int:
    """The one way a Beam stage's command runs: `execute_stage` (its arguments and order), then the
    exit status. 2 with one line on stderr when anything a user can fix is refused (an input, a
    Beam option, the output); 0 for a dry run; else `summarise(stats)` on stdout and
    `report_identity` of the stats (with `problems(stats)`, a stage's own checks of its books).
    On the DirectRunner, `progress_unit` (what the stage reads, e.g. "documents") is shown as it
    goes (`pipelines.progress`)."""
    with BeamErrorsHeldBack() as held:
        try:
            stats = execute_stage(stage, output, overwrite=overwrite, beam_args=beam_args, wire=wire, finish=finish,
                                  inputs=inputs, check_inputs=check_inputs, output_files=output_files,
                                  progress_unit=progress_unit)
        except (UsageError, *OUTPUT_REFUSED) as error:
            held.drop()
            return usage_error(stage, str(error))
        except Exception as error:  # noqa: BLE001 - only the environment's own faults are answered here
            cause = environment_fault(error)
            if cause is None:
                raise
            held.drop()
            print(f"{stage}: error: {cause}", file=sys.stderr)
            return 1
    if stats is None:
        return 0
    if summarise is not None:
        print(summarise(stats), flush=True)
    return report_identity(stage, stats, problems(stats) if problems else ())


class BeamErrorsHeldBack(logging.Filter):
    """While a stage runs, Beam's ERROR records (a worker's exception with its traceback, logged
    before the run fails) and the tracebacks of threads that die (Beam's gRPC readers, when a
    portable run's workers go away) are held back: when the failure is one the kit answers in one
    line (a full disk, an unreachable endpoint, lost workers, a refused input), `drop()` leaves that
    line alone; otherwise they are shown when the block ends (a bug keeps every trace of it).
    With -v (Beam's logger at INFO) nothing is held back."""

    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.handlers: list[logging.Handler] = []
        self.thread_failures: list = []
        self.thread_hook = None

    def filter(self, record: logging.LogRecord) -> bool:
        # Beam's loggers, and the root logger where a portable job's messages are logged from Beam's code
        from_beam = record.name.startswith("apache_beam") or f"{os.sep}apache_beam{os.sep}" in (record.pathname or "")
        if from_beam and record.levelno >= logging.ERROR:
            self.records.append(record)
            return False
        return True

    def hold_thread_failure(self, failure) -> None:
        self.thread_failures.append(failure)

    def drop(self) -> None:
        self.records, self.thread_failures = [], []

    def __enter__(self) -> "BeamErrorsHeldBack":
        if logging.getLogger("apache_beam").getEffectiveLevel() >= logging.WARNING:  # not -v
            self.handlers = list(logging.getLogger().handlers)
            for handler in self.handlers:
                handler.addFilter(self)
            self.thread_hook, threading.excepthook = threading.excepthook, self.hold_thread_failure
        return self

    def __exit__(self, *exc_info) -> None:
        for handler in self.handlers:
            handler.removeFilter(self)
        if self.thread_hook is not None:
            threading.excepthook = self.thread_hook
        for record in self.records:
            logging.getLogger(record.name).handle(record)
        for failure in self.thread_failures:
            threading.excepthook(failure)


def environment_fault(error: BaseException) -> str | None:
    """One line naming the environment's fault behind `error`: an unreachable storage endpoint
    (`storage.unreachable_endpoint`), a portable run's lost workers (`WORKERS_LOST`), or a write
    the machine refused (a full disk or quota, a read-only file system, a file size limit, a
    permission: `pipelines.io.write_errors`); None for anything else, which keeps its traceback. Beam re-raises a worker's exception with the step's
    name, so the cause is looked for along the exception's causes and, failing that, by its text."""
    from pipelines.io.storage import unreachable_endpoint
    from pipelines.io.write_errors import CAUSES, WriteError

    unreachable = unreachable_endpoint(error)
    if unreachable is not None:
        return unreachable
    lost = str(error).partition(f"{WORKERS_LOST}: ")[2]  # failed in the job's thread, sent as text
    if lost:
        return f"{lost.splitlines()[0]}; nothing was completed: restart the worker pool and rerun"
    if "StartWorker" in str(error) and "StatusCode.UNAVAILABLE" in str(error):  # the pool died as it started one
        return (f"{WORKERS_LOST_LINE}: it stopped answering as it started a worker; nothing was completed: restart "
                "the worker pool and rerun")
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in CAUSES and error.errno != errno.EIO:
            return f"{WriteError(error.errno, error.strerror, error.filename or '(a file of the output)')}; nothing was completed"
        for number, cause in CAUSES.items():
            if number != errno.EIO and f"[Errno {number}]" in str(error):
                return f"{cause}: {str(error).strip().splitlines()[0][:300]}; nothing was completed"
        error = error.__cause__ or error.__context__
    return None


def execute_stage(stage: str, output: str, *, overwrite: bool, beam_args: Sequence[str],
                  wire: Callable[[beam.Pipeline], object], finish: Callable[[], Mapping],
                  inputs: Sequence[str | None] = (), check_inputs: Callable[[], object] | None = None,
                  output_files: Sequence[str] = (), progress_unit: str | None = None) -> dict | None:
    """Run a Beam stage into `output`, everything that can be refused checked before anything is
    removed (in the manner of datatrove's `PipelineExecutor._run_for_rank`). In this order:

    1. the output's place (`check_output_place`), the inputs: `check_inputs()` (present, complete: it raises UsageError), and the output
       (or each of `output_files`) apart from every one of `inputs` (`check_output_apart`);
    2. the pipeline and all its options: the Beam options (`beam_pipeline`: the runner's name,
       Beam's own checks such as Dataflow's --project/--region/--temp_location, the files a run
       stages: --setup_file, --requirements_file, --extra_package), then `wire(pipeline)` adds the
       stage's transforms (a setting they refuse raises UsageError here), or returns NOTHING_TO_RUN;
    3. only then `output_lock(output)`, held to the end, and the old output refused, or removed
       with `overwrite` (`prepare_output`; `prepare_output_files` for a stage whose output is
       `output_files` beside each other, as labse-vocab's). A dry run that only builds the job
       (`builds_only`) removes nothing; a run marks the output started (`mark_started`: a run that
       fails leaves `_STARTED` beside what it wrote);
    4. the pipeline run to completion (`run_to_completion`; None for a dry run: the job was built,
       not run). Its last step writes the stats and then `_SUCCESS` (on the workers, so a finished
       Dataflow job is complete even if the launcher is gone);
    5. `finish()`: the stats, read back from the output, or made by work the launcher does after
       the pipeline (labse-vocab learns its vocabulary from the counts and writes its stats last).

    Raises UsageError or one of OUTPUT_REFUSED for what a user can fix (nothing was removed for
    either before step 3 succeeded). A stage whose output is `output_files` has no completion
    marker, so a run that fails in steps 4-5 removes them (a retry would be refused otherwise)."""
    for path in output_files or [output]:
        check_output_place(path)  # a bucket's root or a read-only folder: refused before any input is read
    if check_inputs is not None:
        check_inputs()
    for path in output_files or [output]:
        check_output_apart(path, inputs)
    pipeline = beam_pipeline(beam_args)
    wired = wire(pipeline)
    with output_lock(output):  # before looking at the output: no check-then-act race between runs
        if not (overwrite and builds_only(pipeline)):  # a dry run refuses what a run would, and removes nothing
            if output_files:
                prepare_output_files(output_files, overwrite=overwrite, inputs=inputs)
            else:
                prepare_output(output, overwrite=overwrite, inputs=inputs)
        if not output_files and not builds_only(pipeline):
            mark_started(output, stage=stage)  # a run that fails leaves it: `unfinished_traces`
        try:
            local = progress_unit is not None and runs_locally(pipeline.options) and not is_dry_run(pipeline.options)
            if wired is NOTHING_TO_RUN:
                ran = not builds_only(pipeline)
                if not ran:
                    print(f"{stage}: no job built (--dry_run): its Beam work is done already", flush=True)
            else:
                with ProgressBoard(stage, progress_unit or "records", enabled=local):
                    ran = run_to_completion(pipeline, stage)
            if not ran:
                return None
            return dict(finish())
        except BaseException:
            for path in output_files:  # no marker: what an unfinished run leaves would block the retry
                remove_output(path)
            raise


def beam_pipeline(beam_args: Sequence[str]) -> beam.Pipeline:
    """A Beam pipeline for `beam_args`, every option checked that can be before it runs: the files
    a run stages exist (`check_staged_files`), the runner is one Beam knows and Beam's own
    validators pass (Dataflow: --project, --region, gs:// --temp_location ...); a local run gets
    `local_runner` (no download). Every SDK worker of the run, and this process, bound the memory
    of their outputs to the runner (`pipelines.beam_worker`, a Beam plugin). Raises UsageError, one
    line, naming what is wrong; nothing has been touched."""
    from apache_beam.options.pipeline_options import PipelineOptions, SetupOptions

    from pipelines import beam_worker

    options = PipelineOptions(list(beam_args))
    setup = options.view_as(SetupOptions)
    setup.beam_plugins = [*(setup.beam_plugins or ()), beam_worker.__name__]
    check_staged_files(options)
    if check_worker_pool(options):
        fail_when_workers_are_lost()
    check_dataflow_locations(options)
    try:
        return beam.Pipeline(runner=local_runner(options), options=options)
    except ValueError as error:  # an unknown runner, or "Pipeline has validations errors: \n..."
        reasons = [line.strip() for line in str(error).splitlines() if line.strip()]
        if reasons and reasons[0].startswith("Pipeline has validation"):
            reasons = reasons[1:]
        raise UsageError("Beam options: " + " ".join(r if r.endswith(".") else r + ";" for r in reasons)
                         .rstrip(";")) from error


# `--runner` names of Beam's DirectRunner (none given is the DirectRunner too)
DIRECT_RUNNER_NAMES = ("", "direct", "directrunner", "switchingdirectrunner")


def local_runner(options):
    """The runner of a local run (`options` name no runner, or the DirectRunner): Beam's DirectRunner
    without its first attempt, the PrismRunner, which downloads a binary from GitHub at run time
    (offline it fails and falls back; nothing here downloads while it runs). Beam then runs the
    pipeline in process on its FnApiRunner (`--direct_running_mode`, `--direct_num_workers` as
    always), or on its bundle-based runner where the FnApiRunner lacks a feature. In Beam 2.77
    (pinned) the one switch that skips Prism is `is_interactive()`, which does nothing else
    (apache_beam/runners/direct/direct_runner.py); tests/test_local_runner.py guards it. None for
    any other runner: Beam makes the one the options name."""
    from apache_beam.options.pipeline_options import StandardOptions
    from apache_beam.runners.direct.direct_runner import SwitchingDirectRunner

    name = str(options.view_as(StandardOptions).runner or "").rpartition(".")[2].lower()
    if name not in DIRECT_RUNNER_NAMES:
        return None
    runner = SwitchingDirectRunner()
    runner.is_interactive()
    return runner


def check_dataflow_locations(options) -> None:
    """On Dataflow, a gs:// --temp_location (or --staging_location) must be given: without one Beam
    tries to create a default bucket through the Cloud Storage API, which offline (or without the
    permission) spends about 120 s before an unclear failure. UsageError, one line."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions

    if not runs_on_dataflow(options):
        return  # a misspelt runner is Beam's own one-line refusal
    cloud = options.view_as(GoogleCloudOptions)
    if not any(str(location or "").startswith("gs://") for location in (cloud.temp_location, cloud.staging_location)):
        raise UsageError("Beam options: the DataflowRunner needs --temp_location gs://BUCKET/tmp (a folder its job "
                         f"may write; got {cloud.temp_location or 'none'}): name one rather than let Beam create "
                         "a default bucket over the network")


def runs_on_dataflow(options) -> bool:
    """Whether these pipeline options name Dataflow's runner (its workers see no local path)."""
    from apache_beam.options.pipeline_options import StandardOptions

    runner = options.view_as(StandardOptions).runner
    name = runner if isinstance(runner, str) else type(runner).__name__ if runner else ""
    return name.lower() in ("dataflowrunner", "dataflow", "testdataflowrunner")


def require_remote_on_dataflow(options, option: str, path: str) -> None:
    """UsageError (one line) for a local `path` (given as `option`) that a Dataflow job's workers read:
    they see no local path, and the job would fail only once they start."""
    if runs_on_dataflow(options) and not storage.is_remote(path):
        raise UsageError(f"{option} {path}: Dataflow's workers read it and see no local path: put it on Cloud "
                         "Storage (gs://BUCKET/...) and pass that")


def check_worker_pool(options, timeout: float = 5.0) -> str | None:
    """With `--environment_type EXTERNAL` the work goes to an SDK worker pool already running at
    `--environment_config HOST:PORT` (or `--environment_option external_service_address=...`):
    UsageError, one line, when none is named or nothing answers there. Without this check Beam
    waits on the absent pool, then fails deep in gRPC. The pool's address when the run uses one."""
    address = worker_pool_address(options)
    if address is None:
        return None
    if not pool_answers(address, timeout):
        raise UsageError(f"--environment_config {address}: no SDK worker pool answers there; start one (python -m "
                         f"apache_beam.runners.worker.worker_pool_main --service_port {address.rpartition(':')[2]}) "
                         "or drop --environment_type EXTERNAL")
    return address


def worker_pool_address(options) -> str | None:
    """HOST:PORT of the SDK worker pool of an `--environment_type EXTERNAL` run; None for other runs."""
    from apache_beam.options.pipeline_options import PortableOptions

    portable = options.view_as(PortableOptions)
    if (portable.environment_type or "").upper() != "EXTERNAL":
        return None
    address = portable.environment_config or (portable.lookup_environment_option("external_service_address")
                                              if portable.environment_options else None)
    if not address:
        raise UsageError("--environment_type EXTERNAL needs the worker pool's address: --environment_config HOST:PORT")
    if not str(address).rpartition(":")[2].isdigit():
        raise UsageError(f"--environment_config {address}: expected HOST:PORT of an SDK worker pool")
    return str(address)


def pool_answers(address: str, timeout: float) -> bool:
    import socket

    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "localhost", int(port)), timeout=timeout):
            return True
    except OSError:
        return False


# A portable run whose SDK workers went away: the marker the kit finds in the failed job's text.
WORKERS_LOST = "WorkersLost"
WORKERS_LOST_LINE = "the SDK workers stopped during the run (their worker pool at --environment_config died or was stopped)"

_CONNECTIONS: "weakref.WeakSet" = weakref.WeakSet()  # Beam's control connections to SDK workers, this process


def fail_when_workers_are_lost() -> None:
    """Make a portable run fail when its SDK workers go away. Beam's control connection to a worker
    (`ControlConnection`, in the launcher for `--job_endpoint embed`) ends its reading thread with a
    gRPC error when the worker dies, or never starts it when the worker never connects, and the
    runner then waits forever for the answers it asked for (Beam fails them only for Docker
    workers, by watching the container). Here a broken connection answers its pending requests
    with an error, as a worker reports a failed bundle (so the job fails and the kit says so in one
    line), and every connection is registered for `fail_pending_work` (the pool's watch,
    `watching_worker_pool`)."""
    from apache_beam.runners.portability.fn_api_runner import worker_handlers

    connection = worker_handlers.ControlConnection
    if getattr(connection._read, "fails_when_lost", False):
        return
    read, init = connection._read, connection.__init__

    def read_or_fail(self) -> None:
        try:
            read(self)
        except Exception as error:  # noqa: BLE001 - any broken stream: the worker is gone
            fail_pending_work(self, f"the control connection broke ({type(error).__name__})")

    def init_and_register(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        _CONNECTIONS.add(self)

    read_or_fail.fails_when_lost = True
    connection._read, connection.__init__ = read_or_fail, init_and_register


def fail_pending_work(connection, why: str) -> None:
    """Answer every request `connection` still waits on with an error naming the lost workers."""
    from apache_beam.portability.api import beam_fn_api_pb2

    for instruction_id, future in list(connection._futures_by_id.items()):
        if not future.is_done():
            future.set(beam_fn_api_pb2.InstructionResponse(
                instruction_id=instruction_id, error=f"{WORKERS_LOST}: {WORKERS_LOST_LINE}: {why}"))


@contextmanager
def watching_worker_pool(address: str | None, every: float = 2.0):
    """While the block runs, the pool at `address` is asked every `every` seconds whether it still
    answers; after two silences in a row the run's pending work fails (`fail_pending_work`),
    also when a worker never connected, and again at each later check (work the runner asks for
    after that). Nothing to watch for `address` None."""
    if address is None:
        yield
        return
    done = threading.Event()

    def watch() -> None:
        silences = 0
        while not done.wait(every):
            silences = silences + 1 if silences >= 2 or not pool_answers(address, every) else 0
            if silences >= 2 and not done.is_set():  # a run that has ended is not failed after the fact
                for connection in list(_CONNECTIONS):
                    fail_pending_work(connection, f"{address} stopped answering")

    watcher = threading.Thread(target=watch, name="worker-pool-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()


# The SetupOptions that name local files a run stages for its workers (Beam checks them only when
# the job is submitted, after the output would have been removed).
STAGED_FILE_OPTIONS = (("setup_file", "--setup_file"), ("requirements_file", "--requirements_file"),
                       ("extra_packages", "--extra_package"))


def check_staged_files(options) -> None:
    """Every local file that --setup_file, --requirements_file or --extra_package names exists
    (UsageError naming the option). Object-store and URL paths are left to the stager."""
    from apache_beam.options.pipeline_options import SetupOptions

    setup = options.view_as(SetupOptions)
    for attribute, option in STAGED_FILE_OPTIONS:
        value = getattr(setup, attribute)
        for path in value if isinstance(value, list) else [value] if value else []:
            if "://" not in path and not os.path.isfile(path):
                raise UsageError(f"{option} {path}: no such file (a run stages it for its workers)")


def is_dry_run(options) -> bool:
    from apache_beam.options.pipeline_options import TestOptions

    return bool(options.view_as(TestOptions).dry_run)


def builds_only(pipeline: beam.Pipeline) -> bool:
    """True for a dry run on a runner that honours it (Dataflow builds the job and runs nothing);
    the DirectRunner ignores --dry_run and writes the output like any run."""
    if not is_dry_run(pipeline.options):
        return False
    try:
        from apache_beam.runners.dataflow.dataflow_runner import DataflowRunner
    except ImportError:  # without Beam's GCP extra there is no Dataflow runner
        return False
    return isinstance(pipeline.runner, DataflowRunner)


def run_to_completion(pipeline, stage: str) -> bool:
    """Run a built Beam pipeline and wait until it has finished, on every runner (DirectRunner,
    Dataflow, a portable job service): True when it ran, so its outputs (stats) can be read back.

    False for a dry run (`--dry_run True`, e.g. with `--runner DataflowRunner --no_auth`): the job
    was built (graph translated, `--setup_file` packaged) but nothing ran, so there is nothing to
    read back; one line on stdout says so and what would have been staged. With
    `--dataflow_job_file PATH` the built pipeline (runner API proto, as JSON) is saved there too.
    A job that ends in any state but DONE raises: its outputs are incomplete.
    """
    result = pipeline.run()
    if is_dry_run(pipeline.options):
        print(describe_built_job(stage, pipeline.options, getattr(result, "job", None)), flush=True)
        return False
    with watching_worker_pool(worker_pool_address(pipeline.options)):
        state = result.wait_until_finish()
    if state is not None and str(state).rsplit(".", 1)[-1] != "DONE":
        raise RuntimeError(f"{stage}: the Beam job ended in state {state}, not DONE: its output is incomplete")
    return True


def describe_built_job(stage: str, options, job) -> str:
    """The line a dry run prints: job built, not run; its size; the files a real run stages."""
    from apache_beam.options.pipeline_options import DebugOptions, GoogleCloudOptions

    proto = getattr(job, "proto_pipeline", None)
    if proto is None:  # a runner without a job description (DirectRunner ignores --dry_run)
        return f"{stage}: job built, not run (--dry_run)"
    staged = sorted({name for _path, name in staged_artifacts(proto)})
    cloud = options.view_as(GoogleCloudOptions)
    staging = cloud.staging_location or (f"{cloud.temp_location.rstrip('/')}/staging" if cloud.temp_location else "?")
    job_file = options.view_as(DebugOptions).dataflow_job_file
    if job_file:
        from google.protobuf import json_format

        write_bytes_atomic(job_file, json_format.MessageToJson(proto).encode("utf-8"))
    return (f"{stage}: job built, not run (--dry_run): {len(proto.components.transforms)} transforms, "
            f"pipeline {proto.ByteSize() / 1024:.0f} KB; a real run stages {', '.join(staged) or 'nothing'} "
            f"to {staging}" + (f"; pipeline saved to {job_file}" if job_file else ""))


def staged_artifacts(proto) -> list[tuple[str, str]]:
    """(local file, staged name) of every file the pipeline's environments stage for the workers
    (the package built from --setup_file is `workflow.tar.gz`)."""
    from apache_beam.portability import common_urns
    from apache_beam.portability.api import beam_runner_api_pb2

    found = []
    for environment in proto.components.environments.values():
        for artifact in environment.dependencies:
            if (artifact.type_urn != common_urns.artifact_types.FILE.urn
                    or artifact.role_urn != common_urns.artifact_roles.STAGING_TO.urn):
                continue
            path = beam_runner_api_pb2.ArtifactFilePayload.FromString(artifact.type_payload).path
            name = beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(artifact.role_payload).staged_name
            found.append((path, name))
    return found


def stable_hash(text: str) -> int:
    """crc32 of the text, not Python's hash(): the same in every process and run."""
    return zlib.crc32(text.encode("utf-8"))


def shard_path(output: str, shard: int, num_shards: int) -> str:
    return f"{output}/part-{shard:05d}-of-{num_shards:05d}.parquet"


def write_empty_shard(output: str, schema: pa.Schema) -> None:
    """One empty file, so that readers of an output without rows still see its schema."""
    write_parquet_atomic([], shard_path(output, 0, 1), schema)


class _WriteParquetShard(beam.DoFn):
    def __init__(self, output: str, schema: pa.Schema, sort_key: Callable[[dict], object],
                 tally_of: Callable[[list[dict]], dict]):
        self.output, self.schema, self.sort_key, self.tally_of = output, schema, sort_key, tally_of

    def process(self, keyed: tuple[tuple[int, int], Iterable[dict]]):
        (shard, num_shards), rows = keyed
        rows = sorted(rows, key=self.sort_key)
        write_parquet_atomic(rows, shard_path(self.output, shard, num_shards), self.schema)
        yield self.tally_of(rows)


class WriteParquetShards(beam.PTransform):
    """Rows (dicts of `schema`'s columns) -> `OUTPUT/part-SSSSS-of-NNNNN.parquet`: ceil(n /
    rows_per_file) files, each row's file chosen by `stable_hash(shard_key(row))`, the rows of a file
    sorted by `sort_key`. Outputs one tally per file written, `tally_of(its rows)` (the rows are
    counted where they are written, so the stats and the files agree)."""

    def __init__(self, output: str, schema: pa.Schema, *, shard_key: Callable[[dict], str],
                 sort_key: Callable[[dict], object], tally_of: Callable[[list[dict]], dict],
                 rows_per_file: int = DEFAULT_ROWS_PER_FILE):
        super().__init__()
        self.output, self.schema, self.rows_per_file = output.rstrip("/"), schema, rows_per_file
        self.shard_key, self.sort_key, self.tally_of = shard_key, sort_key, tally_of

    def expand(self, rows):
        per_file, shard_key = self.rows_per_file, self.shard_key
        total = rows | "CountRows" >> beam.combiners.Count.Globally()

        def key_by_shard(row, n):
            num_shards = max(1, math.ceil(n / per_file))
            return (stable_hash(shard_key(row)) % num_shards, num_shards), row

        return (rows
                | "KeyShard" >> beam.Map(key_by_shard, beam.pvalue.AsSingleton(total))
                | "GroupShard" >> beam.GroupByKey()
                | "WriteShard" >> beam.ParDo(_WriteParquetShard(self.output, self.schema, self.sort_key,
                                                                self.tally_of)))


# A file's rows are grouped in parts of about this many rows, each sorted into runs on its own
# worker: a runner may hand a worker a group's values whole (the DirectRunner does; Dataflow pages
# them), so a part, not a file, is what one element holds: a file of 200,000 rows is 10 parts; a
# part of pair rows ~3 MB of Arrow (~160 bytes a row of labse-mine's benchmark pairs).
DEFAULT_ROWS_PER_PART = 20_000
# where a stage's sorted runs wait for their file's merge, inside its (locked) output; removed
# before the stage's last writes
SORT_RUNS_FOLDER = ".sort-runs"


def _part_batches(batch: pa.RecordBatch, n: int, per_file: int, per_part: int, key_columns: Sequence[str]):
    """A record batch -> (((shard, number of shards), part), its rows of that part of that shard) for
    each present. A row's shard is `stable_hash` of its key columns joined by tabs modulo the number
    of shards, as `WriteParquetShards` files it; its part the same hash's quotient modulo the parts
    a file, ceil(rows a file / `per_part`)."""
    num_shards = max(1, math.ceil(n / per_file))
    num_parts = max(1, math.ceil(math.ceil(n / num_shards) / per_part))
    if num_shards == 1 and num_parts == 1 and batch.num_rows:  # every row's file and part: no hashing, no copy
        yield ((0, 1), 0), batch
        return
    keys = zip(*(batch.column(name).to_pylist() for name in key_columns))
    hashes = np.fromiter((stable_hash("\t".join(key)) for key in keys), np.int64, batch.num_rows)
    places = (hashes % num_shards) * num_parts + (hashes // num_shards) % num_parts
    for place in np.unique(places).tolist():
        yield ((place // num_parts, num_shards), place % num_parts), batch.take(pa.array(np.flatnonzero(places == place)))


def sort_runs_folder(output: str, shard: int) -> str:
    return f"{output}/{SORT_RUNS_FOLDER}/part-{shard:05d}"


class _SortPart(beam.DoFn):
    """One part of a file's rows -> the paths of its sorted runs, written beside the output (a unique
    name each attempt: a retried or duplicated bundle never mixes its runs with another's)."""

    def __init__(self, output: str, schema: pa.Schema, sort_columns: Sequence[str], run_bytes: int):
        self.output, self.schema, self.sort_columns, self.run_bytes = output, schema, sort_columns, run_bytes

    def process(self, keyed):
        ((shard, num_shards), part), batches = keyed
        prefix = f"part-{part:05d}-{uuid.uuid4().hex[:12]}"
        paths = spill_sorted_runs(batches, sort_runs_folder(self.output, shard), self.schema, self.sort_columns,
                                  prefix=prefix, run_bytes=self.run_bytes)
        release_freed_memory()
        for path in paths:
            yield (shard, num_shards), path


class _MergeFile(beam.DoFn):
    def __init__(self, output: str, schema: pa.Schema, sort_columns: Sequence[str], tally_of: Callable[[int], dict],
                 run_bytes: int):
        self.output, self.schema, self.sort_columns, self.tally_of = output, schema, sort_columns, tally_of
        self.run_bytes = run_bytes

    def process(self, keyed):
        (shard, num_shards), runs = keyed
        rows = merge_sorted_runs(sorted(runs), shard_path(self.output, shard, num_shards), self.schema,
                                 self.sort_columns, run_bytes=self.run_bytes)
        release_freed_memory()
        yield self.tally_of(rows)


def _without_sort_runs(tallies: list[dict], output: str):
    """Every file is written: the runs go, then the files' tallies pass on to the stage's last writes."""
    storage.remove_tree(f"{output}/{SORT_RUNS_FOLDER}")
    yield from tallies


class WriteParquetBatches(beam.PTransform):
    """`WriteParquetShards` for Arrow record batches of `schema`: the same files (a row's file by the
    tab-joined `key_columns`, the rows of a file sorted by `sort_columns`, ties by the other columns),
    while a file's rows stay columns until they are written (a Python dict a row is ~1 KB; columns
    are their bytes), and no worker holds a whole file's rows however large the file: a file's rows
    are grouped in parts of about `rows_per_part` rows, each part sorted in runs of about `run_bytes`
    written to `OUTPUT/.sort-runs/` (`spill_sorted_runs`), then each file merged from its runs'
    paths (`merge_sorted_runs`), and the runs removed once every file is written. One tally per file
    written, `tally_of(its number of rows)`, output after the runs are removed."""

    def __init__(self, output: str, schema: pa.Schema, *, key_columns: Sequence[str], sort_columns: Sequence[str],
                 tally_of: Callable[[int], dict], rows_per_file: int = DEFAULT_ROWS_PER_FILE,
                 rows_per_part: int = DEFAULT_ROWS_PER_PART, run_bytes: int = RUN_BYTES):
        super().__init__()
        self.output, self.schema, self.rows_per_file = output.rstrip("/"), schema, rows_per_file
        self.key_columns, self.sort_columns, self.tally_of = tuple(key_columns), tuple(sort_columns), tally_of
        self.rows_per_part, self.run_bytes = rows_per_part, run_bytes

    def expand(self, batches):
        """`batches` (record batches), or {"batches": them, "rows": their number of rows, one element
        counted upstream from something smaller}: the files' number comes from it, a side input of
        the keying, so counting the batches themselves makes the runner store them once more first."""
        if isinstance(batches, dict):
            batches, total = batches["batches"], batches["rows"]
        else:
            total = (batches
                     | "BatchRows" >> beam.Map(lambda batch: batch.num_rows)
                     | "CountRows" >> beam.CombineGlobally(sum))
        return (batches
                | "KeyPart" >> beam.FlatMap(_part_batches, beam.pvalue.AsSingleton(total), self.rows_per_file,
                                            self.rows_per_part, self.key_columns)
                | "GroupPart" >> beam.GroupByKey()
                | "SortPart" >> beam.ParDo(_SortPart(self.output, self.schema, self.sort_columns, self.run_bytes))
                | "GroupShard" >> beam.GroupByKey()
                | "WriteShard" >> beam.ParDo(_MergeFile(self.output, self.schema, self.sort_columns,
                                                        self.tally_of, self.run_bytes))
                | "AllFiles" >> beam.combiners.ToList()
                | "RemoveRuns" >> beam.FlatMap(_without_sort_runs, self.output))
