"""html_to_lines (contract 2) and lid.176 language identification, on real pages and hand-made text."""
from __future__ import annotations

import pytest

from pipelines.io.documents import Document
from pipelines.read.readers import read_records
from pipelines.text.html import html_to_lines
from pipelines.text.langid import LanguageIdentifier, decide_language, lid176_path, normalise_label
from tests.conftest import require_file


def test_html_blocks_become_lines_scripts_and_styles_do_not():
    html = (
        "<html><head><title>T</title><style>p{color:red}</style><script>var secret=1;</script></head>"
        "<body><h1>Heading</h1><p>One  paragraph\n spread over   lines.</p><ul><li>first</li><li>second</li></ul>"
        "<table><tr><td>c1</td><td>c2</td></tr></table>before<br>after<div>amp &amp; entity</div></body></html>"
    )
    lines = html_to_lines(html)
    assert lines == ["Heading", "One paragraph spread over lines.", "first", "second", "c1 c2", "before", "after",
                     "amp & entity"]
    assert not any("secret" in line or "color" in line for line in lines)


@pytest.mark.parametrize("html, expected", [
    ("", []),
    ("   ", []),
    ("<html></html>", []),
    ("<p>unclosed <b>tags", ["unclosed tags"]),
    ("<p>  padded  </p>\n\n<div> \t </div><p>tab\tinside</p>", ["padded", "tab inside"]),
])
def test_odd_html_never_raises_and_has_no_empty_lines(html, expected):
    assert html_to_lines(html) == expected


def test_binary_junk_is_kept_as_one_stripped_line():
    lines = html_to_lines("\x00\x01\xff<<<>>>  ")
    assert len(lines) == 1 and lines[0].endswith("\xff<<<>>>") and lines[0] == lines[0].strip()


def test_real_pages_give_many_lines(labse_data):
    path = require_file(labse_data, "commoncrawl/web-pages-sample.warc.gz")
    docs = [r for r in read_records(str(path), "warc") if isinstance(r, Document)][:10]
    counts = [len(html_to_lines(d.body)) for d in docs]
    assert len(docs) == 10 and min(counts) > 5
    assert all("<div" not in line for d in docs[:3] for line in html_to_lines(d.body))


@pytest.fixture(scope="module")
def lid():
    return LanguageIdentifier()


def test_lid176_is_found_in_the_installed_package_and_has_176_labels(lid):
    assert lid176_path().endswith((".ftz", ".bin"))
    assert len(lid.labels) == 176 and {"en", "de", "zh", "ru"} <= lid.labels
    assert normalise_label("__label__zh") == "zh" and normalise_label("zh") == "zh"


def test_batch_prediction_on_udhr(lid, labse_data):
    samples = {}
    for code, lang in [("deu", "de"), ("rus", "ru"), ("cmn_hans", "zh"), ("fra", "fr"), ("arb", "ar")]:
        path = require_file(labse_data, f"udhr/{code}.txt")
        lines = [l.strip() for l in path.read_text(encoding="utf-8").splitlines() if len(l.strip()) > 40]
        samples[lang] = lines[5:15]
    for lang, lines in samples.items():
        assert len(lines) == 10, (lang, lines)
        predicted = lid.predict(lines)
        assert sum(p == lang for p, _ in predicted) >= 8, (lang, predicted)
        assert all(0.0 <= s <= 1.0 for _, s in predicted)


def test_huge_and_multiline_texts_are_bounded(lid):
    (lang, score), = lid.predict(["Dies ist ein deutscher Satz.\n" * 400_000])  # 11 MB with newlines
    assert lang == "de" and score > 0.5
    assert lid.predict([]) == []


def test_decision_for_web_text_needs_confidence():
    assert decide_language("de", 0.9, None, 0.5).lang == "de"
    low = decide_language("de", 0.3, None, 0.5)
    assert low.lang is None and low.drop_reason == "langid_low_confidence"


def test_decision_for_wikipedia_only_removes_confident_other_languages():
    assert decide_language("en", 0.95, "en", 0.5).lang == "en"
    other = decide_language("de", 0.9, "en", 0.5)
    assert other.lang is None and other.drop_reason == "langid_other_language"
    unsure = decide_language("de", 0.3, "en", 0.5)
    assert unsure.lang == "en" and unsure.drop_reason is None
    # lid.176 has no Latgalian: Latvian predictions stay Latgalian, not "another language".
    assert decide_language("lv", 0.99, "ltg", 0.5).lang == "ltg"
    assert decide_language("ru", 0.99, "ltg", 0.5).drop_reason == "langid_other_language"


def test_han_only_lines_are_chinese_even_when_lid176_says_japanese(lid):
    line = "第001期：四三各配七六码，三四组合中头彩，送：声色十中金。"
    assert lid.predict([line])[0][0] == "zh"
    assert lid.predict(["今日はとても良い天気ですね、散歩に行きましょう。"])[0][0] == "ja"
