"""labse-export round trip: SentenceTransformer(path) reproduces the trainer's encoder."""
from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
import torch

from labse_model import checkpoint as ckpt
from labse_model.checkpoint import save_model_weights
from labse_model.encoder import pool_tokens
from labse_model.export import load_encoder, main as export_main
from labse_model.train import main as train_main
from model_helpers import build_vocab, tatoeba_lines, write_shards
from pipelines.text.wordpiece import hf_tokenizer

# Several scripts: Latin with diacritics, Cyrillic, Greek, Arabic, Hebrew, Devanagari, Han, kana.
LANGS = ["deu", "ces", "rus", "ell", "ara", "heb", "hin", "cmn", "jpn"]


@pytest.fixture(scope="module")
def run_dir(labse_data, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("export_run")
    # UDHR texts give the vocabulary word pieces in every script tested below (no all-[UNK] lines).
    vocab = build_vocab(labse_data, root / "vocab", vocab_size=3000,
                        udhr=("rus", "ell_monotonic", "arb", "heb", "hin", "cmn_hans", "cmn_hant", "jpn"))
    shards = write_shards(labse_data, vocab, root / "shards", pairs_per_lang=16)
    run = root / "run"
    assert train_main(["--data", shards, "--vocab", str(vocab), "--output", str(run), "--config", "tiny",
                       "--global-batch-size", "8", "--max-steps", "2", "--lr", "5e-3", "--warmup-steps", "0"]) == 0
    # A freshly initialised BERT maps every sentence to nearly the same [CLS] vector (pairwise
    # cosines ~0.9999), which would make "cosine >= 0.9999" meaningless; spread the weights so that
    # distinct sentences get clearly distinct embeddings, then export those.
    encoder, _, checkpoint = load_encoder(run)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in encoder.parameters():
            parameter.add_(0.3 * torch.randn(parameter.shape, generator=generator))
    save_model_weights(encoder, checkpoint / "model.safetensors")
    return run


def test_sentence_transformers_directory_gives_the_trainer_embeddings(labse_data, run_dir, tmp_path, monkeypatch):
    from sentence_transformers import SentenceTransformer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    output = tmp_path / "model"
    assert export_main(["--run", str(run_dir), "--output", str(output)]) == 0
    assert (output / "modules.json").is_file() and (output / "2_Dense" / "config.json").is_file()
    assert (output / "vocab.txt").read_text() == (run_dir / "vocab.txt").read_text()

    sentences = [line for lang in LANGS for line in tatoeba_lines(labse_data, lang, 3)]
    model = SentenceTransformer(str(output), device="cpu")
    exported = torch.tensor(model.encode(sentences, batch_size=8))

    encoder, config, _ = load_encoder(run_dir)
    tokenizer = hf_tokenizer(run_dir / "vocab.txt")
    batch = tokenizer(sentences, padding=True, truncation=True, max_length=config.train.max_seq_length,
                      return_tensors="pt")
    with torch.no_grad():
        trained = encoder(batch["input_ids"], batch["attention_mask"])
    cosines = (exported * trained).sum(dim=-1)
    assert cosines.min().item() >= 0.9999, list(zip(sentences, cosines.tolist()))
    # Distinct sentences get distinct embeddings (the comparison is not between constants).
    assert (exported @ exported.T).fill_diagonal_(0).max().item() < 0.99

    # Cased tokenizer, full vocabulary, training length.
    assert len(model.tokenizer) == len(tokenizer) == 3000
    pieces = [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(s)) for s in sentences]
    assert sum(ids.count(1) for ids in pieces) / sum(map(len, pieces)) < 0.1  # real pieces, not [UNK] runs
    assert model.tokenizer.tokenize("Haus") != model.tokenizer.tokenize("haus")
    assert model.max_seq_length == config.train.max_seq_length

    # Plain transformers sees the same model: pooler_output is LaBSE's head before normalisation.
    from transformers import BertModel

    bert = BertModel.from_pretrained(str(output)).eval()
    with torch.no_grad():
        pooled = bert(**{k: batch[k] for k in ("input_ids", "attention_mask")}).pooler_output
    assert torch.nn.functional.cosine_similarity(pooled, trained).min().item() >= 0.9999


