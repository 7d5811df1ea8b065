"""The one closing summary (pipelines.accounting.summary_text / closing_lines) of labse-clean,
labse-main-content build-data, labse-vocab, labse-pretrain and labse-train, and the progress of
labse-score train's embedding. The stats are shaped as the commands write them (numbers from a
run of the README's examples on the sample data)."""
from __future__ import annotations

import types

from pipelines.clean.cli import summarise as clean_summary
from pipelines.main_content.cli import build_data_summary
from vocab.cli import vocab_summary

CLEAN_STATS = {
    "accounting": {
        "documents": {"read": 2371, "kept": 1083, "errored": 0, "dropped": {
            "namespace": 906, "redirect": 295, "no_sentences_kept": 43, "empty_text": 7, "warc_type:request": 17,
            "warc_type:metadata": 16, "warc_type:warcinfo": 2, "only_duplicate_sentences": 2}},
        "sentences": {"read": 61726, "kept": 31730, "errored": 0, "dropped": {
            "main_content": 18300, "no_terminal_punctuation": 7419, "too_short": 2869, "langid_other_language": 751,
            "duplicate": 434, "langid_low_confidence": 94, "digits": 80, "symbols": 33, "policy": 6,
            "gbk_mojibake": 4, "javascript": 4, "script_mismatch": 2}},
    },
    "per_language": {"en": 20658, "ltg": 5852, "de": 4793, "zh": 220, "fr": 169, "ru": 19, "nl": 11, "tr": 7, "wuu": 1},
    "main_content": {"pages": {"model": 900, "teacher": 100}, "fallback_share": 0.1},
    "per_file": {"files": 4, "files_with_errors": 1,
                 "top_files": [{"file": "a.warc.gz", "documents_errored": 3}, {"file": "b.warc.gz", "documents_errored": 0}]},
}


def test_clean_ends_with_documents_then_sentences_their_top_reasons_languages_and_deciders():
    lines = clean_summary(CLEAN_STATS).splitlines()
    assert lines[0] == ("labse-clean: 2,371 documents read, 1,083 kept, 1,288 dropped (namespace 906, redirect 295, "
                        "no_sentences_kept 43, ...), 0 errored")
    assert lines[1].startswith("labse-clean: 61,726 sentences read, 31,730 kept, 29,996 dropped (main_content 18,300, "
                               "no_terminal_punctuation 7,419, too_short 2,869, ...)")
    assert lines[2] == "  kept per language: en 20,658, ltg 5,852, de 4,793, zh 220, fr 169, ru 19, nl 11, tr 7, ... (9 languages)"
    assert lines[3] == "  main content decided by: model 900 pages, teacher 100 pages (fallback share 10.0%)"
    assert lines[4] == "  input files: 4, 1 with errored documents; most: a.warc.gz (3) (stats.json per_file)"
    assert not any(line.startswith("WARNING") for line in lines)


def test_clean_warns_when_nothing_is_kept():
    books = {"read": 10, "kept": 0, "errored": 0, "dropped": {"too_short": 10}}
    stats = {"accounting": {"documents": {**books, "dropped": {"no_sentences_kept": 10}}, "sentences": books},
             "per_language": {}}
    lines = clean_summary(stats).splitlines()
    assert "  kept per language: none" in lines
    assert "WARNING no sentence kept in any language" in lines
    assert "WARNING only 0 of 10 sentences kept (< 1%)" in lines


def test_build_data_says_the_splits_and_warns_of_a_test_split_too_small_to_score():
    stats = {"accounting": {"documents": {"read": 161, "kept": 126, "errored": 0,
                                          "dropped": {"warc_type:request": 17, "warc_type:metadata": 16, "warc_type:warcinfo": 2}},
                            "lines": {"read": 21649, "kept": 7705, "errored": 0,
                                      "dropped": {"page_balance": 12748, "disputed_label": 1196}}},
             "pages": {"train": 105, "dev": 13, "test": 28}, "train_examples": 4453,
             "train_examples_per_language": {"en": 1032, "de": 2793}}
    lines = build_data_summary(stats).splitlines()
    assert lines[0].startswith("labse-main-content build-data: 161 documents read, 126 kept, 35 dropped")
    assert lines[1].startswith("labse-main-content build-data: 21,649 lines read, 7,705 kept, 13,944 dropped "
                               "(page_balance 12,748, disputed_label 1,196)")
    assert "  pages per split (disjoint, by URL hash): train 105, dev 13, test 28" in lines
    assert "  4,453 training examples: de 2,793, en 1,032" in lines
    warnings = [line for line in lines if line.startswith("WARNING")]
    assert len(warnings) == 1 and warnings[0].startswith("WARNING the dev split has only 13 pages (< 20)")


