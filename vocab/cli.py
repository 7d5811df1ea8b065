"""labse-vocab: a cased multilingual WordPiece vocabulary from cleaned sentences.

    labse-vocab --input DIR/sentences --output vocab.txt [--vocab-size 500000] [--smoothing 0.3]
        [--num-unused 0] [--char-min-count 5] [Beam options]
    labse-vocab --input-text de=de.txt --input-text zh=zh.txt --output vocab.txt ...

Steps: Beam counts words per language (`vocab.count`, BERT pre-tokenisation), holding out ~1% of
sentences; language weights p_l ∝ n_l^α scale each language's counts (`vocab.smoothing`); the
learner builds exactly --vocab-size tokens (`vocab.learn`); the report measures [UNK] share,
subwords per word and whole words per language on the held-out sentences (`vocab.report`).

Outputs next to --output (vocab.txt): `vocab.report.json`, `vocab.report.png`, `vocab.stats.json`
(configuration, tallies, weights, learner search; written last), and `vocab.work/` (counts TSV,
held-out, tally). The output is locked while it is built (`vocab.txt.lock`) and refused if any of
these exist, unless `--overwrite`. `--input` must be a complete labse-clean output (`_SUCCESS`).
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping, Sequence

from pipelines.io.stage_output import OutputExistsError, OutputLockedError, usage_error
from vocab.learn import LearnerConfig, LearnResult, VocabSizeError, learn, write_vocab

log = logging.getLogger("labse.vocab")


@dataclass
class VocabConfig:
    vocab_size: int = 500_000  # LaBSE: 501,153
    smoothing: float = 0.3  # LaBSE's exponent
    num_unused: int = 0
    char_min_count: float = 5.0
    holdout_rate: float = 0.01
    heldout_per_language: int = 2000
    max_token_length: int = 50

    def problems(self) -> list[str]:
        """What is wrong with these settings (as CLI options), checked before any work starts."""
        found = []
        if not 0.0 <= self.holdout_rate < 1.0:
            found.append(f"--holdout-rate must be in [0, 1), got {self.holdout_rate}")
        if not (math.isfinite(self.smoothing) and self.smoothing >= 0.0):
            found.append(f"--smoothing must be a finite number >= 0, got {self.smoothing}")
        if not (math.isfinite(self.char_min_count) and self.char_min_count > 0.0):
            found.append(f"--char-min-count must be a finite number > 0, got {self.char_min_count}")
        for name in ("vocab_size", "max_token_length"):
            if getattr(self, name) < 1:
                found.append(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        for name in ("num_unused", "heldout_per_language"):
            if getattr(self, name) < 0:
                found.append(f"--{name.replace('_', '-')} must be at least 0, got {getattr(self, name)}")
        return found

    def learner(self) -> LearnerConfig:
        return LearnerConfig(
            vocab_size=self.vocab_size,
            num_unused=self.num_unused,
            char_min_count=self.char_min_count,
            max_token_length=self.max_token_length,
        )


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


def run_counting(
    work_dir: str,
    *,
    sentences_dir: str | None,
    text_files: Mapping[str, str] | None,
    config: VocabConfig,
    beam_args: Sequence[str] = (),
) -> None:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from vocab.count import CountWords, ReadLanguageTexts, ReadSentenceParquet, WriteCounts

    options = PipelineOptions(list(beam_args))
    with beam.Pipeline(options=options) as pipeline:
        inputs = []
        if sentences_dir:
            inputs.append(pipeline | "Sentences" >> ReadSentenceParquet(sentences_dir))
        if text_files:
            inputs.append(pipeline | "Texts" >> ReadLanguageTexts(text_files))
        sentences = inputs[0] if len(inputs) == 1 else tuple(inputs) | "Inputs" >> beam.Flatten()
        counted = sentences | "CountWords" >> CountWords(config.holdout_rate, config.heldout_per_language)
        counted | "Write" >> WriteCounts(work_dir)


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


def weighted_counts(work_dir: str, weights: Mapping[str, float]) -> tuple[list[str], "np.ndarray"]:
    """Sum over languages of count x weight, word by word, from the counts TSV shards."""
    import numpy as np
    from tqdm.auto import tqdm

    from vocab.count import parse_count

    totals: dict[str, float] = defaultdict(float)
    for line in tqdm(_read_lines(f"{work_dir}/counts/counts*.tsv"), desc="loading counts", unit=" words", mininterval=5):
        lang, word, count = parse_count(line)
        totals[word] += count * weights[lang]
    words = list(totals)
    return words, np.fromiter((totals[w] for w in words), dtype=np.float64, count=len(words))


def _check_inputs(sentences_dir: str | None, text_files: Mapping[str, str] | None) -> None:
    """Fail before starting Beam, with the path, when an input matches no file or is a labse-clean
    output that is not complete (interrupted, or still running)."""
    from apache_beam.io.filesystems import FileSystems

    from pipelines.io.parquet import clean_output_root
    from pipelines.io.stage_output import require_complete
    from vocab.count import ReadSentenceParquet

    patterns = []
    if sentences_dir:
        patterns.append(("--input", ReadSentenceParquet(sentences_dir).pattern))
    for lang, pattern in (text_files or {}).items():
        patterns.append((f"--input-text {lang}", pattern))
    for option, pattern in patterns:
        if not FileSystems.match([pattern])[0].metadata_list:
            raise ValueError(f"{option}: no file matches {pattern}")
    root = clean_output_root(sentences_dir) if sentences_dir else None
    if root is not None:
        require_complete(root, f"--input {sentences_dir}: labse-clean output")


def build(
    output: str,
    *,
    sentences_dir: str | None = None,
    text_files: Mapping[str, str] | None = None,
    config: VocabConfig | None = None,
    beam_args: Sequence[str] = (),
    work_dir: str | None = None,
    overwrite: bool = False,
) -> BuildResult:
    """Count (Beam), smooth, learn, report: writes `output` (vocab.txt) and the files beside it.

    `work_dir` receives the Beam outputs (default: `vocab.work/` beside `output`); on Dataflow it
    must be a bucket path the workers can write (gs://...). The output is locked while it is built
    (`vocab.txt.lock`); if vocab.txt, its report, stats or work directory exist, it is refused
    (OutputExistsError) unless `overwrite`, which removes them first: leftover count shards of an
    earlier run would otherwise be summed with the new ones.
    """
    from pipelines.io.stage_output import output_lock, prepare_output_files

    config = config or VocabConfig()
    problems = config.problems()
    if problems:
        raise ValueError("; ".join(problems))
    if not sentences_dir and not text_files:
        raise ValueError("give sentences_dir (labse-clean output) and/or text_files {lang: path}")
    _check_inputs(sentences_dir, text_files)
    paths = side_paths(output)
    if work_dir:
        paths["work"] = work_dir.rstrip("/")
    with output_lock(output):  # before looking at the outputs: two runs never mix
        prepare_output_files([output, paths["report"], paths["png"], paths["stats"], paths["work"]],
                             overwrite=overwrite)
        return _build(output, paths, sentences_dir, text_files, config, beam_args)


def _build(output: str, paths: dict[str, str], sentences_dir: str | None, text_files: Mapping[str, str] | None,
           config: VocabConfig, beam_args: Sequence[str]) -> BuildResult:
    from pipelines.io.stage_output import write_stats_json
    from vocab.report import build_report, write_report
    from vocab.smoothing import language_weights, smoothed_shares

    started = time.perf_counter()
    log.info("counting words with Beam into %s", paths["work"])
    run_counting(paths["work"], sentences_dir=sentences_dir, text_files=text_files, config=config, beam_args=beam_args)
    counted = time.perf_counter()
    tally, heldout = load_work(paths["work"])
    totals = {key[len("words."):]: value for key, value in tally.items() if key.startswith("words.")}
    if not totals:
        raise VocabSizeError(f"no words were counted (tally: {tally}); is the input empty?")
    weights = language_weights(totals, config.smoothing)
    shares = smoothed_shares(totals, config.smoothing)
    words, counts = weighted_counts(paths["work"], weights)
    log.info("learning %d tokens from %d distinct words in %d languages", config.vocab_size, len(words), len(totals))
    result: LearnResult = learn(words, counts, config.learner())
    del words, counts
    write_vocab(result.vocab, output)
    learned = time.perf_counter()
    report = build_report(output, heldout)
    write_report(report, paths["report"], paths["png"])
    stats = {
        "config": asdict(config),
        "tally": tally,
        "languages": {
            lang: {"words": totals[lang], "raw_share": totals[lang] / sum(totals.values()),
                   "smoothed_share": shares[lang], "weight": weights[lang]}
            for lang in sorted(totals, key=lambda l: -totals[l])
        },
        "learner": result.summary(),
        "seconds": {"count": round(counted - started, 1), "learn": round(learned - counted, 1),
                    "report": round(time.perf_counter() - learned, 1)},
        "outputs": {"vocab": output, **paths},
    }
    write_stats_json(paths["stats"], stats)  # the last file: a run without it did not finish
    return BuildResult(output, paths["report"], paths["stats"], report, stats)


def _parse_text_input(value: str) -> tuple[str, str]:
    lang, sep, path = value.partition("=")
    if not sep or not lang or not path:
        raise argparse.ArgumentTypeError(f"--input-text wants LANG=PATH, got {value!r}")
    return lang, path


def build_parser() -> argparse.ArgumentParser:
    defaults = VocabConfig()
    parser = argparse.ArgumentParser(
        prog="labse-vocab",
        description="Learn a cased multilingual WordPiece vocabulary (vocab.txt) from labse-clean output "
        "or plain text files. Unknown options go to Apache Beam (e.g. --runner DataflowRunner).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--input", help="labse-clean's DIR/sentences (hive lang=XX/*.parquet with text, lang)")
    parser.add_argument("--input-text", action="append", type=_parse_text_input, default=[], metavar="LANG=PATH",
                        help="a plain text file or pattern, one sentence per line, of language LANG (repeatable)")
    parser.add_argument("--output", required=True, help="vocab.txt to write; report, stats and work files go beside it")
    parser.add_argument("--work-dir", default=None,
                        help="where Beam writes counts/held-out/tally (default: beside --output); gs://... on Dataflow")
    parser.add_argument("--vocab-size", type=int, default=defaults.vocab_size, help="exact number of tokens")
    parser.add_argument("--smoothing", type=float, default=defaults.smoothing,
                        help="exponent alpha of the language weights p_l ∝ n_l^alpha (1 = raw counts, 0 = uniform)")
    parser.add_argument("--num-unused", type=int, default=defaults.num_unused, help="[unusedN] slots after the reserved tokens")
    parser.add_argument("--char-min-count", type=float, default=defaults.char_min_count,
                        help="a character with at least this weighted count is a token alone and as ##c")
    parser.add_argument("--holdout-rate", type=float, default=defaults.holdout_rate,
                        help="share of sentences held out of counting, for the report")
    parser.add_argument("--heldout-per-language", type=int, default=defaults.heldout_per_language)
    parser.add_argument("--max-token-length", type=int, default=defaults.max_token_length,
                        help="words longer than this (in characters) are not learned from")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace vocab.txt and the files beside it from an earlier run (else they are refused)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, beam_args = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("apache_beam").setLevel(logging.WARNING)  # per-batch statistics drown the progress
    if not args.input and not args.input_text:
        parser.error("give --input DIR/sentences and/or --input-text LANG=PATH")
    config = VocabConfig(
        vocab_size=args.vocab_size, smoothing=args.smoothing, num_unused=args.num_unused,
        char_min_count=args.char_min_count, holdout_rate=args.holdout_rate,
        heldout_per_language=args.heldout_per_language, max_token_length=args.max_token_length,
    )
    problems = config.problems()
    if problems:  # before anything is read
        return usage_error("labse-vocab", "; ".join(problems))
    try:
        result = build(args.output, sentences_dir=args.input, text_files=dict(args.input_text) or None,
                       config=config, beam_args=beam_args, work_dir=args.work_dir, overwrite=args.overwrite)
    except (VocabSizeError, ValueError, OutputExistsError, OutputLockedError) as error:
        return usage_error("labse-vocab", str(error))
    overall = result.report["overall"]
    print(f"wrote {result.vocab_path} ({result.report['vocab_size']} tokens); held-out: "
          f"[UNK] {overall['unk_share']:.4f}, subwords/word {overall['subwords_per_word']:.3f}; "
          f"report {result.report_path}")
    return 0


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