def test_export_refuses_to_overwrite_and_names_missing_runs(run_dir, tmp_path, caplog):
    output = tmp_path / "model"
    output.mkdir()
    (output / "keep.txt").write_text("user data")
    assert export_main(["--run", str(run_dir), "--output", str(output)]) == 2
    assert "--overwrite" in caplog.text and (output / "keep.txt").is_file()
    assert export_main(["--run", str(tmp_path / "no_run"), "--output", str(tmp_path / "m2")]) == 2
    assert "labse-train run directory" in caplog.text
    assert export_main(["--run", str(run_dir), "--output", str(tmp_path / "m3"), "--step", "7"]) == 2
    assert "available steps: [2]" in caplog.text


@pytest.mark.parametrize("pooling", ["mean", "max"])
def test_token_pooling_run_exports_its_pooling_mode(labse_data, run_dir, tmp_path, monkeypatch, pooling):
    """A `--pooling mean|max` run exports that Pooling mode and still gives the trainer's embeddings."""
    import json
    import shutil

    from sentence_transformers import SentenceTransformer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    pooled_run = tmp_path / f"{pooling}_run"
    shutil.copytree(run_dir, pooled_run)
    config = json.loads((pooled_run / "config.json").read_text())
    config["model"]["pooling"] = pooling  # same weights, pooled another way
    (pooled_run / "config.json").write_text(json.dumps(config))
    output = tmp_path / "model"
    assert export_main(["--run", str(pooled_run), "--output", str(output)]) == 0
    pooling_config = json.loads((output / "1_Pooling" / "config.json").read_text())
    assert pooling_config["pooling_mode"] == pooling

    sentences = [line for lang in LANGS for line in tatoeba_lines(labse_data, lang, 2)]
    exported = torch.tensor(SentenceTransformer(str(output), device="cpu").encode(sentences, batch_size=8))
    encoder, config_obj, _ = load_encoder(pooled_run)
    assert config_obj.model.pooling == pooling
    batch = hf_tokenizer(pooled_run / "vocab.txt")(sentences, padding=True, truncation=True,
                                                   max_length=config_obj.train.max_seq_length, return_tensors="pt")
    with torch.no_grad():
        trained = encoder(batch["input_ids"], batch["attention_mask"])
        hidden = encoder.bert(**{k: batch[k] for k in ("input_ids", "attention_mask")}).last_hidden_state
    assert ((exported * trained).sum(dim=-1)).min().item() >= 0.9999
    # The pooling really is the one named: every other mode gives other embeddings. Batches are padded
    # to the longest sentence, so padding positions would change a max or mean that did not mask them.
    assert batch["attention_mask"].min().item() == 0
    for other in {"cls", "mean", "max"} - {pooling}:
        other_pooled = torch.nn.functional.normalize(
            torch.tanh(encoder.head(pool_tokens(hidden, batch["attention_mask"], other))), dim=-1)
        assert ((trained * other_pooled).sum(dim=-1)).max().item() < 0.9999, other


def test_unknown_pooling_is_refused():
    from labse_model.config import ModelConfig

    with pytest.raises(ValueError, match="pooling"):
        ModelConfig.from_preset("tiny", 100, pooling="weightedmean")


def test_export_refuses_a_file_as_output_and_a_locked_output(run_dir, tmp_path, caplog):
    from pipelines.io.locks import output_lock

    a_file = tmp_path / "model.txt"
    a_file.write_text("user data")
    assert export_main(["--run", str(run_dir), "--output", str(a_file), "--overwrite"]) == 2
    assert "existing file" in caplog.text and a_file.read_text() == "user data"
    with output_lock(tmp_path / "model"):
        assert export_main(["--run", str(run_dir), "--output", str(tmp_path / "model")]) == 2
    assert "model.lock" in caplog.text and not (tmp_path / "model").exists()


@pytest.fixture(scope="module")
def finished_run(pair_inputs, tmp_path_factory) -> Path:
    """A finished 2-step tiny run; tests that could damage it work on copies."""
    vocab, shards = pair_inputs
    run = tmp_path_factory.mktemp("export_run") / "run"
    assert train_main(["--data", shards, "--vocab", str(vocab), "--output", str(run), "--config", "tiny",
                       "--global-batch-size", "8", "--max-steps", "2", "--lr", "1e-3", "--warmup-steps", "0",
                       "--save-every", "2"]) == 0
    return run


