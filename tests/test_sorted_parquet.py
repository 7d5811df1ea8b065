"""`write_sorted_parquet`, the batch writer's external merge sort: a file spilled into several sorted
runs comes out with the rows and order of one in-memory sort (ties, non-ASCII text, arrival order of
rows equal on every orderable column), the spill files are removed, a failure leaves nothing at
the destination, and an object store gets the same file."""
import os
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.io import sorted_parquet, storage
from pipelines.io.sorted_parquet import sort_keys, write_sorted_parquet

SCHEMA = pa.schema([("text", pa.string()), ("other", pa.string()), ("score", pa.float32()),
                    ("arrival", pa.list_(pa.int64()))])  # nested: not orderable, so it shows arrival order
TEXTS = ["zebra", "Zebra", "été", "ete", "日本語", "日本", "😀", "", "naïve", "naive", "straße", "strasse", "Ωmega", "a\tb"]
ROWS = 600


def _rows():
    """Many ties on `text`, some on (text, other), and some rows equal on every orderable column."""
    return [{"text": TEXTS[(i * 7) % len(TEXTS)], "other": ["b", "a", "ä"][i % 3] if i % 5 else "a",
             "score": float((i * 13) % 4), "arrival": [i]} for i in range(ROWS)]


def _batches(rows, size=37):
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    return table.to_batches(max_chunksize=size)


@pytest.fixture
def spill_root(tmp_path, monkeypatch):
    """tempfile's folder for this test, so that the spill files can be looked for afterwards."""
    root = tmp_path / "spill"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


@pytest.fixture
def runs(monkeypatch):
    """The run files spilled, in order."""
    spilled = []
    spill = sorted_parquet._spill

    def counting(table, path):
        spilled.append(path)
        return spill(table, path)

    monkeypatch.setattr(sorted_parquet, "_spill", counting)
    return spilled


@pytest.mark.parametrize("run_bytes", [1024, 4096])
def test_spilled_runs_merge_into_the_one_sort_order(tmp_path, spill_root, runs, run_bytes):
    rows = _rows()
    batches = _batches(rows)
    whole = pa.Table.from_batches(batches).sort_by(sort_keys(SCHEMA, ("text",)))
    written = write_sorted_parquet(iter(batches), str(tmp_path / "out.parquet"), SCHEMA, ("text",), run_bytes=run_bytes)
    assert len(runs) >= 4
    got = pq.read_table(tmp_path / "out.parquet")
    assert written == ROWS and got.schema.equals(SCHEMA) and got.equals(whole)
    # the order independently: UTF-8 byte order of the text (= code point order), then the other
    # columns, then arrival; rows tie on text and on all orderable columns
    expected = sorted(rows, key=lambda r: (r["text"].encode("utf-8"), r["other"].encode("utf-8"), r["score"],
                                           r["arrival"]))
    assert got.to_pylist() == expected
    assert len({r["text"] for r in rows}) < ROWS // 10
    assert len({(r["text"], r["other"], r["score"]) for r in rows}) < ROWS // 2
    assert os.listdir(spill_root) == []


def test_the_merge_writes_row_groups_of_its_own_size_not_the_runs(tmp_path, spill_root, runs, monkeypatch):
    """The Parquet writer holds a row group until it ends: the merge's groups are about
    ROW_GROUP_BYTES however large the runs, and the file is the same one sort."""
    batches = _batches(_rows())
    whole = pa.Table.from_batches(batches).sort_by(sort_keys(SCHEMA, ("text",)))
    sizes = {}
    for group_bytes in (1 << 30, 2048):
        monkeypatch.setattr(sorted_parquet, "ROW_GROUP_BYTES", group_bytes)
        out = tmp_path / f"{group_bytes}.parquet"
        write_sorted_parquet(iter(batches), str(out), SCHEMA, ("text",), run_bytes=8192)
        assert pq.read_table(out).equals(whole)
        sizes[group_bytes] = pq.ParquetFile(out).num_row_groups
    assert len(runs) >= 4 and sizes[1 << 30] < sizes[2048], sizes


def test_a_file_that_fits_one_run_is_not_spilled(tmp_path, spill_root, runs):
    batches = _batches(_rows())
    path = tmp_path / "out.parquet"
    assert write_sorted_parquet(iter(batches), str(path), SCHEMA, ("text", "other")) == ROWS
    assert runs == []
    assert pq.read_table(path).equals(pa.Table.from_batches(batches).sort_by(sort_keys(SCHEMA, ("text", "other"))))


def test_no_rows_give_an_empty_file_with_the_schema(tmp_path):
    path = tmp_path / "out.parquet"
    assert write_sorted_parquet(iter([]), str(path), SCHEMA, ("text",)) == 0
    assert pq.read_table(path).schema.equals(SCHEMA) and pq.read_table(path).num_rows == 0


def test_a_failed_merge_leaves_nothing_at_the_destination_and_no_spill(tmp_path, spill_root, runs, monkeypatch):
    row_groups = sorted_parquet._row_groups

    def failing(tables, group_bytes):
        groups = row_groups(tables, group_bytes)
        yield next(groups)
        raise OSError("disk full")

    monkeypatch.setattr(sorted_parquet, "_row_groups", failing)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(OSError, match="disk full"):
        write_sorted_parquet(iter(_batches(_rows())), str(out / "part.parquet"), SCHEMA, ("text",), run_bytes=1024)
    assert len(runs) >= 4
    assert os.listdir(out) == [] and os.listdir(spill_root) == []


def test_an_object_store_gets_the_same_file(tmp_path, spill_root):
    batches = _batches(_rows())
    url = "memory://bucket/sorted/part-00000-of-00001.parquet"
    write_sorted_parquet(iter(batches), url, SCHEMA, ("text",), run_bytes=1024)
    local = tmp_path / "part.parquet"
    storage.download(url, local)
    assert pq.read_table(local).equals(pa.Table.from_batches(batches).sort_by(sort_keys(SCHEMA, ("text",))))
    assert os.listdir(spill_root) == []
    storage.remove(url)


def test_a_sort_column_outside_the_schema_is_refused():
    with pytest.raises(ValueError, match="missing"):
        sort_keys(SCHEMA, ("missing",))


def test_nulls_nan_and_signed_zeros_in_the_first_sort_column_merge_as_arrow_sorts_them(tmp_path, spill_root, runs):
    values = [float("nan"), None, -0.0, 0.0, 1.5, float("-inf"), float("inf"), -2.0]
    schema = pa.schema([("score", pa.float32()), ("text", pa.string()), ("arrival", pa.list_(pa.int64()))])
    rows = [{"score": values[(i * 5) % len(values)], "text": TEXTS[i % 3], "arrival": [i]} for i in range(400)]
    batches = pa.Table.from_pylist(rows, schema=schema).to_batches(max_chunksize=23)
    write_sorted_parquet(iter(batches), str(tmp_path / "out.parquet"), schema, ("score",), run_bytes=512)
    assert len(runs) >= 4
    got, expected = pq.read_table(tmp_path / "out.parquet"), pa.Table.from_batches(batches).sort_by(sort_keys(schema, ("score",)))
    assert got.schema.equals(expected.schema)
    assert repr(got.to_pylist()) == repr(expected.to_pylist())  # repr: NaN is not equal to itself; -0.0 shows its sign
