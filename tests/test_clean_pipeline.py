"""labse-clean end to end on the real samples and on hand-made bad inputs (DirectRunner).

One pipeline per sample (so the accounting identity is checked per sample), one over the hand-made
inputs, and one with multi_processing workers; the runs are shared by the tests (session fixture).
"""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from pipelines.accounting import identity_violations
from pipelines.clean.cli import main, run
from pipelines.clean.transforms import per_file_violations
from pipelines.io.parquet import ROW_FIELDS, SENTENCE_COLUMNS
from pipelines.clean.config import CleanConfig
from pipelines.text.normalise import dedup_key
from tests.conftest import require_file

SAMPLES = {
    "cc": ("commoncrawl/CC-MAIN-2020-34-sample.warc.gz", "warc"),
    "web": ("commoncrawl/web-pages-sample.warc.gz", "warc"),
    "enwiki": ("wikipedia/enwiki-pages-articles-sample.xml.bz2", "wikipedia"),
    "ltgwiki": ("wikipedia/ltgwiki-pages-articles-sample.xml.bz2", "wikipedia"),
}

ARTICLE = (
    "The council approved the new budget on Tuesday after a long debate about schools, roads and the "
    "future of the old harbour district."
)
OTHER = (
    "Critics said the plan does not do enough for the poorer districts of the city, and they promised "
    "to keep fighting it in the months ahead."
)

# Page 2's copy of ARTICLE: the same dedup key (case and punctuation fold), and still confidently
# English, so it reaches dedup (an upper-case copy was dropped by language identification first).
ARTICLE_COPY = ARTICLE.lower().replace(",", "")

THIRD = (
    "The museum reopened its east wing in the spring, with a new collection of maps, letters and "
    "photographs from the early years of the town."
)


def _warc_record(html: str | bytes, uri: str, record_id: str) -> bytes:
    body = html.encode("utf-8") if isinstance(html, str) else html
    http = f"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {len(body)}\r\n\r\n"
    block = http.encode("latin-1") + body
    head = (
        f"WARC/1.0\r\nWARC-Type: response\r\nWARC-Record-ID: <urn:uuid:{record_id}>\r\n"
        f"WARC-Date: 2020-08-01T00:00:00Z\r\nWARC-Target-URI: {uri}\r\n"
        f"Content-Type: application/http; msgtype=response\r\nContent-Length: {len(block)}\r\n\r\n"
    )
    return gzip.compress(head.encode("utf-8") + block + b"\r\n\r\n")


def _page(*paragraphs: str) -> str:
    return "<html><body>" + "".join(f"<p>{p}</p>" for p in paragraphs) + "</body></html>"


