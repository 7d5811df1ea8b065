"""labse-mine's global layout over `vectors:DIR` in packed elements (`pipelines.mine.packed`), end to end.

    records of each side --PackedSentences--> query batches (store ids by range key) + the side's provenance
    query batches --PackedNeighbours--> best candidates (the index searches, kNN means, margins)
    best candidates --PackedSelect--> selected pairs (the strategy, then --min-margin)
    selected pairs + each side's provenance --PackedPairRows--> Arrow batches of the pair rows --> part-*.parquet

Every step's elements are columns for one range key (or the run's candidates for `max`), so a worker
holds a query batch, an index shard and a range's columns, not a share of the input's sentences.
The counts are the same as `MineBitext`'s (README contract 11).

Each side's provenance (ids, url, doc_id: the largest columns) stays its own PCollection up to the
one join that reads it: a Flatten of both sides would be one more write of it to the runner (the
DirectRunner materialises every Flatten), and each join would read both sides to keep one.
"""
from __future__ import annotations

import apache_beam as beam

from pipelines.accounting import CountByName, MergeTallies
from pipelines.mine.config import MineConfig
from pipelines.mine.packed import SRC, TGT, rows_of
from pipelines.mine.packed_io import PackedPairRows, PackedSentences, kept_tally
from pipelines.mine.packed_search import PackedNeighbours, PackedSelect
from pipelines.mine.transforms import PAIR_SCHEMA, wire_mining
from pipelines.mine.units import CANDIDATES, SIDE_UNIT
from pipelines.stage import WriteParquetBatches


def packed_mining(config: MineConfig) -> bool:
    """Whether labse-mine runs this path: the global layout with the vectors the indexes were built from."""
    from pipelines.embed.saved_vectors import is_saved_vectors_spec

    return config.resolved_layout == "global" and is_saved_vectors_spec(config.embedder)


class PackedSides(beam.PTransform):
    """(source records, target records) -> {"batches": both sides' query batches, "provenance":
    {SRC: the source's, TGT: the target's}, "tally"} (`PackedSentences`), with the records read counted."""

    def __init__(self, config: MineConfig):
        super().__init__()
        self.config = config

    def expand(self, sides):
        c = self.config
        batches, provenance, tallies = [], {}, []
        for side, records in zip((SRC, TGT), sides):
            name = "Src" if side == SRC else "Tgt"
            packed = records | f"Packed{name}" >> PackedSentences(side, c.embedder, c.query_batch)
            batches.append(packed["batches"])
            provenance[side] = packed["provenance"]
            tallies += [packed["tally"],
                        records | f"Count{name}Read" >> CountByName(lambda _, u=SIDE_UNIT[side]: f"{u}.read")]
        return {"batches": tuple(batches) | "BothBatches" >> beam.Flatten(), "provenance": provenance,
                "tally": tuple(tallies) | "SidesTally" >> MergeTallies()}


class PackedGlobalMining(beam.PTransform):
    """(source records, target records) -> {"pairs": {"batches": Arrow record batches of the pair
    rows (`PAIR_SCHEMA`), "rows": their number}, "tally": the counts}: `MineBitext` for the global
    layout over `vectors:DIR` (`WriteParquetBatches` takes "pairs" as it is)."""

    def __init__(self, config: MineConfig):
        super().__init__()
        self.config = config

    def expand(self, sides):
        c = self.config
        read = sides | "Sides" >> PackedSides(c)
        kept = read["batches"] | "CountKept" >> beam.Map(kept_tally)
        found = read["batches"] | "Neighbours" >> PackedNeighbours(c)
        selected = found["bests"] | "Select" >> PackedSelect(c.strategy, c.min_margin, query_batch=c.query_batch)
        rows = ((selected["pairs"], read["provenance"])
                | "Rows" >> PackedPairRows(c.embedder, c.src_lang, c.tgt_lang, c.query_batch, PAIR_SCHEMA))
        # one row a selected pair: counted here, the rows (their texts) go straight to the writer's files
        count = (selected["pairs"]
                 | "PairsInBatch" >> beam.Map(rows_of)
                 | "CountPairs" >> beam.CombineGlobally(sum))
        tally = (read["tally"], kept, found["tally"], selected["tally"]) | "Total" >> MergeTallies()
        return {"pairs": {"batches": rows, "rows": count}, "tally": tally}


def _pair_batches_written(rows: int) -> dict:
    return {"files.written": 1, f"{CANDIDATES}.kept": rows}


def write_pair_batches(output: str) -> WriteParquetBatches:
    """`transforms.write_pairs` for Arrow record batches of pair rows: the same files; one tally per file."""
    return WriteParquetBatches(output, PAIR_SCHEMA, key_columns=("src", "tgt"), sort_columns=("src", "tgt"),
                               tally_of=_pair_batches_written)


def build_packed_pipeline(pipeline: beam.Pipeline, src: str, tgt: str, output: str, config: MineConfig):
    """`transforms.build_pipeline` for the global layout over `vectors:DIR`: read -> PackedGlobalMining
    -> write -> stats.json."""
    return wire_mining(pipeline, src, tgt, output, config, PackedGlobalMining(config),
                       write_pair_batches(output.rstrip("/")))
