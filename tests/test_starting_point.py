"""labse-train --init-from a published model: each kind of source, strictness, and the round trip
through labse-train and labse-export (small models built here; nothing is downloaded)."""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from labse_model.config import ModelConfig, file_sha256
from labse_model.encoder import SentenceEncoder
from labse_model.export import load_encoder, main as export_main
from labse_model.starting_point import load_starting_point
from labse_model.train import main as train_main
from model_helpers import LANGS, build_vocab, read_multi30k, write_shards
from pipelines.text.wordpiece import hf_tokenizer

HIDDEN = 32


@pytest.fixture(scope="module")
def vocab(labse_data, tmp_path_factory) -> Path:
    return build_vocab(labse_data, tmp_path_factory.mktemp("start_vocab"))


@pytest.fixture(scope="module")
def sentences(labse_data) -> list[str]:
    """Multi30k test captions in four languages (evaluation data, not training data)."""
    return [line for lang in (*LANGS, "en") for line in read_multi30k(labse_data, "test_2016_flickr", lang, 6)]


def spread(module: torch.nn.Module, seed: int) -> None:
    """Freshly initialised BERTs give every sentence nearly the same vector, which would make a cosine
    comparison meaningless; large random weights make distinct sentences clearly distinct."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(0.3 * torch.randn(parameter.shape, generator=generator))


def write_bert_dir(path: Path, vocab: Path, *, pooler: bool = True, masked_lm: bool = False, seed: int = 0) -> Path:
    """A Hugging Face BERT directory as `save_pretrained` writes it, with a cased vocab.txt and tokenizer."""
    from transformers import BertConfig, BertForMaskedLM, BertModel, BertTokenizerFast

    vocab_size = len(vocab.read_text(encoding="utf-8").splitlines())
    config = BertConfig(vocab_size=vocab_size, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(seed)
    model = BertForMaskedLM(config) if masked_lm else BertModel(config, add_pooling_layer=pooler)
    spread(model, seed)
    model.save_pretrained(path)
    (path / "vocab.txt").write_bytes(vocab.read_bytes())
    BertTokenizerFast(vocab=str(path / "vocab.txt"), do_lower_case=False).save_pretrained(path)
    return path


def write_sentence_transformer(path: Path, bert_dir: Path, pooling: str, dense: bool, normalize: bool,
                               activation: torch.nn.Module | None = None) -> Path:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Dense, Normalize, Pooling, Transformer

    modules = [Transformer(str(bert_dir), max_seq_length=64), Pooling(HIDDEN, pooling_mode=pooling)]
    if dense:
        torch.manual_seed(1)  # nn.Linear's own initialisation: larger weights would saturate the tanh
        modules.append(Dense(HIDDEN, HIDDEN, activation_function=activation or torch.nn.Tanh()))
    if normalize:
        modules.append(Normalize())
    SentenceTransformer(modules=modules, device="cpu").save(str(path))
    (path / "vocab.txt").write_bytes((bert_dir / "vocab.txt").read_bytes())
    return path


def trainer_embeddings(encoder: SentenceEncoder, vocab: Path, texts: list[str]) -> torch.Tensor:
    """What the trainer computes: labse-tfrecords' tokenisation (hf_tokenizer gives the same ids)."""
    batch = hf_tokenizer(vocab)(texts, padding=True, truncation=True, max_length=64, return_tensors="pt")
    encoder.eval()
    with torch.no_grad():
        return encoder(batch["input_ids"], batch["attention_mask"])


def published_embeddings(model_dir: Path, texts: list[str]) -> torch.Tensor:
    from sentence_transformers import SentenceTransformer

    encoded = SentenceTransformer(str(model_dir), device="cpu").encode(texts, batch_size=8, convert_to_tensor=True)
    return torch.nn.functional.normalize(encoded, dim=-1)  # sources without Normalize: compare directions


