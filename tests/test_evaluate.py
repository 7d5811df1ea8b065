"""labse-eval: Tatoeba and Multi30k retrieval accuracy on the real data, directions and indexing, the CLI."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from labse_model import evaluate
from tests.conftest import require_file


def char_trigram_encoder(texts: list[str]) -> np.ndarray:
    """Hashed bag of character trigrams: no learning, so accuracy comes only from shared spelling."""
    from sklearn.feature_extraction.text import HashingVectorizer

    vectorizer = HashingVectorizer(analyzer="char_wb", ngram_range=(3, 3), n_features=2**11,
                                   alternate_sign=False, norm=None, lowercase=True)
    return vectorizer.transform(texts).toarray().astype(np.float32)


@pytest.fixture(scope="module")
def tatoeba(labse_data):
    require_file(labse_data, "tatoeba/tatoeba.deu-eng.deu")
    return labse_data / "tatoeba"


def test_oracle_encoder_gives_100_percent_both_directions(tatoeba):
    """An encoder that maps every German sentence to the vector of its English line must score 1.0:
    proves the files are aligned line by line and that query i is scored against candidate i."""
    deu, eng = evaluate.load_tatoeba(tatoeba, "deu")
    assert len(deu) == len(eng) == 1000 and len(set(eng)) == 1000
    translation = dict(zip(deu, eng))

    def oracle(texts):
        return char_trigram_encoder([translation.get(t, t) for t in texts])

    result = evaluate.tatoeba_accuracy(oracle, tatoeba, ["deu"])
    assert result["languages"]["deu"] == {"xx->en": 1.0, "en->xx": 1.0, "mean": 1.0, "pairs": 1000}
    # Shifting the alignment by one line must destroy it: the metric does look at the index.
    shifted = lambda texts: np.roll(oracle(texts), 1, axis=0) if texts[0] in translation else oracle(texts)
    assert evaluate.tatoeba_accuracy(shifted, tatoeba, ["deu"])["mean"] < 0.01


def test_char_trigrams_on_real_tatoeba(tatoeba):
    """Without any learning, shared spelling carries Dutch and German part of the way, Russian (Cyrillic) nowhere."""
    result = evaluate.tatoeba_accuracy(char_trigram_encoder, tatoeba, ["nld", "deu", "rus"])
    nld, deu, rus = (result["languages"][k]["mean"] for k in ("nld", "deu", "rus"))
    assert nld > deu > 0.08  # measured 0.24 and 0.14; chance is 0.001
    assert rus < 0.01
    assert result["mean"] == pytest.approx((nld + deu + rus) / 3)
    assert result["mean_xx->en"] == pytest.approx(np.mean([result["languages"][k]["xx->en"] for k in ("nld", "deu", "rus")]))


def test_directions_are_not_swapped(tmp_path):
    """xx->en uses the XXX sentences as queries: a hand-made case where the directions differ."""
    vectors = {"s0": [1.0, 0.0], "s1": [0.0, 1.0], "t0": [1.0, 0.0], "t1": [1.0, 0.1]}
    (tmp_path / "tatoeba.zzz-eng.zzz").write_text("s0\ns1\n", encoding="utf-8")
    (tmp_path / "tatoeba.zzz-eng.eng").write_text("t0\nt1\n", encoding="utf-8")
    encode = lambda texts: np.array([vectors[t] for t in texts])
    # s0 -> t0, s1 -> t1 (0.0995 > 0): 1.0.  t0 -> s0, t1 -> s0 (0.995 > 0.0995): 0.5.
    result = evaluate.tatoeba_accuracy(encode, tmp_path)
    assert result["languages"]["zzz"] == {"xx->en": 1.0, "en->xx": 0.5, "mean": 0.75, "pairs": 2}
    assert evaluate.tatoeba_languages(tmp_path) == ["zzz"]


def test_multi30k_retrieval(labse_data):
    require_file(labse_data, "multi30k/test_2016_flickr.de.gz")
    de, en = (evaluate.load_multi30k(labse_data, lang) for lang in ("de", "en"))
    translation = dict(zip(de, en))
    oracle = lambda texts: char_trigram_encoder([translation.get(t, t) for t in texts])
    result = evaluate.multi30k_retrieval_accuracy(oracle, labse_data / "multi30k", ("de", "en"))
    assert result["pairs"] == 1000 and result["pair"] == "de-en"
    # test_2016 has a few identical English captions; everything else must be found.
    assert result["src->tgt"] > 0.99 and result["tgt->src"] > 0.99
    trigram = evaluate.multi30k_retrieval_accuracy(char_trigram_encoder, labse_data, ("de", "en"), limit=300)
    assert trigram["pairs"] == 300 and 0.02 < trigram["mean"] < 0.9


def test_multi30k_encodes_each_language_once(labse_data):
    """de-en, fr-en and cs-en share the English captions: encoded once, same accuracies as pair by pair."""
    require_file(labse_data, "multi30k/test_2016_flickr.cs.gz")
    calls = []

    def counting_encoder(texts):
        calls.append(texts[0])
        return char_trigram_encoder(texts)

    pairs = [("de", "en"), ("fr", "en"), ("cs", "en")]
    results = evaluate.multi30k_retrieval_accuracies(counting_encoder, labse_data, pairs, limit=200)
    assert len(calls) == len(set(calls)) == 4
    en = char_trigram_encoder(evaluate.load_multi30k(labse_data, "en")[:200])
    for src, tgt in pairs:
        xx = char_trigram_encoder(evaluate.load_multi30k(labse_data, src)[:200])
        forward, backward = evaluate.retrieval_accuracy(xx, en), evaluate.retrieval_accuracy(en, xx)
        assert results[f"{src}-{tgt}"] == {"src->tgt": forward, "tgt->src": backward, "mean": (forward + backward) / 2,
                                           "pairs": 200, "pair": f"{src}-{tgt}", "split": "test_2016_flickr"}
    assert results["de-en"] == evaluate.multi30k_retrieval_accuracy(char_trigram_encoder, labse_data, limit=200)


@pytest.mark.parametrize("pairs, problem", [("deen", "'deen' is not a language pair of the form SRC-TGT, e.g. de-en"),
                                            ("de-en,xx-en", "no test_2016_flickr file for xx")])
def test_multi30k_bad_pairs_are_usage_errors(labse_data, tmp_path, capsys, pairs, problem):
    """A malformed or unknown pair fails before any model is loaded, naming the form and the languages there."""
    with pytest.raises(SystemExit) as exit_info:
        evaluate.main(["multi30k", "--model", str(tmp_path), "--data", str(labse_data / "multi30k"), "--pairs", pairs])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: labse-eval multi30k" in err and problem in err
    assert "languages in" in err and "for split test_2016_flickr: cs, de, en, fr" in err


def build_tiny_sentence_transformer(path, texts: list[str]):
    """A 1-layer, 32-wide BERT with a character vocabulary, saved as a sentence-transformers directory."""
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import BertConfig, BertModel, BertTokenizerFast

    chars = sorted({c for t in texts for c in t if not c.isspace()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + chars + ["##" + c for c in chars]
    bert_dir = path / "bert"
    bert_dir.mkdir(parents=True)
    (bert_dir / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = BertTokenizerFast(vocab=str(bert_dir / "vocab.txt"), do_lower_case=False)
    assert len(tokenizer) == len(vocab)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    bert = BertModel(config, add_pooling_layer=False)
    bert.save_pretrained(bert_dir)
    tokenizer.save_pretrained(bert_dir)
    transformer = models.Transformer(str(bert_dir), max_seq_length=64)
    model = SentenceTransformer(modules=[transformer, models.Pooling(32, pooling_mode="cls"), models.Normalize()], device="cpu")
    model.save(str(path / "st"))
    return bert, tokenizer, path / "st"


def test_cli_on_a_tiny_sentence_transformer(tatoeba, tmp_path, capsys):
    import torch

    # The first 300 real lines of two languages keep the CPU time small.
    langs = ["deu", "nld"]
    subset = tmp_path / "tatoeba"
    subset.mkdir()
    texts = []
    for lang in langs:
        xx, en = evaluate.load_tatoeba(tatoeba, lang)
        (subset / f"tatoeba.{lang}-eng.{lang}").write_text("\n".join(xx[:300]) + "\n", encoding="utf-8")
        (subset / f"tatoeba.{lang}-eng.eng").write_text("\n".join(en[:300]) + "\n", encoding="utf-8")
        texts += xx + en
    bert, tokenizer, model_dir = build_tiny_sentence_transformer(tmp_path, texts)
    output = tmp_path / "results.json"
    assert evaluate.main(["tatoeba", "--model", str(model_dir), "--data", str(subset), "--langs", ",".join(langs),
                          "--batch-size", "128", "--device", "cpu", "--output", str(output)]) == 0
    printed = capsys.readouterr().out
    assert "deu" in printed and "nld" in printed and "mean" in printed
    results = json.loads(output.read_text())
    assert results["task"] == "tatoeba" and set(results["languages"]) == set(langs)
    assert all(r["pairs"] == 300 for r in results["languages"].values())

    # The encoder the CLI loads gives the raw transformers model's [CLS] vector, normalised: it used
    # the directory it was given, with its tokenizer and pooling.
    encode = evaluate.load_encoder(str(model_dir), device="cpu")
    sample = texts[:40] + texts[-40:]
    bert.eval()
    with torch.no_grad():
        batch = tokenizer(sample, padding=True, truncation=True, max_length=64, return_tensors="pt")
        by_hand = torch.nn.functional.normalize(bert(**batch).last_hidden_state[:, 0], dim=-1).numpy()
    cosine = (encode(sample) * by_hand).sum(axis=1)
    assert cosine.min() > 0.9999
    again = evaluate.tatoeba_accuracy(encode, subset, langs)
    assert results["languages"] == again["languages"] and results["mean"] == again["mean"]


def test_cli_errors_are_clear(tmp_path, capsys):
    assert evaluate.main(["tatoeba", "--model", str(tmp_path), "--data", str(tmp_path)]) == 2
    assert "not a sentence-transformers directory" in capsys.readouterr().err


def test_mining_subcommand_dispatches_to_bucc(capsys):
    with pytest.raises(SystemExit) as exit_info:
        evaluate.main(["mining", "--help"])
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    assert "labse-eval mining" in help_text and "--gold" in help_text  # bucc's own parser answered


def _remove_weights(model: Path) -> None:
    for weights in model.rglob("*.safetensors"):
        weights.unlink()


def _truncate_weights(model: Path) -> None:
    for weights in model.rglob("*.safetensors"):
        weights.write_bytes(weights.read_bytes()[:100])


def _modules_json_not_a_list(model: Path) -> None:
    (model / "modules.json").write_text(json.dumps({"Transformer": ""}))


def _pickled_weights(model: Path) -> None:
    """Weights replaced by a pickle of an object (what a hostile .bin holds): PyTorch refuses it and
    advises `weights_only=False`, which must never reach the user (issue 34 item 6)."""
    import collections

    import torch

    for weights in model.rglob("model.safetensors"):
        weights.unlink()
        torch.save({"weights": collections.OrderedDict(), "hook": Path("x")}, weights.parent / "pytorch_model.bin")


@pytest.mark.parametrize("damage", [_remove_weights, _truncate_weights, _modules_json_not_a_list, _pickled_weights])
def test_labse_eval_refuses_a_directory_that_is_not_a_model_in_one_line(labse_data, tmp_path, capsys, damage):
    from conftest import require_file
    from labse_model.evaluate import main as eval_main
    from model_helpers import save_tiny_sentence_transformer

    require_file(labse_data, "tatoeba/tatoeba.deu-eng.deu")
    (tmp_path / "work").mkdir()
    model = save_tiny_sentence_transformer(tmp_path / "work", tmp_path / "model")
    damage(model)
    capsys.readouterr()
    assert eval_main(["tatoeba", "--model", str(model), "--data", str(labse_data / "tatoeba"), "--langs", "deu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("labse-eval: error:") and str(model) in err[0], err
    assert "weights_only" not in err[0] and "can still be loaded" not in err[0].lower(), err