def _vocab_result(unk_share: float):
    report = {"vocab_size": 32000, "overall": {"unk_share": unk_share, "subwords_per_word": 1.179}}
    return types.SimpleNamespace(vocab_path="out/vocab/vocab.txt", report_path="out/vocab/vocab.report.json", report=report)


def test_vocab_says_the_words_learned_from_the_pruning_and_warns_of_many_unknown_tokens():
    stats = {"accounting": {"sentences": {"read": 89730, "kept": 88813, "errored": 0, "dropped": {"held_out": 917}},
                            "word_types": {"read": 96097, "kept": 20000, "errored": 0,
                                           "dropped": {"over_language_budget": 76097}}},
             "languages": {"en": {}, "de": {}, "ltg": {}}}
    lines = vocab_summary(stats, _vocab_result(0.0004)).splitlines()
    assert lines[0] == "labse-vocab: 89,730 sentences read, 88,813 kept, 917 dropped (held_out 917), 0 errored"
    assert lines[1] == ("  wrote out/vocab/vocab.txt (32,000 tokens) from 20,000 distinct words in 3 languages "
                        "(76,097 more pruned by --max-words)")
    assert lines[2].startswith("  held-out: [UNK] 0.0004, subwords/word 1.179")
    assert len(lines) == 3
    warned = vocab_summary(stats, _vocab_result(0.05)).splitlines()
    assert warned[-1].startswith("WARNING [UNK] is 5.0% of held-out tokens (> 1%)")


def test_train_warns_of_a_warm_up_as_long_as_the_run_and_of_an_early_stop():
    from labse_model.train import closing_summary

    summary = {"step": 120, "finished": False, "stopped_by": "SIGTERM", "final_loss": 8.25, "steps_per_second": 1.8,
               "global_batch_size": 64, "world_size": 2, "gather_negatives": True,
               "dev_accuracy": {"src2tgt": 0.6, "tgt2src": 0.62, "mean": 0.61}}
    lines = closing_summary(summary, 300, 300, "out/run").splitlines()
    assert lines[0] == "labse-train: 120 of 300 steps (stopped by SIGTERM)"
    assert lines[1] == "  final loss 8.2500, 1.80 steps/s, global batch 64 over 2 process(es), negatives gathered; run in out/run"
    assert lines[2] == "  dev retrieval: src2tgt 60.0%, tgt2src 62.0%, mean 61.0%"
    assert lines[3].startswith("WARNING stopped at step 120 of 300")
    assert lines[4].startswith("WARNING --warmup-steps 300 is not shorter than --max-steps 300") and "<= 299" in lines[4]
    healthy = closing_summary({**summary, "step": 300, "finished": True, "stopped_by": None}, 300, 30, "out/run")
    assert "WARNING" not in healthy and healthy.startswith("labse-train: 300 of 300 steps (finished)")
    assert "WARNING the final loss is nan" in closing_summary({**summary, "final_loss": float("nan")}, 300, 30, "r")


def test_pretrain_lists_each_stage_the_languages_and_packing():
    from labse_model.pretrain import closing_summary

    stage = {"stage": 1, "layers": 1, "first_step": 1, "last_step": 20, "final_loss": 9.5,
             "heldout_mlm_accuracy": 0.125, "tokens_per_second": 1500.0}
    summary = {"step": 20, "finished": True, "stopped_by": None, "languages": {"en": 20658, "de": 4793},
               "sentences_cut": 3, "rows_skipped": 0, "stages": {"0": stage}}
    lines = closing_summary(summary, 20, "out/pt").splitlines()
    assert lines == ["labse-pretrain: 20 of 20 steps (finished)",
                     "  stage 1 (1 layers, steps 1-20): final loss 9.5000, held-out MLM accuracy 12.5%, 1,500 tokens/s",
                     "  monolingual sentences: en 20,658, de 4,793",
                     "  packing: 3 sentences cut to the sequence length, 0 rows skipped; run in out/pt"]
    diverged = closing_summary({**summary, "stages": {"0": {**stage, "final_loss": float("inf")}}}, 20, "p")
    assert "WARNING stage 1's final loss is inf: the run diverged" in diverged


def test_score_train_counts_every_sentence_it_embeds_on_the_progress_board():
    import numpy as np

    from pipelines.progress import ProgressBoard, read_total
    from pipelines.score.cli import EmbeddingProgress

    class Embedder:
        dim = 3

        def encode(self, texts, batch_size=256):
            return np.zeros((len(texts), self.dim), dtype=np.float32)

    with ProgressBoard("labse-score train", "sentences embedded") as board:
        embedder = EmbeddingProgress(Embedder, board.tracker())
        assert embedder.encode(["a", "b", "c"]).shape == (3, 3) and embedder.dim == 3
        embedder.encode(["d"] * 997, batch_size=64)
        embedder.tracker.flush()
        assert read_total(board.folder, "sentences embedded") == 1000
