"""labse-report's sections on small stage outputs written here in each stage's file contract:
balanced books, unbalanced books (flagged at the top), a stage with zero rows, mining margins and
score thresholds drawn from Parquet, the vocabulary per script, training curves, evaluations."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.report.cli import main
from pipelines.report.discover import RunRoot, discover
from pipelines.report.sections import books, script_of


def write_stage(folder: Path, stage: str, stats: dict) -> Path:
    folder.mkdir(parents=True)
    (folder / "_SUCCESS").write_text(json.dumps({"complete": True, "stage": stage, "completed_at": "2026-11-28T00:00:00+00:00",
                                                 "stats": stats}))
    return folder


def accounting(read: int, kept: int, dropped: dict, errored: int = 0) -> dict:
    return {"read": read, "kept": kept, "dropped": dropped, "errored": errored}


def clean_stats(read=10, kept=6, dropped=None) -> dict:
    dropped = {"too_short": 3, "main_content": 1} if dropped is None else dropped
    books_ = {"sentences": accounting(read, kept, dropped)}
    holds = read == kept + sum(dropped.values())
    return {"accounting": books_, "identity_holds": holds, "per_language": {"de": 4, "en": 2},
            "config": {"min_chars": 20}}


def report(tmp_path: Path, root: Path) -> str:
    out = tmp_path / "report.html"
    assert main([str(root), "--output", str(out)]) == 0
    return out.read_text(encoding="utf-8")


def flags_at_top(page: str) -> list[str]:
    top = page.split("<section", 1)[0]
    return [re.sub(r"<[^>]+>", "", flag) for flag in re.findall(r'<div class="flag">(.*?)</div>', top)]


def test_balanced_books_are_not_flagged_and_reasons_are_ranked(tmp_path):
    write_stage(tmp_path / "run" / "clean", "labse-clean", clean_stats())
    page = report(tmp_path, tmp_path / "run")
    assert flags_at_top(page) == []
    assert "balanced books" in page
    reasons = page.split("sentences: why the rest were not kept", 1)[1]
    assert reasons.index("too_short") < reasons.index("main_content")  # 3 before 1
    assert page.count("<img") >= 2  # reasons and languages
    assert "1 of 10 sentences read (10.0%) were dropped as boilerplate" in page
    assert "<script" not in page and "http://" not in page and "https://" not in page


def test_unbalanced_books_are_flagged_at_the_top(tmp_path):
    write_stage(tmp_path / "run" / "clean", "labse-clean", clean_stats(read=11))
    flags = flags_at_top(report(tmp_path, tmp_path / "run"))
    assert len(flags) == 1 and "books do not balance" in flags[0] and "sentences" in flags[0]


def test_a_stage_with_zero_rows_is_reported_not_flagged(tmp_path):
    write_stage(tmp_path / "run" / "clean", "labse-clean", clean_stats(read=0, kept=0, dropped={}))
    page = report(tmp_path, tmp_path / "run")
    assert flags_at_top(page) == []
    assert "0 of 0 sentences" in page


def test_a_degenerate_keep_is_flagged(tmp_path):
    write_stage(tmp_path / "run" / "clean", "labse-clean", clean_stats(read=1000, kept=1, dropped={"too_short": 999}))
    (flag,) = flags_at_top(report(tmp_path, tmp_path / "run"))
    assert "kept 0.10% of 1,000 sentences" in flag


def test_books_flag_a_missing_accounting_section():
    flags, blocks = books({"pairs_read": 3})
    assert flags == ["books do not balance: no accounting section"] and blocks == []


def pairs_table(margins: list[float], scores: list[float] | None = None) -> pa.Table:
    n = len(margins)
    columns = {"src": [f"s{i}" for i in range(n)], "tgt": [f"t{i}" for i in range(n)], "src_lang": ["de"] * n,
               "tgt_lang": ["en"] * n, "margin": margins}
    if scores is not None:
        columns["score"] = scores
    return pa.table(columns)


def test_mining_margins_and_scoring_thresholds_are_drawn(tmp_path):
    mine = write_stage(tmp_path / "run" / "pairs", "labse-mine",
                       {"accounting": {"candidate_pairs": accounting(5, 3, {"not_selected": 2})},
                        "identity_holds": True, "config": {"min_margin": 1.05}})
    pq.write_table(pairs_table([1.1, 1.2, 1.3]), mine / "part-00000-of-00001.parquet")
    score = write_stage(tmp_path / "run" / "scored", "labse-score", {
        "accounting": {"pairs": accounting(3, 2, {"below_threshold": 1})}, "identity_holds": True,
        "per_language_pair": {"de-en": {"pairs": 3, "kept": 2, "threshold": 0.61803, "estimated_good_share": 0.7,
                                        "set_statistic_in_calibration_range": False}}})
    pq.write_table(pairs_table([1.2, 1.3], [0.7, 0.9]), score / "part-00000-of-00001.parquet")
    page = report(tmp_path, tmp_path / "run")
    assert page.index("labse-mine") < page.index("labse-score")  # data-flow order
    mined = page.split('id="s-labse-mine', 1)[1].split("<section", 1)[0]
    assert re.search(r"<td[^>]*>de-en</td><td[^>]*>3</td>", mined)
    assert "margin histogram" in mined
    scored = page.split('id="s-labse-score', 1)[1]
    assert "0.618" in scored and "de-en score histogram" in scored
    assert ">NO<" in scored  # outside the calibration range is shown


def test_vocabulary_coverage_per_script(tmp_path):
    vocab = tmp_path / "run" / "vocab"
    vocab.mkdir(parents=True)
    (vocab / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "Haus", "##er", "дом", "家", "12"]) + "\n")
    (vocab / "vocab.stats.json").write_text(json.dumps(
        {"accounting": {"sentences": accounting(10, 9, {"held_out": 1})}, "identity_holds": True}))
    (vocab / "vocab.report.json").write_text(json.dumps({"languages": {
        "de": {"words": 100, "unk_share": 0.0, "subwords_per_word": 1.2, "whole_word_share": 0.9},
        "ru": {"words": 50, "unk_share": 0.02, "subwords_per_word": 1.5, "whole_word_share": 0.7}}}))
    page = report(tmp_path, tmp_path / "run")
    assert "7 tokens" in page
    cyrillic = re.search(r"<td[^>]*>Cyrillic</td><td[^>]*>ru</td><td[^>]*>([^<]+)</td>", page)
    assert cyrillic and cyrillic.group(1) == "2.000%"


@pytest.mark.parametrize("token, script", [("Haus", "Latin"), ("##er", "Latin"), ("дом", "Cyrillic"), ("家", "Han"),
                                           ("12", "no letter (digits, marks)"), ("ไทย", "Thai"), ("한", "Hangul")])
def test_script_of_a_token(token, script):
    assert script_of(token) == script


def test_training_curves_and_evaluation(tmp_path):
    run = tmp_path / "run" / "train"
    run.mkdir(parents=True)
    (run / "train_summary.json").write_text(json.dumps({"step": 20, "final_loss": 2.5, "steps_per_second": 1.5}))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "train/loss": 5 - s / 10, "lr": 1e-3}) + "\n"
                                               for s in range(0, 21, 10)))
    (tmp_path / "run" / "eval.json").write_text(json.dumps(
        {"task": "tatoeba", "model": "m", "languages": {"deu": {"mean": 0.5}}, "mean": 0.5}))
    page = report(tmp_path, tmp_path / "run")
    assert "training loss curve" in page and "20 steps, final loss 2.5" in page
    assert "mean accuracy 50.0%" in page


def test_a_nan_loss_is_flagged(tmp_path):
    run = tmp_path / "run" / "train"
    run.mkdir(parents=True)
    (run / "train_summary.json").write_text('{"step": 3, "final_loss": NaN}')
    flags = flags_at_top(report(tmp_path, tmp_path / "run"))
    assert flags == ["labse-train: no metrics.jsonl: no curves", "labse-train: final loss is NaN"]


def test_an_unreadable_marker_is_a_flagged_section_not_a_crash(tmp_path):
    folder = tmp_path / "run" / "clean"
    folder.mkdir(parents=True)
    (folder / "_SUCCESS").write_bytes(b"\xff\xfe not json")
    flags = flags_at_top(report(tmp_path, tmp_path / "run"))
    assert any("not readable JSON" in flag for flag in flags)


def test_the_walk_stays_out_of_stage_outputs_and_working_folders(tmp_path):
    clean = write_stage(tmp_path / "run" / "clean", "labse-clean", clean_stats())
    write_stage(clean / "sentences" / "nested", "labse-clean", clean_stats())  # inside an output: not walked
    write_stage(tmp_path / "run" / "vocab.work" / "x", "labse-x", clean_stats())
    # labse-distill's work folder holds the teacher's pass, itself a finished Beam output
    write_stage(tmp_path / "run" / "distill.work" / "teacher-1916d123", "labse-distill", clean_stats())
    assert [f.kind for f in discover(RunRoot(str(tmp_path / "run")))] == ["labse-clean"]


def test_an_empty_root_says_so_and_a_missing_root_is_one_line(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    assert "no stage output found" in report(tmp_path, tmp_path / "run")
    assert main([str(tmp_path / "absent")]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
