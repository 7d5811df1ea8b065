"""The cascade in the global layout: two passes of labse-mine, each against indexes of its own
embedder's vectors, so that the strong embedder embeds, indexes and searches only the survivors.

    1. the cheap pass (`labse-mine --cascade-survivors`, `--embedder` the cheap embedder, usually its
       saved vectors, `--src-index`/`--tgt-index` labse-index outputs over those vectors): each
       sentence's k nearest in the other language's index and its best candidate by the cheap ratio
       margin, as global mining finds them; a best-candidate pair whose margin reaches
       `--cascade-loose-margin` makes both its sentences survivors (the cells cascade's rule,
       `pipelines.mine.cascade.survivors`), written to `OUTPUT/lang=XX/part-*.parquet` (text, url,
       doc_id, lang: a sentence input of labse-mine, provenance kept); the others are counted
       `dropped.spared_by_cascade`, and `_stats.json`'s `cascade` section gives the share that
       survives per side;
    2. the strong pass: the strong embedder's vectors of the survivors (one folder per language:
       the union of a language's survivors over its language pairs, embedded once), labse-index over
       them, and labse-mine global with `--src OUTPUT/lang=de --tgt OUTPUT/lang=en` against those
       indexes: margins and the selection are the strong embedder's own among the survivors.

Why two commands and not one: each pass is an ordinary global run whose indexes are built once per
language and reused by every language pair, as stopes does; a single command would have to build the
strong indexes of the survivors inside the mining job. The cheap pass refuses indexes that were
not built from its embedder's vectors (`check_index_matches`), since it would then measure its
margins between two embedders' spaces.
"""
from __future__ import annotations

import dataclasses
import functools

import apache_beam as beam
import numpy as np
import pyarrow as pa

from pipelines.accounting import CountByName, MergeTallies, accounting_section
from pipelines.io.completion import finish_output
from pipelines.io.config_options import UsageError
from pipelines.mine.cascade import SURVIVOR_MARGIN
from pipelines.mine.config import MineConfig
from pipelines.embed.saved_vectors import is_saved_vectors_spec
from pipelines.mine.index_search import searchable
from pipelines.mine.transforms import (FILES, NON_FINITE_VECTOR, SIDE_UNIT, SPARED, SRC, TGT, Embed, Neighbours,
                                       PrepareSide, _keep_finite, _survivor_marks, read_sides)
from pipelines.stage import MAX_LISTED_ERRORS, WriteParquetBatches, WriteParquetShards, write_empty_shard

SURVIVOR_SCHEMA = pa.schema([("text", pa.string()), ("url", pa.string()), ("doc_id", pa.string()),
                             ("lang", pa.string())])
UNITS = (SIDE_UNIT[SRC], SIDE_UNIT[TGT], FILES)
CHECKED_ROWS = 32  # an index's first sentences re-embedded to check that it holds the embedder's vectors
SAME_VECTOR = 0.99  # their cosine to the index's own rows at least this (float16 rows: ~0.9999)


def survivors_folder(output: str, lang: str) -> str:
    """Where the cheap pass writes a language's survivors: labse-clean's `lang=XX` layout."""
    return f"{output.rstrip('/')}/lang={lang}"


