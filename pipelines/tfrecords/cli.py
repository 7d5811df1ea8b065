"""`labse-tfrecords`: options and input checks, then the Beam pipeline through the stage kit.

    labse-tfrecords --pairs SCORED_DIR --vocab vocab.txt --output SHARDS_DIR \\
        [--parallel-text de:train.de.gz,en:train.en.gz ...] [--max-seq-length 64] [--num-shards 16] \\
        [--min-score S] [--include-text] [--seed 0] [--overwrite] [Beam options]

Everything about the inputs is checked before any work (one line, exit 2): options, the Parquet
files `--pairs` finds and that each lies in a complete stage output (`_SUCCESS`), the vocabulary.
The stage kit (`pipelines.stage.run_stage`) checks the Beam options, locks the output while the
stage runs and refuses it if it holds anything, unless `--overwrite`. The stage itself is `pipelines.tfrecords.transforms.BuildTFRecords`.
"""
from __future__ import annotations

import argparse
import glob
import logging
import os
import sys
from typing import Sequence

from apache_beam.io.filesystems import FileSystems

from pipelines.io.console import start_logging
from pipelines.io.config_options import UsageError, add_config_options, config_from_args
from pipelines.accounting import summary_text
from pipelines.stage import run_stage
from pipelines.io.completion import read_stats_json, require_stage_output
from pipelines.stage_options import stage_parser, usage_error
from pipelines.io.parallel_text import parse_parallel_text
from pipelines.text.wordpiece import VocabError
from pipelines.tfrecords.config import TFRecordsConfig
from pipelines.tfrecords.transforms import READ_BY_INPUT, BuildTFRecords

logger = logging.getLogger(__name__)


def find_parquet_files(location: str) -> list[str]:
    """Parquet files under a directory (recursively: flat or hive-partitioned) or matching a glob."""
    if "://" not in location and os.path.isdir(location):
        found = glob.glob(os.path.join(location, "**", "*.parquet"), recursive=True)
    else:
        if "://" in location and not any(ch in location for ch in "*?[") and not location.endswith(".parquet"):
            location = location.rstrip("/") + "/**.parquet"  # an object-store folder: every shard below it
        found = [m.path for r in FileSystems.match([location]) for m in r.metadata_list]
    return sorted(p for p in found if not os.path.basename(p).startswith((".", "_")))


def check_pairs_complete(location: str, files: Sequence[str]) -> None:
    """Every Parquet file read from `location` must lie in a complete stage output (the kit's
    `require_stage_output` on each folder: its root holds `_SUCCESS`; labse-score writes one, so
    does Spark, and `touch DIR/_SUCCESS` marks hand-made Parquet). Raises IncompleteOutputError."""
    for folder in sorted({f.rsplit("/", 1)[0] for f in files}):
        require_stage_output(folder, f"--pairs {location}")


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser(
        "labse-tfrecords",
        "Tokenise translation pairs and write globally shuffled tf.train.Example shards "
        "(src_ids, tgt_ids, src_lang, tgt_lang, score) with schema.json and stats.json.",
        output="directory for the shards, schema.json and stats.json")
    parser.add_argument("--pairs", action="append", default=[],
                        help="scored pairs: a directory of Parquet files (searched recursively) or a glob; repeatable")
    parser.add_argument("--parallel-text", action="append", default=[], metavar="SRC_LANG:PATH,TGT_LANG:PATH",
                        help="line-aligned text files (gzip ok), e.g. de:train.de.gz,en:train.en.gz; score 1.0; repeatable")
    parser.add_argument("--vocab", required=True, help="vocab.txt from labse-vocab")
    add_config_options(parser, TFRecordsConfig)
    return parser


def tfrecords_summary(stats: dict, num_shards: int, output: str) -> str:
    """The accounting line, the records and shards written, and what share of the pairs read came from
    each kind of input (--pairs, --parallel-text), with a WARNING when one gives nearly all of them."""
    decisions = [f"{stats['written_pairs']:,} records in {num_shards - stats['empty_shards']} shards "
                 f"under {output}"]
    by_input = stats.get(READ_BY_INPUT, {})
    total = sum(by_input.values())
    if total:
        decisions.append("pairs read by input: " + ", ".join(
            f"{name} {n:,} ({n / total:.1%})" for name, n in by_input.items()))
    warnings = [f"{name} gave {n / total:.1%} of the pairs read: the records are nearly all one input"
                for name, n in by_input.items() if len(by_input) > 1 and n > 0.95 * total]
    return summary_text("labse-tfrecords", stats, "pairs", decisions, warnings)


def main(argv: list[str] | None = None) -> int:
    argv = start_logging(argv, "%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args, beam_args = parser.parse_known_args(argv)
    try:  # everything about the inputs is checked here, before any work: one line, exit 2
        config = config_from_args(TFRecordsConfig, args)
        specs = [parse_parallel_text(s, "--parallel-text") for s in args.parallel_text]
        parquet_files: list[str] = []
        for location in args.pairs:
            found = find_parquet_files(location)
            if not found:
                raise UsageError(f"--pairs {location}: no Parquet files found")
            check_pairs_complete(location, found)
            parquet_files.extend(found)
        if not parquet_files and not specs:
            raise UsageError("give --pairs and/or --parallel-text")
        try:  # builds the tokenizer: the vocabulary is read here
            build = BuildTFRecords(args.vocab, args.output, config, parquet_files=parquet_files, parallel_text=specs)
        except (VocabError, OSError) as exc:
            raise UsageError(f"--vocab: {exc}") from exc
    except (UsageError, OSError) as exc:
        return usage_error("labse-tfrecords", str(exc))

    logger.info("writing TFRecords from %d Parquet files and %d parallel text pairs of files to %s",
                len(parquet_files), len(specs), args.output)


    return run_stage("labse-tfrecords", args.output, progress_unit="pairs", overwrite=args.overwrite, beam_args=beam_args,
                     inputs=[*args.pairs, args.vocab, *(path for spec in specs for path in (spec.src_path, spec.tgt_path))],
                     wire=lambda pipeline: pipeline | "BuildTFRecords" >> build,
                     summarise=lambda stats: tfrecords_summary(stats, build.config.num_shards, args.output),
                     finish=lambda: read_stats_json(FileSystems.join(args.output, "stats.json")))


if __name__ == "__main__":
    sys.exit(main())
