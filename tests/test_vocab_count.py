"""vocab.count (Beam) and labse-vocab end to end on small real inputs (Parquet + text)."""
import gzip
import json
import os
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import require_file
from pipelines.io.completion import mark_complete
from pipelines.io.locks import output_lock
from vocab.count import count_batch, is_heldout, parse_count
from pipelines.text.pretokenize import pretokenize
from pipelines.text.wordpiece import SPECIAL_TOKENS, load_vocab


def multi30k_lines(root, lang, n):
    with gzip.open(require_file(root, f"multi30k/train.{lang}.gz"), "rt", encoding="utf-8") as handle:
        return [next(handle).rstrip("\n") for _ in range(n)]


def test_count_batch_accounts_for_every_sentence(labse_data):
    rows = [("de", s) for s in multi30k_lines(labse_data, "de", 200)] + [("de", ""), (None, "text"), ("de", "  ")]
    counts, heldout, tally = count_batch(rows, holdout_rate=0.1)
    dropped = sum(v for k, v in tally.items() if k.startswith("sentences.dropped."))
    assert tally["sentences.read"] == len(rows) == tally["sentences.kept"] + dropped
    assert tally["sentences.dropped.empty"] == 2 and tally["sentences.dropped.no_lang"] == 1
    assert 0 < len(heldout) < 60 and all(is_heldout(text, 0.1) for _, text in heldout)
    # held out = not counted, and read again as a held-out sentence for the report
    assert tally["sentences.dropped.held_out"] == len(heldout) == tally["heldout_sentences.read"]
    expected = Counter()
    for lang, text in rows[:200]:
        if not is_heldout(text, 0.1):
            expected.update((lang, w) for w in pretokenize(text))
    assert counts == expected
    assert tally["words.de"] == sum(expected.values())


@pytest.mark.slow
def test_labse_vocab_end_to_end_parquet_and_text(labse_data, tmp_path):
    """Beam on multi_processing with 2 workers (the pipeline must pickle), Parquet + text inputs."""
    from vocab.cli import main

    german = multi30k_lines(labse_data, "de", 600)
    russian = [l for l in require_file(labse_data, "udhr/rus.txt").read_text(encoding="utf-8").splitlines() if l.strip()]
    chinese = [l for l in require_file(labse_data, "udhr/cmn_hans.txt").read_text(encoding="utf-8").splitlines() if l.strip()]
    sentences = tmp_path / "clean" / "sentences"
    for lang, lines in (("de", german), ("ru", russian), ("zh", chinese)):
        (sentences / f"lang={lang}").mkdir(parents=True)
        table = pa.table({"text": lines, "lang": [lang] * len(lines), "lang_score": [0.9] * len(lines)})
        pq.write_table(table, sentences / f"lang={lang}" / "part-00000-of-00001.parquet")
    mark_complete(tmp_path / "clean", {}, stage="labse-clean")  # a finished labse-clean output
    english = multi30k_lines(labse_data, "en", 600)
    text_file = tmp_path / "en.txt"
    text_file.write_text("\n".join(english) + "\n", encoding="utf-8")

    output = tmp_path / "out" / "vocab.txt"
    code = main([
        "--input", str(sentences), "--input-text", f"en={text_file}", "--output", str(output),
        "--vocab-size", "3000", "--num-unused", "7", "--char-min-count", "1", "--holdout-rate", "0.05",
        "--direct_running_mode=multi_processing", "--direct_num_workers=2",
    ])
    assert code == 0
    vocab = load_vocab(output)
    assert len(vocab) == 3000 and vocab[:5] == SPECIAL_TOKENS and vocab[5] == "[unused0]"

    # the Beam counts are exactly the pure-Python counts of the sentences not held out
    expected = Counter()
    for lang, lines in (("de", german), ("ru", russian), ("zh", chinese), ("en", english)):
        for text in lines:
            if text.strip() and not is_heldout(text, 0.05):
                expected.update((lang, w) for w in pretokenize(text))
    got = Counter()
    for shard in (tmp_path / "out" / "vocab.work" / "counts").glob("counts*.tsv"):
        for line in shard.read_text(encoding="utf-8").splitlines():
            lang, word, count = parse_count(line)
            got[(lang, word)] += count
    assert got == expected

    stats = json.loads((tmp_path / "out" / "vocab.stats.json").read_text(encoding="utf-8"))
    assert set(stats["languages"]) == {"de", "ru", "zh", "en"}
    shares = [row["smoothed_share"] for row in stats["languages"].values()]
    assert sum(shares) == pytest.approx(1.0)
    tally = stats["tally"]
    assert tally["sentences.read"] == len(german) + len(russian) + len(chinese) + len(english)
    # The accounting section (README contract 11): every sentence read was counted or dropped by
    # reason; every held-out one is in heldout.jsonl (the report's sentences) or over the limit.
    from pipelines.accounting import identity_violations

    assert identity_violations(stats) == [] and stats["identity_holds"]
    sentences_, heldout = stats["accounting"]["sentences"], stats["accounting"]["heldout_sentences"]
    every = [text for lines in (german, russian, chinese, english) for text in lines]
    assert sentences_["read"] == len(every) and sentences_["errored"] == 0
    held = [text for text in every if text.strip() and is_heldout(text, 0.05)]
    assert sentences_["kept"] == sum(1 for text in every if text.strip() and not is_heldout(text, 0.05)
                                     and pretokenize(text))
    assert sentences_["dropped"]["held_out"] == heldout["read"] == len(held) > 0
    written = [json.loads(line) for line in
               (tmp_path / "out" / "vocab.work" / "heldout.jsonl").read_text(encoding="utf-8").splitlines()]
    assert heldout["kept"] == sum(len(row["texts"]) for row in written) == heldout["read"]
    assert heldout["dropped"] == {}  # under the 2,000 a language the report takes

    report = json.loads((tmp_path / "out" / "vocab.report.json").read_text(encoding="utf-8"))
    assert report["vocab_size"] == 3000
    for lang in ("de", "en"):
        row = report["languages"][lang]
        assert row["sentences"] > 0 and 1.0 <= row["subwords_per_word"] < 3.0
        assert 0.0 <= row["unk_share"] < 0.05 and 0.3 < row["whole_word_share"] <= 1.0
    png = tmp_path / "out" / "vocab.report.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Chinese characters of the data are tokens, never [UNK]
    assert all(ch in vocab for text in chinese for ch in text if "\u4e00" <= ch <= "\u9fff")


