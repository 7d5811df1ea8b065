"""The fast paths of the per-sentence and per-line rules give exactly the reference results.

`first_failure` / `first_failures` (counted with per-code-point tables, one page of sentences at
a time) must equal the plain loop over FILTERS, and the page-wide
`heuristic_main_content_scores` must equal `line_score` per line plus rule 5, on every line and
sentence of a real sample (several languages per sentence, so the language-dependent branches
run too). Also: a line that main-content scoring drops is ONE accounting unit, not split.
"""
from __future__ import annotations

import pytest

from tests.conftest import require_file

LANGS = ("en", "de", "ru", "zh", "ja", "th", "ar", "hi", "ko", "ltg")


@pytest.fixture(scope="module")
def web_lines(labse_data):
    from pipelines.io.documents import Document
    from pipelines.read.readers import read_records
    from pipelines.text.html import html_to_lines

    pages = []
    for relative in ("commoncrawl/web-pages-sample.warc.gz", "commoncrawl/CC-MAIN-2020-34-sample.warc.gz"):
        path = require_file(labse_data, relative)
        pages += [html_to_lines(r.body) for r in read_records(str(path), "warc") if isinstance(r, Document)]
    assert len(pages) > 100
    return pages


def _reference_scores(lines):
    from pipelines.text.boilerplate import _ends_with_terminal, line_score

    base = [line_score(line) for line in lines]
    out = list(base)
    for i, line in enumerate(lines):
        if base[i] == 0.2 and _ends_with_terminal(line):
            before = base[i - 1] if i > 0 else 0.0
            after = base[i + 1] if i + 1 < len(lines) else 0.0
            if before >= 0.8 and after >= 0.8:
                out[i] = 0.6
    return out


def test_page_wide_heuristic_equals_per_line_rules(web_lines):
    from pipelines.text.boilerplate import heuristic_main_content_scores, heuristic_scores_of_documents

    for lines in web_lines:
        assert heuristic_main_content_scores(lines) == _reference_scores(lines)
    # Many documents at once (a bundle): rule 5 looks at neighbours inside a document only.
    bounds = [0]
    for lines in web_lines:
        bounds.append(bounds[-1] + len(lines))
    together = heuristic_scores_of_documents([line for lines in web_lines for line in lines], bounds).tolist()
    assert together == [score for lines in web_lines for score in _reference_scores(lines)]
    # Lines with a newline inside (not a document's lines) fall back to the per-line rules.
    odd = ["Home | News | About", "(c)\n2020 Example", "A long enough sentence that ends with a full stop."]
    assert heuristic_main_content_scores(odd) == _reference_scores(odd)


def test_fused_filters_equal_the_filter_loop(web_lines):
    from pipelines.text.filters import first_failure, first_failure_reference
    from pipelines.text.normalise import clean_text
    from pipelines.text.sentences import split_sentences

    reasons = set()
    checked = 0
    for lines in web_lines[::3]:
        for line in lines:
            for sentence in split_sentences(line, None):
                text = clean_text(sentence)
                for lang in LANGS:
                    expected = first_failure_reference(text, lang)
                    assert first_failure(text, lang) == expected, (text, lang)
                    reasons.add(expected)
                    checked += 1
    assert checked > 10_000
    # The sample exercises most branches, passing ones included.
    assert {None, "too_short", "no_terminal_punctuation", "script_mismatch", "digits", "symbols"} <= reasons
    for text in ("Ünïcödé ßtraße mit Zahlen 1234567890 und €€€ Symbolen!", "\uFFFD broken charset text.",
                 "Enable JavaScript and accept our privacy policy.", "Lorem ipsum dolor sit amet.",
                 "Wow!!!!!!!!!!!! That is great.", "１２３４５６７８９０１２３。", "   "):
        for lang in LANGS:
            assert first_failure(text, lang) == first_failure_reference(text, lang), (text, lang)


SAMPLES = (("commoncrawl/CC-MAIN-2020-34-sample.warc.gz", "warc"), ("commoncrawl/web-pages-sample.warc.gz", "warc"),
           ("maincontent/article-pages.warc.gz", "warc"), ("wikipedia/enwiki-pages-articles-sample.xml.bz2", "wikipedia"),
           ("wikipedia/ltgwiki-pages-articles-sample.xml.bz2", "wikipedia"))


