"""The stage kit: how every Beam stage runs. Its output is locked, refused when it exists without
--overwrite, written by the pipeline, marked complete (`_SUCCESS`) last, and its stats must satisfy
the accounting identity (`report_identity`). The Beam-free pieces it uses (locks, `_SUCCESS`,
stats JSON) are `pipelines.io.stage_output`; the counting is `pipelines.accounting`."""
from __future__ import annotations

import sys
from typing import Callable, Mapping

from pipelines.accounting import identity_violations
from pipelines.io.stage_output import OUTPUT_REFUSED, fresh_output, read_shard_stats, usage_error


def report_identity(stage: str, stats: Mapping) -> int:
    """A command's exit status for its finished stats: 0 when every unit balances; else one line
    on stderr naming the units (a counting bug, never the data's fault) and 1."""
    problems = identity_violations(stats)
    if problems:
        print(f"{stage}: accounting identity read = kept + dropped + errored broken (a bug, please report): "
              + "; ".join(problems), file=sys.stderr)
        return 1
    return 0


def run_sharded_stage(stage: str, output: str, *, overwrite: bool, run: Callable[[], object]) -> int:
    """A sharded stage's run, as labse-mine and labse-score make it: `run()` (a Beam pipeline whose
    sinks write Parquet shards and `_stats.json` into `output`) with `output` fresh and locked
    first, so two runs never mix. The exit status: 2 with one line when the output is refused
    (it exists without --overwrite, or another run holds it); else `report_identity` of the stats
    the run wrote (0 for an object-store output, whose stats Beam wrote and only Beam checks)."""
    try:
        with fresh_output(output, overwrite=overwrite):
            run()
    except OUTPUT_REFUSED as error:
        return usage_error(stage, str(error))
    if "://" in output:
        return 0
    return report_identity(stage, read_shard_stats(output))
