"""labse-tfrecords (Beam, real Multi30k text, the project tokenizer) and the TensorFlow-free reader."""
from __future__ import annotations

import gzip
import json
import os
import re
from collections import Counter

import numpy as np
import pytest

from pipelines.io import tfrecord
from labse_model.data import build_train_loader, iter_pairs
from pipelines.io.parallel_text import ParallelTextSpec
from pipelines.io.tfrecord import TFRecordCorruptError, example_to_dict, index_records, iter_records
from pipelines import tfrecords as tfr
from pipelines.tfrecords import cli as tfr_cli, encode as tfr_encode, transforms as tfr_beam
from tests.conftest import require_file
from pipelines.io.completion import mark_complete
from tests.object_store import ObjectStoreOnDisk
from pipelines.accounting import identity_violations

MAX_LEN = 16
SCORED_ROWS = 300  # from Multi30k val de-en, as contract-7 scored pairs


def read_lines(path, n=None):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    return lines[:n] if n else lines


def write_multi30k_vocab(labse_data, path) -> None:
    """A real (small) WordPiece vocabulary from Multi30k train: frequent words, then every character."""
    words: Counter = Counter()
    chars: set[str] = set()
    for lang in ("en", "de", "fr", "cs"):
        for line in read_lines(require_file(labse_data, f"multi30k/train.{lang}.gz"), 3000):
            words.update(re.findall(r"\w+|[^\w\s]", line))
            chars.update(line.replace(" ", ""))
    for lang in ("en", "de", "fr", "cs"):  # val is tokenised below: every character must be known
        for line in read_lines(require_file(labse_data, f"multi30k/val.{lang}.gz")):
            chars.update(line.replace(" ", ""))
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens += [w for w, _ in words.most_common(1500)]
    seen = set(tokens)
    for ch in sorted(chars):
        for token in (ch, "##" + ch):
            if token not in seen and not ch.isspace():
                tokens.append(token)
                seen.add(token)
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def built(labse_data, tmp_path_factory):
    """One multi-process DirectRunner run of the CLI on real data: scored Parquet + parallel text."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("tfrecords")
    vocab = root / "vocab.txt"
    write_multi30k_vocab(labse_data, vocab)
    de = read_lines(require_file(labse_data, "multi30k/val.de.gz"), SCORED_ROWS)
    en = read_lines(require_file(labse_data, "multi30k/val.en.gz"), SCORED_ROWS)
    rng = np.random.default_rng(0)
    scores = rng.uniform(0, 1, SCORED_ROWS)
    src = list(de)
    tgt: list = list(en)
    src[0] = "   "  # empty after stripping
    tgt[1] = None  # missing text
    scored = root / "scored"
    scored.mkdir()
    n = SCORED_ROWS // 2  # two files, as labse-score writes shards
    for part, rows in enumerate((slice(0, n), slice(n, SCORED_ROWS))):
        table = pa.table({
            "src": src[rows], "tgt": tgt[rows], "src_lang": ["de"] * len(src[rows]), "tgt_lang": ["en"] * len(src[rows]),
            "cosine": scores[rows], "margin": scores[rows], "score": scores[rows],
            "src_url": ["u"] * len(src[rows]), "src_doc_id": ["d"] * len(src[rows]),
            "tgt_url": ["u"] * len(src[rows]), "tgt_doc_id": ["d"] * len(src[rows]),
        })
        pq.write_table(table, scored / f"part-{part}.parquet")
    (scored / "broken.parquet").write_bytes(b"PAR1 this is not parquet")
    mark_complete(scored, {}, stage="labse-score")  # a finished labse-score output

    out = root / "shards"
    argv = [
        "--pairs", str(scored), "--vocab", str(vocab), "--output", str(out),
        "--parallel-text", f"fr:{require_file(labse_data, 'multi30k/val.fr.gz')},en:{require_file(labse_data, 'multi30k/val.en.gz')}",
        "--max-seq-length", str(MAX_LEN), "--num-shards", "3", "--min-score", "0.2", "--include-text", "--seed", "7",
        "--direct_running_mode=multi_processing", "--direct_num_workers=2",
    ]
    assert tfr.main(argv) == 0
    return {"root": root, "vocab": vocab, "out": out, "scores": scores, "src": src, "tgt": tgt, "argv": argv}


def test_shards_schema_and_stats(built, labse_data):
    out = built["out"]
    shards = sorted(p.name for p in out.glob("*.tfrecord"))
    assert shards == [f"pairs-0000{i}-of-00003.tfrecord" for i in range(3)]
    schema = json.loads((out / "schema.json").read_text())
    stats = json.loads((out / "stats.json").read_text())
    assert schema["version"] == tfr_encode.SCHEMA_VERSION and schema["max_seq_length"] == MAX_LEN
    assert {"src_ids", "tgt_ids", "src_lang", "tgt_lang", "score", "src_text", "tgt_text"} == set(schema["features"])
    import hashlib

    assert schema["vocab"]["sha256"] == hashlib.sha256(built["vocab"].read_bytes()).hexdigest()
    assert schema["vocab"]["file"] == "vocab.txt"
    assert schema["vocab"]["special_ids"] == {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
    for entry in schema["shards"]:
        assert (out / entry["file"]).stat().st_size == entry["num_bytes"]
        assert len(index_records(out / entry["file"])) == entry["num_records"]
        # The offset index beside each shard (8 bytes a record) says where the records start.
        index = out / entry["index"]
        assert index.stat().st_size == 8 * entry["num_records"]
        np.testing.assert_array_equal(tfrecord.decode_index(index.read_bytes(), str(index)),
                                      index_records(out / entry["file"]))

    # Every input pair is accounted for: written, or dropped with a reason.
    scores = built["scores"]
    below = int(sum(1 for i, s in enumerate(scores) if s < 0.2 and i not in (0, 1)))
    fr_en = read_lines(require_file(labse_data, "multi30k/val.fr.gz"))
    fr_pairs = len(fr_en)
    pairs_read = stats["accounting"]["pairs"]["read"]
    assert stats["dropped"]["empty_text"] == 1
    assert stats["dropped"]["missing_text"] == 1
    assert stats["dropped"]["below_min_score"] == below
    assert stats["dropped"]["parquet_unreadable"] == 1
    dropped_pairs = sum(v for k, v in stats["dropped"].items() if k != "parquet_unreadable")
    assert stats["written_pairs"] + dropped_pairs == SCORED_ROWS + fr_pairs == stats["input_pairs"]
    assert stats["written_pairs"] == schema["num_records"] == sum(s["num_records"] for s in schema["shards"])
    assert set(stats["language_pairs"]) == {"de-en", "fr-en"}
    # which input the pairs came from, and the closing summary that says so
    assert stats["read_by_input"]["--parallel-text"] == fr_pairs
    assert SCORED_ROWS - 2 <= stats["read_by_input"]["--pairs"] <= SCORED_ROWS
    from pipelines.tfrecords.cli import tfrecords_summary

    summary = tfrecords_summary(stats, 3, str(out))
    share = stats["read_by_input"]["--parallel-text"] / sum(stats["read_by_input"].values())
    assert f"--parallel-text {fr_pairs:,} ({share:.1%})" in summary
    assert summary.splitlines()[0].startswith(f"labse-tfrecords: {pairs_read:,} pairs read, {stats['written_pairs']:,} kept")
    # The accounting section (README contract 11) balances and matches the records on disk.
    assert identity_violations(stats) == [] and stats["identity_holds"]
    pairs = stats["accounting"]["pairs"]
    on_disk = sum(len(index_records(out / entry["file"])) for entry in schema["shards"])
    assert pairs["read"] == SCORED_ROWS + fr_pairs and pairs["kept"] == on_disk == stats["written_pairs"]
    assert pairs["dropped"] == {k: v for k, v in stats["dropped"].items() if k != "parquet_unreadable"}
    assert pairs["errored"] == 0
    assert stats["accounting"]["parquet_files"] == {"read": 3, "kept": 2, "dropped": {}, "errored": 1,
                                                    "errors": {"parquet_unreadable": 1}}
    assert stats["truncated_src"] > 0  # max_seq_length 16 cuts many captions


def test_records_match_the_tokenizer_and_are_globally_shuffled(built):
    from pipelines.text.wordpiece import TFTextTokenizer

    tokenizer = TFTextTokenizer(str(built["vocab"]))
    records = []
    for path in sorted(built["out"].glob("*.tfrecord")):
        records.append([example_to_dict(r) for r in iter_records(path)])
    flat = [r for shard in records for r in shard]
    texts = [r["src_text"][0].decode() for r in flat]
    expected = tokenizer.tokenize_ids(texts)
    for record, pieces in zip(flat, expected):
        assert record["src_ids"][0] == 2 and record["src_ids"][-1] == 3
        assert len(record["src_ids"]) <= MAX_LEN
        assert record["src_ids"][1:-1] == pieces[: MAX_LEN - 2]
        assert record["tgt_lang"] == [b"en"] and record["src_lang"][0] in (b"de", b"fr")
        if record["src_lang"] == [b"fr"]:
            assert record["score"] == [1.0]
        else:
            assert record["score"][0] >= 0.2
    # Global shuffle: each shard mixes both sources, in an order unrelated to the input order.
    for shard in records:
        langs = Counter(r["src_lang"][0] for r in shard)
        assert langs[b"de"] > 10 and langs[b"fr"] > 100
    de_texts = [t for r, t in zip(flat, texts) if r["src_lang"] == [b"de"]]
    positions = [built["src"].index(t) for t in de_texts]
    assert positions != sorted(positions)


def test_tensorflow_reads_the_shards(built):
    import tensorflow as tf

    path = str(sorted(built["out"].glob("*.tfrecord"))[0])
    spec = {"src_ids": tf.io.VarLenFeature(tf.int64), "tgt_ids": tf.io.VarLenFeature(tf.int64),
            "src_lang": tf.io.FixedLenFeature([], tf.string), "score": tf.io.FixedLenFeature([], tf.float32)}
    ours = [example_to_dict(r) for r in iter_records(path)]
    theirs = [tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(path)]
    assert len(theirs) == len(ours)
    for a, b in zip(ours, theirs):
        assert tf.sparse.to_dense(b["src_ids"]).numpy().tolist() == a["src_ids"]
        assert b["src_lang"].numpy() == a["src_lang"][0]


def test_same_seed_same_shards_in_process_runner(built, tmp_path, monkeypatch):
    """Determinism: the default in-process DirectRunner writes byte-identical shards (reading vocab.txt once)."""
    hashed = []
    fingerprint = tfr_beam.vocab_fingerprint
    monkeypatch.setattr(tfr_beam, "vocab_fingerprint", lambda path: hashed.append(path) or fingerprint(path))
    argv = list(built["argv"])
    out_index = argv.index("--output") + 1
    argv[out_index] = str(tmp_path / "again")
    argv = [a for a in argv if not a.startswith("--direct_")]
    assert tfr.main(argv) == 0
    assert hashed == [str(built["vocab"])]
    assert (tmp_path / "again" / "schema.json").read_text() == (built["out"] / "schema.json").read_text()
    for path in sorted(built["out"].glob("*.tfrecord")):
        assert (tmp_path / "again" / path.name).read_bytes() == path.read_bytes()
    # And the output directory is protected against mixing runs.
    assert tfr.main(argv) == 2
    assert (tmp_path / "again" / "_SUCCESS").is_file()


def test_train_loader_reads_beam_shards(built):
    pattern = str(built["out"] / "*.tfrecord")
    total = sum(1 for _ in iter_pairs(pattern))
    batches = [
        next(build_train_loader(pattern, global_batch_size=8, rank=r, world_size=2, seed=0, start_step=3))
        for r in range(2)
    ]
    for batch in batches:
        assert batch["src_input_ids"].shape[0] == 4
        assert batch["src_input_ids"].shape[1] <= MAX_LEN
        assert (batch["src_input_ids"][:, 0] == 2).all()
    assert total > 500


def test_truncated_and_corrupt_shards_name_the_file(built, tmp_path):
    source = sorted(built["out"].glob("*.tfrecord"))[0]
    data = source.read_bytes()
    offsets = index_records(source)
    mark_complete(tmp_path, {}, stage="test: damaged copies of a complete output")  # the loader requires it

    truncated = tmp_path / "truncated.tfrecord"
    truncated.write_bytes(data[:-7])
    with pytest.raises(TFRecordCorruptError, match=rf"{re.escape(str(truncated))} at byte offset {offsets[-1]}.*truncated"):
        index_records(truncated)
    with pytest.raises(TFRecordCorruptError, match="truncated"):
        list(iter_records(truncated))
    with pytest.raises(TFRecordCorruptError, match=re.escape(str(truncated))):
        build_train_loader(str(truncated), global_batch_size=2, rank=0, world_size=1, seed=0)

    flipped = bytearray(data)
    flipped[int(offsets[5]) + 12 + 3] ^= 0x10  # inside the 6th record's payload
    bad = tmp_path / "flipped.tfrecord"
    bad.write_bytes(bytes(flipped))
    with pytest.raises(TFRecordCorruptError, match=rf"{re.escape(str(bad))} at byte offset {offsets[5]}: data checksum"):
        list(iter_records(bad))
    loader = build_train_loader(str(bad), global_batch_size=len(offsets), rank=0, world_size=1, seed=0)
    with pytest.raises(TFRecordCorruptError, match="data checksum"):
        next(loader)

    header = bytearray(data)
    header[int(offsets[2]) + 1] ^= 0x01  # the 3rd record's length field
    bad_len = tmp_path / "length.tfrecord"
    bad_len.write_bytes(bytes(header))
    with pytest.raises(TFRecordCorruptError, match=rf"offset {offsets[2]}: length checksum"):
        index_records(bad_len)


def test_crc32c_is_castagnoli():
    assert tfrecord.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert tfrecord.CRC32C_IMPLEMENTATION.startswith("google-crc32c")


def test_pure_functions():
    assert tfr_encode.wrap_and_truncate([10, 11, 12], 2, 3, 5) == ([2, 10, 11, 12, 3], False)
    assert tfr_encode.wrap_and_truncate([10, 11, 12, 13], 2, 3, 5) == ([2, 10, 11, 12, 3], True)
    assert tfr_encode.normalise_pair({"src": " a ", "tgt": "b"}) == {
        "src": "a", "tgt": "b", "src_lang": "und", "tgt_lang": "und", "score": pytest.approx(float("nan"), nan_ok=True)}
    assert tfr_encode.normalise_pair({"src": "a", "tgt": ""}) == "empty_text"
    assert tfr_encode.normalise_pair({"src": "a", "tgt": "b", "score": "x"}) == "bad_score"
    assert tfr_encode.passes_min_score(float("nan"), 0.5) == "score_missing"
    assert tfr_encode.passes_min_score(0.4, None) is None
    spec = ParallelTextSpec.parse("de:/x/train.de.gz,en:/x/train.en.gz")
    assert (spec.src_lang, spec.tgt_path) == ("de", "/x/train.en.gz")
    with pytest.raises(ValueError, match="src_lang:path"):
        ParallelTextSpec.parse("/x/train.de.gz")
    pair = {"src": "a", "tgt": "b", "src_lang": "de", "tgt_lang": "en"}
    assert tfr_encode.shuffle_key(1, pair) == tfr_encode.shuffle_key(1, dict(pair)) != tfr_encode.shuffle_key(2, pair)


def test_writer_is_atomic(tmp_path):
    target = tmp_path / "shard.tfrecord"
    with pytest.raises(RuntimeError):
        with tfrecord.TFRecordWriter(target) as writer:
            writer.write(b"first")
            raise RuntimeError("worker died")
    assert list(tmp_path.iterdir()) == []  # neither the shard nor a temp file
    with tfrecord.TFRecordWriter(target) as writer:
        writer.write(b"first")
        writer.write(b"")
    assert list(iter_records(target)) == [b"first", b""]


def test_gzip_shards_get_a_clear_message(tmp_path):
    plain = tmp_path / "plain.tfrecord"
    with tfrecord.TFRecordWriter(plain) as writer:
        writer.write(b"payload")
    zipped = tmp_path / "zipped.tfrecord.gz"
    zipped.write_bytes(gzip.compress(plain.read_bytes()))
    with pytest.raises(TFRecordCorruptError, match="GZIP-compressed"):
        index_records(zipped)
    (tmp_path / "text.tfrecord").write_text("not a tfrecord at all\n")
    with pytest.raises(TFRecordCorruptError, match="text.tfrecord at byte offset 0: length checksum"):
        index_records(tmp_path / "text.tfrecord")


def test_object_store_shard_is_written_or_removed(labse_data, tmp_path):
    """A shard that fails partway on an object store is deleted, not left behind as a short object."""
    de = read_lines(require_file(labse_data, "multi30k/val.de.gz"), 20)
    en = read_lines(require_file(labse_data, "multi30k/val.en.gz"), 20)
    facts = ("de-en", 3, 3, False, False)
    records = [(key, tfrecord.encode_example({"src_text": s, "tgt_text": t}), facts)
               for key, (s, t) in enumerate(zip(de, en))]
    write = tfr_beam._WriteShard(ObjectStoreOnDisk.PREFIX + str(tmp_path), 1)

    summary = next(write.process((0, records)))
    shard = tmp_path / tfr_encode.shard_name(0, 1)
    assert summary["num_records"] == 20 and summary["num_bytes"] == shard.stat().st_size
    assert [example_to_dict(r)["src_text"] for r in iter_records(shard)] == [[s.encode()] for s in de]
    index = tmp_path / tfrecord.index_path(shard.name)
    np.testing.assert_array_equal(tfrecord.decode_index(index.read_bytes(), str(index)), index_records(shard))
    shard.unlink()
    index.unlink()

    broken = records[:10] + [(10, None, facts)] + records[11:]  # record 11 cannot be framed
    with pytest.raises(TypeError):
        next(write.process((0, broken)))
    assert list(tmp_path.iterdir()) == []


def test_parallel_text_streams_and_counts_unaligned_lines(labse_data, tmp_path):
    """Line-aligned files are read line by line; lines one side has more of are dropped with a reason."""
    de = read_lines(require_file(labse_data, "multi30k/val.de.gz"), 5)
    en = read_lines(require_file(labse_data, "multi30k/val.en.gz"), 7)
    (tmp_path / "de.txt").write_text("\n".join(de) + "\n", encoding="utf-8")
    (tmp_path / "en.txt").write_text("\r\n".join(en), encoding="utf-8")  # CRLF, no final newline
    spec = ParallelTextSpec("de", str(tmp_path / "de.txt"), "en", str(tmp_path / "en.txt"))
    out = list(tfr_beam._ReadParallelText().process(spec))
    pairs = [o for o in out if isinstance(o, dict)]
    assert [(p["src"], p["tgt"]) for p in pairs] == list(zip(de, en[:5]))
    assert _tagged(out, "dropped") == ["unaligned_line"] * 2
    assert _tagged(out, "tally") == [{"pairs.read": 7}]  # every line position: 5 pairs + 2 unaligned


def test_parquet_pairs_without_src_tgt_are_dropped_with_a_reason(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"src": ["Hallo Welt."], "other": ["x"]}), tmp_path / "bad.parquet")
    pq.write_table(pa.table({"src": ["Hallo."], "tgt": ["Hello."], "score": [0.9]}), tmp_path / "good.parquet")
    bad = list(tfr_beam._ReadParquetPairs().process(str(tmp_path / "bad.parquet")))
    assert _tagged(bad, "dropped") == ["parquet_without_src_tgt"]
    assert _tagged(bad, "tally") == [{"pairs.read": 0, "parquet_files.errored.parquet_without_src_tgt": 1}]
    good = list(tfr_beam._ReadParquetPairs().process(str(tmp_path / "good.parquet")))
    assert [o for o in good if isinstance(o, dict)] == [{"src": "Hallo.", "tgt": "Hello.", "score": 0.9}]
    assert _tagged(good, "tally") == [{"pairs.read": 1, "parquet_files.kept": 1}]


def _tagged(outputs, tag):
    """The values a DoFn's `process` gave on one tagged output."""
    return [o.value for o in outputs if getattr(o, "tag", None) == tag]


