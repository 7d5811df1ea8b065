"""Cleaning a bundle of documents at once (`pipelines.clean.bundle`, the Beam step's buffer) gives
every document exactly what cleaning it alone gives, and keeps the accounting exact.

- `clean_bundle` over all documents of the real samples == `clean_document` on each (rows, tally,
  errors), with the heuristic rules and with a main-content model;
- the Beam step flushes its buffer at the size limits and at the end of a bundle, and every output
  keeps the timestamp and window of its document;
- a bug in one document of a bundle costs that document only (one `processing_failed` error).
"""
from __future__ import annotations

import itertools

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window

from pipelines.accounting import SumTallies
from pipelines.io.documents import Document
from pipelines.io.parquet import row_dict
from pipelines.clean.config import CleanConfig
from tests.conftest import require_file

SAMPLES = (
    ("commoncrawl/CC-MAIN-2020-34-sample.warc.gz", "warc"),
    ("commoncrawl/web-pages-sample.warc.gz", "warc"),
    ("maincontent/article-pages.warc.gz", "warc"),
    ("wikipedia/enwiki-pages-articles-sample.xml.bz2", "wikipedia"),
    ("wikipedia/ltgwiki-pages-articles-sample.xml.bz2", "wikipedia"),
)


@pytest.fixture(scope="module")
def sample_documents(labse_data) -> list[Document]:
    from pipelines.read.readers import read_records

    docs = []
    for relative, fmt in SAMPLES:
        records = read_records(str(require_file(labse_data, relative)), fmt)
        docs += itertools.islice((r for r in records if isinstance(r, Document)), 400)
    # Odd documents too: empty, whitespace only, an oversized line, a WET-like text with a menu.
    docs += [
        Document("cc", "http://x/empty", "e", "f", 1, "html", "", None),
        Document("cc", "http://x/blank", "b", "f", 2, "text", " \n \n", None),
        Document("cc", "http://x/big", "g", "f", 3, "html",
                 "<p>" + "word " * 12_000 + "</p><p>A normal sentence that is long enough to be kept here.</p>", None),
        Document("cc", "http://x/wet", "w", "f", 4, "text",
                 "Home | News | Contact\nThe council met on Tuesday and approved the budget for next year.\nOK.", None),
    ]
    return docs


@pytest.fixture(scope="module")
def lid():
    from pipelines.text.langid import LanguageIdentifier

    return LanguageIdentifier()


def _alone(docs, lid, config, model=None):
    from pipelines.clean.document import clean_document

    return [clean_document(doc, lid, config, model) for doc in docs]


def _together(docs, lid, config, model=None, size=None):
    from pipelines.clean.bundle import clean_bundle, prepare_document

    size = size or len(docs)
    out = []
    for start in range(0, len(docs), size):
        chunk = docs[start:start + size]
        result = clean_bundle([prepare_document(doc, config, model) for doc in chunk], lid, config)
        rows = result.rows()
        for d in range(len(chunk)):
            mine = [row for row, owner in zip(rows, result.doc) if owner == d]
            out.append((mine, dict(result.tallies[d]), result.errors[d]))
    return out


@pytest.mark.parametrize("size", [None, 7])
def test_a_bundle_gives_each_document_what_it_gets_alone(sample_documents, lid, size):
    config = CleanConfig()
    alone = _alone(sample_documents, lid, config)
    together = _together(sample_documents, lid, config, size=size)
    assert len(together) == len(alone) > 800
    for doc, expected, (rows, tally, errors) in zip(sample_documents, alone, together):
        assert rows == expected.rows, doc.url
        assert tally == dict(expected.tally), doc.url
        assert errors == expected.errors, doc.url
    assert sum(len(r.rows) for r in alone) > 20_000


@pytest.fixture(scope="module")
def main_content_model_path(tmp_path_factory, labse_data):
    """A main-content model trained on the Common Crawl samples, as `make demo` does."""
    from pipelines.main_content.cli import main as main_content

    root = tmp_path_factory.mktemp("main-content")
    data, path = root / "data", root / "model.bin"
    assert main_content(["build-data", "--input", str(labse_data / "commoncrawl/*.warc.gz"),
                         "--output", str(data), "--overwrite"]) == 0
    assert main_content(["train", "--data", str(data), "--output", str(path)]) == 0
    return path


def test_a_bundle_with_a_main_content_model_matches_too(sample_documents, lid, main_content_model_path):
    from pipelines.main_content.model import MainContentModel

    path = main_content_model_path
    model = MainContentModel.load(str(path))
    config = CleanConfig(main_content_model=str(path))
    docs = sample_documents[:300] + sample_documents[-4:]
    alone = _alone(docs, lid, config, model)
    for doc, expected, (rows, tally, errors) in zip(docs, alone, _together(docs, lid, config, model)):
        assert (rows, tally, errors) == (expected.rows, dict(expected.tally), expected.errors), doc.url


