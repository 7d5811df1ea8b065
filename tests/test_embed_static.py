"""The static embedder directory: the project's loader and sentence-transformers give the same vectors."""
from __future__ import annotations

import json

import numpy as np
import pytest

from model_helpers import build_vocab, read_multi30k
from pipelines.embed.static import (METADATA_FILE, StaticEmbedder, StaticEmbedderError, StaticMetadata,
                                    read_table, save_static_embedder)
from pipelines.text.wordpiece import TFTextTokenizer


@pytest.fixture(scope="module")
def static_dir(labse_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("static")
    vocab = build_vocab(labse_data, root / "vocab", vocab_size=1500, lines_per_lang=400, udhr=("rus",))
    size = sum(1 for _ in open(vocab, encoding="utf-8"))
    rng = np.random.default_rng(0)
    embeddings = rng.standard_normal((size, 24)).astype(np.float32)
    weights = rng.uniform(0.1, 1.0, size).astype(np.float32)
    meta = StaticMetadata(dims=0, vocab_size=0, teacher="test", languages=["de", "en", "ru"], weighting="random")
    return save_static_embedder(root / "model", vocab, embeddings, weights, meta), vocab, embeddings, weights


def sentences(labse_data) -> list[str]:
    return (read_multi30k(labse_data, "val", "de", 20) + read_multi30k(labse_data, "val", "en", 20)
            + ["", "Всеобщая декларация прав человека", "   ", "ein [MASK] Wort"])


def test_loader_is_the_weighted_mean_of_wordpiece_rows(static_dir, labse_data):
    directory, vocab, embeddings, weights = static_dir
    texts = sentences(labse_data)
    got = StaticEmbedder(directory).encode(texts)
    ids = TFTextTokenizer(vocab).tokenize_ids(texts)  # the project's WordPiece (TF Text), same ids
    table = embeddings.astype(np.float16).astype(np.float32) * weights[:, None]
    assert ids == StaticEmbedder(directory).token_ids(texts)  # tokenizer.json keeps TF Text's ids, [MASK] too
    for row, token_ids in zip(got, ids):
        if not token_ids:
            assert not row.any()
            continue
        expected = table[token_ids].sum(axis=0)
        np.testing.assert_allclose(row, expected / np.linalg.norm(expected), atol=3e-3)
    assert got.dtype == np.float32 and got.shape == (len(texts), 24)


def test_sentence_transformers_loads_the_same_model(static_dir, labse_data):
    from sentence_transformers import SentenceTransformer

    directory = static_dir[0]
    texts = [t for t in sentences(labse_data) if t.strip()]
    ours = StaticEmbedder(directory).encode(texts)
    theirs = SentenceTransformer(str(directory), device="cpu").encode(texts, convert_to_numpy=True)
    np.testing.assert_allclose(np.asarray(theirs, np.float32), ours, atol=3e-3)
    assert np.abs((np.asarray(theirs, np.float32) * ours).sum(axis=1) - 1).max() < 1e-3


def test_directory_contents_and_metadata(static_dir):
    directory = static_dir[0]
    embeddings, weights = read_table(directory)
    assert embeddings.dtype == np.float16 and weights.dtype == np.float32
    meta = json.loads((directory / METADATA_FILE).read_text())
    assert meta["format"] == "labse-static-embedder" and meta["dims"] == 24
    assert meta["vocab_size"] == embeddings.shape[0] and meta["languages"] == ["de", "en", "ru"]


def test_damaged_directory_is_a_one_line_error(static_dir, tmp_path):
    with pytest.raises(StaticEmbedderError, match="no static_embedder.json"):
        StaticEmbedder(tmp_path)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / METADATA_FILE).write_text(json.dumps({"format": "labse-static-embedder", "dims": 2, "vocab_size": 2}))
    (broken / "model.safetensors").write_bytes(b"not a table")
    with pytest.raises(StaticEmbedderError, match="not a readable safetensors"):
        StaticEmbedder(broken)
