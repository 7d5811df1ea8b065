"""pipelines.accounting: the one accounting section every stage's stats JSON carries (README,
contract 11), the one check of it, and the counting helpers that feed it."""
import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from pipelines.accounting import (
    CountByName,
    MergeTallies,
    accounting_section,
    build_stats,
    identity_violations,
    tally_key,
)
from pipelines.stage import report_identity


def test_section_from_a_tally():
    tally = {"pairs.read": 10, "pairs.kept": 6, "pairs.dropped.empty_text": 2, "pairs.dropped.duplicate": 1,
             "pairs.dropped.zero": 0, "pairs.errored.tokenizer_error": 1, "files.read": 2, "files.kept": 2,
             "words.de": 99}  # not an outcome: the stage's own fact, left out of the section
    section = accounting_section(tally, ("pairs", "files", "documents"))
    assert section == {
        "accounting": {
            "pairs": {"read": 10, "kept": 6, "dropped": {"duplicate": 1, "empty_text": 2}, "errored": 1,
                      "errors": {"tokenizer_error": 1}},
            "files": {"read": 2, "kept": 2, "dropped": {}, "errored": 0},
            "documents": {"read": 0, "kept": 0, "dropped": {}, "errored": 0},  # a unit with nothing read
        },
        "identity_holds": True,
    }
    assert identity_violations(section) == []


def test_errored_with_and_without_reasons_sums():
    section = accounting_section({"files.read": 3, "files.errored": 1, "files.errored.unreadable": 2}, ("files",))
    assert section["accounting"]["files"]["errored"] == 3
    assert section["accounting"]["files"]["errors"] == {"unreadable": 2, "unspecified": 1}
    assert section["identity_holds"]


@pytest.mark.parametrize("tally, message", [
    ({"pairs.read": 5, "pairs.kept": 3}, "pairs: read 5 != kept + dropped + errored 3"),
    ({"pairs.read": 1, "pairs.kept": 3, "pairs.dropped.x": -2}, "negative"),
])
def test_unbalanced_books_are_named(tally, message, capsys):
    section = accounting_section(tally, ("pairs",))
    assert not section["identity_holds"]
    assert any(message in problem for problem in identity_violations(section))
    assert report_identity("labse-x", section) == 1
    err = capsys.readouterr().err
    assert err.startswith("labse-x: accounting identity") and len(err.strip().splitlines()) == 1
    assert identity_violations({"config": {}}) == ["no accounting section"]
    assert report_identity("labse-x", accounting_section({"pairs.read": 1, "pairs.kept": 1}, ("pairs",))) == 0


def test_clean_keeps_its_top_level_keys_from_the_same_numbers():
    tally = {"documents.read": 4, "documents.kept": 2, "documents.dropped.no_text": 1, "documents.errored": 1,
             "sentences.read": 9, "sentences.kept": 5, "sentences.dropped.duplicate": 4}
    stats = build_stats(tally, {"de": 3, "en": 2}, {"min_chars": 10})
    assert stats["documents_dropped"] == stats["accounting"]["documents"]["dropped"] == {"no_text": 1}
    assert stats["sentences_read"] == stats["accounting"]["sentences"]["read"] == 9
    assert stats["documents_errored"] == 1 and stats["identity_holds"]


def test_tally_key():
    assert tally_key("pairs", "dropped", "empty_text") == "pairs.dropped.empty_text"
    assert tally_key("documents", "read") == "documents.read"
    for bad in (("a.b", "read"), ("pairs", "lost"), ("pairs", "kept", "why")):
        with pytest.raises(ValueError):
            tally_key(*bad)


def test_count_by_name_and_merge_tallies_in_a_pipeline():
    with beam.Pipeline() as pipeline:
        reasons = pipeline | "Reasons" >> beam.Create(["empty_text", "empty_text", "keep", "duplicate"])
        dropped = reasons | "Dropped" >> CountByName(
            lambda r: None if r == "keep" else tally_key("pairs", "dropped", r), namespace="test")
        read = reasons | "Read" >> CountByName(lambda _r: "pairs.read")
        nothing = (pipeline | "Nothing" >> beam.Create([])) | "None" >> CountByName(lambda _r: "pairs.read")
        total = (dropped, read, nothing) | MergeTallies()
        assert_that(total, equal_to([{"pairs.read": 4, "pairs.dropped.empty_text": 2, "pairs.dropped.duplicate": 1}]))