# ------------------------------------------------------------------------------ the launcher's check
def check_index_matches(embedder, index_dir: str, manifest, option: str, lang: str) -> None:
    """UsageError (one line) unless the index at `index_dir` is of `lang` and holds `embedder`'s
    vectors: its first sentences, embedded again, must give its own saved rows (or, for an index
    without them, the same width)."""
    from pipelines.embed.base import EmbedderError, l2_normalise
    from pipelines.index.shards import RERANK_SUFFIX
    from pipelines.index.vector_files import MatrixFile, matrix_header, open_file

    if manifest.lang != lang:
        raise UsageError(f"{option} {index_dir} indexes language {manifest.lang!r}, not {lang!r}: give that "
                         "language's index")
    shard = next((s for s in manifest.shards if s["sentences"]), None)
    if shard is None:
        return
    base = f"{index_dir.rstrip('/')}/{shard['name']}"
    with open_file(f"{base}.txt") as handle:  # the first lines only, local or gs://
        texts = [line.decode("utf-8").rstrip("\n") for _, line in zip(range(CHECKED_ROWS), handle)]
    try:
        vectors = np.asarray(embedder.encode(texts), np.float32)
    except EmbedderError as error:
        raise UsageError(f"{option} {index_dir} was not built from --embedder's vectors ({error}): the cheap pass "
                         "searches indexes of the cheap embedder's own vectors (labse-index --vectors over them)") from None
    if vectors.shape[1] != manifest.dim:
        raise UsageError(f"{option} {index_dir} holds {manifest.dim}-dimensional vectors but --embedder gives "
                         f"{vectors.shape[1]}: build the cheap pass's indexes from the cheap embedder's vectors")
    if not manifest.rerank_vectors:
        return
    (count, dim), dtype, offset = matrix_header(f"{base}{RERANK_SUFFIX}")
    rows = MatrixFile(f"{base}{RERANK_SUFFIX}", f"{base}.txt", count, dim, dtype.str, offset).read_rows(
        0, min(len(texts), count))  # one ranged read of the first rows
    rows = l2_normalise(rows)
    agreement = float(np.median(np.sum(rows * vectors, axis=1)))
    if agreement < SAME_VECTOR:
        raise UsageError(f"{option} {index_dir} was not built from --embedder's vectors (its first sentences, "
                         f"embedded again, have a median cosine of {agreement:.2f} to the index's rows): the cheap "
                         "pass searches indexes of the cheap embedder's own vectors")


# ------------------------------------------------------------------------------------- the Beam pass
def _survivor_or_spared(joined):
    """(searchable item, {"item": the input's item, "embedded": a key if its vector was finite, "survives":
    marks}) -> the item on the main output (a survivor) or on `spared`; an item whose vector was not
    finite is neither (it is counted as `non_finite_vector`)."""
    _key, grouped = joined
    items = list(grouped["item"])
    if not items or not any(True for _ in grouped["embedded"]):
        return
    if any(True for _ in grouped["survives"]):
        yield items[0]
    else:
        yield beam.pvalue.TaggedOutput("spared", items[0])


class CheapPass(beam.PTransform):
    """(source records, target records) -> {"survivors": items `(side, group, text, url, doc_id)` in a
    best-candidate pair at the loose margin, "tally": the counts}. `config.embedder` is the cheap
    embedder (a model; its saved vectors go through `PackedCheapPass`) and its indexes are
    `config.src_index` / `config.tgt_index` (global layout)."""

    def __init__(self, config: MineConfig):
        super().__init__()
        # the survivors' margin is the ratio one whatever --margin says (the loose margin's scale)
        self.config = dataclasses.replace(config, margin_kind=SURVIVOR_MARGIN)

    def expand(self, sides):
        src_records, tgt_records = sides
        c = self.config
        src = src_records | "PrepareSrc" >> PrepareSide(SRC, False)
        tgt = tgt_records | "PrepareTgt" >> PrepareSide(TGT, False)
        items = (src["items"], tgt["items"]) | "BothSides" >> beam.Flatten()
        checked = (items
                   | "EmbedCheap" >> Embed(c.embedder, c.batch_size, c.embedder_threads)
                   | "KeepFinite" >> beam.FlatMap(_keep_finite).with_outputs("dropped", main="embedded"))
        searched = checked.embedded | "Searchable" >> beam.Map(lambda e: (searchable(e[0]), e[1]))
        non_finite = checked.dropped
        neighbours = searched | "Neighbours" >> Neighbours(c)
        marks = neighbours["bests"] | "MarkSurvivors" >> beam.FlatMap(_survivor_marks, c.loose_margin)
        split = ({"item": items | "KeyItems" >> beam.Map(lambda i: (searchable(i), i)),
                  "embedded": searched | "EmbeddedKeys" >> beam.Map(lambda e: (e[0], None)),
                  "survives": marks}
                 | "JoinMarks" >> beam.CoGroupByKey()
                 | "Split" >> beam.FlatMap(_survivor_or_spared).with_outputs("spared", main="survivors"))
        src_unit, tgt_unit = SIDE_UNIT[SRC], SIDE_UNIT[TGT]
        tallies = (
            src_records | "CountSrcRead" >> CountByName(lambda _: f"{src_unit}.read"),
            tgt_records | "CountTgtRead" >> CountByName(lambda _: f"{tgt_unit}.read"),
            src["dropped"] | "CountSrcDropped" >> CountByName(lambda r: f"{src_unit}.dropped.{r}"),
            tgt["dropped"] | "CountTgtDropped" >> CountByName(lambda r: f"{tgt_unit}.dropped.{r}"),
            items | "CountUnique" >> CountByName(lambda i: f"{SIDE_UNIT[i[0]]}.unique"),
            non_finite | "CountNonFinite" >> CountByName(
                lambda i: f"{SIDE_UNIT[i[0]]}.dropped.{NON_FINITE_VECTOR}"),
            neighbours["top"] | "CountWithNeighbours" >> CountByName(lambda t: f"{SIDE_UNIT[t[0][0]]}.with_candidates"),
            split.spared | "CountSpared" >> CountByName(lambda i: f"{SIDE_UNIT[i[0]]}.dropped.{SPARED}"),
        )
        return {"survivors": split.survivors, "tally": tallies | "Total" >> MergeTallies()}


