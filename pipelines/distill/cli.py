"""labse-distill: a static miner (WordPiece -> table -> weighted mean) taught by a sentence encoder.

    labse-distill --vocab vocab.txt --sentences CLEAN_OUT [--sentences ...] [--text LANG=FILE ...] \\
                  [--pairs PAIRS_DIR ...] --teacher auto --dims 256 --output MODEL_DIR [Beam options]

Writes MODEL_DIR (local or gs://), a static embedder directory (`pipelines/embed/static.py`:
float16 table, vocab.txt, tokenizer.json, static_embedder.json, a sentence-transformers layout), its
`stats.json` (accounting, languages, pairs, losses per epoch) and `_SUCCESS` last. `--embedder
MODEL_DIR` mines with it in labse-mine, labse-score and labse-eval (a local folder: copy a gs:// one
first). It runs through the stage kit (`pipelines.distill.run.DistillRun`): the teacher's pass is a
Beam job (its options after ours; `--runner DataflowRunner` runs it on Dataflow against buckets),
the table's training runs here, in torch. The work folder (`--work-dir`, default MODEL_DIR.work,
local or gs://) keeps the teacher's vectors and the training checkpoint, so an interrupted run
continues when started again.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from pipelines.distill.config import DistillConfig
from pipelines.distill.run import STAGE, DistillRun, distill_summary
from pipelines.io.console import start_logging
from pipelines.io.config_options import add_config_options, config_from_args
from pipelines.stage import run_stage
from pipelines.stage_options import replace_help, stage_parser, usage_error


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser(
        STAGE,
        "Distil a static sentence embedder (WordPiece -> token table -> weighted mean -> unit length, tens of "
        "thousands of sentences per CPU-second) from a teacher encoder: token vectors from the teacher (PCA, SIF "
        "weights), fitted to the teacher's sentence vectors in every language, then trained on translation pairs.",
        output="MODEL_DIR: the static embedder directory", overwrite=replace_help("MODEL_DIR"))
    parser.add_argument("--vocab", required=True, help="the WordPiece vocab.txt (labse-vocab output)")
    parser.add_argument("--sentences", action="append", default=[],
                        help="monolingual sentences: a labse-clean output, its sentences/ folder or one lang=XX "
                             "folder, local or gs:// (repeatable)")
    parser.add_argument("--text", action="append", default=[], metavar="LANG=FILE",
                        help="monolingual sentences from a text file, one a line, .gz allowed (repeatable)")
    parser.add_argument("--pairs", action="append", default=[],
                        help="translation pairs for the contrastive step: a labse-mine or labse-score output "
                             "(repeatable; the pairs the teacher mines from the sentences are added unless "
                             "--no-mined-pairs)")
    parser.add_argument("--work-dir", help="folder for the teacher's vectors and the training checkpoint, kept "
                                           "for reruns (default MODEL_DIR.work); gs://... on Dataflow")
    add_config_options(parser, DistillConfig)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = start_logging(argv, "%(asctime)s %(name)s %(message)s")
    args, beam_args = build_parser().parse_known_args(argv)
    try:
        config = config_from_args(DistillConfig, args)
    except ValueError as error:  # the config's own checks, one line each
        return usage_error(STAGE, str(error))
    run = DistillRun(args.output, args.vocab, config, sentences=args.sentences, texts=args.text, pairs=args.pairs,
                     work_dir=args.work_dir, beam_args=beam_args, overwrite=args.overwrite)
    return run_stage(STAGE, progress_unit="sentences", summarise=lambda stats: distill_summary(stats, run.output),
                     **run.stage_arguments())


if __name__ == "__main__":
    sys.exit(main())
