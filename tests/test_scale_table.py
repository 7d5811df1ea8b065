"""The pure parts of benchmarks/scale_table.py (copies, the tree poller, the table) and the
arithmetic of benchmarks/snapshot_cost.py. The benchmarks themselves run for tens of minutes
(BENCHMARKS.md); these checks take seconds."""
from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import benchmark_script

scale_table = benchmark_script("scale_table")
snapshot_cost = benchmark_script("snapshot_cost")
TreePoller, copy_tag, markdown_table = scale_table.TreePoller, scale_table.copy_tag, scale_table.markdown_table
vary_html, vary_line, varied_lines, varied_warc = (scale_table.vary_html, scale_table.vary_line,
                                                  scale_table.varied_lines, scale_table.varied_warc)


def test_copy_tags_are_distinct_words_of_letters_and_copy_zero_is_the_sample():
    tags = [copy_tag(k) for k in range(1, 2000)]
    assert len(set(tags)) == len(tags)
    assert all(tag.isalpha() and tag.isascii() and tag.islower() for tag in tags)
    assert copy_tag(0) == "" and vary_line("Ein Satz.", 0) == "Ein Satz."
    assert vary_line("Ein Satz.", 3) == f"Ein Satz. {copy_tag(3)}"
    assert varied_lines(["a", "b"], 2) == ["a", "b", f"a {copy_tag(1)}", f"b {copy_tag(1)}"]


def test_html_copies_change_every_ascii_sentence_end_and_nothing_else():
    body = b"<p>Erster Satz. Zweiter Satz!</p><script>x.y = 1;</script><p>\xe4\xb8\xad\xe6\x96\x87\xe3\x80\x82</p>"
    assert vary_html(body, 0) == body
    varied = vary_html(body, 2)
    tag = copy_tag(2).encode()
    assert b"Erster Satz " + tag + b". Zweiter Satz " + tag + b"!</p>" in varied
    assert b"x.y = 1;" in varied  # a dot inside a word is no sentence end
    assert b"\xe4\xb8\xad\xe6\x96\x87\xe3\x80\x82" in varied  # CJK sentence ends stay as they are


def test_varied_warc_copies_read_back_with_their_own_urls_and_text(tmp_path, labse_data):
    from pipelines.io.documents import Document
    from pipelines.read.readers import read_records

    sample = labse_data / "commoncrawl" / "CC-MAIN-2020-34-sample.warc.gz"
    originals = [r for r in read_records(str(sample), "warc") if isinstance(r, Document)]
    varied_warc(sample, tmp_path / "copy.warc.gz", 5)
    copies = [r for r in read_records(str(tmp_path / "copy.warc.gz"), "warc") if isinstance(r, Document)]
    assert len(copies) == len(originals) > 0
    assert all(c.url == o.url + ("&" if "?" in o.url else "?") + "scale_copy=5" for c, o in zip(copies, originals))
    assert sum(copy_tag(5) in str(c.body) for c in copies) > 0