# ------------------------------------------------------------------ refused before any work starts
@pytest.fixture
def small_inputs(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    scored = tmp_path / "scored"
    scored.mkdir()
    pq.write_table(pa.table({"src": ["Hallo Welt."], "tgt": ["Hello world."], "score": [0.9]}),
                   scored / "part-00000-of-00001.parquet")
    mark_complete(scored, {})
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "H", "##a", "##l", "##o"]) + "\n")
    return scored, vocab


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("labse-tfrecords: error:") and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("tokens, message", [
    (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "Hallo", "##a", "Hallo"], "appears twice (lines 6 and 8)"),
    (["[PAD]", "[CLS]", "[SEP]", "[MASK]", "Hallo"], "lacks ['[UNK]']"),
    # issue 34 item 5: was accepted here, then a traceback in every worker's tokenizer
    (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "Hallo", "gu ten"], ":7: token 'gu ten' contains whitespace"),
    (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "Hallo", "tab\there"], ":7: token 'tab\\there' contains whitespace"),
])
def test_a_vocabulary_with_duplicates_or_without_unk_is_refused_before_the_pipeline(small_inputs, tmp_path, capsys,
                                                                                    tokens, message):
    scored, vocab = small_inputs
    vocab.write_text("\n".join(tokens) + "\n")
    assert tfr.main(["--pairs", str(scored), "--vocab", str(vocab), "--output", str(tmp_path / "out")]) == 2
    assert message in _one_line_error(capsys)
    assert not (tmp_path / "out").exists()


