"""Global mining's ends in packed elements (`pipelines.mine.packed`): the input sentences become
store ids by range key, and the selected pairs get their sentences and provenance back.

`PackedSentences` (one side): records -> each sentence's store id (`SavedVectorsEmbedder.locate`,
`LOCATE_BATCH` at a time, in the worker that read them) -> by range key: the same sentence from
several records is one (the smallest (url, doc_id) kept, as `PrepareSide` keeps it, the others
counted `duplicate`), and a sentence whose saved row is not finite is dropped
(`non_finite_vector`). Outputs the range's ids (the query batches of `PackedNeighbours`) and its
provenance (ids, url, doc_id), which stays by range key until a pair or a survivor needs it.

`PackedPairRows`: selected pairs (store ids) -> joined with the source side's provenance by the
source's range key, then with the target's by the target's -> Arrow record batches of labse-mine's
rows, the texts read from the store (each sentence's normalised text: the mined key). Each side's
provenance is its own PCollection from `PackedSentences` to its join (and the cascade's): no
Flatten of both sides writes it to the runner again, and no join reads the other side's.

`PackedSurvivors` (the global cascade's cheap pass): the best candidates at the loose margin ->
survivor rows per side, the other sentences counted `spared_by_cascade`.
"""
from __future__ import annotations

import apache_beam as beam
import numpy as np
import pyarrow as pa

from pipelines.io.parquet import release_freed_memory
from pipelines.mine.packed import (SRC, TGT, Packed, among, concat, references, split_by_column, split_by_range,
                                   store_ids)
from pipelines.mine.units import DUPLICATE, EMPTY_TEXT, NON_FINITE_VECTOR, SIDE_UNIT, SPARED

LOCATE_BATCH = 4_096  # records whose sentences are looked up in the store together


def _windowed(element):
    from apache_beam.transforms.window import GlobalWindow
    from apache_beam.utils.windowed_value import WindowedValue

    return WindowedValue(element, GlobalWindow().max_timestamp(), [GlobalWindow()])


class _HeldStore(beam.DoFn):
    """A DoFn that holds the `vectors:DIR` store `spec` (once per worker process, `Shared`)."""

    def __init__(self, spec: str):
        from apache_beam.utils.shared import Shared

        self.spec = spec
        self._shared = Shared()

    def setup(self):
        from pipelines.embed.embedders import held_embedder
        from pipelines.mine.index_search import return_freed_memory

        return_freed_memory()
        self._held = held_embedder(self._shared, self.spec, 1)

    @property
    def store(self):
        return self._held.embedder


class _LocateRecords(_HeldStore):
    """Records of one side -> ((side, file, block), Packed ids/url/doc_id) per range key, a bundle's
    records `LOCATE_BATCH` at a time; the tally of empty texts on the `tally` output."""

    def __init__(self, side: str, spec: str, query_batch: int):
        super().__init__(spec)
        self.side, self.query_batch = side, query_batch

    def start_bundle(self):
        self._texts, self._urls, self._docs = [], [], []
        self._empty = 0

    def process(self, record):
        text = record.get("text")
        if not isinstance(text, str) or not text.strip():
            self._empty += 1
            return
        self._texts.append(text)  # `locate` files it under its normalised key
        self._urls.append(str(record.get("url") or ""))
        self._docs.append(str(record.get("doc_id") or ""))
        if len(self._texts) >= LOCATE_BATCH:
            yield from self._flush()

    def finish_bundle(self):
        for element in self._flush():
            yield _windowed(element)
        if self._empty:
            yield beam.pvalue.TaggedOutput("tally", _windowed({f"{SIDE_UNIT[self.side]}.dropped.{EMPTY_TEXT}": self._empty}))
            self._empty = 0

    def _flush(self):
        if not self._texts:
            return
        ids = store_ids(self.store.locate(self._texts))
        urls, docs = np.array(self._urls, dtype=object), np.array(self._docs, dtype=object)
        self._texts, self._urls, self._docs = [], [], []
        yield from split_by_range(self.side, ids, self.query_batch, url=urls, doc_id=docs)


