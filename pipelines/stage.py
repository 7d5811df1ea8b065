"""The stage kit: how every Beam stage runs. Its output is locked, refused when it exists without
--overwrite, written by the pipeline (`WriteParquetShards`: the sharded Parquet writer), marked
complete (`_SUCCESS`) last, and its stats must satisfy the accounting identity (`report_identity`).
Its pipeline runs to completion on every runner, or is only built for a `--dry_run`
(`run_to_completion`).
The Beam-free pieces it uses (locks, `_SUCCESS`, stats JSON, atomic Parquet files) are
`pipelines.io`; the counting is `pipelines.accounting`."""
from __future__ import annotations

import math
import sys
import zlib
from typing import Callable, Iterable, Mapping, Sequence

import apache_beam as beam
import pyarrow as pa

from pipelines.accounting import identity_violations
from pipelines.io.atomic import write_bytes_atomic
from pipelines.io.parquet import DEFAULT_ROWS_PER_FILE, write_parquet_atomic
from pipelines.io.completion import read_output_stats
from pipelines.io.overlap import OUTPUT_REFUSED, fresh_output
from pipelines.stage_options import usage_error

MAX_LISTED_ERRORS = 100  # errors a stage's stats list one by one (all are counted)


def report_identity(stage: str, stats: Mapping) -> int:
    """A command's exit status for its finished stats: 0 when every unit balances; else one line
    on stderr naming the units (a counting bug, never the data's fault) and 1."""
    problems = identity_violations(stats)
    if problems:
        print(f"{stage}: accounting identity read = kept + dropped + errored broken (a bug, please report): "
              + "; ".join(problems), file=sys.stderr)
        return 1
    return 0


def run_sharded_stage(stage: str, output: str, *, overwrite: bool, run: Callable[[], bool],
                      inputs: Sequence[str] = ()) -> int:
    """A sharded stage's run, as labse-mine and labse-score make it: `run()` (a Beam pipeline whose
    sinks write Parquet shards and `_stats.json` into `output`; it returns `run_to_completion`'s
    answer) with `output` fresh and locked first, so two runs never mix. The exit status: 2 with
    one line when the output is refused (it exists without --overwrite, another run holds it, or
    it overlaps one of `inputs`); 0 for a dry run (the job was built, not run); else
    `report_identity` of the stats the run wrote, read back from `output` wherever it is (local
    disk or an object store)."""
    try:
        with fresh_output(output, overwrite=overwrite, inputs=inputs):
            ran = run()
    except OUTPUT_REFUSED as error:
        return usage_error(stage, str(error))
    if not ran:
        return 0
    return report_identity(stage, read_output_stats(output))


def run_to_completion(pipeline, stage: str) -> bool:
    """Run a built Beam pipeline and wait until it has finished, on every runner (DirectRunner,
    Dataflow, a portable job service): True when it ran, so its outputs (stats) can be read back.

    False for a dry run (`--dry_run True`, e.g. with `--runner DataflowRunner --no_auth`): the job
    was built (graph translated, `--setup_file` packaged) but nothing ran, so there is nothing to
    read back; one line on stdout says so and what would have been staged. With
    `--dataflow_job_file PATH` the built pipeline (runner API proto, as JSON) is saved there too.
    A job that ends in any state but DONE raises: its outputs are incomplete.
    """
    from apache_beam.options.pipeline_options import TestOptions

    result = pipeline.run()
    if pipeline.options.view_as(TestOptions).dry_run:
        print(describe_built_job(stage, pipeline.options, getattr(result, "job", None)), flush=True)
        return False
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
