"""labse-vocab: a cased multilingual WordPiece vocabulary from cleaned sentences.

    labse-vocab --input DIR/sentences --output vocab.txt [--vocab-size 500000] [--smoothing 0.3]
        [--num-unused 0] [--char-min-count 5] [--max-words 5000000] [Beam options]
    labse-vocab --input-text de=de.txt --input-text zh=zh.txt --output vocab.txt ...

This module parses the options and runs `vocab.builder.stage_plan` (count with Beam, smooth, learn,
report; the steps and outputs are described there) through the stage kit (`pipelines.stage.run_stage`):
the output is locked while it is built (`vocab.txt.lock`) and refused if any of its files exist,
unless `--overwrite`. `--input` must be a
complete labse-clean output (`_SUCCESS`). Bad settings are refused before anything is read (one
line, exit 2).
"""
from __future__ import annotations

import argparse
import sys

from pipelines.accounting import summary_text
from pipelines.io.console import start_logging
from pipelines.io.config_options import UsageError, add_config_options, config_from_args
from pipelines.stage_options import stage_parser, usage_error
from pipelines.stage import run_stage
from vocab.builder import stage_plan
from vocab.config import VocabConfig
from vocab.learn import VocabSizeError


def _parse_text_input(value: str) -> tuple[str, str]:
    lang, sep, path = value.partition("=")
    if not sep or not lang or not path:
        raise argparse.ArgumentTypeError(f"--input-text wants LANG=PATH, got {value!r}")
    return lang, path


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser(
        "labse-vocab",
        "Learn a cased multilingual WordPiece vocabulary (vocab.txt) from labse-clean output or plain text files.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        output="vocab.txt to write; report, stats and work files go beside it",
        overwrite="replace vocab.txt and the files beside it from an earlier run (else they are refused)")
    parser.add_argument("--input", help="labse-clean's DIR/sentences (hive lang=XX/*.parquet with text, lang)")
    parser.add_argument("--input-text", action="append", type=_parse_text_input, default=[], metavar="LANG=PATH",
                        help="a plain text file or pattern, one sentence per line, of language LANG (repeatable)")
    parser.add_argument("--work-dir", default=None,
                        help="where Beam writes counts/held-out/tally (default: beside --output); gs://... on Dataflow")
    add_config_options(parser, VocabConfig)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = start_logging(argv, "%(asctime)s %(name)s %(levelname)s %(message)s")
    parser = build_parser()
    args, beam_args = parser.parse_known_args(argv)
    if not args.input and not args.input_text:
        parser.error("give --input DIR/sentences and/or --input-text LANG=PATH")
    try:  # before anything is read
        config = config_from_args(VocabConfig, args)
    except UsageError as error:
        return usage_error("labse-vocab", str(error))
    built: list = []

    def summarise(stats) -> str:
        return vocab_summary(stats, built[-1])

    try:
        return run_stage("labse-vocab", progress_unit="sentences", **stage_plan(args.output, sentences_dir=args.input,
                                                     text_files=dict(args.input_text) or None, config=config,
                                                     beam_args=beam_args, work_dir=args.work_dir,
                                                     overwrite=args.overwrite, built=built),
                         summarise=summarise)
    except (VocabSizeError, UsageError) as error:  # VocabSizeError: the learner's, after counting (files removed)
        return usage_error("labse-vocab", str(error))


UNK_WARNING_SHARE = 0.01  # above this share of held-out tokens, [UNK] hides real words from the model


def vocab_summary(stats: dict, result) -> str:
    """The closing lines (accounting.summary_text): sentences read, kept and held out; the vocabulary
    written, the words it was learned from (and those pruned by --max-words), its held-out [UNK]
    share and subwords per word; a WARNING when [UNK] covers more than 1% of held-out tokens."""
    overall = result.report["overall"]
    word_types = stats.get("accounting", {}).get("word_types", {})
    pruned = sum(word_types.get("dropped", {}).values())
    decisions = [f"wrote {result.vocab_path} ({result.report['vocab_size']:,} tokens) from "
                 f"{word_types.get('kept', 0):,} distinct words in {len(stats.get('languages', {}))} languages"
                 + (f" ({pruned:,} more pruned by --max-words)" if pruned else ""),
                 f"held-out: [UNK] {overall['unk_share']:.4f}, subwords/word {overall['subwords_per_word']:.3f}; "
                 f"report {result.report_path}"]
    warnings = [f"[UNK] is {overall['unk_share']:.1%} of held-out tokens (> {UNK_WARNING_SHARE:.0%}): lower "
                "--char-min-count or give more text"] if overall["unk_share"] > UNK_WARNING_SHARE else []
    return summary_text("labse-vocab", stats, "sentences", decisions, warnings)


if __name__ == "__main__":
    sys.exit(main())
