"""labse-score's Beam steps: read the mined pairs, score them in batches, decide each language
pair's threshold from bounded summaries of its scores (`decision.decide_from_summary`), then
calibrate and filter the rows in a second pass, write the kept rows and `_stats.json`."""
from __future__ import annotations

import math

import apache_beam as beam
import pyarrow as pa

from pipelines.accounting import CountByName, MergeTallies, ReasonCounters, accounting_section
from pipelines.progress import worker_tracker
from pipelines.io.parquet import MissingColumnsError, iter_parquet_rows
from pipelines.io.completion import finish_output
from pipelines.score.decision import calibrated_scores
from pipelines.score.features import pair_problem
from pipelines.stage import MAX_LISTED_ERRORS, WriteParquetShards, write_empty_shard


PAIR_COLUMNS = ("src", "tgt", "src_lang", "tgt_lang", "cosine", "margin", "src_url", "src_doc_id",
                "tgt_url", "tgt_doc_id")
SCORED_SCHEMA = pa.schema([
    ("src", pa.string()), ("tgt", pa.string()), ("src_lang", pa.string()), ("tgt_lang", pa.string()),
    ("cosine", pa.float32()), ("margin", pa.float32()), ("score", pa.float32()), ("src_url", pa.string()),
    ("src_doc_id", pa.string()), ("tgt_url", pa.string()), ("tgt_doc_id", pa.string()),
])
BATCH = 512
COUNTER_NAMESPACE = "score"  # Beam counters: one namespace per stage, its name
KEPT_PREFIX = "kept_by_language_pair."  # tally key of the rows written per language pair
# _stats.json's accounting units (README contract 11): pairs (rows read -> kept: written; dropped:
# invalid, below_threshold) and input_files (matched -> kept: read through; errored: reason).
UNITS = ("pairs", "input_files")


class _ReadPairsFile(beam.DoFn):
    """One Parquet file -> pair rows; a file that cannot be read or lacks a pair column goes to the
    `errors` output (counted, listed in _stats.json) and the run goes on, as in labse-mine and
    labse-tfrecords. Rows read before a file turned out damaged are kept."""

    def __init__(self):
        self.errored = beam.metrics.Metrics.counter(COUNTER_NAMESPACE, "files.errored")

    def process(self, readable_file):
        from pipelines.read.readers import local_file_problem

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
                # MatchFiles emits from one element: without a reshuffle every file is read and scored
                # (fused downstream) on the one worker that matched them.
                | "SpreadFiles" >> beam.Reshuffle()
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
        self.dropped = ReasonCounters(COUNTER_NAMESPACE)

    def setup(self):
        from pipelines.score.scorer import QualityScorer
        from pipelines.text.langid import LanguageIdentifier

        self.scorer = QualityScorer.load(self.model_path)
        self.lid = LanguageIdentifier()

    def process(self, rows: list[dict]):
        from pipelines.score.features import pair_features

        worker_tracker("pairs").advance(len(rows))
        good = []
        for row in rows:
            problem = pair_problem(row)
            if problem is None:
                good.append(row)
            else:
                self.dropped.inc(f"pairs.dropped.{problem}")
                yield beam.pvalue.TaggedOutput("dropped", problem)
        if not good:
            return
        features = pair_features([r["src"] for r in good], [r["tgt"] for r in good],
                                 [r["src_lang"] or "" for r in good], [r["tgt_lang"] or "" for r in good],
                                 [r["cosine"] for r in good], [r["margin"] for r in good], self.lid,
                                 self.scorer.feature_set)
        for row, ranker, sanity in zip(good, *self.scorer.components(features)):
            if math.isfinite(ranker) and math.isfinite(sanity):
                yield {**row, "ranker": float(ranker), "sanity": float(sanity)}
            else:  # finite inputs the scorer still cannot rate (an overflowing feature)
                self.dropped.inc("pairs.dropped.invalid")
                yield beam.pvalue.TaggedOutput("dropped", "invalid")


def _language_pair(row: dict) -> str:
    return f"{row['src_lang']}-{row['tgt_lang']}"


