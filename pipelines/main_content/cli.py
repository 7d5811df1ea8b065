"""`labse-main-content`: build teacher-labelled data, train the fastText classifier, evaluate it.

    labse-main-content build-data --input 'PATTERN.warc.gz' --output DIR [Beam options]
    labse-main-content train --data DIR --output model.bin [--quantize]
    labse-main-content evaluate --model model.bin --input 'PATTERN.warc.gz'
    labse-main-content learning-curve --input 'PATTERN.warc.gz' [--truth-input A.warc.gz --truth A.json]

Then ``labse-clean ... --main-content-model model.bin`` filters lines with it.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections import Counter

from pipelines.accounting import summary_text
from pipelines.io.console import VERBOSE_HELP, add_verbose_option, start_logging
from pipelines.io.config_options import UsageError, add_config_options, config_from_args
from pipelines.stage_options import usage_error
from pipelines.main_content.config import BuildConfig, MainContentEvaluateConfig, MainContentTrainConfig, TeacherConfig

logger = logging.getLogger(__name__)



def _usage() -> str:
    lines = [__doc__.strip(), "", "commands:"]
    lines += [f"  {name:<15} {help_}" for name, (_command, help_) in COMMANDS.items()]
    lines.append(f"\noptions of every command:\n  -v, --verbose   {VERBOSE_HELP}")
    lines.append("\n`labse-main-content COMMAND --help` for a command's options.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = start_logging(argv, "%(levelname)s %(message)s")
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"error: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    return COMMANDS[command][0](rest)


def build_data_parser() -> argparse.ArgumentParser:
    from pipelines.stage_options import stage_parser

    parser = stage_parser(
        "labse-main-content build-data",
        "Label every line of every HTML page in WARC files with the teacher (trafilatura) and write "
        "page-disjoint train/dev/test files in fastText format plus stats.json.",
        output="output directory (local or gs://)")
    parser.add_argument("--input", required=True, help="WARC file pattern (local or gs://), e.g. 'crawl/*.warc.gz'")
    add_config_options(parser, BuildConfig)
    parser.add_argument("--teacher-balanced", action="store_true",
                        help="run trafilatura in its balanced mode instead of favor_precision")
    return parser


def build_data_plan(input_pattern: str, output: str, config: BuildConfig = BuildConfig(),
                    beam_args: list[str] | None = None, overwrite: bool = False) -> dict:
    """build-data's arguments to the stage kit (`pipelines.stage.run_stage`): `ReadDocuments |
    BuildTrainingData` into `output`, whose stats are `output/stats.json`."""
    from pipelines.io.completion import read_stats_json
    from pipelines.main_content.transforms import COUNTER_NAMESPACE, BuildTrainingData
    from pipelines.read.readers import ReadDocuments, check_pattern_matches

    def check_inputs() -> None:
        try:
            files = check_pattern_matches(input_pattern)
        except FileNotFoundError as exc:
            raise UsageError(str(exc)) from exc
        logger.info("labelling %d file(s) matching %s into %s", len(files), input_pattern, output)

    def wire(pipeline) -> None:
        _ = (pipeline | "Read" >> ReadDocuments(input_pattern, "warc", namespace=COUNTER_NAMESPACE)
             | "Build" >> BuildTrainingData(output, config))

    return dict(output=output, overwrite=overwrite, beam_args=list(beam_args or []), inputs=[input_pattern],
                check_inputs=check_inputs, wire=wire, finish=lambda: read_stats_json(f"{output.rstrip('/')}/stats.json"))


def build_data(input_pattern: str, output: str, config: BuildConfig = BuildConfig(),
               beam_args: list[str] | None = None, overwrite: bool = False) -> dict | None:
    """Build and run the pipeline through the stage kit (`execute_stage`: an existing output is
    refused with OutputExistsError unless `overwrite`); returns the stats written to
    ``output/stats.json``, or None for a dry run (the job was built, not run)."""
    from pipelines.stage import execute_stage

    return execute_stage(BUILD_DATA, **build_data_plan(input_pattern, output, config, beam_args, overwrite))


def build_data_main(argv: list[str] | None = None) -> int:
    from pipelines.stage import run_stage

    parser = build_data_parser()
    args, beam_args = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        config = config_from_args(BuildConfig, args)
    except UsageError as exc:
        return usage_error(BUILD_DATA, str(exc))
    if args.teacher_balanced:
        config = dataclasses.replace(config, teacher=TeacherConfig(favor_precision=False))
    return run_stage(BUILD_DATA, progress_unit="documents",
                     **build_data_plan(args.input, args.output, config, beam_args, args.overwrite),
                     summarise=build_data_summary)


BUILD_DATA = "labse-main-content build-data"


def build_data_summary(stats: dict) -> str:
    """The closing lines (accounting.summary_text): documents and lines read, kept, dropped and
    errored; the pages of each split and the training examples per language; a WARNING for a dev
    or test split too small for its scores to mean anything."""
    from pipelines.main_content.evaluate import MIN_PAGES_TO_SCORE

    pages = stats.get("pages", {})
    per_language = sorted(stats.get("train_examples_per_language", {}).items(), key=lambda item: -item[1])
    decisions = ["pages per split (disjoint, by URL hash): " + ", ".join(f"{split} {n:,}" for split, n in pages.items()),
                 f"{stats.get('train_examples', 0):,} training examples"
                 + (": " + ", ".join(f"{lang} {n:,}" for lang, n in per_language[:6]) if per_language else "")]
    warnings = [f"the {split} split has only {pages.get(split, 0)} pages (< {MIN_PAGES_TO_SCORE}): the F1 that train "
                "and evaluate report on it is too noisy to compare models; label more pages"
                for split in ("dev", "test") if pages.get(split, 0) < MIN_PAGES_TO_SCORE]
    return "\n".join([summary_text(BUILD_DATA, stats, "documents"),
                      summary_text(BUILD_DATA, stats, "lines", decisions, warnings)])


def parse_with_config(parser: argparse.ArgumentParser, config_cls: type, argv: list[str] | None):
    """(args, the config dataclass built from them); a value the config refuses raises UsageError."""
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    return args, config_from_args(config_cls, args)


def train_parser() -> argparse.ArgumentParser:
    return config_parser(
        "labse-main-content train", "Train the fastText main-content classifier on `build-data` output and report "
        "precision, recall, F1 and agreement with the teacher on the page-disjoint test split.",
        [("--data", "directory written by `labse-main-content build-data`"),
         ("--output", "model file to write (model.bin, or model.ftz with --quantize)")], MainContentTrainConfig)


def config_parser(prog: str, description: str, required: list[tuple[str, str]], config_cls: type):
    """A subcommand's parser: its required path options (flag, help), then its config's options."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    for flag, help_text in required:
        parser.add_argument(flag, required=True, help=help_text)
    add_config_options(parser, config_cls)
    return add_verbose_option(parser)


def train_main(argv: list[str] | None = None) -> int:
    from pipelines.main_content.evaluate import format_metrics, small_split_warnings
    from pipelines.main_content.train import train

    try:
        args, config = parse_with_config(train_parser(), MainContentTrainConfig, argv)
    except UsageError as exc:
        return usage_error("labse-main-content train", str(exc))
    try:
        report = train(args.data, args.output, config)
    except (FileNotFoundError, UsageError, RuntimeError) as exc:  # RuntimeError: fastText itself failed
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"model: {args.output} ({report['model_bytes']} bytes, {report['train_examples']} examples, "
          f"{report['train_seconds']} s)")
    for split in ("dev", "test"):
        if split in report:
            print(format_metrics(f"{split} (page-disjoint, vs teacher)", report[split]))
            print(format_metrics(f"{split} text only, no HTML feature (as for WET)", report[f"{split}_text_only"]))
    print(f"metrics: {args.output}.metrics.json")
    for warning in small_split_warnings(report):
        print(f"WARNING {warning}")
    return 0


def evaluate_parser() -> argparse.ArgumentParser:
    parser = config_parser(
        "labse-main-content evaluate", "Agreement of a main-content model with the teacher (trafilatura) on any "
        "WARC: line precision/recall/F1 for 'main content', agreement, kept-text token F1.",
        [("--model", "fastText model from `labse-main-content train`"),
         ("--input", "WARC file pattern, e.g. 'crawl/*.warc.gz'")], MainContentEvaluateConfig)
    parser.add_argument("--json", dest="json_out", default=None, help="also write the metrics to this JSON file")
    return parser


def evaluate_main(argv: list[str] | None = None) -> int:
    try:  # before the model is loaded
        args, config = parse_with_config(evaluate_parser(), MainContentEvaluateConfig, argv)
    except UsageError as exc:
        return usage_error("labse-main-content evaluate", str(exc))

    from pipelines.main_content.evaluate import evaluate_pages, format_metrics, labelled_pages_from_warc
    from pipelines.main_content.model import MainContentModel, MainContentModelError

    try:
        model = MainContentModel.load(args.model)
    except MainContentModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stats: Counter = Counter()
    try:
        from tqdm import tqdm

        pages = tqdm(labelled_pages_from_warc(args.input, limit=config.limit, stats=stats),
                     desc="pages", unit="page", disable=None)
        summary = evaluate_pages(model, pages, config.threshold, use_html=not config.text_only)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary["threshold"] = config.threshold
    summary["html_feature"] = not config.text_only
    summary["input_counts"] = dict(sorted(stats.items()))
    print(format_metrics(f"{args.model} vs teacher on {args.input}", summary))
    if args.json_out:
        from pipelines.io.atomic import write_json_atomic

        write_json_atomic(args.json_out, summary)
    return 0


def learning_curve_main(argv: list[str] | None = None) -> int:
    from pipelines.main_content.learning_curve import main as curve_main

    return curve_main(argv)


COMMANDS = {
    "build-data": (build_data_main, "label WARC pages with the teacher; write train/dev/test"),
    "train": (train_main, "train the fastText classifier; report P/R/F1 on the test split"),
    "evaluate": (evaluate_main, "agreement of a model with the teacher on any WARC, per page type too"),
    "learning-curve": (learning_curve_main, "quality against the number of training pages"),
}


if __name__ == "__main__":
    sys.exit(main())
