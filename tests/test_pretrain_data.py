"""labse_model.pretrain_data's Packer: a huge --mono line is cut before it is tokenised, null and
empty rows are skipped and counted, and a file that cannot be read as sentences is named."""
from __future__ import annotations

import gzip
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from labse_model.pretrain_data import TEXT, Packer
from pipelines.text.wordpiece import CLS_ID, SEP_ID, hf_tokenizer


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


def _packer(vocab: Path):
    from labse_model.pretrain_data import Packer
    from pipelines.text.wordpiece import CLS_ID, SEP_ID, hf_tokenizer

    return Packer(hf_tokenizer(vocab), 32, CLS_ID, SEP_ID)


def test_mono_null_and_empty_rows_are_skipped_and_counted(pair_inputs, tmp_path):
    from labse_model.pretrain_data import PARQUET

    vocab, _ = pair_inputs
    path = tmp_path / "part.parquet"
    texts = ["A man rides a horse.", None, "", "Two dogs play in the snow."]
    pq.write_table(pa.table({"text": texts, "doc_id": ["d1", "d1", "d1", "d2"]}), path)
    packer = _packer(vocab)
    sequences = list(packer.pack(str(path), PARQUET))
    assert packer.rows_skipped == 2
    assert [(s.first_row, s.next_row) for s in sequences] == [(0, 3), (3, 4)]


@pytest.mark.parametrize("table", [
    pa.table({"sentence": ["A man rides a horse."], "doc_id": ["d1"]}),  # no text column
    pa.table({"text": [17], "doc_id": ["d1"]}),  # not strings
])
def test_mono_content_errors_name_the_file(pair_inputs, tmp_path, table):
    from labse_model.pretrain_data import PARQUET

    vocab, _ = pair_inputs
    path = tmp_path / "part.parquet"
    pq.write_table(table, path)
    with pytest.raises(ValueError, match=f"--mono file {path}"):
        list(_packer(vocab).pack(str(path), PARQUET))


def test_a_mono_text_file_that_is_not_utf8_is_named(pair_inputs, tmp_path):
    from labse_model.pretrain_data import TEXT

    vocab, _ = pair_inputs
    path = tmp_path / "de.txt"
    path.write_bytes("Ein Hund läuft.\n".encode("utf-8") + "Ein Hund läuft.\n".encode("latin-1"))
    with pytest.raises(ValueError, match=rf"--mono file {path}: not UTF-8 text \(line 2\)"):
        list(_packer(vocab).pack(str(path), TEXT))
