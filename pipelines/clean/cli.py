"""labse-clean: CommonCrawl WARC/WET and Wikipedia dumps to per-language sentence shards.

    labse-clean --input 'PATTERN' [--input 'PATTERN' ...] --format warc|wet|wikipedia|auto \\
        --output DIR [--main-content-model PATH] [options] [Beam options]

Per document: HTML to lines (resiliparse), main-content score per line (a fastText model or
heuristic rules), language per line (lid.176), sentences per line (sentencex), quality filters per
sentence; then exact deduplication of normalised sentences per language across the whole run,
keeping the first source (smallest file, offset, doc_id, position). Writes
`DIR/sentences/lang=XX/*.parquet`, `DIR/errors/*.jsonl` and `DIR/stats.json`.

This module is the CLI only: it parses options and wires `ReadAll | CleanCorpus`
(`pipelines.clean.transforms`); the per-document logic is `pipelines.clean.document.clean_document`.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import asdict

from pipelines.accounting import summary_text
from pipelines.io.console import start_logging
from pipelines.clean.transforms import (
    DEFAULT_PER_FILE_LIMIT,
    CleanCorpus,
    ReadAll,
    load_main_content_model,
    per_file_violations,
)
from pipelines.io.config_options import UsageError, add_config_options, config_from_args
from pipelines.read.readers import FORMATS
from pipelines.io.completion import read_stats_json
from pipelines.stage_options import stage_parser, usage_error
from pipelines.stage import execute_stage, run_stage
from pipelines.clean.config import CleanConfig

__all__ = ["build_parser", "infer_format", "main", "run"]

logger = logging.getLogger(__name__)



def infer_format(pattern: str) -> str:
    name = pattern.lower()
    if name.endswith((".xml", ".xml.bz2", ".xml.gz")):
        return "wikipedia"
    if ".wet" in name:
        return "wet"
    if name.endswith((".warc", ".warc.gz", ".arc.gz")) or ".warc" in name:
        return "warc"
    raise UsageError(f"cannot tell the format of {pattern!r} from its name; pass --format warc|wet|wikipedia")


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser(
        "labse-clean",
        "Clean CommonCrawl WARC/WET and Wikipedia pages-articles dumps into per-language sentence Parquet "
        "shards (Apache Beam).",
        output="output directory (local or gs://)", output_metavar="DIR",
        overwrite="replace sentences/, errors/ and stats.json of an earlier run in DIR")
    parser.add_argument("--input", action="append", required=True, metavar="PATTERN",
                        help="Beam file pattern (local or gs://); repeat for several inputs")
    parser.add_argument("--format", default="auto", choices=FORMATS + ("auto",),
                        help="input format for every --input; 'auto' (default) infers it per pattern from "
                             "the file name (.warc[.gz] -> warc, .wet -> wet, .xml[.bz2] -> wikipedia)")
    add_config_options(parser, CleanConfig)  # one option per CleanConfig field
    parser.add_argument("--per-file-limit", type=int, default=DEFAULT_PER_FILE_LIMIT, metavar="N",
                        help="stats.json lists the N input files with the most errored documents one by one "
                             "(`per_file`; its totals cover every file) (default %(default)s)")
    return parser


def stage_plan(inputs: list[tuple[str, str]], output: str, config: CleanConfig, beam_args: list[str] | None = None,
               overwrite: bool = False, per_file_limit: int = DEFAULT_PER_FILE_LIMIT) -> dict:
    """labse-clean's arguments to the stage kit (`pipelines.stage.run_stage`): `ReadAll | CleanCorpus`
    into `output`, whose stats are `output/stats.json`."""
    output = output.rstrip("/")
    run_config = {"inputs": [{"pattern": p, "format": f} for p, f in inputs], "output": output, **asdict(config),
                  "beam_args": list(beam_args or [])}
    started = time.perf_counter()

    def wire(pipeline) -> None:
        _ = (pipeline
             | "ReadInputs" >> ReadAll(inputs)
             | "CleanCorpus" >> CleanCorpus(output, config, run_config, per_file_limit=per_file_limit))

    def finish() -> dict:
        logger.info("pipeline finished in %.1f s", time.perf_counter() - started)
        return read_stats_json(f"{output}/stats.json")

    return dict(output=output, overwrite=overwrite, beam_args=list(beam_args or []), wire=wire, finish=finish,
                inputs=[pattern for pattern, _ in inputs], check_inputs=lambda: check_inputs(inputs, config))


def check_inputs(inputs: list[tuple[str, str]], config: CleanConfig) -> None:
    """Every --input pattern matches a file and the main-content model loads: UsageError, before any work."""
    from pipelines.read.readers import check_pattern_matches

    for pattern, _fmt in inputs:
        try:
            check_pattern_matches(pattern)
        except FileNotFoundError as exc:
            raise UsageError(str(exc)) from exc
    if config.main_content_model:
        from pipelines.main_content.model import MainContentModelError

        try:  # fail before the pipeline starts, not in every worker
            load_main_content_model(config.main_content_model)
        except MainContentModelError as exc:
            raise UsageError(f"--main-content-model: {exc}") from exc


def run(inputs: list[tuple[str, str]], output: str, config: CleanConfig, beam_args: list[str] | None = None,
        overwrite: bool = False, per_file_limit: int = DEFAULT_PER_FILE_LIMIT) -> dict | None:
    """Build and run the pipeline through the stage kit (`execute_stage`); returns the stats written
    to `output/stats.json` (None for a dry run: the job was built, not run)."""
    return execute_stage("labse-clean", **stage_plan(inputs, output, config, beam_args, overwrite, per_file_limit))


def main(argv: list[str] | None = None) -> int:
    argv = start_logging(argv, "%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args, beam_args = parser.parse_known_args(argv)
    try:
        inputs = [(pattern, infer_format(pattern) if args.format == "auto" else args.format) for pattern in args.input]
    except UsageError as exc:
        parser.error(str(exc))
    try:
        config = config_from_args(CleanConfig, args)
    except UsageError as exc:
        return usage_error("labse-clean", str(exc))
    if args.per_file_limit < 0:
        parser.error("--per-file-limit must be >= 0")
    return run_stage("labse-clean", progress_unit="documents", **stage_plan(inputs, args.output, config, beam_args, args.overwrite,
                                                 args.per_file_limit),
                     summarise=summarise, problems=per_file_violations)


def summarise(stats: dict) -> str:
    """The closing lines (accounting.summary_text): documents, then sentences read, kept, dropped (top
    reasons) and errored; the sentences kept per language, which decider took the pages' main
    content, and the input files with the most errored documents."""
    languages = sorted(stats["per_language"].items(), key=lambda item: -item[1])
    decisions = ["kept per language: " + (", ".join(f"{lang} {n:,}" for lang, n in languages[:8])
                                          + (f", ... ({len(languages)} languages)" if len(languages) > 8 else "")
                                          if languages else "none")]
    main_content = stats.get("main_content") or {}
    if main_content.get("pages"):
        decisions.append("main content decided by: " + ", ".join(
            f"{decider} {n:,} pages" for decider, n in main_content["pages"].items())
            + f" (fallback share {main_content.get('fallback_share', 0):.1%})")
    per_file = stats.get("per_file")
    if per_file:
        worst = [f"{entry['file']} ({entry['documents_errored']})" for entry in per_file["top_files"][:3]
                 if entry["documents_errored"]]
        decisions.append(f"input files: {per_file['files']}, {per_file['files_with_errors']} with errored documents"
                         + (f"; most: {', '.join(worst)}" if worst else "") + " (stats.json per_file)")
    warnings = [] if languages else ["no sentence kept in any language"]
    return "\n".join([summary_text("labse-clean", stats, "documents"),
                      summary_text("labse-clean", stats, "sentences", decisions, warnings)])


if __name__ == "__main__":
    sys.exit(main())
