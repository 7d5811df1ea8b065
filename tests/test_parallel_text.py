"""Parallel text on a command line is `SRC_LANG:PATH,TGT_LANG:PATH` everywhere (pipelines.io.parallel_text):
labse-tfrecords --parallel-text and labse-train --dev-data, whose older SRC_FILE:TGT_FILE form is still
read for one release, with a warning."""
from __future__ import annotations

import logging

import pytest

from labse_model.dev_eval import dev_text_files, load_dev_pairs
from labse_model.train import main as train_main
from model_helpers import build_vocab
from pipelines.io.parallel_text import ParallelTextSpec, is_parallel_text, parse_parallel_text
from pipelines.tfrecords import transforms as tfr_transforms


def test_parse_names_languages_and_paths():
    spec = parse_parallel_text("de:train.de.gz,en:train.en.gz")
    assert spec == ParallelTextSpec("de", "train.de.gz", "en", "train.en.gz")
    assert str(spec) == "de:train.de.gz,en:train.en.gz"
    assert ParallelTextSpec.parse(str(spec)) == spec
    assert is_parallel_text(str(spec)) and not is_parallel_text("train.de.gz:train.en.gz")
    # A path may hold colons (object stores); spaces around the parts are dropped.
    assert parse_parallel_text(" de : gs://b/x.de.gz , pt-BR:gs://b/x.pt.gz") == \
        ParallelTextSpec("de", "gs://b/x.de.gz", "pt-BR", "gs://b/x.pt.gz")
    # labse-tfrecords reads this very spec (pipelines.tfrecords.transforms imports it).
    assert tfr_transforms.ParallelTextSpec is ParallelTextSpec


@pytest.mark.parametrize("text,problem", [
    ("train.de.gz", "expects 'src_lang:path,tgt_lang:path'"),
    ("train.de.gz:train.en.gz", "expects"),                      # the old dev-data form
    ("de:a.gz,en:b.gz,fr:c.gz", "expects"),
    ("de:a.gz,b.gz", "expects"),
    ("data/x.de:a,data/x.en:b", "'data/x.de' is not a language code"),
    (":a.gz,en:b.gz", "'' is not a language code"),
    ("de:,en:b.gz", "no path after de:"),
])
def test_malformed_specs_are_refused_naming_the_option(text, problem):
    with pytest.raises(ValueError, match="^--dev-data expects") as error:
        parse_parallel_text(text, "--dev-data")
    assert problem in str(error.value) and repr(text) in str(error.value)


def test_dev_data_forms(tmp_path, caplog):
    shard = tmp_path / "dev-00000.tfrecord"
    shard.write_bytes(b"")
    assert dev_text_files(str(tmp_path / "*.tfrecord")) is None   # a glob that matches: shards
    assert dev_text_files(str(tmp_path / "none-*.tfrecord")) is None
    assert dev_text_files("de:v.de.gz,en:v.en.gz", warn=True) == ("v.de.gz", "v.en.gz")
    assert not caplog.records
    assert dev_text_files("v.de.gz:v.en.gz") == ("v.de.gz", "v.en.gz")   # deprecated, still read
    assert not caplog.records
    with caplog.at_level(logging.WARNING, logger="labse_model.dev_eval"):
        assert dev_text_files("v.de.gz:v.en.gz", warn=True) == ("v.de.gz", "v.en.gz")
    [record] = caplog.records
    assert "deprecated" in record.getMessage() and "SRC_LANG:v.de.gz,TGT_LANG:v.en.gz" in record.getMessage()
    with pytest.raises(ValueError, match="'x/de' is not a language code"):
        dev_text_files("x/de:v.de.gz,en:v.en.gz")


def test_old_and_new_dev_data_forms_give_the_same_pairs(labse_data, tmp_path):
    vocab = build_vocab(labse_data, tmp_path / "vocab", vocab_size=500, lines_per_lang=200)
    de, en = labse_data / "multi30k" / "val.de.gz", labse_data / "multi30k" / "val.en.gz"
    new = load_dev_pairs(f"de:{de},en:{en}", str(vocab), max_pairs=20, max_seq_length=16)
    old = load_dev_pairs(f"{de}:{en}", str(vocab), max_pairs=20, max_seq_length=16)
    assert new == old and len(new[0]) == len(new[1]) == 20


def test_a_malformed_dev_data_is_refused_before_any_work(tmp_path, caplog):
    status = train_main(["--data", "/no/such/*.tfrecord", "--vocab", "/no/such/vocab.txt", "--output",
                         str(tmp_path / "run"), "--dev-data", "val/de:val.de.gz,en:val.en.gz"])
    assert status == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].startswith("--dev-data expects 'src_lang:path,tgt_lang:path'")
    assert not list(tmp_path.iterdir())
