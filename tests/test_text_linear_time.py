"""Linear time on any text (issue 34 item 3): every stage's text functions finish on a 10^6-character line
without spaces (Han, Thai, 'a' x 10^6, runs that look like URLs, e-mail addresses, tags or references).

A quadratic regex over such a line runs for hours, and a regex running in C cannot be interrupted by
pytest-timeout's signal (the handler runs only after the match returns), so each stage's functions run in
a child process that is killed when it overruns a generous hang guard (HANG_GUARD_S, minutes for work of
seconds): this is no timing threshold, it tells "finishes" from "never finishes". The patterns that were
quadratic (features._URL, wikitext._MARKUP_LEFT, _REFS, _EMPTY_BRACKETS, _BRACKET_CLOSE_PUNCT) also get
direct checks of the text they look at.
"""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HANG_GUARD_S = 600  # the work takes ~10-60 s on a loaded 2-core machine; a quadratic pattern takes hours
N = 1_000_000
# Lines of N characters with no space: scripts written without spaces, one long "word", and runs that
# the URL, e-mail, tag, reference and bracket patterns start matching at every position.
ADVERSARIAL = textwrap.dedent(f"""
    N = {N}
    LINES = {{
        "han": "\\u4e2d" * N, "thai": "\\u0e01" * N, "a": "a" * N, "url": "http://" + "a" * N,
        "email_local": "a." * (N // 2) + "@", "tags": "<a" * (N // 2), "refs": "<ref " * (N // 5),
        "ideographic_spaces": "(" + "\\u3000" * N + "x",
    }}
""")


def _completes(body: str) -> None:
    """Runs `body` (with LINES defined) in a child process; fails if it is still running after the guard."""
    code = ADVERSARIAL + textwrap.dedent(body) + "\nprint('done')\n"
    try:
        result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                                timeout=HANG_GUARD_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after {HANG_GUARD_S} s on a {N:,}-character line: not linear")
    assert result.returncode == 0 and result.stdout.strip().endswith("done"), result.stderr[-2000:]


@pytest.mark.slow
def test_score_features_finish_on_a_million_character_line():
    _completes("""
        from pipelines.score.features import numbers, text_features, urls
        for name, line in LINES.items():
            urls(line); numbers(line)
            text_features(line, "a short English sentence.")
    """)


def test_the_url_pattern_looks_at_a_bounded_span_around_each_address():
    """An address is found whole in ordinary text, and inside a run of word characters the e-mail part
    looks at most 64 characters back (RFC 5321's local part), so each position costs a bounded amount."""
    from pipelines.score.features import urls

    assert urls("write to info@example.org or see https://example.org/a?b=c.") == {
        "info@example.org", "https://example.org/a?b=c"}
    assert urls("www.Example.com/x, mail First.Last+tag@sub.example.co.uk!") == {
        "www.example.com/x", "first.last+tag@sub.example.co.uk"}
    long_local = "a" * 1000 + "@example.org"
    assert urls(long_local) == {"a" * 64 + "@example.org"}  # features.MAX_EMAIL_LOCAL
    assert urls("a" * 5000) == set() and urls("\u4e2d" * 5000) == set()


@pytest.mark.slow
def test_text_stage_functions_finish_on_a_million_character_line():
    """labse-clean's sentence filters, normalisation and dedup keys, sentence splitting, boilerplate
    scores; labse-vocab's pre-tokenisation and counting; the main-content labels and the classifier's
    line features; the HTML reader. (None of these was quadratic: a guard against regressions.)"""
    _completes("""
        from pipelines.text import boilerplate, filters, normalise, pretokenize, sentences
        from pipelines.text.html import html_to_lines
        from pipelines.main_content import labels
        from pipelines.main_content.model import featurise_document
        from vocab.count import count_batch
        for name, line in LINES.items():
            filters.first_failures([line], ["zh"]); filters.first_failure_reference(line, "zh")
            for lang in ("en", "th"):  # Thai adds its own space rule
                sentences.split_sentences(line, lang)
            normalise.clean_text(line); normalise.normalise_for_dedup(line); normalise.dedup_keys([line], ["en"])
            boilerplate.line_scores([line]); boilerplate.heuristic_scores_of_documents([line], [0, 1])
            pretokenize.pretokenize(line)
            count_batch([("en", line)], 0.0)
            labels.line_is_kept(line, labels.TeacherText.from_text(line[:1000]))
            featurise_document([line, "A short line.", line])
            html_to_lines("<html><body><p>" + line + "</p></body></html>")
    """)


@pytest.mark.slow
def test_wikitext_cleanup_finishes_on_a_million_character_line():
    """labse-clean's Wikipedia path: the pre-strip (comments, references, templates, tables), the line
    cleanup and the leftover-markup checks; and the whole conversion on lines the parser reads in one
    pass (mwparserfromhell itself is quadratic in unclosed HTML tags: README, "Reliability in brief")."""
    _completes("""
        from pipelines.text import wikitext
        for name, line in LINES.items():
            wikitext._prestrip(line)
            cleaned = wikitext._clean_line(line)
            wikitext._MARKUP_LEFT.search(line); wikitext._TABLE_OR_FILE_LEFT.search(line)
            if name not in ("tags", "refs"):
                wikitext.wikitext_to_text(line)
    """)


def test_the_wikitext_patterns_still_find_what_they_are_for():
    from pipelines.text import wikitext

    assert wikitext._prestrip("a<ref>x</ref>b<ref name=y/>c<REF>z</ref >d") == "abcd"
    assert wikitext._prestrip("open <ref>closed late. Later <ref>closed</ref> end") == "open  end"  # as MediaWiki pairs
    assert wikitext._prestrip("a <ref>never closed, <ref name=q/> b") == "a <ref>never closed,  b"
    assert wikitext._MARKUP_LEFT.search("text </ div> more") and wikitext._MARKUP_LEFT.search("<span class=x>")
    assert wikitext._clean_line("Paris ( ; ) is (born 1900 , ) here ,  now") == "Paris is (born 1900) here, now"