def test_the_pipeline_with_a_main_content_model_writes_what_the_plain_path_gives(lid, main_content_model_path,
                                                                                 labse_data, tmp_path):
    """labse-clean with the model (the Beam DoFn: models loaded in setup, pages prepared as they
    arrive, bundles flushed) == `clean_document` with the model on every page of the WARC samples,
    deduplicated by hand (first source kept): the same sentence rows, and the same tallies."""
    from collections import Counter

    import numpy as np
    import pyarrow.dataset as ds

    from pipelines.clean.cli import run
    from pipelines.io.documents import Dropped
    from pipelines.io.parquet import SENTENCE_COLUMNS
    from pipelines.read.readers import read_records
    from pipelines.main_content.model import MainContentModel
    from pipelines.clean.document import clean_document
    from pipelines.text.normalise import dedup_keys

    config = CleanConfig(main_content_model=str(main_content_model_path))
    model = MainContentModel.load(str(main_content_model_path))
    inputs = [(str(require_file(labse_data, relative)), fmt) for relative, fmt in SAMPLES if fmt == "warc"]
    tally: Counter = Counter()
    first: dict[bytes, tuple] = {}
    copies: Counter = Counter()
    for path, fmt in inputs:
        for record in read_records(path, fmt):
            if isinstance(record, Dropped):
                tally.update({"documents.read": 1, f"documents.dropped.{record.reason}": 1})
                continue
            assert isinstance(record, Document), record
            cleaned = clean_document(record, lid, config, model)
            assert not cleaned.errors
            tally.update(cleaned.tally)
            for row, key in zip(cleaned.rows, dedup_keys([r["text"] for r in cleaned.rows],
                                                          [r["lang"] for r in cleaned.rows])):
                order = (row["file"], row["offset"], row["doc_id"], row["position"])
                copies[key] += 1
                if key not in first or order < first[key][0]:
                    first[key] = (order, row)

    out = tmp_path / "out"
    stats = run(inputs, str(out), config)

    def comparable(row: dict) -> tuple:  # Parquet holds the scores as float32
        return tuple(float(np.float32(row[c])) if c.endswith("score") else row[c] for c in SENTENCE_COLUMNS)

    written = ds.dataset(str(out / "sentences"), partitioning="hive").to_table().to_pylist()
    expected = [row for _order, row in first.values()]
    assert len(expected) > 1000
    assert sorted(map(comparable, written)) == sorted(map(comparable, expected))
    dropped = {key[len("sentences.dropped."):]: n for key, n in tally.items() if key.startswith("sentences.dropped.")}
    dropped["duplicate"] = sum(copies.values()) - len(first)
    assert stats["sentences_dropped"] == dropped
    assert stats["sentences_kept"] == len(first)
    assert stats["sentences_read"] == tally["sentences.read"] and stats["documents_read"] == tally["documents.read"]
    assert stats["sentences_errored"] == 0 and stats["documents_errored"] == 0 and stats["identity_holds"]
    assert stats["per_language"] == dict(Counter(row["lang"] for row in expected))


def _page_doc(i: int, body: str) -> Document:
    return Document("cc", f"http://example.com/{i}", f"d{i}", f"file-{i % 3}.warc.gz", i, "html", body, None)


PAGES = [
    "<p>The council approved the new budget on Tuesday after a long debate about the schools.</p>",
    "<p>Critics said the plan does not do enough for the poorer districts of the city.</p>",
    "<p>Home | News | Contact</p>",
    "<p>The museum reopened its east wing in the spring, with a new collection of maps.</p>",
    "<p>Der Gemeinderat hat am Dienstag nach einer langen Debatte den Haushalt beschlossen.</p>",
]


def test_the_beam_step_keeps_windows_and_timestamps_and_flushes_at_the_limits():
    """Documents in fixed windows, cleaned two at a time: each row keeps its document's window."""
    from pipelines.clean.transforms import ExtractSentences

    docs = [_page_doc(i, PAGES[i % len(PAGES)]) for i in range(10)]
    with beam.Pipeline() as pipeline:
        extracted = (
            pipeline
            | beam.Create([(doc, 100 * i + 5) for i, doc in enumerate(docs)])
            | "Stamp" >> beam.Map(lambda pair: window.TimestampedValue(pair[0], pair[1]))
            | beam.WindowInto(window.FixedWindows(100))
            | ExtractSentences(CleanConfig(), bundle_documents=2)
        )
        placed = extracted["rows"] | beam.ParDo(_WithPlace())
        expected = [(doc.doc_id, 100 * i, 100 * i + 5) for i, doc in enumerate(docs) if i % len(PAGES) != 2]
        assert_that(placed, equal_to(expected))
        # The tallies are per window too: one document read in each.
        per_window = (extracted["tally"]
                      | beam.CombineGlobally(SumTallies()).without_defaults()
                      | beam.ParDo(_ReadInWindow()))
        assert_that(per_window, equal_to([(100 * i, 1) for i in range(10)]), label="TalliesPerWindow")