def test_incomplete_pairs_are_refused(small_inputs, tmp_path, capsys):
    scored, vocab = small_inputs
    (scored / "_SUCCESS").unlink()  # labse-score interrupted, or still running
    for location in (str(scored), str(scored / "*.parquet")):
        assert tfr.main(["--pairs", location, "--vocab", str(vocab), "--output", str(tmp_path / "out")]) == 2
        assert "rerun the stage" in _one_line_error(capsys)
    # a folder of complete outputs, searched recursively: each lies in a complete output
    (tmp_path / "all").mkdir()
    scored.rename(tmp_path / "all" / "de-en")
    mark_complete(tmp_path / "all" / "de-en", {})
    assert tfr_cli.check_pairs_complete(str(tmp_path / "all"), tfr_cli.find_parquet_files(str(tmp_path / "all"))) is None


def test_an_existing_output_on_an_object_store_is_refused_too(small_inputs, tmp_path, capsys, monkeypatch):
    scored, vocab = small_inputs
    (tmp_path / "remote").mkdir()
    (tmp_path / "remote" / "pairs-00000-of-00001.tfrecord").write_bytes(b"an earlier run")
    remote = ObjectStoreOnDisk.PREFIX + str(tmp_path / "remote")
    assert tfr.main(["--pairs", str(scored), "--vocab", str(vocab), "--output", remote]) == 2
    assert "--overwrite" in _one_line_error(capsys)
    assert (tmp_path / "remote" / "pairs-00000-of-00001.tfrecord").read_bytes() == b"an earlier run"


@pytest.mark.timeout(60)  # opening the pipe would block forever
def test_a_named_pipe_named_like_parquet_is_counted_unreadable_not_a_hang(tmp_path):
    os.mkfifo(tmp_path / "pipe.parquet")
    assert _tagged(tfr_beam._ReadParquetPairs().process(str(tmp_path / "pipe.parquet")), "dropped") == ["parquet_unreadable"]


def test_default_shards_hold_about_a_million_records(labse_data):
    from pipelines.tfrecords.config import shards_for
    from pipelines.tfrecords.transforms import count_input_pairs

    assert [shards_for(n) for n in (0, 1, 1_000_000, 1_000_001, 6_000_000_000)] == [1, 1, 1, 2, 6000]
    spec = ParallelTextSpec("de", str(require_file(labse_data, "multi30k/val.de.gz")),
                            "en", str(require_file(labse_data, "multi30k/val.en.gz")))
    assert count_input_pairs([], [spec, spec]) == 2 * len(read_lines(spec.src_path))