def test_tree_poller_sees_the_peak_of_a_grandchild_process():
    """The polled process starts a child that starts a grandchild holding 200 MiB resident (all
    three share the test's pipes); the worker peak (the largest descendant) covers the grandchild
    while the polled process stays small."""
    grandchild = "import sys; b = b'x' * (200 * 2**20); print('ready', flush=True); sys.stdin.readline()"
    child = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {grandchild!r}])"
    root = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"
    process = subprocess.Popen([sys.executable, "-c", root], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "ready"
        poller = TreePoller(process.pid)
        poller.poll()
    finally:
        process.communicate("\n")
    summary = poller.summary()
    assert summary["worker_processes"] == 2
    assert summary["worker_peak_mb"] >= 200
    assert summary["worker_anon_peak_mb"] >= 200  # bytes built in the process: anonymous memory
    assert summary["main_peak_mb"] < 100


def test_measure_reports_cpu_and_exit_code(tmp_path):
    result = scale_table.measure([sys.executable, "-c", "sum(i * i for i in range(3_000_000)); raise SystemExit(3)"],
                                 tmp_path / "log.txt")
    assert result["rc"] == 3
    assert result["cpu_s"] > 0 and result["main_peak_mb"] > 0


def test_markdown_table_one_row_per_stage_in_pipeline_order():
    cells = [
        {"stage": "vocab", "scale": 1, "status": "ok", "wall_s": 20.4, "cpu_s": 11.6, "worker_peak_mb": 228.7,
         "main_peak_mb": 263.0, "units": "39,805 words"},
        {"stage": "clean", "scale": 1, "status": "ok", "wall_s": 13.3, "cpu_s": 8.2, "worker_peak_mb": 289.0,
         "main_peak_mb": 261.0, "units": "342 documents"},
        {"stage": "clean", "scale": 10, "status": "not run", "reason": "too slow"},
        {"stage": "loader", "scale": 10, "status": "ok", "wall_s": 3.0, "cpu_s": 2.0, "worker_peak_mb": None,
         "main_peak_mb": 231.0},
    ]
    lines = markdown_table(cells).splitlines()
    assert lines[0].startswith("| stage | 1x: wall s") and "10x: wall s" in lines[0]
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| clean", "| vocab", "| loader"]
    assert lines[2] == "| clean | 13 / 8 / 289 (261) | not run: too slow | 342 documents |"
    assert lines[3] == "| vocab | 20 / 12 / 229 (263) | not run | 39,805 words |"
    assert lines[4] == "| loader | not run | 3 / 2 / - (231) |  |"


# ----------------------------------------------------------------------------- snapshot_cost
def _cell(stage, scale, cpu, **extra):
    return {"stage": stage, "scale": scale, "status": "ok", "cpu_s": cpu, "wall_s": cpu,
            "worker_peak_mb": 100.0 * scale ** 0.5, "main_peak_mb": 50.0, **extra}


def _table():
    def clean(scale, cpu):
        return _cell("clean", scale, cpu, unit="documents", count=100 * scale, documents=100 * scale,
                     sentences_kept=4000 * scale, english_kept=1000 * scale)

    return {"cells": [
        clean(1, 10), clean(10, 28), clean(100, 208),
        _cell("mine", 1, 20, unit="cells", count=4, sentences_per_side=1000, pairs=900),
        _cell("mine", 10, 416, unit="cells", count=400, sentences_per_side=10000, pairs=9000),
        _cell("score", 1, 5, unit="pairs", count=900, pairs_in=900, pairs_kept=450),
        _cell("score", 10, 14, unit="pairs", count=9000, pairs_in=9000, pairs_kept=4500),
        {"stage": "mine", "scale": 100, "status": "not run", "reason": "over budget"},
    ]}


def test_marginal_cost_per_unit_uses_the_two_largest_scales():
    rates = snapshot_cost.unit_costs(_table())
    assert rates["clean"].cpu_per_unit == pytest.approx((208 - 28) / (10000 - 1000))
    assert rates["clean"].unit == "documents"
    assert rates["mine"].cpu_per_unit == pytest.approx((416 - 20) / (400 - 4))  # per cell
    assert rates["mine"].unit == "cells"
    assert rates["score"].cpu_per_unit == pytest.approx((14 - 5) / (9000 - 900))


def test_snapshot_arithmetic():
    table = _table()
    params = snapshot_cost.Parameters(pages=1_000_000, warc_files=100, price=0.05, sentences_per_page=None,
                                      english_share=None, pairs_per_sentence=None, keep_share=None)
    measured = snapshot_cost.derive(table, params)
    assert measured.english_share == pytest.approx(0.25)  # 1000 of the 4000 kept sentences
    params.english_share = 0.5
    derived = snapshot_cost.derive(table, params)
    assert derived.sentences_per_page == pytest.approx(40.0)  # 4000 kept / 100 documents of the 1x cell
    assert derived.pairs_per_sentence == pytest.approx(0.9)
    assert derived.keep_share == pytest.approx(0.5)
    assert derived.cell_side == 500  # 1000 sentences a side in 2 x 1 blocks
    rows = {row.stage: row for row in snapshot_cost.snapshot_rows(table, params)}
    assert rows["clean"].units == 1_000_000
    assert rows["clean"].vcpu_hours == pytest.approx(1_000_000 * 0.02 / 3600)
    assert rows["clean"].cost == pytest.approx(rows["clean"].vcpu_hours * 0.05)
    sentences = 40 * 1_000_000
    # every non-English sentence against every English one, in cells of 500 x 500
    assert rows["mine"].units == pytest.approx((sentences * 0.5) * (sentences * 0.5) / 500 ** 2)
    pairs = sentences * 0.5 * 0.9
    assert rows["score"].units == pytest.approx(pairs)
    assert rows["clean"].worker_peak_mb == pytest.approx(1000.0)  # the largest measured


def test_same_site_mining_row_scales_the_exact_cells_by_the_site_concentration():
    """`mine (same-site)`: only sentences of one site are compared, so the exact row's cells times
    H = sum of the sites' squared shares (1 / D for D equal sites); left out without H."""
    table = _table()
    params = snapshot_cost.Parameters(pages=1_000_000, warc_files=100, price=0.05, sentences_per_page=None,
                                      english_share=0.5, pairs_per_sentence=None, keep_share=None)
    assert "mine (same-site)" not in {row.stage for row in snapshot_cost.snapshot_rows(table, params)}
    params.site_concentration = 1 / 1000
    rows = {row.stage: row for row in snapshot_cost.snapshot_rows(table, params)}
    assert rows["mine (same-site)"].units == pytest.approx(rows["mine"].units / 1000)
    assert rows["mine (same-site)"].vcpu_hours == pytest.approx(rows["mine"].vcpu_hours / 1000)
    assert "mine (same-site)" in snapshot_cost.report(table, params)


def test_global_cells_read_the_first_rows_of_each_side_as_vectors_folders(tmp_path):
    """The index and mine-global cells take GLOBAL_UNIT x scale rows a side of mine_million's
    vectors, one vectors:DIR folder a language; too few rows means the cell cannot run."""
    import numpy as np

    source = tmp_path / "mg"
    (source / "vectors").mkdir(parents=True)
    for side, prefix in (("src", "de"), ("tgt", "en")):
        np.save(source / "vectors" / f"{side}.npy", np.arange(12_000, dtype=np.float32).reshape(3000, 4))
        (source / "vectors" / f"{side}.txt").write_text("".join(f"{prefix}{i:07d}\n" for i in range(3000)))
    table = scale_table.Table(tmp_path, tmp_path / "work", tmp_path / "t.json", 600.0)
    with pytest.raises(FileNotFoundError, match="mine-vectors"):
        table.global_vectors(1)
    table.mine_vectors = source
    folder = table.global_vectors(1)
    rows = scale_table.GLOBAL_UNIT
    de = np.load(folder / "de" / "src.npy")
    assert de.shape == (rows, 4) and de[-1, 0] == 4 * (rows - 1)
    assert (folder / "en" / "tgt.txt").read_text().splitlines()[-1] == f"en{rows - 1:07d}"
    with pytest.raises(FileNotFoundError, match="rows"):
        table.global_vectors(10)
    assert scale_table.STAGES.index("index") < scale_table.STAGES.index("mine-global")


def test_the_index_cells_take_a_fixed_shard_size_and_factory_when_given(tmp_path, monkeypatch):
    """--index-shard-sentences and --index-factory reach both labse-index commands (so that every
    scale holds shards of one size, as at crawl scale); without them labse-index chooses."""
    import numpy as np

    source = tmp_path / "mg"
    (source / "vectors").mkdir(parents=True)
    for side in ("src", "tgt"):
        np.save(source / "vectors" / f"{side}.npy", np.zeros((scale_table.GLOBAL_UNIT, 4), np.float32))
        (source / "vectors" / f"{side}.txt").write_text("".join(f"s{i}\n" for i in range(scale_table.GLOBAL_UNIT)))
    table = scale_table.Table(tmp_path, tmp_path / "work", tmp_path / "t.json", 600.0)
    table.mine_vectors = source
    commands = []
    monkeypatch.setattr(table, "_measure", lambda stage, scale, argv: commands.append(argv[-1]) or {"rc": 1})
    table.cell_index(1)
    table.index_shard_sentences, table.index_factory = 20_000, "OPQ32,IVF512,PQ32"
    table.cell_index(1)
    default, fixed = commands
    assert "--shard-sentences" not in default and "--factory" not in default
    assert fixed.count("--shard-sentences 20000") == 2 and fixed.count("--factory OPQ32,IVF512,PQ32") == 2


def test_the_cascade_s_embedding_row_charges_the_cheap_embedder_all_and_the_strong_one_its_share(capsys):
    assert snapshot_cost.main(["--cascade-share", "0.5", "--embed-rate", "1000", "--strong-rate", "100",
                               "--unique-sentences", "3.6e6"]) == 0
    out = capsys.readouterr().out
    assert "| embed (strong only) | 3,600,000 unique sentences | U / 100 | 10 |" in out  # 3.6e6 / 100 / 3600
    assert "| embed (cascade) | 3,600,000 unique sentences | U x (1/1,000 cheap + 0.500 x 1/100 strong) | 6 |" in out
    assert snapshot_cost.main(["--cascade-share"]) == 0  # alone: the share measured (BENCHMARKS.md)
    assert f"{snapshot_cost.CASCADE_SHARE:.3f} x 1/68 strong" in capsys.readouterr().out