def test_cli_rejects_missing_input(tmp_path, capsys):
    from vocab.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--output", str(tmp_path / "v.txt")])
    assert exit_info.value.code == 2
    assert "give --input DIR/sentences and/or --input-text LANG=PATH" in capsys.readouterr().err


def test_cli_names_inputs_that_match_nothing(tmp_path, capsys):
    from vocab.cli import main

    (tmp_path / "sentences").mkdir()
    assert main(["--input", str(tmp_path / "sentences"), "--output", str(tmp_path / "v.txt")]) == 2
    assert "no file matches" in capsys.readouterr().err
    assert main(["--input-text", f"de={tmp_path}/missing*.txt", "--output", str(tmp_path / "v.txt")]) == 2


def _clean_output(root, complete=True):
    (root / "sentences" / "lang=de").mkdir(parents=True)
    pq.write_table(pa.table({"text": ["Ein Hund rennt."], "lang": ["de"]}),
                   root / "sentences" / "lang=de" / "part-00000-of-00001.parquet")
    if complete:
        mark_complete(root, {}, stage="labse-clean")
    return root / "sentences"


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("labse-vocab: error:") and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("option", [["--holdout-rate", "2"], ["--holdout-rate", "1"], ["--smoothing", "nan"],
                                    ["--vocab-size", "0"]])
def test_bad_settings_are_refused_before_counting(tmp_path, capsys, monkeypatch, option):
    from pipelines import stage
    from vocab import cli

    monkeypatch.setattr(stage, "run_to_completion", lambda *a, **k: pytest.fail("counting started"))
    sentences = _clean_output(tmp_path / "clean")
    assert cli.main(["--input", str(sentences), "--output", str(tmp_path / "v.txt")] + option) == 2
    assert option[0] in _one_line_error(capsys)


def test_an_incomplete_clean_output_is_refused(tmp_path, capsys, monkeypatch):
    from pipelines import stage
    from vocab import cli

    monkeypatch.setattr(stage, "run_to_completion", lambda *a, **k: pytest.fail("counting started"))
    sentences = _clean_output(tmp_path / "clean", complete=False)  # labse-clean interrupted
    assert cli.main(["--input", str(sentences), "--output", str(tmp_path / "v.txt")]) == 2
    assert "rerun the stage" in _one_line_error(capsys)


def test_an_existing_or_locked_vocabulary_is_refused_unless_overwrite(tmp_path, capsys, monkeypatch):
    from pipelines import stage
    from vocab import cli

    sentences = _clean_output(tmp_path / "clean")
    (tmp_path / "v.work" / "counts").mkdir(parents=True)
    (tmp_path / "v.work" / "counts" / "counts-00000-of-00009.tsv").write_text("de\tHund\t99\n")  # an earlier run
    argv = ["--input", str(sentences), "--output", str(tmp_path / "v.txt")]
    monkeypatch.setattr(stage, "run_to_completion", lambda *a, **k: pytest.fail("counting started"))
    assert cli.main(argv) == 2
    assert "--overwrite" in _one_line_error(capsys)
    with output_lock(tmp_path / "v.txt"):
        assert cli.main(argv + ["--overwrite"]) == 2
        assert "v.txt.lock" in _one_line_error(capsys)
    counted = []
    monkeypatch.setattr(stage, "run_to_completion", lambda *a: counted.append(os.listdir(tmp_path)) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        cli.main(argv + ["--overwrite"])
    assert "v.work" not in counted[0]  # the old counts were removed before counting began