def _components(row: dict) -> tuple[float, float, float, float]:
    return row["ranker"], row["sanity"], float(row["cosine"]), float(row["margin"])


class _WithScorer(beam.DoFn):
    """A DoFn that loads the scorer once per worker."""

    def __init__(self, model_path: str):
        self.model_path = model_path

    def setup(self):
        from pipelines.score.scorer import QualityScorer

        self.scorer = QualityScorer.load(self.model_path)


class _Calibrate(_WithScorer):
    """Each row's `score`: its probability under its language pair's decision (same function)."""

    def process(self, row: dict, decisions: dict):
        decision = decisions[_language_pair(row)]
        out = {k: v for k, v in row.items() if k not in ("ranker", "sanity")}
        out["score"] = float(calibrated_scores(self.scorer, [_components(row)], decision)[0])
        yield out


class SummariseScores(beam.CombineFn):
    """Numbers of one key -> their `summary.ScoreSummary` over `range_`: at most `exact_limit` values
    or `range_.bins` counts, so a language pair's threshold is chosen without holding its pairs."""

    def __init__(self, range_, exact_limit: int | None = None):
        from pipelines.score.summary import EXACT_LIMIT

        self.range_, self.exact_limit = range_, EXACT_LIMIT if exact_limit is None else exact_limit

    def create_accumulator(self):
        from pipelines.score.summary import ScoreSummary

        return ScoreSummary(self.range_, self.exact_limit)

    def add_input(self, summary, value):
        return summary.add(value)

    def merge_accumulators(self, summaries):
        summaries = iter(summaries)
        merged = next(summaries)
        for summary in summaries:
            merged = merged.merge(summary)
        return merged

    def extract_output(self, summary):
        return summary


class _MarginDenominator(_WithScorer):
    """row -> (language pair, its margin denominator), whose median is the set statistic z."""

    def process(self, row: dict):
        from pipelines.score.decision import margin_denominators

        for denominator in margin_denominators(self.scorer, _language_pair(row), [row["cosine"]], [row["margin"]]):
            yield _language_pair(row), float(denominator)


class _DecisionStatistic(_WithScorer):
    """row -> (language pair, its decision statistic under its language pair's z)."""

    def process(self, row: dict, set_statistics: dict):
        from pipelines.score.decision import decision_statistic

        language_pair = _language_pair(row)
        statistic = decision_statistic(self.scorer, language_pair, [_components(row)],
                                       set_statistics.get(language_pair, 0.0))
        yield language_pair, float(statistic[0])


