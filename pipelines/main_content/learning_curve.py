"""`labse-main-content learning-curve`: quality against the number of training pages.

    labse-main-content learning-curve --input 'crawl/*.warc.gz' [--sizes 10,25,50,100] \\
        [--truth-input articles.warc.gz --truth ground-truth.json] [--json curve.json]

Labels every HTML page of the input as ``build-data`` does (``--labels``, committee by default),
holds out the pages ``build-data`` would put in dev and test (URL hash), and for each size N trains
a model on the first N training pages (in URL-hash order, so a larger set contains the smaller)
with ``build-data``'s balancing and the default ``train`` settings, then reports line F1 against
the labels of the held-out pages, per page type too, and, with ``--truth``, token F1 of the kept
text against human main text (a JSON file {url: text} for the pages of ``--truth-input``). It tells
a user how much crawl to label: where the curve flattens, more pages stop paying. Runs without
Beam (one process; each training in a fresh fastText process, as ``train`` does).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import random
import sys
import tempfile
from typing import Sequence

from pipelines.io.config_options import UsageError
from pipelines.io.console import add_verbose_option
from pipelines.main_content.config import LABEL_SCHEMES, BuildConfig, MainContentTrainConfig, TeacherConfig
from pipelines.main_content.labels import LabelledPage, split_of

logger = logging.getLogger(__name__)


def _order(url: str) -> int:
    return int.from_bytes(hashlib.sha1(f"curve\t{url}".encode("utf-8", "replace")).digest()[:8], "big")


def learning_curve(pages: Sequence[LabelledPage], sizes: Sequence[int], config: BuildConfig = BuildConfig(),
                   train_config: MainContentTrainConfig = MainContentTrainConfig(),
                   truth_pages: Sequence[tuple[str, str]] = (), truth: dict[str, str] | None = None) -> list[dict]:
    """One row per size: training pages and examples, held-out metrics vs the labels (with
    ``per_page_type``), and ``f1_vs_human`` when ``truth`` is given (``truth_pages``: (url, html))."""
    from pipelines.main_content.evaluate import evaluate_pages, mean_token_f1_vs_truth, model_kept_text
    from pipelines.main_content.model import MainContentModel
    from pipelines.main_content.train import train_fasttext
    from pipelines.main_content.transforms import training_examples

    train_pages = sorted((p for p in pages if split_of(p.url, config.dev_fraction, config.test_fraction) == "train"),
                         key=lambda p: _order(p.url))
    held_out = [p for p in pages if split_of(p.url, config.dev_fraction, config.test_fraction) != "train"]
    if not train_pages or not held_out:
        raise UsageError(f"{len(train_pages)} training and {len(held_out)} held-out pages: need both (more input)")
    rows_per_page = [[row for _lang, (_digest, row) in training_examples(page.to_json(), config)]
                     for page in train_pages]
    curve = []
    with tempfile.TemporaryDirectory(prefix="main-content-curve-") as work:
        for size in sorted({min(size, len(train_pages)) for size in sizes}):
            rows = [row for page_rows in rows_per_page[:size] for row in page_rows]
            random.Random(train_config.seed).shuffle(rows)
            train_file, model_file = os.path.join(work, f"train{size}.txt"), os.path.join(work, f"model{size}.bin")
            with open(train_file, "w", encoding="utf-8") as handle:
                handle.write("\n".join(rows) + "\n")
            train_fasttext(train_file, model_file, train_config)
            model = MainContentModel.load(model_file)
            row = {"train_pages": size, "train_examples": len(rows),
                   "held_out": evaluate_pages(model, held_out, train_config.threshold)}
            if truth:
                row["f1_vs_human"], row["human_pages"] = mean_token_f1_vs_truth(
                    lambda html: model_kept_text(model, html, train_config.threshold), truth_pages, truth)
            logger.info("%d training pages: held-out line F1 %.3f%s", size, row["held_out"]["f1"],
                        f", F1 vs human {row['f1_vs_human']:.3f}" if truth else "")
            curve.append(row)
    return curve


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="labse-main-content learning-curve",
                                     description="Quality of the main-content classifier against the number of "
                                                 "training pages (module docstring of pipelines.main_content."
                                                 "learning_curve).")
    parser.add_argument("--input", required=True, help="WARC file pattern to label, train and hold out from")
    parser.add_argument("--sizes", default="10,25,50,100", help="training pages per point (default %(default)s)")
    parser.add_argument("--labels", choices=LABEL_SCHEMES, default="committee", help="default %(default)s")
    parser.add_argument("--truth-input", default=None, help="WARC of pages with human main text")
    parser.add_argument("--truth", default=None, help="JSON {url: human main text} for --truth-input")
    parser.add_argument("--threads", type=int, default=1, help="fastText threads (1: repeatable; default 1)")
    parser.add_argument("--json", dest="json_out", default=None, help="also write the curve to this JSON file")
    return add_verbose_option(parser)


def main(argv: list[str] | None = None) -> int:
    from pipelines.main_content.evaluate import html_pages, labelled_pages_from_warc

    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        sizes = [int(size) for size in args.sizes.split(",") if size.strip()]
        if not sizes or min(sizes) < 1:
            raise ValueError
    except ValueError:
        print(f"labse-main-content learning-curve: error: --sizes must be positive integers, got {args.sizes!r}",
              file=sys.stderr)
        return 2
    if bool(args.truth) != bool(args.truth_input):
        print("labse-main-content learning-curve: error: --truth and --truth-input go together", file=sys.stderr)
        return 2
    config = BuildConfig(labels=args.labels)
    try:
        pages = list(labelled_pages_from_warc(args.input, TeacherConfig(), scheme=args.labels))
        truth_pages, truth = (), None
        if args.truth:
            with open(args.truth, encoding="utf-8") as handle:
                truth = json.load(handle)
            truth_pages = html_pages(args.truth_input)
        curve = learning_curve(pages, sizes, config, MainContentTrainConfig(threads=args.threads),
                               truth_pages, truth)
    except (FileNotFoundError, UsageError) as exc:
        print(f"labse-main-content learning-curve: error: {exc}", file=sys.stderr)
        return 2
    print("| training pages | examples | held-out line F1 | " + ("F1 vs human | " if truth else "")
          + " | ".join(f"{kind} F1" for kind in _types(curve)) + " |")
    for row in curve:
        per_type = row["held_out"].get("per_page_type", {})
        cells = [str(row["train_pages"]), str(row["train_examples"]), f"{row['held_out']['f1']:.3f}"]
        cells += [f"{row['f1_vs_human']:.3f}"] if truth else []
        cells += [f"{per_type[kind]['f1']:.3f} ({per_type[kind]['pages']})" if kind in per_type else "-"
                  for kind in _types(curve)]
        print("| " + " | ".join(cells) + " |")
    if args.json_out:
        from pipelines.io.atomic import write_json_atomic

        write_json_atomic(args.json_out, {"sizes": sizes, "labels": args.labels, "curve": curve})
    return 0


def _types(curve: list[dict]) -> list[str]:
    from pipelines.main_content.page_types import PAGE_TYPES

    seen = {kind for row in curve for kind in row["held_out"].get("per_page_type", {})}
    return [kind for kind in PAGE_TYPES if kind in seen]