def assert_same_embeddings(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    cosines = (ours * theirs).sum(dim=-1)
    assert cosines.min().item() >= 0.9999, cosines.tolist()
    # Distinct sentences are at least five times farther apart than the tolerance above: the comparison
    # is not between near-constants (an untrained BERT gives every sentence almost the same vector). The
    # briefly trained CLS model's closest pair sits near 1 - 1e-3: 0.99906 once in a full-suite run
    # (below 0.999 when the file runs alone; the cause of the difference is not pinned down), so ten
    # times was too tight a margin.
    assert (theirs @ theirs.T).fill_diagonal_(0).max().item() < 0.9995


# ----------------------------------------------------------------------------------------------
# sentence-transformers directories


@pytest.mark.parametrize("pooling,dense,normalize", [
    ("cls", True, True),     # the released LaBSE: [CLS] -> Dense(tanh) -> Normalize
    ("mean", False, True),   # a mean-pooling model without a Dense module
    ("max", True, False),    # max pooling, Dense, no Normalize
])
def test_sentence_transformer_gives_its_own_embeddings(vocab, sentences, tmp_path, monkeypatch, pooling, dense, normalize):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    source = write_sentence_transformer(tmp_path / "st", write_bert_dir(tmp_path / "bert", vocab), pooling, dense,
                                        normalize)
    start = load_starting_point(source)
    assert start.kind == "sentence-transformers" and start.defines_pooling
    assert (start.model.pooling, start.model.dense_head) == (pooling, dense)
    assert (start.model.num_layers, start.model.hidden_size, start.model.vocab_size) == (2, HIDDEN, 2000)
    assert start.vocab == source / "vocab.txt"

    encoder = SentenceEncoder(start.model)
    start.check_matches(start.model)
    start.load_into(encoder)
    assert (encoder.head is not None) == dense
    assert_same_embeddings(trainer_embeddings(encoder, start.vocab, sentences), published_embeddings(source, sentences))


def test_unrepresentable_sentence_transformers_are_refused(vocab, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    bert = write_bert_dir(tmp_path / "bert", vocab)
    relu = write_sentence_transformer(tmp_path / "relu", bert, "cls", dense=True, normalize=True,
                                      activation=torch.nn.ReLU())
    with pytest.raises(ValueError, match=r"activation torch\.nn\.modules\.activation\.ReLU, .*cannot be represented"):
        load_starting_point(relu)

    two_poolings = write_sentence_transformer(tmp_path / "sqrt", bert, "mean_sqrt_len_tokens", dense=False,
                                              normalize=True)
    with pytest.raises(ValueError, match="pooling .*mean_sqrt_len_tokens.* cannot be represented"):
        load_starting_point(two_poolings)

    extra = write_sentence_transformer(tmp_path / "extra", bert, "cls", dense=True, normalize=True)
    modules = json.loads((extra / "modules.json").read_text())
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_LayerNorm",
                       "type": "sentence_transformers.models.LayerNorm"})
    for index, entry in enumerate(modules):
        entry["idx"] = index
    (extra / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match="LayerNorm.*cannot be represented"):
        load_starting_point(extra)