@pytest.fixture(scope="module")
def sample_sentence_pages(labse_data):
    """Every document of the five samples as one page of cleaned sentences (all its lines, split
    without a language, so boilerplate and tables are in too)."""
    from pipelines.io.documents import KIND_HTML, Document
    from pipelines.read.readers import read_records
    from pipelines.text.html import html_to_lines
    from pipelines.text.normalise import clean_text
    from pipelines.text.sentences import split_sentences

    pages = []
    for relative, fmt in SAMPLES:
        path = require_file(labse_data, relative)
        for doc in read_records(str(path), fmt):
            if not isinstance(doc, Document):
                continue
            lines = html_to_lines(doc.body) if doc.kind == KIND_HTML else doc.body.splitlines()
            texts = [text for text in (clean_text(s) for line in lines for s in split_sentences(line, None)) if text]
            if texts:
                pages.append(texts)
    assert len(pages) > 1200
    return pages


def test_batched_filters_equal_the_filter_loop(sample_sentence_pages):
    """`first_failures` over many pages' sentences at once (mixed languages) == the reference per
    sentence, on every document of the five samples; and the parts it is made of agree with their
    definitions: the batch's table counts with the counts taken one character at a time, each
    rule's batch form with its check on every sentence, and a rule returns only the reasons it
    declares."""
    from pipelines.text.filters import (FILTERS, REASONS, FilterConfig, Sentence, SentenceBatch,
                                        first_failure_reference, first_failures)

    def counts(sentence):
        return (sentence.text, sentence.lang, sentence.visible, sentence.digits, sentence.symbols, sentence.letters,
                sentence.in_script)

    checked = 0
    reasons = set()
    fired = {filter_rule.name: 0 for filter_rule in FILTERS}
    config = FilterConfig()
    # Bundles of 40 pages, so that a bundle mixes languages and pages (as the Beam step's do).
    for first in range(0, len(sample_sentence_pages), 40):
        texts, langs = [], []
        for page_number in range(first, min(first + 40, len(sample_sentence_pages))):
            page = sample_sentence_pages[page_number]
            texts += page
            langs += [LANGS[(page_number + i) % len(LANGS)] for i in range(len(page))]
        expected = [first_failure_reference(t, l) for t, l in zip(texts, langs)]
        assert first_failures(texts, langs) == expected
        batch = SentenceBatch.of(texts, langs)
        counted = [Sentence.counted(t, l) for t, l in zip(texts, langs)]
        batch_counts = list(zip(texts, langs, *(getattr(batch, name).tolist() for name in
                                                ("visible", "digits", "symbols", "letters", "in_script"))))
        assert batch_counts == [counts(s) for s in counted]
        for filter_rule in FILTERS:
            found = [filter_rule.check(s, config) for s in counted]
            assert set(found) <= {None, *filter_rule.reasons}, filter_rule.name
            names = (None,) + filter_rule.reasons
            assert [names[code + 1] for code in filter_rule.batch(batch, config).tolist()] == found, filter_rule.name
            fired[filter_rule.name] += sum(reason is not None for reason in found)
        reasons.update(expected)
        checked += len(texts)
    assert checked > 50_000
    # All but four reasons occur in the samples (the edge cases below and test_fused_filters_equal_the_filter_loop
    # hold the others).
    assert set(REASONS) - reasons == {"too_long", "replacement_character", "lorem_ipsum", "no_letters"}
    assert [name for name, count in fired.items() if not count] == ["replacement_character", "lorem_ipsum"]


def test_batched_filters_on_edge_cases():
    from pipelines.text.filters import FilterConfig, first_failure_reference, first_failures

    # A run of 10 equal characters only across two sentences is not a repeated-characters run;
    # inside one it is. Sentences with a newline or beyond the tabled planes take the reference path.
    pairs = [
        (["Das ist gut zzzzz", "zzzzz ist ein Wort."], ["de", "de"]),
        (["Das ist gut zzzzzzzzzz ja.", "Noch ein Satz hier."], ["de", "de"]),
        (["Two\nlines in one text.", "Plain sentence here."], ["en", "en"]),
        (["An old character \U00020000 here.", "中文句子在这里可以。"], ["en", "zh"]),
        (["Ok.", "A sentence that ends well... really.", "１２３４５６７８９０１２３。"], ["en", "en", "ja"]),
        # Empty and whitespace-edged sentences, casefolding that changes lengths (ß, İ) before a
        # policy phrase, ellipses in Chinese and English, closers and spaces before the end.
        (["", "Straße und İstanbul: privacy policy.", "ok", "Dots.... and more...", "中文...好。", 'He said "yes." ',
          "Klammer (siehe oben.) ", "   "], ["de", "de", "en", "en", "zh", "en", "de", "en"]),
        (["aaaaaaaaa.", "bbbbbbbbbb.", "x" * 30, "ab" * 20 + ".", "Zahlen 1234567890 12345.", "Wörter ===== ++"],
         ["en", "en", "en", "en", "de", "de"]),
        (["— « » — « » — « » —.", "Lorem ipsum dolor sit amet.", "Das Ger\ufffdt ist kaputt."], ["de", "la", "de"]),
    ]
    for texts, langs in pairs:
        assert first_failures(texts, langs) == [first_failure_reference(t, l) for t, l in zip(texts, langs)], texts
    assert first_failures(["Das ist gut zzzzz", "zzzzz ist ein Wort."], ["de", "de"]) == [
        "no_terminal_punctuation", None]
    assert first_failures(*pairs[-1]) == ["no_letters", "lorem_ipsum", "replacement_character"]
    assert first_failures([], []) == []
    # Pure ASCII text is Latin whatever the ratio threshold says (as the reference `script` rule).
    lenient = FilterConfig(min_script_ratio=0.0)
    texts, langs = ["An English sentence here.", "Русский текст и English."], ["ru", "ru"]
    assert first_failures(texts, langs, lenient) == [first_failure_reference(t, l, lenient) for t, l in zip(texts, langs)]
    assert first_failures(texts, langs, lenient)[0] == "script_mismatch"


