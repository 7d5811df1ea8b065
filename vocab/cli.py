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
import json
import logging
import sys
from pathlib import Path

from pipelines.io.config_options import UsageError, add_config_options, config_from_args
from pipelines.io.stage_output import stage_parser, usage_error
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
    parser = build_parser()
    args, beam_args = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("apache_beam").setLevel(logging.WARNING)  # per-batch statistics drown the progress
    if not args.input and not args.input_text:
        parser.error("give --input DIR/sentences and/or --input-text LANG=PATH")
    try:  # before anything is read
        config = config_from_args(VocabConfig, args)
    except UsageError as error:
        return usage_error("labse-vocab", str(error))
    built: list = []

    def summarise(stats) -> str:
        result = built[-1]
        overall = result.report["overall"]
        return (f"wrote {result.vocab_path} ({result.report['vocab_size']} tokens); held-out: "
                f"[UNK] {overall['unk_share']:.4f}, subwords/word {overall['subwords_per_word']:.3f}; "
                f"report {result.report_path}")

    try:
        return run_stage("labse-vocab", **stage_plan(args.output, sentences_dir=args.input,
                                                     text_files=dict(args.input_text) or None, config=config,
                                                     beam_args=beam_args, work_dir=args.work_dir,
                                                     overwrite=args.overwrite, built=built),
                         summarise=summarise)
    except (VocabSizeError, UsageError) as error:  # VocabSizeError: the learner's, after counting (files removed)
        return usage_error("labse-vocab", str(error))


def run_demo(data: Path, out: Path, artifacts: dict) -> list[str]:
    """Demo step: a 32k vocabulary from the demo's cleaned text plus Multi30k train (en/de/fr/cs)."""
    out_dir = out / "vocab"
    out_dir.mkdir(parents=True, exist_ok=True)
    argv = ["--output", str(out_dir / "vocab.txt"), "--vocab-size", "32000", "--char-min-count", "2", "--overwrite"]
    clean = artifacts.get("clean_output")
    sentences = Path(clean) / "sentences" if clean else None
    if sentences is not None and any(sentences.glob("lang=*/*.parquet")):
        argv += ["--input", str(sentences)]
    for lang in ("en", "de", "fr", "cs"):
        path = data / "multi30k" / f"train.{lang}.gz"
        if not path.is_file():
            raise FileNotFoundError(f"demo vocabulary needs {path}")
        argv += ["--input-text", f"{lang}={path}"]
    argv += ["--direct_num_workers", "1"]
    code = main(argv)
    if code != 0:
        raise RuntimeError(f"labse-vocab failed with exit code {code}")
    artifacts["vocab"] = str(out_dir / "vocab.txt")
    report = json.loads((out_dir / "vocab.report.json").read_text(encoding="utf-8"))
    stats = json.loads((out_dir / "vocab.stats.json").read_text(encoding="utf-8"))
    lines = [
        f"vocab.txt: {report['vocab_size']:,} tokens ({stats['learner']['num_chars']} characters, alone and as ##c) "
        f"from {stats['learner']['num_words_in']:,} distinct words in {len(stats['languages'])} languages"
        + (" (cleaned demo text + Multi30k train)" if "--input" in argv else " (Multi30k train; no cleaned text found)"),
        f"learning took {stats['seconds']['learn']:.0f} s, counting with Beam {stats['seconds']['count']:.0f} s",
    ]
    ranked = sorted(report["languages"].items(), key=lambda kv: -kv[1]["sentences"])[:8]
    lines.append("held-out sentences, per language: [UNK] share / subwords per word / words kept whole")
    for lang, row in ranked:
        lines.append(f"  {lang}: {row['unk_share']:.4f} / {row['subwords_per_word']:.3f} / {row['whole_word_share']:.3f}"
                     f"  ({row['sentences']} sentences)")
    return lines


if __name__ == "__main__":
    sys.exit(main())