def test_released_labse_file_layout_loads(vocab, tmp_path, monkeypatch):
    """The released LaBSE predates sentence-transformers 5: Pooling config with one boolean per mode,
    Dense weights in pytorch_model.bin, and an `embeddings.position_ids` buffer in the BERT weights."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    source = write_sentence_transformer(tmp_path / "st", write_bert_dir(tmp_path / "bert", vocab), "cls", True, True)
    (source / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": HIDDEN, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}))
    dense = load_file(source / "2_Dense" / "model.safetensors")
    (source / "2_Dense" / "model.safetensors").unlink()
    torch.save(dense, source / "2_Dense" / "pytorch_model.bin")
    bert = load_file(source / "model.safetensors")
    bert["embeddings.position_ids"] = torch.arange(64).unsqueeze(0)
    save_file(bert, source / "model.safetensors")

    start = load_starting_point(source)
    assert start.model.pooling == "cls" and start.model.dense_head
    assert torch.equal(start.weights["head.weight"], dense["linear.weight"])
    start.check_matches(start.model)


# ----------------------------------------------------------------------------------------------
# Hugging Face BERT directories and labse-pretrain outputs


def test_huggingface_bert_pooler_becomes_the_head(vocab, tmp_path, caplog):
    from transformers import BertModel

    source = write_bert_dir(tmp_path / "bert", vocab, pooler=True)
    start = load_starting_point(source)
    assert start.kind == "huggingface" and not start.defines_pooling and start.model.dense_head
    encoder = SentenceEncoder(start.model)
    with caplog.at_level(logging.INFO, logger="labse_model.starting_point"):
        start.load_into(encoder)
    assert "freshly initialised" not in caplog.text
    # [CLS] -> pooler dense+tanh: BertModel's own pooler_output, normalised.
    bert = BertModel.from_pretrained(source).eval()
    batch = hf_tokenizer(start.vocab)(["Ein Hund rennt.", "A dog runs."], padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = torch.nn.functional.normalize(bert(**batch).pooler_output, dim=-1)
    assert torch.allclose(trainer_embeddings(encoder, start.vocab, ["Ein Hund rennt.", "A dog runs."]), expected,
                          atol=1e-5)


def test_masked_lm_checkpoint_in_pytorch_bin_starts_a_fresh_head(vocab, tmp_path, caplog):
    """BertForMaskedLM saves `bert.`-prefixed weights and an MLM head; a .bin is read weights-only."""
    source = write_bert_dir(tmp_path / "mlm", vocab, masked_lm=True)
    tensors = load_file(source / "model.safetensors")
    assert any(k.startswith("cls.") for k in tensors) and all(k.startswith(("bert.", "cls.")) for k in tensors)
    (source / "model.safetensors").unlink()
    torch.save(tensors, source / "pytorch_model.bin")

    start = load_starting_point(source)
    encoder = SentenceEncoder(start.model)
    head_before = encoder.head.weight.detach().clone()
    with caplog.at_level(logging.INFO, logger="labse_model.starting_point"):
        start.load_into(encoder)
    assert "freshly initialised (the source has no such weights): head.bias, head.weight" in caplog.text
    assert "pre-training heads not used" in caplog.text
    assert torch.equal(encoder.head.weight, head_before)
    word_embeddings = encoder.bert.embeddings.word_embeddings.weight
    assert torch.equal(word_embeddings, tensors["bert.embeddings.word_embeddings.weight"])

    # A .bin that holds more than tensors is refused, not unpickled, and PyTorch's advice to retry
    # with weights_only=False is not passed on.
    torch.save({"weights": tensors, "note": _Unpicklable()}, source / "pytorch_model.bin")
    with pytest.raises(ValueError, match="not a valid or trusted checkpoint file") as refused:
        load_starting_point(source)
    assert "weights_only" not in str(refused.value)


class _Unpicklable:
    """An arbitrary object: `torch.load(weights_only=True)` must refuse to rebuild it."""


def write_pretrain_dir(path: Path, vocab: Path, config: ModelConfig) -> tuple[Path, dict[str, torch.Tensor]]:
    """A labse-pretrain output written by hand to its fixed format."""
    path.mkdir()
    torch.manual_seed(3)
    bert = {f"bert.{k}": v.contiguous() for k, v in SentenceEncoder(config).bert.state_dict().items()}
    save_file(bert, path / "encoder.safetensors")
    (path / "vocab.txt").write_bytes(vocab.read_bytes())
    import dataclasses

    (path / "pretrain_config.json").write_text(json.dumps({"model": dataclasses.asdict(config),
                                                           "vocab_sha256": file_sha256(vocab)}))
    return path, bert


def test_pretrain_output_loads_and_its_missing_or_extra_keys_are_named(vocab, tmp_path, caplog):
    config = ModelConfig.from_preset("tiny", 2000)
    source, bert = write_pretrain_dir(tmp_path / "pt", vocab, config)
    start = load_starting_point(source)
    assert start.kind == "pretrain" and start.model == config and not start.defines_pooling
    encoder = SentenceEncoder(start.model)
    with caplog.at_level(logging.INFO, logger="labse_model.starting_point"):
        start.load_into(encoder)
    assert "freshly initialised (the source has no such weights): head.bias, head.weight" in caplog.text
    assert all(torch.equal(encoder.state_dict()[k], v) for k, v in bert.items())

    missing = dict(bert)
    del missing["bert.encoder.layer.1.output.dense.bias"]
    save_file(missing, source / "encoder.safetensors")
    with pytest.raises(ValueError, match=r"missing \[bert\.encoder\.layer\.1\.output\.dense\.bias\], unexpected \[\]"):
        load_starting_point(source).check_matches(config)

    extra = {**bert, "bert.encoder.layer.2.output.dense.bias": torch.zeros(64)}
    save_file(extra, source / "encoder.safetensors")
    with pytest.raises(ValueError, match=r"missing \[\], unexpected \[bert\.encoder\.layer\.2\.output\.dense\.bias\]"):
        load_starting_point(source).load_into(SentenceEncoder(config))

    save_file(bert, source / "encoder.safetensors")
    (source / "vocab.txt").write_bytes(vocab.read_bytes() + b"extra\n")
    with pytest.raises(ValueError, match="not the vocabulary the encoder was pre-trained with"):
        load_starting_point(source)


# ----------------------------------------------------------------------------------------------
# labse-train --init-from, then labse-export


@pytest.fixture(scope="module")
def shards(labse_data, vocab, tmp_path_factory) -> str:
    return write_shards(labse_data, vocab, tmp_path_factory.mktemp("start_shards"), pairs_per_lang=16)


def _train_args(vocab: Path, shards: str, output: Path, source: Path, *extra: str) -> list[str]:
    return ["--data", shards, "--vocab", str(vocab), "--output", str(output), "--init-from", str(source),
            "--global-batch-size", "8", "--max-steps", "2", "--warmup-steps", "0", "--dropout", "0", *extra]


def test_train_from_a_sentence_transformer_then_export(vocab, shards, sentences, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    source = write_sentence_transformer(tmp_path / "st", write_bert_dir(tmp_path / "bert", vocab), "cls", True, True)

    # With lr 0 the run keeps the source's weights: its export must be the source model itself.
    unchanged = tmp_path / "unchanged"
    assert train_main(_train_args(vocab, shards, unchanged, source, "--lr", "0")) == 0
    config = json.loads((unchanged / "config.json").read_text())
    assert config["model"]["hidden_size"] == HIDDEN and config["model"]["pooling"] == "cls"
    assert config["init_from"] == str(source)
    assert (unchanged / "vocab.txt").read_bytes() == (source / "vocab.txt").read_bytes()
    assert export_main(["--run", str(unchanged), "--output", str(tmp_path / "unchanged_model")]) == 0
    assert_same_embeddings(published_embeddings(tmp_path / "unchanged_model", sentences),
                           published_embeddings(source, sentences))

    # Trained for real, the export gives the trainer's embeddings.
    trained_run = tmp_path / "trained"
    assert train_main(_train_args(vocab, shards, trained_run, source, "--lr", "1e-3")) == 0
    assert export_main(["--run", str(trained_run), "--output", str(tmp_path / "trained_model")]) == 0
    encoder, run_config, _ = load_encoder(trained_run)
    trained = trainer_embeddings(encoder, trained_run / "vocab.txt", sentences)
    assert_same_embeddings(trained, published_embeddings(tmp_path / "trained_model", sentences))
    assert ((trained * published_embeddings(source, sentences)).sum(dim=-1)).min().item() < 0.9999  # it trained


def test_train_from_a_model_without_dense_exports_without_dense(vocab, shards, sentences, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    source = write_sentence_transformer(tmp_path / "st", write_bert_dir(tmp_path / "bert", vocab), "mean", False,
                                        True)
    run = tmp_path / "run"
    assert train_main(_train_args(vocab, shards, run, source, "--lr", "1e-3")) == 0
    model_dir = tmp_path / "model"
    assert export_main(["--run", str(run), "--output", str(model_dir)]) == 0
    types = [entry["type"].rsplit(".", 1)[-1] for entry in json.loads((model_dir / "modules.json").read_text())]
    assert types == ["Transformer", "Pooling", "Normalize"]
    encoder, _, _ = load_encoder(run)
    assert encoder.head is None
    assert_same_embeddings(trainer_embeddings(encoder, run / "vocab.txt", sentences),
                           published_embeddings(model_dir, sentences))


def test_init_from_contradictions_are_clear_errors(labse_data, vocab, shards, tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    source = write_sentence_transformer(tmp_path / "st", write_bert_dir(tmp_path / "bert", vocab), "cls", True, True)

    assert train_main(_train_args(vocab, shards, tmp_path / "a", source, "--config", "tiny")) == 2
    assert "--config tiny" in caplog.text and "leave --config out" in caplog.text
    assert train_main(_train_args(vocab, shards, tmp_path / "b", source, "--pooling", "mean")) == 2
    assert "--pooling mean contradicts" in caplog.text

    other_vocab = build_vocab(labse_data, tmp_path / "other_vocab", vocab_size=1500)
    assert train_main(_train_args(other_vocab, shards, tmp_path / "c", source)) == 2
    assert f"the shards must be made by labse-tfrecords --vocab {source / 'vocab.txt'}" in caplog.text
    assert not (tmp_path / "c").exists()  # refused before the run directory is written

    # Shards whose schema names another vocabulary: the schema check says where the vocabulary comes from.
    schema_dir = Path(shards).parent
    (schema_dir / "schema.json").write_text(json.dumps({"version": 1, "vocab": {"sha256": file_sha256(other_vocab)}}))
    try:
        assert train_main(_train_args(vocab, shards, tmp_path / "d", source)) == 2
    finally:
        (schema_dir / "schema.json").unlink()
    assert f"the run starts from --init-from {source}" in caplog.text
    assert "make the shards with labse-tfrecords --vocab" in caplog.text

    broken = tmp_path / "broken"
    broken.mkdir()
    assert train_main(_train_args(vocab, shards, tmp_path / "e", broken)) == 2
    assert "not a labse-train run or checkpoint" in caplog.text


def test_run_directory_and_bare_weights_still_work(vocab, shards, tmp_path):
    first = tmp_path / "first"
    assert train_main(_train_args(vocab, shards, first, tmp_path / "none")) == 2  # does not exist
    assert train_main(["--data", shards, "--vocab", str(vocab), "--output", str(first), "--config", "tiny",
                       "--pooling", "max", "--global-batch-size", "8", "--max-steps", "1"]) == 0
    from labse_model.checkpoint import find_checkpoint

    weights = find_checkpoint(first) / "model.safetensors"
    from_run = load_starting_point(first)
    assert from_run.kind == "run" and from_run.model.pooling == "max" and from_run.vocab == first / "vocab.txt"
    assert load_starting_point(weights).model == from_run.model  # the run around the checkpoint gives the config
    # Continuing a run takes its architecture: no --config needed, the pooling is kept.
    second = tmp_path / "second"
    assert train_main(_train_args(vocab, shards, second, first)) == 0
    assert json.loads((second / "config.json").read_text())["model"]["pooling"] == "max"
    # A bare weights file outside a run says nothing about the architecture: --config decides, strictly.
    bare = tmp_path / "bare.safetensors"
    bare.write_bytes(weights.read_bytes())
    assert train_main(_train_args(vocab, shards, tmp_path / "third", bare, "--config", "tiny")) == 0
    assert train_main(_train_args(vocab, shards, tmp_path / "fourth", bare, "--config", "mini")) == 2


@pytest.mark.parametrize("escape", ["../model/{path}", "{model}/{path}"])
def test_init_from_refuses_module_paths_that_leave_the_directory(tmp_path, escape):
    from labse_model.starting_point import load_starting_point
    from model_helpers import save_tiny_sentence_transformer

    (tmp_path / "work").mkdir()
    model = save_tiny_sentence_transformer(tmp_path / "work", tmp_path / "model")
    shutil.copyfile(tmp_path / "work" / "vocab.txt", model / "vocab.txt")  # as labse-export writes it
    load_starting_point(model)  # the model itself loads
    wrapper = tmp_path / "wrapper"
    wrapper.mkdir()
    shutil.copyfile(model / "vocab.txt", wrapper / "vocab.txt")
    modules = json.loads((model / "modules.json").read_text())
    for entry in modules:
        entry["path"] = escape.format(model=model, path=entry["path"]).rstrip("/")
    (wrapper / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match="leaves the directory"):
        load_starting_point(wrapper)