class _ReadInWindow(beam.DoFn):
    def process(self, tally, win=beam.DoFn.WindowParam):
        yield int(win.start), tally["documents.read"]


class _WithPlace(beam.DoFn):
    def process(self, keyed, timestamp=beam.DoFn.TimestampParam, win=beam.DoFn.WindowParam):
        _key, row = keyed
        yield row_dict(row)["doc_id"], int(win.start), int(timestamp)


def test_a_bug_in_one_document_costs_that_document_only(monkeypatch):
    """The bundle fails as a whole, so the step cleans its documents one at a time: the broken one
    becomes one processing_failed error, the others are kept, and the tallies add up."""
    import pipelines.clean.transforms as transforms

    real = transforms.clean_bundle

    def fragile(prepared, lid, config):
        if any(p.doc.doc_id == "d3" for p in prepared):
            raise RuntimeError("bundle bug")
        return real(prepared, lid, config)

    monkeypatch.setattr(transforms, "clean_bundle", fragile)
    fn = transforms._CleanDocumentsFn(CleanConfig(), bundle_documents=4)
    fn.setup()
    fn.start_bundle()
    outputs = []
    for i in range(6):
        outputs += list(fn.process(_page_doc(i, PAGES[i % len(PAGES)])))
    outputs += list(fn.finish_bundle())
    values = [getattr(o, "value", o) for o in outputs]
    tags = [getattr(o, "tag", None) for o in outputs]
    unwrap = [getattr(v, "value", v) for v in values]
    errors = [v for v, tag in zip(unwrap, tags) if tag == "errors"]
    assert [(e["doc_id"], e["reason"]) for e in errors] == [("d3", "processing_failed")]
    assert "bundle bug" in errors[0]["detail"]
    rows = [row_dict(v[1]) for v, tag in zip(unwrap, tags) if tag is None]
    assert sorted({row["doc_id"] for row in rows}) == ["d0", "d1", "d4", "d5"]
    (tally,) = [v for v, tag in zip(unwrap, tags) if tag == "tally"]
    assert tally["documents.read"] == 6 and tally["documents.errored"] == 1
    assert tally["documents.with_candidates"] == 4 and tally["documents.dropped.no_sentences_kept"] == 1
    files = dict(v for v, tag in zip(unwrap, tags) if tag == "files")
    assert files["file-0.warc.gz"] == {"read": 2, "with_candidates": 1, "errored": 1, "errored.processing_failed": 1}
    assert sum(f["read"] for f in files.values()) == 6


def test_row_tuples_make_the_same_parquet_table_as_row_dicts(sample_documents, lid):
    """The compact rows that travel through the dedup shuffle become the same table as the rows."""
    import pyarrow as pa

    from pipelines.io.parquet import ROW_FIELDS, SENTENCE_SCHEMA, sentence_table
    from pipelines.clean.bundle import clean_bundle, prepare_document

    config = CleanConfig()
    result = clean_bundle([prepare_document(doc, config) for doc in sample_documents[:60]], lid, config)
    tuples, dicts = result.row_tuples(), result.rows()
    assert len(tuples) > 500 and [row_dict(row) for row in tuples] == dicts
    assert all(dict(zip(ROW_FIELDS, row)) == d for row, d in zip(tuples, dicts))
    assert sentence_table(tuples).equals(pa.Table.from_pylist(dicts, schema=SENTENCE_SCHEMA))
    assert sentence_table([]).equals(pa.Table.from_pylist([], schema=SENTENCE_SCHEMA))
    # Tuples compare in sentence order: (file, offset, doc_id, position).
    assert sorted(tuples) == sorted(tuples, key=lambda row: (row[0], row[1], row[2], row[3]))


def test_the_buffer_holds_lines_not_pages_and_flushes_at_the_character_limit():
    import pipelines.clean.transforms as transforms

    fn = transforms._CleanDocumentsFn(CleanConfig(), bundle_documents=100, bundle_chars=150)
    fn.setup()
    fn.start_bundle()
    first = list(fn.process(_page_doc(0, PAGES[0])))
    assert first == [] and len(fn.pending) == 1 and fn.pending[0].doc.body == ""  # held: its lines only
    assert fn.pending[0].lines and fn.pending_chars == sum(map(len, fn.pending[0].lines)) < 150
    second = list(fn.process(_page_doc(1, PAGES[1])))  # now over 150 characters: cleaned at once
    assert fn.pending == [] and fn.pending_chars == 0
    assert sorted(row_dict(o.value[1])["doc_id"] for o in second) == ["d0", "d1"]
    assert list(fn.finish_bundle())  # the tallies
