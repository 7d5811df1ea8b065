"""pipelines.mine.transforms.Embed: batches decided by the items' content (not by the runner), so
the same input is embedded in the same batches, in the same order, on every run."""
import zlib

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.mine import transforms
from pipelines.mine.transforms import Embed, embedding_batches

BATCHES_SEEN: list[tuple[str, ...]] = []  # what the recording embedder was asked to encode, batch by batch


class _RecordingEmbedder:
    def encode(self, texts, batch_size=256):
        BATCHES_SEEN.append(tuple(texts))
        return np.array([[len(t), 1.0] for t in texts], np.float32)


class _Held:
    embedder = _RecordingEmbedder()


@pytest.fixture
def recording_embedder(monkeypatch):
    monkeypatch.setattr(transforms._EmbedBatch, "setup", lambda self: setattr(self, "_held", _Held()))
    BATCHES_SEEN.clear()
    yield BATCHES_SEEN
    BATCHES_SEEN.clear()


def test_embedding_batches_holds_about_batch_size_items_each():
    assert [embedding_batches(n, 4) for n in (0, 1, 4, 5, 8, 9)] == [1, 1, 1, 2, 2, 3]


def _embed(items) -> list[tuple[str, ...]]:
    BATCHES_SEEN.clear()
    with beam.Pipeline(options=PipelineOptions(["--direct_num_workers", "1"])) as pipeline:
        _ = pipeline | beam.Create(items, reshuffle=False) | Embed("unused", batch_size=4)
    return sorted(BATCHES_SEEN)


def test_the_same_items_in_any_order_are_embedded_in_the_same_batches(recording_embedder):
    texts = [f"Satz Nummer {i}." for i in range(10)]
    items = [("", str(i), text) for i, text in enumerate(texts)]
    first, reversed_order = _embed(items), _embed(items[::-1])
    assert first == reversed_order
    assert sorted(t for batch in first for t in batch) == sorted(texts)  # each text once
    n = embedding_batches(len(items), 4)
    for batch in first:  # a text's batch is crc32(text) % n, the key no runner can change
        assert len({zlib.crc32(t.encode("utf-8")) % n for t in batch}) == 1
        assert list(batch) == sorted(batch, key=lambda t: items[texts.index(t)])  # in item order


def test_a_batch_is_encoded_in_item_order_whatever_order_it_arrives_in(recording_embedder):
    step = transforms._EmbedBatch("unused", batch_size=4, threads=1)
    step.setup()
    items = [("", "b", "zwei"), ("", "a", "eins"), ("", "c", "drei")]
    out = list(step.process((0, items))) + list(step.process((0, items[::-1])))
    assert BATCHES_SEEN == [("eins", "zwei", "drei")] * 2
    assert [item for item, _ in out[:3]] == [item for item, _ in out[3:]] == sorted(items)
    assert all(vector.dtype == np.float32 for _, vector in out)
