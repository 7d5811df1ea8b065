"""Sizes bounded before anything is allocated (issue 26, item 5, the trainer's parts).

labse-pretrain tokenised a whole line before cutting it to the sequence length (one 50 MB line:
11 GB and 2 minutes); a config asking for 10^6 layers or a hidden size of 10^6 was only found out
by the allocation (labse-export tried 128 GB). The old code is never run into a huge allocation
here: the tokenizer's inputs are recorded, and the export runs in a child whose address space is
bounded (old code: a MemoryError traceback there; new code: one line before allocating).
"""
from __future__ import annotations

import gzip
import json
import os
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from labse_model.config import MAX_PARAMETERS, ModelConfig
from labse_model.pretrain_data import TEXT, Packer
from pipelines.text.wordpiece import CLS_ID, SEP_ID, hf_tokenizer

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def vocab(labse_data, tmp_path_factory) -> Path:
    from model_helpers import build_vocab

    return build_vocab(labse_data, tmp_path_factory.mktemp("bounds_vocab"))


class RecordingTokenizer:
    def __init__(self, tokenizer):
        self.tokenizer, self.longest = tokenizer, 0

    def __call__(self, texts, **settings):
        self.longest = max(self.longest, *(len(t) for t in texts))
        return self.tokenizer(texts, **settings)


def test_pretrain_cuts_a_huge_line_before_tokenising_it_and_keeps_the_same_tokens(labse_data, vocab, tmp_path):
    with gzip.open(labse_data / "multi30k" / "train.de.gz", "rt", encoding="utf-8") as handle:
        sentences = [next(handle).strip() for _ in range(1000)]
    huge = " ".join(sentences * 2)  # ~130 KB on one line (the whole line is tokenised below, as a reference)
    path = tmp_path / "huge.txt"
    path.write_text(f"{sentences[0]}\n{huge}\n", encoding="utf-8")
    tokenizer = RecordingTokenizer(hf_tokenizer(vocab))
    packer = Packer(tokenizer, max_seq_length=64, cls_id=CLS_ID, sep_id=SEP_ID)

    packed = [sequence.ids for sequence in packer.pack(str(path), TEXT)]
    assert len(huge) > 100_000 and tokenizer.longest <= 62 * 128
    # The kept tokens are exactly the first 62 of the whole line's.
    whole = hf_tokenizer(vocab)(huge, add_special_tokens=False, verbose=False)["input_ids"]
    first = hf_tokenizer(vocab)(sentences[0], add_special_tokens=False)["input_ids"]
    assert packed == [[CLS_ID, *first, SEP_ID], [CLS_ID, *whole[:62], SEP_ID]]
    assert packer.sentences_cut == 1


@pytest.mark.parametrize("field, value", [("num_layers", 10**6), ("hidden_size", 10**6), ("vocab_size", 10**9)])
def test_a_model_config_too_large_is_refused_before_building_it(field, value):
    settings = {**{"vocab_size": 2000, "num_layers": 2, "hidden_size": 64, "num_heads": 2}, field: value}
    with pytest.raises(ValueError, match=re.escape(f"over this trainer's limit of {MAX_PARAMETERS:.0e}")) as refused:
        ModelConfig(**settings)
    assert "\n" not in str(refused.value)
    assert ModelConfig.from_preset("base", 501_153).parameter_count() == 470_926_848  # LaBSE's size, allowed


def test_export_of_a_run_config_with_a_huge_hidden_size_is_one_line_without_allocating(pair_inputs, tmp_path):
    from labse_model.train import main as train_main

    vocab, shards = pair_inputs
    run = tmp_path / "run"
    assert train_main(["--data", shards, "--vocab", str(vocab), "--output", str(run), "--config", "tiny",
                       "--global-batch-size", "8", "--max-steps", "1"]) == 0
    config = json.loads((run / "config.json").read_text())
    config["model"].update(hidden_size=10**6, num_heads=1)
    (run / "config.json").write_text(json.dumps(config))

    limit = 3 << 30  # 3 GiB of address space: enough for Python and torch, far from 128 GB
    result = subprocess.run(
        [sys.executable, "-m", "labse_model.export", "--run", str(run), "--output", str(tmp_path / "model")],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "config.json" in errors[0] and "parameters" in errors[0]
    assert not (tmp_path / "model").exists()