class _UniqueInRange(_HeldStore):
    """A range key's located records -> its unique sentences: ids on the main output (finite rows
    only), (ids, url, doc_id) on `provenance`, the counts on `tally`."""

    def process(self, keyed):
        key, parts = keyed
        records = concat(parts)
        order = np.lexsort((records["doc_id"], records["url"], records["ids"]))  # by id, then (url, doc_id)
        ids = records["ids"][order]
        first = np.concatenate([[True], ids[1:] != ids[:-1]])
        unique = order[first]
        ids = records["ids"][unique]
        finite = np.isfinite(self.store.read_located(references(ids))).all(axis=1)
        unit = SIDE_UNIT[key[0]]
        counts = {f"{unit}.dropped.{DUPLICATE}": int(len(order) - len(unique)), f"{unit}.unique": int(len(unique)),
                  f"{unit}.dropped.{NON_FINITE_VECTOR}": int((~finite).sum())}
        yield beam.pvalue.TaggedOutput("tally", {name: n for name, n in counts.items() if n})  # as CountByName: no zeros
        if finite.any():
            kept = unique[finite]
            yield key, {"ids": records["ids"][kept]}
            yield beam.pvalue.TaggedOutput("provenance", (key, {"ids": records["ids"][kept], "url": records["url"][kept],
                                                                "doc_id": records["doc_id"][kept]}))


class PackedSentences(beam.PTransform):
    """One side's records -> {"batches": ((side, file, block), {"ids"}) of its unique sentences with
    a finite saved row (sorted ids), "provenance": ((side, file, block), {"ids", "url", "doc_id"}),
    "tally": dicts of `dropped.empty_text`, `dropped.duplicate`, `unique`, `dropped.non_finite_vector`}."""

    def __init__(self, side: str, spec: str, query_batch: int):
        super().__init__()
        self.side, self.spec, self.query_batch = side, spec, query_batch

    def expand(self, records):
        located = records | "Locate" >> beam.ParDo(_LocateRecords(self.side, self.spec, self.query_batch)).with_outputs(
            "tally", main="located")
        unique = (located.located
                  | "GroupRange" >> beam.GroupByKey()
                  | "Unique" >> beam.ParDo(_UniqueInRange(self.spec)).with_outputs("provenance", "tally", main="batches"))
        tally = (located.tally, unique.tally) | "Tallies" >> beam.Flatten()
        return {"batches": unique.batches, "provenance": unique.provenance, "tally": tally}


def kept_tally(keyed) -> dict:
    """A range's batch -> its sentences counted as the side's `kept` (searched)."""
    (side, _file, _block), packed = keyed
    return {f"{SIDE_UNIT[side]}.kept": int(len(packed["ids"]))}


# ------------------------------------------------------------------------------------ provenance
def _provenance_of(ids: np.ndarray, provenance: Packed, key) -> tuple[np.ndarray, np.ndarray]:
    """url and doc_id of `ids` (all among `provenance`'s, which are sorted)."""
    at = np.searchsorted(provenance["ids"], ids)
    if (at >= len(provenance["ids"])).any() or (provenance["ids"][np.minimum(at, len(provenance["ids"]) - 1)] != ids).any():
        raise ValueError(f"a selected sentence of range {key} is not among the range's input sentences")
    return provenance["url"][at], provenance["doc_id"][at]


def _join_side(joined, side: str, column: str):
    """(range key, {"pairs": ..., "provenance": ...}) -> the pairs with `column`'s url and doc_id."""
    key, grouped = joined
    pairs = concat(grouped["pairs"])
    if not pairs:
        return
    provenance = concat(grouped["provenance"])
    if not provenance:
        raise ValueError(f"the selected sentences of range {key} have no provenance: not in the input")
    urls, docs = _provenance_of(pairs[column], provenance, key)
    prefix = "src" if side == SRC else "tgt"
    yield dict(pairs, **{f"{prefix}_url": urls, f"{prefix}_doc_id": docs})


class _PairRows(_HeldStore):
    """Pairs with both sides' provenance -> one Arrow record batch of labse-mine's rows."""

    def __init__(self, spec: str, src_lang: str, tgt_lang: str, schema: pa.Schema):
        super().__init__(spec)
        self.src_lang, self.tgt_lang, self.schema = src_lang, tgt_lang, schema

    def process(self, pairs: Packed):
        n = len(pairs["src"])
        columns = {"src": self.store.sentences(references(pairs["src"])),
                   "tgt": self.store.sentences(references(pairs["tgt"])),
                   "src_lang": [self.src_lang] * n, "tgt_lang": [self.tgt_lang] * n,
                   "cosine": pairs["cosine"].astype(np.float32), "margin": pairs["margin"].astype(np.float32),
                   "src_url": pairs["src_url"].tolist(), "src_doc_id": pairs["src_doc_id"].tolist(),
                   "tgt_url": pairs["tgt_url"].tolist(), "tgt_doc_id": pairs["tgt_doc_id"].tolist()}
        yield pa.record_batch([pa.array(columns[f.name], f.type) for f in self.schema], schema=self.schema)

    def finish_bundle(self):
        release_freed_memory()