def _copy_run(run: Path, where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copytree(run, where / "run"))


def _files_of(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("output", ["run", "run/checkpoints", "."])
def test_export_refuses_an_output_that_is_inside_or_holds_its_run(finished_run, tmp_path, caplog, output):
    runs = tmp_path / "runs"
    run = _copy_run(finished_run, runs)
    before = _files_of(runs)
    assert export_main(["--run", str(run), "--output", str(runs / output), "--overwrite"]) == 2
    assert "the input" in caplog.text and str(run) in caplog.text
    assert _files_of(runs) == before  # nothing removed, nothing written


def test_export_respects_the_umask(finished_run, tmp_path):
    old = os.umask(0o022)
    try:
        assert export_main(["--run", str(finished_run), "--output", str(tmp_path / "model")]) == 0
    finally:
        os.umask(old)
    model = tmp_path / "model"
    assert stat.S_IMODE(model.stat().st_mode) == 0o755
    assert stat.S_IMODE((model / "model.safetensors").stat().st_mode) == 0o644
    modes = {stat.S_IMODE(p.stat().st_mode) for p in model.rglob("*")}
    assert modes <= {0o755, 0o644}, sorted(oct(m) for m in modes)


def test_exporting_a_checkpoint_without_its_digest_warns_in_one_line(finished_run, tmp_path, caplog):
    from safetensors.torch import load_file, save_file

    run = _copy_run(finished_run, tmp_path)
    weights = ckpt.find_checkpoint(run) / ckpt.MODEL_FILE
    save_file(load_file(weights), weights, metadata={"format": "pt"})  # the format before the digest
    assert export_main(["--run", str(run), "--output", str(tmp_path / "model")]) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "digest" in r.getMessage()]
    assert len(warnings) == 1 and str(weights) in warnings[0] and "\n" not in warnings[0]
    caplog.clear()
    assert export_main(["--run", str(finished_run), "--output", str(tmp_path / "model2")]) == 0
    assert "digest" not in caplog.text  # a checkpoint with its digest exports silently


def test_exporting_zeroed_weights_without_a_digest_warns_naming_them(finished_run, tmp_path, caplog):
    """Issue 34 item 7: bytes zeroed in place keep the file's size and parse; without a digest only
    the zeros tell."""
    from safetensors.torch import load_file, save_file

    run = _copy_run(finished_run, tmp_path)
    weights = ckpt.find_checkpoint(run) / ckpt.MODEL_FILE
    tensors = load_file(weights)
    zeroed = sorted(name for name, tensor in tensors.items() if tensor.dim() == 2)[:2]
    save_file({name: torch.zeros_like(t) if name in zeroed else t for name, t in tensors.items()}, weights,
              metadata={"format": "pt"})
    assert export_main(["--run", str(run), "--output", str(tmp_path / "model")]) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "all zeros" in r.getMessage()]
    assert len(warnings) == 1 and "2 weight matrices are all zeros" in warnings[0]
    assert all(name in warnings[0] for name in zeroed) and "\n" not in warnings[0]
    caplog.clear()
    assert export_main(["--run", str(finished_run), "--output", str(tmp_path / "model2")]) == 0
    assert "all zeros" not in caplog.text


@pytest.mark.parametrize("where", ["read-only parent", "bucket root"])
def test_an_output_that_cannot_be_written_is_one_line_before_any_work(finished_run, tmp_path, caplog, monkeypatch,
                                                                      where):
    """Issue 34 item 6: a read-only folder (a root process passes os.access, so it is simulated) or a
    bucket's root is refused in one line naming it."""
    import os

    output = str(tmp_path / "ro" / "model")
    if where == "bucket root":
        output = "gs://bucket"
    else:
        (tmp_path / "ro").mkdir()
        real_access = os.access
        monkeypatch.setattr(os, "access", lambda path, mode: False if str(path) == str(tmp_path / "ro")
                            else real_access(path, mode))
    assert export_main(["--run", str(finished_run), "--output", output]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "\n" not in errors[0], errors
    assert ("is read-only" if where == "read-only parent" else "gs://bucket is a bucket's root") in errors[0]