def make_handmade_inputs(directory: Path, labse_data: Path) -> dict[str, Path]:
    """Good pages with a duplicate, and every kind of bad input the issue lists."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {}
    # Page 2 repeats page 1's first sentence (modulo case and punctuation): a duplicate of the first source.
    files["dup"] = directory / "a-dup.warc.gz"
    files["dup"].write_bytes(
        _warc_record(_page(ARTICLE), "http://example.com/1", "00000000-0000-0000-0000-000000000001")
        + _warc_record(_page(ARTICLE_COPY, OTHER), "http://example.com/2",
                       "00000000-0000-0000-0000-000000000002")
    )
    # A 10 MB single-line page between two good pages.
    files["huge"] = directory / "b-huge.warc.gz"
    files["huge"].write_bytes(
        _warc_record(_page(THIRD), "http://example.com/3", "00000000-0000-0000-0000-000000000003")
        + _warc_record("<html><body><p>" + "word " * 2_000_000 + "</p></body></html>", "http://example.com/huge",
                       "00000000-0000-0000-0000-000000000004")
        + _warc_record(_page("Ein ganz normaler deutscher Absatz, der lang genug ist, um als Hauptinhalt zu gelten "
                             "und einen Satz zu bilden."), "http://example.com/4", "00000000-0000-0000-0000-000000000005")
    )
    # A wrong charset: Latin-1 bytes declared as UTF-8 (decoded with a fallback or replacement characters).
    latin1 = _page("Größere Änderungen wurden für die Straße über dem Fluss geplant, sagte der Bürgermeister heute.")
    files["charset"] = directory / "c-charset.warc.gz"
    files["charset"].write_bytes(_warc_record(latin1.encode("latin-1"), "http://example.com/latin1",
                                              "00000000-0000-0000-0000-000000000006"))
    cc = require_file(labse_data, SAMPLES["cc"][0]).read_bytes()
    files["truncated"] = directory / "d-truncated.warc.gz"
    files["truncated"].write_bytes(cc[: len(cc) // 2])
    files["empty"] = directory / "e-empty.warc.gz"
    files["empty"].write_bytes(b"")
    files["garbage"] = directory / "f-garbage.warc.gz"
    files["garbage"].write_bytes(bytes(range(256)) * 64)
    files["xml"] = directory / "g-malformed.xml"
    files["xml"].write_text(
        '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/"><siteinfo><dbname>enwiki</dbname>'
        "<base>https://en.wikipedia.org/wiki/Main_Page</base></siteinfo><page><title>A</title><ns>0</ns>"
        "<id>1</id><revision><text>Broken page <b>unclosed", encoding="utf-8")
    # A WET file: a `conversion` record holds extracted text, one block per line.
    text = ("Menu\n" + THIRD.replace("museum", "library") + "\n" + "Kontakt | Impressum\n").encode("utf-8")
    head = ("WARC/1.0\r\nWARC-Type: conversion\r\nWARC-Record-ID: <urn:uuid:00000000-0000-0000-0000-000000000007>\r\n"
            "WARC-Date: 2020-08-01T00:00:00Z\r\nWARC-Target-URI: http://example.com/wet\r\n"
            f"Content-Type: text/plain\r\nContent-Length: {len(text)}\r\n\r\n").encode("utf-8")
    files["wet"] = directory / "h-text.warc.wet.gz"
    files["wet"].write_bytes(gzip.compress(head + text + b"\r\n\r\n"))
    return files


@pytest.fixture(scope="session")
def runs(tmp_path_factory, labse_data) -> dict[str, tuple[Path, dict]]:
    root = tmp_path_factory.mktemp("clean")
    out = {}
    for name, (relative, fmt) in SAMPLES.items():
        path = require_file(labse_data, relative)
        out[name] = (root / name, run([(str(path), fmt)], str(root / name), CleanConfig()))
    handmade = make_handmade_inputs(root / "handmade-inputs", labse_data)
    out["handmade"] = (root / "handmade", run(
        [(str(root / "handmade-inputs" / "*.warc.gz"), "warc"), (str(handmade["xml"]), "wikipedia"),
         (str(handmade["wet"]), "wet")],
        str(root / "handmade"), CleanConfig()))
    return out


def sentences(out_dir: Path):
    return ds.dataset(str(out_dir / "sentences"), partitioning="hive").to_table().to_pylist()


def errors(out_dir: Path) -> list[dict]:
    return [json.loads(line) for f in sorted((out_dir / "errors").glob("*.jsonl"))
            for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SAMPLES) + ["handmade"])
def test_accounting_identity_holds(runs, name):
    out_dir, stats = runs[name]
    assert identity_violations(stats) == [] and stats["identity_holds"]
    assert per_file_violations(stats) == [] and stats["per_file"]["files"] >= 1
    assert stats["documents_read"] > 0 and stats["sentences_read"] > 0
    rows = sentences(out_dir)
    assert len(rows) == stats["sentences_kept"] == sum(stats["per_language"].values())
    assert set(SENTENCE_COLUMNS) <= set(rows[0])
    # The accounting section (README contract 11) holds the same numbers as the top-level keys, and
    # its kept units are what was written: the sentence rows, the documents those rows come from.
    accounting = stats["accounting"]
    assert set(accounting) == {"documents", "sentences"}
    for unit, section in accounting.items():
        assert {f"{unit}_{outcome}": section[outcome] for outcome in ("read", "kept", "dropped", "errored")} == {
            key: stats[key] for key in (f"{unit}_read", f"{unit}_kept", f"{unit}_dropped", f"{unit}_errored")}
    assert accounting["sentences"]["kept"] == len(rows)
    assert accounting["documents"]["kept"] == len({(r["file"], r["offset"], r["doc_id"]) for r in rows})
    assert accounting["documents"]["errored"] == len(
        [e for e in errors(out_dir) if e["reason"] != "sentence_split_failed"])
    assert Counter(r["lang"] for r in rows) == Counter(stats["per_language"])
    # stats.json on disk is what run() returned, with the run configuration.
    assert json.loads((out_dir / "stats.json").read_text(encoding="utf-8")) == stats
    assert stats["config"]["min_chars"] == 10 and stats["config"]["max_chars"] == 5000


@pytest.mark.slow
def test_commoncrawl_sample_yields_chinese_and_russian(runs):
    out_dir, stats = runs["cc"]
    assert stats["per_language"].get("zh", 0) >= 20 and stats["per_language"].get("ru", 0) >= 5
    rows = sentences(out_dir)
    zh = [r for r in rows if r["lang"] == "zh"]
    assert all(r["source"] == "cc" and r["url"].startswith("http") and r["doc_id"] for r in zh)
    assert all(10 <= len(r["text"]) <= 5000 and 0.5 <= r["lang_score"] <= 1.0 for r in rows)
    assert all(r["main_content_score"] >= 0.5 for r in rows)
    assert stats["documents_dropped"]["warc_type:request"] == 17


@pytest.mark.slow
def test_web_pages_yield_german_and_english(runs):
    _out_dir, stats = runs["web"]
    assert stats["per_language"]["de"] >= 500 and stats["per_language"]["en"] >= 200
    assert stats["documents_kept"] >= 80


@pytest.mark.slow
def test_enwiki_yields_english_without_markup(runs):
    out_dir, stats = runs["enwiki"]
    rows = sentences(out_dir)
    english = [r for r in rows if r["lang"] == "en"]
    assert len(english) >= 1000 and len(english) == len(rows)  # the edition is the label
    for row in english:
        assert not any(mark in row["text"] for mark in ("{{", "[[", "|", "<ref")), row["text"]
        assert row["source"] == "wiki" and "wikipedia.org" in row["url"]


@pytest.mark.slow
def test_ltgwiki_yields_latgalian(runs):
    out_dir, stats = runs["ltgwiki"]
    assert stats["per_language"].get("ltg", 0) >= 300
    rows = sentences(out_dir)
    assert {r["lang"] for r in rows} == {"ltg"}


@pytest.mark.slow
def test_no_duplicates_and_first_source_kept(runs):
    for name in SAMPLES:
        rows = sentences(runs[name][0])
        keys = Counter((r["lang"], dedup_key(r["text"])) for r in rows)
        assert max(keys.values()) == 1, name
    out_dir, stats = runs["handmade"]
    rows = [r for r in sentences(out_dir) if dedup_key(r["text"]) == dedup_key(ARTICLE)]
    assert len(rows) == 1 and rows[0]["url"] == "http://example.com/1" and rows[0]["text"] == ARTICLE
    assert stats["sentences_dropped"]["duplicate"] >= 1
    # Page 2 was cleaned (its other sentence is kept), so its copy of ARTICLE reached dedup and lost there.
    assert [r["text"] for r in sentences(out_dir) if r["url"] == "http://example.com/2"] == [OTHER]


def test_dedup_keeps_the_first_source_however_bundles_are_combined_and_merged(lid):
    """Beam combines each bundle's rows (add_input) and merges the bundles' accumulators in any order
    and grouping: every way must keep the row first by (file, offset, doc_id, position)."""
    from itertools import permutations

    from pipelines.clean.transforms import _FirstSource
    from pipelines.io.documents import Document
    from pipelines.clean.document import clean_document

    sources = [("b.warc.gz", 0, "d3"), ("a.warc.gz", 900, "d2"), ("a.warc.gz", 0, "d1"), ("a.warc.gz", 0, "d0")]
    rows = []
    for file, offset, doc_id in sources:
        document = Document(source="cc", url=f"http://example.com/{doc_id}", doc_id=doc_id, file=file, offset=offset,
                            kind="html", body=_page(ARTICLE_COPY if doc_id != "d0" else ARTICLE), lang=None)
        (row,) = clean_document(document, lid, CleanConfig()).rows
        rows.append(tuple(row[name] for name in ROW_FIELDS))
    first = rows[-1]
    assert first[:3] == ("a.warc.gz", 0, "d0") and first[ROW_FIELDS.index("text")] == ARTICLE
    combine = _FirstSource()
    for order in permutations(rows):
        one_bundle = combine.create_accumulator()
        for row in order:
            one_bundle = combine.add_input(one_bundle, row)
        assert combine.extract_output(one_bundle) == (first, 4)
        bundles = [combine.add_input(combine.create_accumulator(), row) for row in order]
        assert combine.extract_output(combine.merge_accumulators(bundles)) == (first, 4)
        pairs = [combine.merge_accumulators(bundles[:2]), combine.merge_accumulators([combine.create_accumulator()]),
                 combine.merge_accumulators(bundles[2:])]
        assert combine.extract_output(combine.merge_accumulators(pairs)) == (first, 4)


@pytest.mark.slow
def test_bad_inputs_land_in_errors_and_the_rest_is_read(runs):
    out_dir, stats = runs["handmade"]
    found = errors(out_dir)
    assert all({"file", "offset", "reason", "detail"} <= set(e) for e in found)
    files_with_errors = {Path(e["file"]).name for e in found}
    for name in ("d-truncated.warc.gz", "e-empty.warc.gz", "f-garbage.warc.gz", "g-malformed.xml"):
        assert name in files_with_errors, (name, found)
    assert stats["documents_errored"] == len(found) - sum(1 for e in found if e["reason"] == "sentence_split_failed")
    # The 10 MB line is one counted drop, and the pages around it were still cleaned.
    assert stats["sentences_dropped"]["line_too_long"] == 1
    urls = {r["url"] for r in sentences(out_dir)}
    assert {"http://example.com/3", "http://example.com/4"} <= urls
    # WET text lines go through the same main-content rules: the article line is kept, the menu is not.
    wet = [r for r in sentences(out_dir) if r["url"] == "http://example.com/wet"]
    assert [r["text"] for r in wet] == [THIRD.replace("museum", "library")] and wet[0]["source"] == "cc"
    # The truncated CommonCrawl file still gave the pages before the cut.
    assert any(r["file"].endswith("d-truncated.warc.gz") for r in sentences(out_dir))


@pytest.mark.slow
def test_multi_processing_workers_give_the_same_result(runs, labse_data, tmp_path):
    out = tmp_path / "mp"
    code = main(["--input", str(require_file(labse_data, SAMPLES["cc"][0])), "--format", "warc",
                 "--output", str(out), "--direct_running_mode", "multi_processing", "--direct_num_workers", "2"])
    assert code == 0
    stats = json.loads((out / "stats.json").read_text(encoding="utf-8"))
    expected = runs["cc"][1]
    for key in ("documents_read", "documents_kept", "documents_dropped", "documents_errored", "sentences_read",
                "sentences_kept", "sentences_dropped", "sentences_errored", "per_language", "per_file"):
        assert stats[key] == expected[key], key
    assert sorted(r["text"] for r in sentences(out)) == sorted(r["text"] for r in sentences(runs["cc"][0]))


def test_cli_fails_early_with_clear_errors(tmp_path, capsys, labse_data):
    assert main(["--input", str(tmp_path / "missing-*.warc.gz"), "--output", str(tmp_path / "o")]) == 2
    assert "matches no files" in capsys.readouterr().err
    bad_model = tmp_path / "model.bin"
    bad_model.write_bytes(b"not a fasttext model")
    cc = str(require_file(labse_data, SAMPLES["cc"][0]))
    assert main(["--input", cc, "--output", str(tmp_path / "o"), "--main-content-model", str(bad_model)]) == 2
    assert "--main-content-model" in capsys.readouterr().err
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "stats.json").write_text("{}")
    assert main(["--input", cc, "--output", str(tmp_path / "used")]) == 2
    assert "--overwrite" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["--input", str(tmp_path / "x.unknown"), "--output", str(tmp_path / "o")])
    assert exit_info.value.code == 2
    assert "cannot tell the format of" in capsys.readouterr().err


@pytest.mark.slow
def test_main_content_model_scores_lines_when_given(labse_data, tmp_path):
    """A real (tiny) fastText main-content model, trained here on heuristic labels, is loaded and used."""
    from pipelines.clean.bundle import document_lines
    from pipelines.io.documents import Document
    from pipelines.read.readers import read_records
    from pipelines.main_content.model import training_lines
    from pipelines.text.boilerplate import heuristic_main_content_scores

    train = []
    web = str(require_file(labse_data, SAMPLES["web"][0]))
    for doc in [r for r in read_records(web, "warc") if isinstance(r, Document)][:30]:
        lines = document_lines(doc)
        train += training_lines(lines, [s >= 0.5 for s in heuristic_main_content_scores(lines)])
    (tmp_path / "train.txt").write_text("\n".join(train) + "\n", encoding="utf-8")
    # Trained in a fresh process: in a process that already ran Beam pipelines, fastText's trainer
    # sometimes stops with "Encountered NaN" (seen with fasttext-numpy2 0.10.4).
    train_script = ("import fasttext, sys; fasttext.train_supervised(sys.argv[1], epoch=3, verbose=0, thread=1)"
                    ".save_model(sys.argv[2])")
    subprocess.run([sys.executable, "-c", train_script, str(tmp_path / "train.txt"), str(tmp_path / "mc.bin")],
                   check=True, timeout=120)

    out = tmp_path / "out"
    cc = str(require_file(labse_data, SAMPLES["cc"][0]))
    assert main(["--input", cc, "--output", str(out), "--main-content-model", str(tmp_path / "mc.bin"),
                 "--main-content-threshold", "0.3"]) == 0
    stats = json.loads((out / "stats.json").read_text(encoding="utf-8"))
    assert stats["config"]["main_content_model"].endswith("mc.bin") and stats["identity_holds"]
    scores = {round(r["main_content_score"], 4) for r in sentences(out)}
    heuristic_values = {0.05, 0.1, 0.2, 0.4, 0.6, 0.7, 0.8, 0.95}
    assert scores - heuristic_values and min(scores) >= 0.3


# ------------------------------------------------------------------ clean_document and the DoFn, without a pipeline
def _doc(body: str, *, source="cc", kind="html", lang=None, doc_id="d1") -> "Document":
    from pipelines.io.documents import Document

    return Document(source=source, url=f"http://example.com/{doc_id}", doc_id=doc_id, file="f.warc.gz", offset=0,
                    kind=kind, body=body, lang=lang)


@pytest.fixture(scope="module")
def lid():
    from pipelines.text.langid import LanguageIdentifier

    return LanguageIdentifier()


def test_wikipedia_lines_in_another_language_are_removed(lid):
    from pipelines.clean.document import clean_document

    german = "Der Gemeinderat hat am Dienstag nach einer langen Debatte den neuen Haushalt beschlossen."
    result = clean_document(_doc(f"{ARTICLE}\n{german}", source="wiki", kind="text", lang="en"), lid, CleanConfig())
    assert [r["text"] for r in result.rows] == [ARTICLE]
    assert result.tally["sentences.dropped.langid_other_language"] == 1
    assert result.rows[0]["lang"] == "en" and result.rows[0]["main_content_score"] == 1.0
    latgalian = "Latgola irā vāsturiskais nūvods Latvejis vydsaustrumūs, kur dzeivoj latgalīši."
    result = clean_document(_doc(latgalian, source="wiki", kind="text", lang="ltg"), lid, CleanConfig())
    assert [r["lang"] for r in result.rows] == ["ltg"]


def test_every_sentence_is_accounted_for_in_one_document(lid):
    from pipelines.clean.document import clean_document

    html = _page(ARTICLE, "Short.", "x" * 60_000, "Home | News | Contact", OTHER)
    result = clean_document(_doc(html), lid, CleanConfig())
    tally = result.tally
    dropped = sum(v for k, v in tally.items() if k.startswith("sentences.dropped."))
    assert tally["sentences.read"] == len(result.rows) + dropped + tally.get("sentences.errored", 0)
    assert tally["sentences.dropped.line_too_long"] == 1
    assert [r["position"] for r in result.rows] == sorted(r["position"] for r in result.rows)
    assert {r["text"] for r in result.rows} == {ARTICLE, OTHER}


def test_a_line_that_breaks_the_splitter_costs_that_line_only(lid, monkeypatch):
    import pipelines.clean.document as document
    import pipelines.text.sentences as sentences

    real = sentences.sentencex.segment

    def flaky(lang, text):
        if text.startswith("Critics"):
            raise RuntimeError("splitter bug")
        return real(lang, text)

    monkeypatch.setattr(sentences.sentencex, "segment", flaky)
    result = document.clean_document(_doc(_page(ARTICLE, OTHER)), lid, CleanConfig())
    assert [r["text"] for r in result.rows] == [ARTICLE]
    assert result.tally["sentences.errored"] == 1
    assert result.errors[0]["reason"] == "sentence_split_failed" and "splitter bug" in result.errors[0]["detail"]


def test_a_document_that_cannot_be_processed_is_an_error_not_a_crash():
    from pipelines.clean.transforms import _CleanDocumentsFn
    from pipelines.io.documents import Dropped, ReadError

    fn = _CleanDocumentsFn(CleanConfig())
    fn.setup()
    fn.start_bundle()
    broken = _doc(b"<p>bytes, not str</p>")  # a reader bug: html_to_lines raises TypeError
    outputs = list(fn.process(broken)) + list(fn.process(Dropped("not_html", "f", 1)))
    outputs += list(fn.process(ReadError("truncated_gzip", "f", 2, "cut")))
    errors = [o.value for o in outputs if getattr(o, "tag", None) == "errors"]
    assert [e["reason"] for e in errors] == ["processing_failed", "truncated_gzip"]
    finished = list(fn.finish_bundle())
    (tally,) = [o.value.value for o in finished if o.tag == "tally"]
    assert tally == {"documents.read": 3, "documents.errored": 2, "documents.dropped.not_html": 1}
    files = dict(o.value.value for o in finished if o.tag == "files")
    assert files == {"f.warc.gz": {"read": 1, "errored": 1, "errored.processing_failed": 1},
                     "f": {"read": 2, "errored": 1, "errored.truncated_gzip": 1, "dropped": 1}}
