"""labse-mine's cascade in Beam (`--cheap-embedder`): the steps of `pipelines.mine.cascade`.

In each (block, shard) cell the cheap embedder embeds the cell's sentences and finds each one's
`cascade_candidates` nearest in the other side (a static model embeds tens of thousands of
sentences per CPU-second, so embedding a sentence again in each cell it is copied to costs less
than shuffling its cheap vector there); the candidate lists are merged over the cells; each
candidate pair then meets both sentences' vectors from `--embedder`, and its cosine in that space
is the hit that labse-mine's margins and selection (`Neighbours`, `SelectPairs`) go on with.
Here `--embedder` still embeds every sentence (what it saves is the search in its space); the
library's `loose_margin`, which spares the strong embedder the sentences without a promising cheap
candidate, has no labse-mine option yet.
"""
from __future__ import annotations

import apache_beam as beam
import numpy as np

from pipelines.mine.cascade import centred
from pipelines.mine.config import MineConfig
from pipelines.mine.search import SearchConfig, knn
from pipelines.mine.transforms import COUNTER_NAMESPACE, SRC, TGT, _top_key, held_embedder


class _CheapCellCandidates(beam.DoFn):
    """One cell: its sentences embedded by the cheap embedder (each side centred on the cell's
    mean, a sample of the side's), each one's nearest in the other side."""

    def __init__(self, spec: str, candidates: int, search: str, batch_size: int, threads: int, center: bool):
        from apache_beam.utils.shared import Shared

        self.spec, self.candidates, self.search, self.center = spec, candidates, search, center
        self.batch_size, self.threads = batch_size, threads
        self._shared = Shared()
        self.cells = beam.metrics.Metrics.counter(COUNTER_NAMESPACE, "cascade.cells_searched")

    def setup(self):
        self._held = held_embedder(self._shared, self.spec, self.threads)  # held: Shared keeps a weak reference

    def process(self, keyed):
        _, members = keyed
        items = sorted(item for item, _vector in members)  # item order: the same hits on every runner
        src = [item for item in items if item[0] == SRC]
        tgt = [item for item in items if item[0] == TGT]
        if not src or not tgt:
            return
        self.cells.inc()
        encode = self._held.embedder.encode
        x = np.asarray(encode([item[2] for item in src], batch_size=self.batch_size), np.float32)
        y = np.asarray(encode([item[2] for item in tgt], batch_size=self.batch_size), np.float32)
        if self.center:
            x, y = centred(x), centred(y)
        config = SearchConfig(method=self.search)
        for queries, base, q_items, b_items in ((x, y, src, tgt), (y, x, tgt, src)):
            sims, ids = knn(queries, base, self.candidates, config)
            for row, item in enumerate(q_items):
                for sim, j in zip(sims[row], ids[row]):
                    if j >= 0 and np.isfinite(sim):
                        yield item, (float(sim), b_items[j])


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


class CascadeHits(beam.PTransform):
    """(cells of (item, strong vector), the (item, strong vector) pairs) -> hits (item, (strong
    cosine, candidate item)) for each sentence's cheap candidates."""

    def __init__(self, config: MineConfig):
        super().__init__()
        self.config = config

    def expand(self, inputs):
        cells, embedded = inputs
        c = self.config
        top = (cells
               | "GroupCells" >> beam.GroupByKey()
               | "CheapCandidates" >> beam.ParDo(_CheapCellCandidates(c.cheap_embedder, c.cascade_candidates, c.search,
                                                                      c.batch_size, c.embedder_threads,
                                                                      c.cascade_center))
               | "MergeCandidates" >> beam.combiners.Top.PerKey(c.cascade_candidates, key=_top_key))
        asks = top | "AskCandidates" >> beam.FlatMap(_ask_candidates)
        answers = ({"vector": embedded, "askers": asks}
                   | "JoinCandidates" >> beam.CoGroupByKey()
                   | "SendVectors" >> beam.FlatMap(_send_vector))
        return ({"vector": embedded, "candidates": answers}
                | "JoinAskers" >> beam.CoGroupByKey()
                | "StrongCosines" >> beam.FlatMap(_strong_hits))