def survivor_row(item: tuple, lang: str) -> dict:
    _side, _group, text, url, doc_id = item
    return {"text": text, "url": url, "doc_id": doc_id, "lang": lang}


def write_survivors(output: str, side: str) -> WriteParquetShards:
    """A side's survivor rows -> `OUTPUT/lang=XX/part-*.parquet`; each file tallies its rows as the
    side's sentences kept."""
    return WriteParquetShards(output, SURVIVOR_SCHEMA, shard_key=_text, sort_key=_text,
                              tally_of=functools.partial(_survivors_written, side))


def _text(row: dict) -> str:
    return row["text"]


def _survivors_written(side: str, rows: list[dict]) -> dict:
    return {f"files.written.{side}": 1, f"{SIDE_UNIT[side]}.kept": len(rows)}


def survivors_stats(tally: dict, config: MineConfig) -> dict:
    """_stats.json: the accounting (a side's sentences read = kept, the survivors written, + dropped:
    empty_text, duplicate, non_finite_vector, spared_by_cascade) and the `cascade` section: per side
    the unique sentences, the survivors and their share; the strong embedder will embed `share` of them."""
    stats: dict = {**accounting_section(tally, UNITS), "counts": dict(sorted(tally.items()))}
    section: dict = {"pass": "survivors", "cheap_embedder": config.embedder, "loose_margin": config.loose_margin,
                     "k": config.k, "src_index": config.src_index, "tgt_index": config.tgt_index}
    totals = {"unique": 0, "survivors": 0}
    for side, short, lang in ((SRC, "src", config.src_lang), (TGT, "tgt", config.tgt_lang)):
        unit = SIDE_UNIT[side]
        unique, kept = tally.get(f"{unit}.unique", 0), tally.get(f"{unit}.kept", 0)
        section[short] = {"lang": lang, "unique": unique, "survivors": kept,
                          "spared": tally.get(f"{unit}.dropped.{SPARED}", 0),
                          "with_candidates": tally.get(f"{unit}.with_candidates", 0),
                          "share": round(kept / unique, 4) if unique else 0.0}
        totals["unique"] += unique
        totals["survivors"] += kept
    section.update(totals, share=round(totals["survivors"] / totals["unique"], 4) if totals["unique"] else 0.0)
    stats["cascade"] = section
    stats["config"] = dataclasses.asdict(config)
    return stats


def _finalise(_, tally: dict, errors: list, output: str, config: MineConfig):
    stats = survivors_stats(tally, config)
    stats["errors"] = errors[:MAX_LISTED_ERRORS]
    for side, lang in ((SRC, config.src_lang), (TGT, config.tgt_lang)):
        if not tally.get(f"files.written.{side}"):
            write_empty_shard(survivors_folder(output, lang), SURVIVOR_SCHEMA)  # no survivor: the folder is there
    finish_output(output, stats, stage="labse-mine", shards_in_root=True)  # the last write
    yield stats