def test_a_dropped_boilerplate_line_is_one_unit_not_split():
    from pipelines.clean.config import CleanConfig
    from pipelines.clean.document import clean_document
    from pipelines.io.documents import Document

    class NoLid:  # main-content drops happen before language identification
        def predict(self, texts):
            return [("en", 0.99)] * len(texts)

    menu = "Home. About us. Contact. Sign in. Subscribe to the newsletter. Share on Facebook."
    doc = Document(source="cc", url="http://x", doc_id="d", file="f", offset=0, kind="text",
                   body=menu, lang=None)
    result = clean_document(doc, NoLid(), CleanConfig())
    assert result.tally["sentences.read"] == 1
    assert result.tally["sentences.dropped.main_content"] == 1
    assert not result.rows


def test_fast_dedup_normalisation_equals_the_definition(web_lines):
    from pipelines.text.normalise import (dedup_key, dedup_keys, normalise_for_dedup, normalise_for_dedup_reference,
                                          normalise_many_for_dedup)

    texts = [line for lines in web_lines[::2] for line in lines]
    texts += ["Hello, World!", "ＡＢＣ！", "„Zitat“ – Ende…", "  lead\x1c trail\u2028 ", "中文，标点。", "Ünïcödé?!"]
    assert len(texts) > 5_000
    for text in texts:
        assert normalise_for_dedup(text) == normalise_for_dedup_reference(text), text
    assert normalise_for_dedup("„Hello,  World!“") == normalise_for_dedup("hello world") == "hello world"
    # All at once (a bundle's sentences): the same, with empty, punctuation-only and edge cases.
    texts += ["", " ", "...", "!? ¿", "e\u0301", "\u0301x", "ﬁ ligature", "ß", "x\u3000\u3000y", "\U00020000 — a"]
    assert normalise_many_for_dedup(texts) == [normalise_for_dedup(text) for text in texts]
    assert normalise_many_for_dedup(["a\nb", "c"]) == ["a b", "c"]  # a newline inside: one by one
    assert normalise_many_for_dedup([]) == []
    # dedup_keys: the same key exactly when the language and dedup_key agree.
    langs = ["en", "de"] * (len(texts) // 2) + ["en"] * (len(texts) % 2)
    keys = dedup_keys(texts, langs)
    pairs = [(lang, dedup_key(text)) for lang, text in zip(langs, texts)]
    assert len(set(keys)) == len(set(pairs))
    assert len(set(zip(keys, pairs))) == len(set(pairs))


def test_no_punctuation_or_symbol_lies_beyond_the_scanned_planes():
    import sys
    import unicodedata

    from pipelines.text.filters import UNICODE_PUNCTUATION_AND_SYMBOLS_END

    beyond = [cp for cp in range(UNICODE_PUNCTUATION_AND_SYMBOLS_END, sys.maxunicode + 1)
              if unicodedata.category(chr(cp))[0] in "PS"]
    assert beyond == [], "a newer Unicode database added P*/S* code points: raise the scan limit"


def test_line_normalisation_equals_split_join(labse_data):
    from resiliparse.extract.html2text import extract_plain_text

    from pipelines.io.documents import Document
    from pipelines.read.readers import read_records
    from pipelines.text.html import normalise_lines

    path = require_file(labse_data, "commoncrawl/CC-MAIN-2020-34-sample.warc.gz")
    texts = [extract_plain_text(r.body, preserve_formatting=True) for r in read_records(str(path), "warc")
             if isinstance(r, Document)]
    texts.append("a\u00a0b\n\t x  y \n\u2028\n\x1cz\x1c\nplain line\n \n")
    for text in texts:
        expected = [line for line in (" ".join(raw.split()) for raw in text.split("\n")) if line]
        assert normalise_lines(text) == expected


def test_clean_text_fast_path_equals_the_definition(web_lines, labse_data):
    """clean_text skips collapsing whitespace for printable text without double/edge spaces."""
    import unicodedata

    from pipelines.io.documents import Document
    from pipelines.read.readers import read_records
    from pipelines.text.normalise import _CONTROL, clean_text

    def definition(text):
        return " ".join(_CONTROL.sub("", unicodedata.normalize("NFC", text)).split())

    path = require_file(labse_data, "commoncrawl/CC-MAIN-2020-34-sample.warc.gz")
    raw_lines = [line for r in read_records(str(path), "warc") if isinstance(r, Document) for line in r.body.split("\n")]
    texts = [line for lines in web_lines for line in lines] + raw_lines
    texts += [" a  b ", "a\u00a0b", "x\u2003y", "\u200b", "e\u0301", "tab\there", " lead", "trail ", "zero\u200bwidth"]
    assert len(texts) > 20_000
    for text in texts:
        assert clean_text(text) == definition(text), repr(text)


def test_splitting_many_lines_equals_splitting_each(web_lines):
    """`split_sentences_many` (a bundle's lines, the rare terminators looked for once) ==
    `split_sentences` per line; a line whose splitting raises gets the exception, the others not."""
    import pipelines.text.sentences as sentences
    from pipelines.text.sentences import split_sentences, split_sentences_many

    texts = [line for lines in web_lines for line in lines]
    texts += ["ខ្ញុំទៅផ្សារ។ គាត់ទៅសាលា។", "ဒါဟာစာကြောင်းပါ။ နောက်တစ်ခု။", "ภาษาไทย ไม่มี จุด", "Ok.  Next one here.", "", "   "]
    langs = [("de", "en", None, "km", "my", "th")[i % 6] for i in range(len(texts))]
    assert split_sentences_many(texts, langs) == [split_sentences(t, l) for t, l in zip(texts, langs)]
    plain = [t for t in texts if not any(ch in t for ch in sentences._TERMINATOR_CHARACTERS)]
    assert split_sentences_many(plain, ["en"] * len(plain)) == [split_sentences(t, "en") for t in plain]

    class Broken(str):
        def isspace(self):
            raise RuntimeError("broken line")

    out = split_sentences_many(["One. Two.", Broken("x y")], ["en", "en"])
    assert out[0] == ["One.", "Two."] and isinstance(out[1], RuntimeError)


def test_the_unicode_facts_the_bundle_forms_rely_on():
    """Over every code point: NFKC and casefolding never produce a newline (texts are joined by
    one and split again), casefolding never maps a character to nothing, and never maps a character
    to or from a space, a separator or a dense-script character (the heuristic runs rules 2 and 3
    on the casefolded lines when casefolding changed no length). A newer Unicode database that
    breaks one of these must fail here."""
    import sys
    import unicodedata

    separators = set("|·»›•/-–")

    def special(ch):
        cp = ord(ch)
        return ch.isspace() or ch in separators or 0x3040 <= cp <= 0x30FF or 0x3400 <= cp <= 0x9FFF \
            or 0xAC00 <= cp <= 0xD7AF or 0x0E00 <= cp <= 0x0E7F

    broken = []
    for cp in range(sys.maxunicode + 1):
        if 0xD800 <= cp <= 0xDFFF or cp == 0x0A:
            continue
        ch = chr(cp)
        folded = ch.casefold()
        if "\n" in unicodedata.normalize("NFKC", ch) or "\n" in folded or not folded:
            broken.append(cp)
        elif folded != ch and (special(ch) or any(map(special, folded))):
            broken.append(cp)
    assert broken == []


def test_deciding_many_languages_equals_deciding_each():
    from pipelines.text.langid import decide_language, decide_languages

    predictions = [(lang, p) for lang in ("en", "de", "und", "lv", "lt", "ltg") for p in (0.0, 0.2, 0.5, 0.7, 1.0)]
    for known in (None, "en", "de", "ltg"):
        for threshold in (0.0, 0.5, 0.9):
            many = decide_languages(predictions, [known] * len(predictions), threshold)
            each = [decide_language(lang, p, known, threshold) for lang, p in predictions]
            assert many == [(d.lang, d.score, d.drop_reason) for d in each]
