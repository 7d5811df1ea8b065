"""labse-distill: a static miner (WordPiece -> table -> weighted mean) taught by a sentence encoder.

    labse-distill --vocab vocab.txt --sentences CLEAN_OUT [--sentences ...] [--text LANG=FILE ...] \\
                  [--pairs PAIRS_DIR ...] --teacher auto --dims 256 --output MODEL_DIR [Beam options]

Writes MODEL_DIR, a static embedder directory (`pipelines/embed/static.py`: float16 table,
vocab.txt, tokenizer.json, static_embedder.json, a sentence-transformers layout), its `stats.json`
(accounting, languages, pairs, losses per epoch) and `_SUCCESS` last. `--embedder MODEL_DIR` mines
with it in labse-mine, labse-score and labse-eval. The teacher's pass is a Beam job (its options
after ours); the work folder (`--work-dir`, default MODEL_DIR.work) keeps its vectors and the
training checkpoint, so an interrupted run continues when started again.
"""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

from pipelines.distill.config import DistillConfig
from pipelines.distill.corpus import sentence_sources
from pipelines.distill.run import STAGE, distill
from pipelines.io.console import start_logging
from pipelines.io.config_options import UsageError, add_config_options, config_from_args
from pipelines.io.completion import require_stage_output
from pipelines.io.overlap import OUTPUT_REFUSED, fresh_output
from pipelines.io.storage import is_remote
from pipelines.stage_options import replace_help, stage_parser, usage_error
from pipelines.embed.base import EmbedderError
from pipelines.embed.embedders import check_embedder_spec

logger = logging.getLogger(__name__)


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
    parser.add_argument("--work-dir", help="local folder for the teacher's vectors and the checkpoint "
                                           "(default MODEL_DIR.work)")
    add_config_options(parser, DistillConfig)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = start_logging(argv, "%(asctime)s %(name)s %(message)s")
    args, beam_args = build_parser().parse_known_args(argv)
    output = args.output.rstrip("/")
    try:
        config = config_from_args(DistillConfig, args)
    except ValueError as error:  # the config's own checks, one line each
        return usage_error(STAGE, str(error))
    try:
        if is_remote(output):
            raise UsageError("--output must be a local folder (the model is a directory that mining workers load; "
                             "copy it to Cloud Storage afterwards)")
        for path in args.sentences:
            require_stage_output(path, f"--sentences {path}", plain_allowed=True)
        sources = sentence_sources(args.sentences, args.text)
        if config.teacher.lower() != "auto":
            try:
                check_embedder_spec(config.teacher)
            except EmbedderError as error:
                raise UsageError(f"--teacher: {error}") from error
        inputs = [args.vocab, *args.sentences, *[t.split("=", 1)[1] for t in args.text], *args.pairs]
        with fresh_output(output, overwrite=args.overwrite, inputs=inputs):
            result = distill(output, args.vocab, sources, config, pairs=args.pairs, work_dir=args.work_dir,
                             beam_args=beam_args)
    except UsageError as error:
        return usage_error(STAGE, str(error))
    except OUTPUT_REFUSED as error:
        return usage_error(STAGE, str(error))
    stats = result.stats
    logger.info("%s: %d languages, %d dims, teacher %s -> %s", STAGE, len(stats["sentences_per_language"]),
                config.dims, stats["teacher"], output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