class PackedCheapPass(beam.PTransform):
    """`CheapPass` over the cheap embedder's saved vectors (`vectors:DIR`), in packed elements as
    labse-mine's global layout runs (`pipelines.mine.packed_mining`): {"rows": {side: Arrow batches
    of its survivor rows}, "tally": the counts}."""

    def __init__(self, config: MineConfig):
        super().__init__()
        self.config = dataclasses.replace(config, margin_kind=SURVIVOR_MARGIN)

    def expand(self, sides):
        from pipelines.mine.packed_io import PackedSurvivors
        from pipelines.mine.packed_mining import PackedSides
        from pipelines.mine.packed_search import PackedNeighbours

        c = self.config
        read = sides | "Sides" >> PackedSides(c)
        found = read["batches"] | "Neighbours" >> PackedNeighbours(c)
        survivors = ((found["bests"], read["provenance"])
                     | "Survivors" >> PackedSurvivors(c.embedder, c.loose_margin, c.query_batch,
                                                      {SRC: c.src_lang, TGT: c.tgt_lang}, SURVIVOR_SCHEMA))
        tally = (read["tally"], found["tally"], survivors["tally"]) | "Total" >> MergeTallies()
        return {"rows": survivors["rows"], "tally": tally}


def _survivor_batches_written(side: str, rows: int) -> dict:
    return {f"files.written.{side}": 1, f"{SIDE_UNIT[side]}.kept": rows}


def build_survivors_pipeline(pipeline: beam.Pipeline, src: str, tgt: str, output: str, config: MineConfig):
    """Wire read -> CheapPass -> OUTPUT/lang=XX per side -> _stats.json into `pipeline`."""
    output = output.rstrip("/")
    src_read, tgt_read, errors = read_sides(pipeline, src, tgt, config)
    records = (src_read["records"], tgt_read["records"])
    written = []
    if is_saved_vectors_spec(config.embedder):
        passed = records | "CheapPass" >> PackedCheapPass(config)
        for side, lang in ((SRC, config.src_lang), (TGT, config.tgt_lang)):
            written.append(passed["rows"][side]
                           | f"Write{side}" >> WriteParquetBatches(
                               survivors_folder(output, lang), SURVIVOR_SCHEMA, key_columns=("text",),
                               sort_columns=("text",), tally_of=functools.partial(_survivor_batches_written, side)))
    else:
        passed = records | "CheapPass" >> CheapPass(config)
        for side, lang in ((SRC, config.src_lang), (TGT, config.tgt_lang)):
            written.append(passed["survivors"]
                           | f"Side{side}" >> beam.Filter(lambda item, s=side: item[0] == s)
                           | f"Rows{side}" >> beam.Map(survivor_row, lang)
                           | f"Write{side}" >> write_survivors(survivors_folder(output, lang), side))
    tally = (passed["tally"], *written, src_read["tally"], tgt_read["tally"]) | "Tally" >> MergeTallies()
    return (pipeline
            | "Once" >> beam.Create([None])
            | "Stats" >> beam.FlatMap(_finalise, beam.pvalue.AsSingleton(tally), beam.pvalue.AsList(errors),
                                      output, config))


def survivors_summary(stats: dict, seconds: float) -> list[str]:
    """The closing summary's lines of the cheap pass."""
    section = stats["cascade"]
    sides = ", ".join(f"{section[s]['lang']} {section[s]['survivors']:,}/{section[s]['unique']:,}" for s in ("src", "tgt"))
    return [f"{section['survivors']:,} of {section['unique']:,} unique sentences survive the cheap pass "
            f"({section['share']:.1%}; {sides}) at cheap ratio margin >= {section['loose_margin']} with "
            f"{section['cheap_embedder']} in {seconds:.0f} s; the strong pass embeds, indexes and mines only them"]