class PackedPairRows(beam.PTransform):
    """(selected pairs: Packed {src, tgt, margin, cosine}, {SRC: the source side's provenance by
    range key, TGT: the target's}) -> Arrow record batches of `schema` (labse-mine's pair rows).
    Each side's provenance goes to its own join only: it is the largest input of both."""

    def __init__(self, spec: str, src_lang: str, tgt_lang: str, query_batch: int, schema: pa.Schema):
        super().__init__()
        self.spec, self.src_lang, self.tgt_lang, self.query_batch, self.schema = spec, src_lang, tgt_lang, query_batch, schema

    def expand(self, pcolls):
        pairs, provenance = pcolls
        qb = self.query_batch
        for side, column in ((SRC, "src"), (TGT, "tgt")):
            pairs = ({"pairs": pairs | f"By{column}Range" >> beam.FlatMap(split_by_column, side, column, qb),
                      "provenance": provenance[side]}
                     | f"Join{column}" >> beam.CoGroupByKey()
                     | f"Put{column}" >> beam.FlatMap(_join_side, side, column))
        return pairs | "Rows" >> beam.ParDo(_PairRows(self.spec, self.src_lang, self.tgt_lang, self.schema))


# ------------------------------------------------------------------------------------ survivors
def _survivor_marks(keyed, side: str, loose_margin: float, query_batch: int):
    """(range key, best candidates) -> (range key on `side`, {"ids"}) of `side`'s sentence of each
    one at the loose margin."""
    _key, bests = keyed
    if not bests or not len(bests["margin"]):
        return
    column = "src" if side == SRC else "tgt"
    yield from split_by_range(side, bests[column][bests["margin"] >= loose_margin], query_batch)


class _SurvivorRows(_HeldStore):
    """(range key of one side, {"provenance", "marks"}) -> the range's survivors as an Arrow record
    batch of (text, url, doc_id, lang) on the main output; the count spared on `tally`."""

    def __init__(self, spec: str, lang: str, schema: pa.Schema):
        super().__init__(spec)
        self.lang, self.schema = lang, schema

    def process(self, joined):
        key, grouped = joined
        provenance = concat(grouped["provenance"])
        if not provenance:
            return
        survives = among(provenance["ids"], concat(grouped["marks"]))
        spared = int((~survives).sum())
        if spared:
            yield beam.pvalue.TaggedOutput("tally", {f"{SIDE_UNIT[key[0]]}.dropped.{SPARED}": spared})
        if survives.any():
            ids = provenance["ids"][survives]
            columns = {"text": self.store.sentences(references(ids)), "url": provenance["url"][survives].tolist(),
                       "doc_id": provenance["doc_id"][survives].tolist(), "lang": [self.lang] * len(ids)}
            yield pa.record_batch([pa.array(columns[f.name], f.type) for f in self.schema], schema=self.schema)

    def finish_bundle(self):
        release_freed_memory()


class PackedSurvivors(beam.PTransform):
    """(best candidates keyed by range key, {SRC: the source side's provenance by range key, TGT: the
    target's}) -> {"rows": {side: Arrow batches of its survivor rows}, "tally": the sentences spared
    by side}: the survivors are both sentences of every best candidate pair whose margin reaches
    `loose_margin` (`pipelines.mine.cascade.survivors`' rule). Each side is joined and written on
    its own: its provenance and its rows are never flattened with the other side's."""

    def __init__(self, spec: str, loose_margin: float, query_batch: int, langs: dict, schema: pa.Schema):
        super().__init__()
        self.spec, self.loose_margin, self.query_batch, self.langs, self.schema = spec, loose_margin, query_batch, langs, schema

    def expand(self, pcolls):
        bests, provenance = pcolls
        rows, tallies = {}, []
        for side in (SRC, TGT):
            name = "Src" if side == SRC else "Tgt"
            marks = bests | f"Marks{name}" >> beam.FlatMap(_survivor_marks, side, self.loose_margin, self.query_batch)
            split = ({"provenance": provenance[side], "marks": marks}
                     | f"JoinMarks{name}" >> beam.CoGroupByKey()
                     | f"Survivors{name}" >> beam.ParDo(
                         _SurvivorRows(self.spec, self.langs[side], self.schema)).with_outputs("tally", main="rows"))
            rows[side] = split.rows
            tallies.append(split.tally)
        return {"rows": rows, "tally": tuple(tallies) | "Tallies" >> beam.Flatten()}
