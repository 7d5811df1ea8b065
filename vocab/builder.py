"""The `labse-vocab` stage as a library call: count (Beam), smooth, learn, report.

    from vocab.builder import build
    from vocab.config import VocabConfig
    result = build("out/vocab.txt", sentences_dir="clean/sentences", config=VocabConfig(vocab_size=64000))

Steps: Beam counts words per language (`vocab.count`, BERT pre-tokenisation), holding out a share
of sentences (`VocabConfig.holdout_rate`), and passes on at most `VocabConfig.max_words` distinct
words, each language's most frequent (`vocab.prune`: the learner's memory is bounded whatever the
corpus size, docs/guides/vocabulary-at-scale.md); language weights p_l ∝ n_l^α scale each language's
counts (`vocab.smoothing`); the learner builds exactly `vocab_size` tokens (`vocab.learn`); the
report measures [UNK] share, subwords per word and whole words per language on the held-out
sentences (`vocab.report`). The command line (`labse-vocab`) is `vocab.cli`.

Outputs next to `output` (vocab.txt): `vocab.report.json`, `vocab.report.png`, `vocab.stats.json`
(the accounting section of README contract 11 for sentences, held-out sentences and word types,
configuration, tallies, weights, learner search; written last), and `vocab.work/` (counts TSV,
held-out, tally). Beam and TensorFlow are imported only when a build runs.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Mapping, Sequence

import numpy as np

from pipelines.io.config_options import UsageError
from vocab.config import VocabConfig
from vocab.learn import LearnResult, VocabSizeError, learn, write_vocab

logger = logging.getLogger(__name__)


@dataclass
class BuildResult:
    vocab_path: str
    report_path: str
    stats_path: str
    report: dict
    stats: dict


def side_paths(output: str) -> dict[str, str]:
    stem = output[: -len(".txt")] if output.endswith(".txt") else output
    return {
        "report": stem + ".report.json",
        "png": stem + ".report.png",
        "stats": stem + ".stats.json",
        "work": stem + ".work",
    }


def wire_counting(pipeline, work_dir: str, *, sentences_dir: str | None, text_files: Mapping[str, str] | None,
                  config: VocabConfig) -> None:
    """The counting pipeline: the inputs | `CountWords` | `WriteCounts(work_dir)`."""
    import apache_beam as beam

    from vocab.count import CountWords, ReadLanguageTexts, ReadSentenceParquet, WriteCounts

    from pipelines.accounting import MergeTallies

    inputs, file_tallies = [], []
    if sentences_dir:
        parquet = pipeline | "Sentences" >> ReadSentenceParquet(sentences_dir)
        inputs.append(parquet["sentences"])
        file_tallies.append(parquet["tally"])
    if text_files:
        inputs.append(pipeline | "Texts" >> ReadLanguageTexts(text_files))
    sentences = inputs[0] if len(inputs) == 1 else tuple(inputs) | "Inputs" >> beam.Flatten()
    counted = sentences | "CountWords" >> CountWords(
        config.holdout_rate, config.heldout_per_language, config.max_words, config.smoothing)
    tally = (counted["tally"], *file_tallies) | "AllTallies" >> MergeTallies()
    {**counted, "tally": tally} | "Write" >> WriteCounts(work_dir)


def run_counting(
    work_dir: str,
    *,
    sentences_dir: str | None,
    text_files: Mapping[str, str] | None,
    config: VocabConfig,
    beam_args: Sequence[str] = (),
) -> bool:
    """Only the counting, with Beam, into `work_dir` (no lock, no learning: `build` is the stage);
    False for a dry run (the job was built, not run)."""
    from pipelines.stage import beam_pipeline, run_to_completion

    pipeline = beam_pipeline(beam_args)
    wire_counting(pipeline, work_dir, sentences_dir=sentences_dir, text_files=text_files, config=config)
    return run_to_completion(pipeline, "labse-vocab")


def _read_lines(pattern: str):
    from apache_beam.io.filesystems import FileSystems

    for metadata in FileSystems.match([pattern])[0].metadata_list:
        with FileSystems.open(metadata.path) as handle:
            for raw in handle:
                line = raw.decode("utf-8").rstrip("\n")
                if line:
                    yield line


def load_work(work_dir: str) -> tuple[dict, dict[str, list[str]]]:
    tally: dict = {}
    for line in _read_lines(f"{work_dir}/tally.json"):
        tally = json.loads(line)
    heldout: dict[str, list[str]] = {}
    for line in _read_lines(f"{work_dir}/heldout.jsonl"):
        row = json.loads(line)
        heldout[row["lang"]] = row["texts"]
    return tally, heldout


# Weights in fixed point: integer sums are exact, so a word's total does not depend on the order in
# which the runner wrote its (language, word, count) lines (float sums did, in the last bit, which
# reordered tied tokens and so changed the vocabulary from run to run).
_WEIGHT_SCALE = 1 << 64


def weighted_counts(work_dir: str, weights: Mapping[str, float]) -> tuple[list[str], np.ndarray]:
    """Sum over languages of count x weight, word by word, from the counts TSV shards.

    Words in sorted order and totals summed exactly: the result is the same whatever order Beam
    wrote the lines in (one run's vocabulary is every run's).
    """
    from tqdm.auto import tqdm

    from vocab.count import parse_count

    scaled = {lang: round(weight * _WEIGHT_SCALE) for lang, weight in weights.items()}
    totals: dict[str, int] = defaultdict(int)
    for line in tqdm(_read_lines(f"{work_dir}/counts/counts*.tsv"), desc="loading counts", unit=" words", mininterval=5):
        lang, word, count = parse_count(line)
        totals[word] += count * scaled[lang]
    words = sorted(totals)
    return words, np.fromiter((totals[w] / _WEIGHT_SCALE for w in words), dtype=np.float64, count=len(words))


def _check_inputs(sentences_dir: str | None, text_files: Mapping[str, str] | None) -> None:
    """Fail before starting Beam, with the path, when an input matches no file or is a labse-clean
    output that is not complete (interrupted, or still running)."""
    from apache_beam.io.filesystems import FileSystems

    from pipelines.io.completion import require_stage_output
    from vocab.count import ReadSentenceParquet

    patterns = []
    if sentences_dir:
        patterns.append(("--input", ReadSentenceParquet(sentences_dir).pattern))
    for lang, pattern in (text_files or {}).items():
        patterns.append((f"--input-text {lang}", pattern))
    for option, pattern in patterns:
        if not FileSystems.match([pattern])[0].metadata_list:
            raise UsageError(f"{option}: no file matches {pattern}")
    if sentences_dir:
        require_stage_output(sentences_dir, f"--input {sentences_dir} (labse-clean output)")
    for lang, pattern in (text_files or {}).items():
        require_stage_output(pattern, f"--input-text {lang}={pattern}", plain_allowed=True)


def build(
    output: str,
    *,
    sentences_dir: str | None = None,
    text_files: Mapping[str, str] | None = None,
    config: VocabConfig | None = None,
    beam_args: Sequence[str] = (),
    work_dir: str | None = None,
    overwrite: bool = False,
) -> BuildResult | None:
    """Count (Beam), smooth, learn, report: writes `output` (vocab.txt) and the files beside it.

    The same as `labse-vocab`; `vocab.build` is this function.

    Args:
        output: the vocab.txt to write; `vocab.report.json`, `vocab.report.png`,
            `vocab.stats.json` and `vocab.work/` go beside it (`side_paths`).
        sentences_dir: labse-clean's `DIR/sentences` (hive `lang=XX/*.parquet`, columns `text`,
            `lang`); `DIR` must be a complete output (`_SUCCESS`).
        text_files: `{lang: path or glob}` of plain text, one sentence per line. At least one of
            `sentences_dir` and `text_files` is needed; both are counted together.
        config: vocabulary size, smoothing exponent, unused slots, ... (`VocabConfig`, LaBSE's
            defaults); checked before anything is read (ValueError).
        beam_args: Beam pipeline options for the counting, e.g. `["--runner", "DataflowRunner", ...]`.
        work_dir: where Beam writes (default: `vocab.work/` beside `output`); on Dataflow a bucket
            path the workers can write (gs://...).
        overwrite: remove an earlier run's files first. Without it an existing vocab.txt, report,
            stats or work directory is refused (OutputExistsError): leftover count shards of an
            earlier run would otherwise be summed with the new ones.

    Returns a `BuildResult` (paths, the report and the stats as dicts), or None for a dry run
    (`--dry_run True` in `beam_args`: the counting job was built, not run). The output is locked while
    it is built (`vocab.txt.lock`, OutputLockedError for a second run).

    Example::

        from vocab.builder import build
        from vocab.config import VocabConfig
        result = build("out/vocab.txt", text_files={"en": "en.txt", "de": "de/*.txt"},
                       config=VocabConfig(vocab_size=32000, num_unused=100))
        result.report["languages"]["de"]["unk_share"]
    """
    from pipelines.stage import execute_stage

    built: list[BuildResult] = []
    stats = execute_stage("labse-vocab", **stage_plan(output, sentences_dir=sentences_dir, text_files=text_files,
                                                      config=config, beam_args=beam_args, work_dir=work_dir,
                                                      overwrite=overwrite, built=built))
    return None if stats is None else built[0]


def stage_plan(output: str, *, sentences_dir: str | None = None, text_files: Mapping[str, str] | None = None,
               config: VocabConfig | None = None, beam_args: Sequence[str] = (), work_dir: str | None = None,
               overwrite: bool = False, built: list | None = None) -> dict:
    """labse-vocab's arguments to the stage kit (`pipelines.stage.run_stage`, `build`'s arguments):
    the counting pipeline (`wire_counting`), then, once it ran, the learning and the report
    (`finish`: its `BuildResult` is appended to `built`). Its output is `output` and the files
    beside it (`side_paths`): they are locked as `output`, and removed when a run fails, so that
    nothing blocks the retry."""
    config = config or VocabConfig()  # checked when built
    if not sentences_dir and not text_files:
        raise UsageError("give sentences_dir (labse-clean output) and/or text_files {lang: path}")
    paths = side_paths(output)
    if work_dir:
        paths["work"] = work_dir.rstrip("/")
    built = [] if built is None else built
    started = time.perf_counter()

    def finish() -> dict:
        built.append(_build(output, paths, heldout_and_tally=load_work(paths["work"]), config=config,
                            count_seconds=time.perf_counter() - started))
        return built[-1].stats

    def wire(pipeline):
        logger.info("counting words with Beam into %s", paths["work"])  # the inputs were checked
        return wire_counting(pipeline, paths["work"], sentences_dir=sentences_dir, text_files=text_files,
                             config=config)

    return dict(output=output, overwrite=overwrite, beam_args=list(beam_args),
                inputs=[sentences_dir, *(text_files or {}).values()],
                check_inputs=lambda: _check_inputs(sentences_dir, text_files),
                wire=wire,
                finish=finish, output_files=[output, paths["report"], paths["png"], paths["stats"], paths["work"]])


def _build(output: str, paths: dict[str, str], *, heldout_and_tally: tuple[dict, dict[str, list[str]]],
           config: VocabConfig, count_seconds: float) -> BuildResult:
    """After the counting: smooth, learn, write vocab.txt and its report, then the stats (last)."""
    from pipelines.accounting import accounting_section
    from pipelines.io.completion import write_stats_json
    from vocab.count import UNITS
    from vocab.report import build_report, write_report
    from vocab.smoothing import language_weights, smoothed_shares

    counted = time.perf_counter()
    started = counted - count_seconds
    tally, heldout = heldout_and_tally
    totals = {key[len("words."):]: value for key, value in tally.items() if key.startswith("words.")}
    if not totals:
        raise VocabSizeError(f"no words were counted (tally: {tally}); is the input empty?")
    weights = language_weights(totals, config.smoothing)
    shares = smoothed_shares(totals, config.smoothing)
    words, counts = weighted_counts(paths["work"], weights)
    logger.info("learning %d tokens from %d distinct words in %d languages", config.vocab_size, len(words), len(totals))
    result: LearnResult = learn(words, counts, config.learner())
    del words, counts
    write_vocab(result.vocab, output)
    learned = time.perf_counter()
    if "://" in output:  # the tokenizers read local files: measure a local copy of what was uploaded
        with tempfile.TemporaryDirectory(prefix="labse-vocab-") as local:
            write_vocab(result.vocab, os.path.join(local, "vocab.txt"))
            report = {**build_report(os.path.join(local, "vocab.txt"), heldout), "vocab": output}
    else:
        report = build_report(output, heldout)
    write_report(report, paths["report"], paths["png"])
    stats = {
        **accounting_section(tally, UNITS),
        "config": asdict(config),
        "tally": tally,
        "languages": {
            lang: {"words": totals[lang], "raw_share": totals[lang] / sum(totals.values()),
                   "smoothed_share": shares[lang], "weight": weights[lang],
                   "pruned_types": tally.get(f"pruned_types.{lang}", 0),
                   "pruned_words": tally.get(f"pruned_words.{lang}", 0)}
            for lang in sorted(totals, key=lambda l: -totals[l])
        },
        "learner": result.summary(),
        "seconds": {"count": round(counted - started, 1), "learn": round(learned - counted, 1),
                    "report": round(time.perf_counter() - learned, 1)},
        "outputs": {"vocab": output, **paths},
    }
    write_stats_json(paths["stats"], stats)  # the last file: a run without it did not finish
    return BuildResult(output, paths["report"], paths["stats"], report, stats)