class ScorePairs(beam.PTransform):
    """Pair rows -> scored rows above their language pair's threshold, plus the decisions.

    Returns {"kept": rows (contract 7), "scored": every scored row, "decisions": one dict per
    language pair, "dropped": one reason per row not kept (`invalid`, `below_threshold`)}. `labelled` maps
    (src, tgt) -> 0/1 for a rated sample (may be empty).

    No worker holds a language pair's pairs: its set statistic z is the median of a bounded summary
    of their margin denominators, and its threshold is chosen from a bounded summary of their decision
    statistics under z (`summary.py`: exact up to 20,000 pairs, a fixed histogram beyond), each
    combined per language pair; the rows are then calibrated and filtered in a second pass.
    `exact_limit` overrides the 20,000 (tests and benchmarks force the histogram with 0).
    """

    def __init__(self, model_path: str, keep_precision: float | None = 0.8, keep_fraction: float | None = None,
                 labelled: dict | None = None, keep_best_f1: bool = False, exact_limit: int | None = None):
        super().__init__()
        self.model_path, self.keep_precision, self.keep_fraction = model_path, keep_precision, keep_fraction
        self.labelled = labelled or {}
        self.keep_best_f1 = keep_best_f1
        self.exact_limit = exact_limit

    def expand(self, rows):
        from pipelines.score.scorer import QualityScorer
        from pipelines.score.summary import DENOMINATOR_RANGE, LOG_LR_RANGE, PRODUCT_RANGE

        scored = (rows
                  | "Batch" >> beam.BatchElements(min_batch_size=1, max_batch_size=BATCH)
                  | "Score" >> beam.ParDo(_ScoreBatch(self.model_path)).with_outputs("dropped", main="rows"))
        scored_rows = scored.rows
        labelled, keep_precision, keep_fraction = self.labelled, self.keep_precision, self.keep_fraction
        model_path, keep_best_f1 = self.model_path, self.keep_best_f1
        calibrated_scorer = QualityScorer.load(model_path).calibration is not None

        set_statistics = (scored_rows
                          | "MarginDenominators" >> beam.ParDo(_MarginDenominator(model_path))
                          | "SummariseDenominators" >> beam.CombinePerKey(
                              SummariseScores(DENOMINATOR_RANGE, self.exact_limit))
                          | "Median" >> beam.MapTuple(lambda language_pair, summary: (language_pair, summary.median()))
                          | "SetStatistics" >> beam.combiners.ToDict())
        statistics = (scored_rows
                      | "DecisionStatistics" >> beam.ParDo(_DecisionStatistic(model_path),
                                                           beam.pvalue.AsSingleton(set_statistics))
                      | "SummariseStatistics" >> beam.CombinePerKey(
                          SummariseScores(LOG_LR_RANGE if calibrated_scorer else PRODUCT_RANGE, self.exact_limit)))
        # rated pairs present in the input (at most the rated sample, held in memory already): their
        # (calibrated) scores decide the threshold
        rated = (scored_rows
                 | "Rated" >> beam.Filter(lambda r: (r["src"], r["tgt"]) in labelled)
                 | "KeyRated" >> beam.Map(lambda r: (_language_pair(r), (
                     _components(r), labelled[(r["src"], r["tgt"])]))))

        def decide(keyed, set_statistics):
            from pipelines.score.decision import decide_from_summary
            from pipelines.score.scorer import QualityScorer

            language_pair, joined = keyed
            summary, = joined["statistics"]
            scorer = QualityScorer.load(model_path)
            z = set_statistics.get(language_pair, 0.0) if scorer.calibration is not None else None
            return language_pair, decide_from_summary(language_pair, summary.points(), z, list(joined["rated"]),
                                                      keep_precision, keep_fraction, scorer, keep_best_f1)

        decisions = ({"statistics": statistics, "rated": rated}
                     | "JoinForThreshold" >> beam.CoGroupByKey()
                     | "Decide" >> beam.Map(decide, beam.pvalue.AsSingleton(set_statistics)))
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


def _pair_key(row: dict) -> str:
    return row["src"] + "\t" + row["tgt"]


def _best_first(row: dict) -> tuple:
    return -row["score"], row["src"], row["tgt"]


def _kept_in_file(rows: list[dict]) -> dict:
    """The kept counts, from the rows just written, so `pairs_kept` and each language pair's `kept` in
    _stats.json are the same number as the rows in the shards."""
    tally = {"files.written": 1, "pairs.kept": len(rows)}
    for row in rows:
        key = f"{KEPT_PREFIX}{_language_pair(row)}"
        tally[key] = tally.get(key, 0) + 1
    return tally


def _finalise(_, tally: dict, decisions: list, errors: list, output: str, config: dict):
    if not tally.get("files.written"):
        write_empty_shard(output, SCORED_SCHEMA)
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
    finish_output(output, stats, stage="labse-score", shards_in_root=True)  # the last write of the stage
    yield stats


def build_pipeline(pipeline, pairs_dir: str, output: str, model: str, keep_precision, keep_fraction, labelled,
                   keep_best_f1: bool = False):
    output = output.rstrip("/")
    read = pipeline | "ReadPairs" >> ReadPairs(pairs_dir)
    rows = read["rows"]
    scored = rows | "ScorePairs" >> ScorePairs(model, keep_precision, keep_fraction, labelled, keep_best_f1)
    written = scored["kept"] | "Write" >> WriteParquetShards(
        output, SCORED_SCHEMA, shard_key=_pair_key, sort_key=_best_first, tally_of=_kept_in_file)
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
