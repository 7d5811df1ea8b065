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
import json
import logging
import sys
import time
from collections import Counter
from pathlib import Path

from pipelines.io.config_options import UsageError, add_config_options, config_from_args
from pipelines.io.stage_output import usage_error
from pipelines.main_content.config import BuildConfig, MainContentTrainConfig, TeacherConfig

logger = logging.getLogger(__name__)



def _usage() -> str:
    lines = [__doc__.strip(), "", "commands:"]
    lines += [f"  {name:<15} {help_}" for name, (_command, help_) in COMMANDS.items()]
    lines.append("\n`labse-main-content COMMAND --help` for a command's options.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"error: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    return COMMANDS[command][0](rest)


def build_data_parser() -> argparse.ArgumentParser:
    from pipelines.io.stage_output import stage_parser

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


def build_data(input_pattern: str, output: str, config: BuildConfig = BuildConfig(),
        beam_args: list[str] | None = None, overwrite: bool = False) -> dict | None:
    """Build and run the pipeline (holding the output lock; an existing output is refused with
    OutputExistsError unless `overwrite`); returns the stats written to ``output/stats.json``, or
    None for a dry run (the job was built, not run)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines.io.stage_output import output_lock, prepare_output, read_stats_json
    from pipelines.main_content.transforms import COUNTER_NAMESPACE, BuildTrainingData
    from pipelines.read.readers import ReadDocuments
    from pipelines.stage import run_to_completion

    with output_lock(output):
        prepare_output(output, overwrite=overwrite, inputs=[input_pattern])
        pipeline = beam.Pipeline(options=PipelineOptions(beam_args or []))
        _ = (pipeline | "Read" >> ReadDocuments(input_pattern, "warc", namespace=COUNTER_NAMESPACE)
             | "Build" >> BuildTrainingData(output, config))
        if not run_to_completion(pipeline, "labse-main-content build-data"):
            return None
    return read_stats_json(f"{output.rstrip('/')}/stats.json")


def build_data_main(argv: list[str] | None = None) -> int:
    from pipelines.io.stage_output import OutputExistsError, OutputLockedError
    from pipelines.stage import report_identity

    parser = build_data_parser()
    args, beam_args = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    from pipelines.read.readers import check_pattern_matches

    try:
        config = config_from_args(BuildConfig, args)
        files = check_pattern_matches(args.input)
    except UsageError as exc:
        return usage_error("labse-main-content build-data", str(exc))
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.teacher_balanced:
        config = dataclasses.replace(config, teacher=TeacherConfig(favor_precision=False))
    logger.info("labelling %d file(s) matching %s into %s", len(files), args.input, args.output)
    try:
        stats = build_data(args.input, args.output, config, beam_args, overwrite=args.overwrite)
    except (OutputExistsError, OutputLockedError) as exc:
        return usage_error("labse-main-content build-data", str(exc))
    if stats is None:  # a dry run
        return 0
    print(json.dumps({k: stats[k] for k in ("documents_read", "documents_kept", "documents_dropped",
                                            "documents_errored", "identity_holds", "pages", "lines",
                                            "train_examples")}, indent=1))
    return report_identity("labse-main-content build-data", stats)


def train_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="labse-main-content train",
        description="Train the fastText main-content classifier on `build-data` output and report precision, "
                    "recall, F1 and agreement with the teacher on the page-disjoint test split.")
    parser.add_argument("--data", required=True, help="directory written by `labse-main-content build-data`")
    parser.add_argument("--output", required=True, help="model file to write (model.bin, or model.ftz with --quantize)")
    add_config_options(parser, MainContentTrainConfig)
    return parser


def train_main(argv: list[str] | None = None) -> int:
    from pipelines.main_content.evaluate import format_metrics
    from pipelines.main_content.train import train

    parser = train_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        config = config_from_args(MainContentTrainConfig, args)
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
    return 0


def evaluate_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="labse-main-content evaluate",
        description="Agreement of a main-content model with the teacher (trafilatura) on any WARC: "
                    "line precision/recall/F1 for 'main content', agreement, kept-text token F1.")
    parser.add_argument("--model", required=True, help="fastText model from `labse-main-content train`")
    parser.add_argument("--input", required=True, help="WARC file pattern, e.g. 'crawl/*.warc.gz'")
    parser.add_argument("--threshold", type=float, default=0.5, help="keep lines scoring at least this (default 0.5)")
    parser.add_argument("--text-only", action="store_true",
                        help="score lines without the HTML feature (as for WET input)")
    parser.add_argument("--limit", type=int, default=None, help="evaluate at most this many HTML pages")
    parser.add_argument("--json", dest="json_out", default=None, help="also write the metrics to this JSON file")
    return parser


def evaluate_main(argv: list[str] | None = None) -> int:
    parser = evaluate_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")

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

        pages = tqdm(labelled_pages_from_warc(args.input, limit=args.limit, stats=stats),
                     desc="pages", unit="page", disable=None)
        summary = evaluate_pages(model, pages, args.threshold, use_html=not args.text_only)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary["threshold"] = args.threshold
    summary["html_feature"] = not args.text_only
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


DEMO_INPUT = "commoncrawl/*.warc.gz"
DEMO_ARTICLES = "maincontent/article-pages.warc.gz"
DEMO_TRUTH = "maincontent/article-pages.ground-truth.json"


def run_demo(data: Path, out: Path, artifacts: dict) -> list[str]:
    """Build data from the two Common Crawl sample WARCs, train, and measure on held-out article pages.

    The 181 article pages are never used for training, so their F1 against the human main text is
    a held-out number. Writes under out/main_content/; sets artifacts["main_content_model"].
    """
    stage = out / "main_content"
    data_dir, model_path = stage / "data", stage / "model.bin"
    started = time.perf_counter()
    argv = ["build-data", "--input", str(data / DEMO_INPUT), "--output", str(data_dir), "--overwrite"]
    print("labse-main-content " + " ".join(argv), flush=True)
    if main(argv) != 0:
        raise RuntimeError("labse-main-content build-data failed")
    build_seconds = time.perf_counter() - started
    # One thread: fastText's training repeats exactly only single-threaded, and every later stage of
    # the demo (vocabulary, mining, training) depends on the sentences this model keeps.
    argv = ["train", "--data", str(data_dir), "--output", str(model_path), "--threads", "1"]
    print("labse-main-content " + " ".join(argv), flush=True)
    if main(argv) != 0:
        raise RuntimeError("labse-main-content train failed")
    artifacts["main_content_model"] = str(model_path)
    stats = json.loads((data_dir / "stats.json").read_text(encoding="utf-8"))
    report = json.loads(Path(str(model_path) + ".metrics.json").read_text(encoding="utf-8"))
    test = report["test"]
    lines = [
        f"build-data on {DEMO_INPUT}: {stats['documents_kept']} HTML pages labelled by trafilatura "
        f"(train/dev/test pages {stats['pages']['train']}/{stats['pages']['dev']}/{stats['pages']['test']}), "
        f"{stats['train_examples']} balanced training lines, {build_seconds:.0f} s",
        f"model {model_path} ({report['model_bytes'] / 1e6:.1f} MB), trained in {report['train_seconds']:.1f} s",
        f"test split vs teacher ({test['pages']} pages, {test['lines']} lines): P {test['precision']:.3f} "
        f"R {test['recall']:.3f} F1 {test['f1']:.3f}, agreement {test['agreement']:.3f} "
        f"(text only: F1 {report['test_text_only']['f1']:.3f}, agreement {report['test_text_only']['agreement']:.3f})",
    ]
    articles, truth_file = data / DEMO_ARTICLES, data / DEMO_TRUTH
    if articles.is_file() and truth_file.is_file():
        from pipelines.main_content.evaluate import html_pages, mean_token_f1_vs_truth, model_kept_text
        from pipelines.main_content.model import MainContentModel

        model = MainContentModel.load(str(model_path))
        truth = json.loads(truth_file.read_text(encoding="utf-8"))
        pages = html_pages(str(articles))
        f1, count = mean_token_f1_vs_truth(lambda html: model_kept_text(model, html), pages, truth)
        f1_text, _ = mean_token_f1_vs_truth(lambda html: model_kept_text(model, html, use_html=False), pages, truth)
        lines.append(f"held-out article pages ({count}, never trained on), kept-text token F1 vs human main text: "
                     f"{f1:.3f} with the HTML feature, {f1_text:.3f} text only "
                     f"(data README: all visible text 0.594, trafilatura 0.955)")
    return lines


if __name__ == "__main__":
    sys.exit(main())
