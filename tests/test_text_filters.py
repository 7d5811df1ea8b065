"""Sentence splitting, quality filters, dedup normalisation and heuristic main-content rules."""
from __future__ import annotations

import pytest

from pipelines.text.boilerplate import heuristic_main_content_scores
from pipelines.text.filters import REASONS, FilterConfig, first_failure
from pipelines.text.normalise import clean_text, dedup_key, normalise_for_dedup
from pipelines.text.sentences import split_sentences


# ----------------------------------------------------------------------------- sentences
@pytest.mark.parametrize(
    "lang, text, expected",
    [
        ("en", "Dr. Smith went to Washington. He arrived at 5 p.m. on Monday! Was it fun? Yes.",
         ["Dr. Smith went to Washington.", "He arrived at 5 p.m. on Monday!", "Was it fun?", "Yes."]),
        ("zh", "我今天很忙。你呢？我们明天见！", ["我今天很忙。", "你呢？", "我们明天见！"]),
        ("ja", "今日は忙しいです。明日会いましょう！", ["今日は忙しいです。", "明日会いましょう！"]),
        ("hi", "मैं घर जा रहा हूँ। तुम कहाँ हो? ठीक है।", ["मैं घर जा रहा हूँ।", "तुम कहाँ हो?", "ठीक है।"]),
        ("ar", "أين أنت؟ أنا في البيت.", ["أين أنت؟", "أنا في البيت."]),
        ("th", "ฉันชอบกินข้าว วันนี้อากาศดี", ["ฉันชอบกินข้าว", "วันนี้อากาศดี"]),
        ("km", "គាត់ខឹងយើង ។ គាត់ខឹងខ្ញុំ ។", ["គាត់ខឹងយើង ។", "គាត់ខឹងខ្ញុំ ។"]),
        ("ltg", "Latgola ir vāsturisks regions. Tī dzeivoj latgalīši.",
         ["Latgola ir vāsturisks regions.", "Tī dzeivoj latgalīši."]),
        (None, "", []),
    ],
)
def test_split_sentences(lang, text, expected):
    assert split_sentences(text, lang) == expected


def test_split_on_known_sentences_from_tatoeba(labse_data):
    for code, lang, joiner in [("deu", "de", " "), ("cmn", "zh", ""), ("rus", "ru", " ")]:
        gold = [l.strip() for l in (labse_data / "tatoeba" / f"tatoeba.{code}-eng.{code}").read_text(
            encoding="utf-8").splitlines() if l.strip()][:200]
        hits = 0
        for i in range(0, len(gold), 4):
            hits += split_sentences(joiner.join(gold[i:i + 4]), lang) == gold[i:i + 4]
        assert hits >= 40, (lang, hits)  # of 50 paragraphs; some Tatoeba lines hold two sentences


# ----------------------------------------------------------------------------- filters
@pytest.mark.parametrize(
    "text, lang, reason",
    [
        ("Das ist ein ganz normaler Satz.", "de", None),
        ("这是一个很好的句子，我们很喜欢它。", "zh", None),
        ("Это хорошее предложение.", "ru", None),
        ("मैं घर जा रहा हूँ और फिर बाज़ार।", "hi", None),
        ("هل تريد أن تأتي معنا غدا؟", "ar", None),
        ("He said \"this is the end.\"", "en", None),
        ("ฉันชอบกินข้าวมากๆเลยนะครับ", "th", None),
        ("Mes dzeivuojam Latgolā i runojam latgaliski.", "ltg", None),
        ("Too short", "en", "too_short"),
        ("x" * 5001 + ".", "en", "too_long"),
        ("Home | About us | Contact", "en", "no_terminal_punctuation"),
        ("Please enable JavaScript to view this page.", "en", "javascript"),
        ("Lorem ipsum dolor sit amet, consectetur.", "en", "lorem_ipsum"),
        ("This site uses cookies to improve your experience.", "en", "policy"),
        ("Read our Privacy Policy before you continue.", "en", "policy"),
        ("Diese Website verwendet Cookies für Statistik.", "de", "policy"),
        ("Call 555-1234-5678 or 555-8765-4321 now.", "en", "digits"),
        ("Great!!!!!!!!!!!! Really great stuff here.", "en", "repeated_characters"),
        ("Price: $$$ ### @@@ *** win now!", "en", "symbols"),
        ("This is clearly English text here.", "ru", "script_mismatch"),
        ("Das Ger\ufffdt ist kaputt gegangen.", "de", "replacement_character"),
        ("1234567890 !!!", "en", "digits"),
    ],
)
def test_filters_reasons(text, lang, reason):
    assert first_failure(text, lang) == reason
    assert reason is None or reason in REASONS


def test_length_bounds_are_configurable():
    config = FilterConfig(min_chars=3, max_chars=20)
    assert first_failure("Kurz da.", "de", config) is None
    assert first_failure("Ein viel zu langer Satz für die Grenze.", "de", config) == "too_long"


def test_letters_are_in_their_languages_scripts():
    from pipelines.text.filters import expected_scripts, in_scripts

    for ch, lang in zip("aЖ中あカ한กß", ("en", "ru", "zh", "ja", "ja", "ko", "th", "de")):
        assert in_scripts(ch, expected_scripts(lang)), (ch, lang)
    for ch, lang in (("a", "ru"), ("Ж", "en"), ("あ", "zh"), ("1", "en"), (" ", "en"), (".", "en")):
        assert not in_scripts(ch, expected_scripts(lang)), (ch, lang)
    # Beyond the tabled planes (the per-character path counts these): CJK extension B is Han.
    assert in_scripts("\U00020000", expected_scripts("zh")) and not in_scripts("\U00020000", expected_scripts("ru"))


@pytest.mark.parametrize(
    "text, lang",
    [
        ("コーヒーとケーキをください。", "ja"),  # ー: Script Common, Script_Extensions Hiragana and Katakana
        ("ｺｰﾋｰを飲みます。", "ja"),  # its halfwidth form
        ("人々は色々な国々へ行きます。", "ja"),  # 々: Han
        ("我们日々进步，人人向上。", "zh"),
        ("メーデー、メーデー！", "ja"),
    ],
)
def test_prolonged_sound_and_iteration_marks_are_in_script(text, lang):
    """ー and 々 are letters of Japanese and Chinese text, not off-script ones (their Unicode names
    start with KATAKANA-HIRAGANA and IDEOGRAPHIC, which is how they were miscounted)."""
    from pipelines.text.filters import Sentence, SentenceBatch, first_failure_reference

    counted = Sentence.counted(text, lang)
    assert counted.letters and counted.in_script == counted.letters
    assert SentenceBatch.of([text], [lang]).in_script.tolist() == [counted.letters]
    assert first_failure(text, lang) is None
    assert first_failure_reference(text, lang) is None


# ----------------------------------------------------------------------------- normalisation
def test_dedup_key_ignores_case_punctuation_width_and_spacing():
    assert normalise_for_dedup("Hello,  World!") == "hello world"
    assert dedup_key("Hello, World!") == dedup_key("hello world") == dedup_key("ＨＥＬＬＯ　world")
    assert dedup_key("Hello world") != dedup_key("Hello word")
    assert dedup_key("Straße") == dedup_key("STRASSE")  # casefold, not lower


def test_clean_text_removes_controls_and_collapses_space():
    assert clean_text("  a\u200b b\x07\t c\u00a0 ") == "a b c"
    assert clean_text("e\u0301") == "é"  # NFC


# ----------------------------------------------------------------------------- heuristic main content
def test_heuristic_scores_prefer_article_text_over_navigation():
    lines = [
        "Home | News | Sport | Contact",
        "Sign in",
        "Menu",
        "The council approved the new budget on Tuesday after a long debate about schools and roads in the city.",
        "It passed by seven votes to two.",
        "Critics said the plan does not do enough for the poorer districts, and promised to keep fighting it.",
        "© 2020 Example News. All rights reserved.",
    ]
    scores = heuristic_main_content_scores(lines)
    assert len(scores) == len(lines)
    assert max(scores[:3]) < 0.5 and scores[6] < 0.5
    assert scores[3] > 0.5 and scores[5] > 0.5
    assert scores[4] > 0.5  # short sentence between two article lines
    assert heuristic_main_content_scores([]) == []


def test_bracket_wrapped_spam_is_symbols():
    assert first_failure("】【随】【着】【经】【济】【社】【会】【的】【发】【展】【，】【以】【及】【女】【性】。", "zh") == "symbols"


@pytest.fixture(scope="module")
def real_chinese_and_japanese_lines(labse_data):
    """Every line of the UDHR and Tatoeba in Chinese (Mandarin, Cantonese, Wu) and Japanese."""
    from tests.conftest import require_file

    real = []
    for relative, lang in (("udhr/cmn_hans.txt", "zh"), ("udhr/cmn_hant.txt", "zh"), ("udhr/jpn.txt", "ja"),
                           ("tatoeba/tatoeba.cmn-eng.cmn", "zh"), ("tatoeba/tatoeba.yue-eng.yue", "zh"),
                           ("tatoeba/tatoeba.wuu-eng.wuu", "zh"), ("tatoeba/tatoeba.jpn-eng.jpn", "ja")):
        path = require_file(labse_data, relative)
        real += [(line.strip(), lang) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(real) > 4000
    return real


def test_gbk_mojibake_flags_the_real_garbled_page_and_no_real_cjk_text(labse_data, real_chinese_and_japanese_lines):
    """UTF-8 Chinese decoded as GBK (as sent by 003338.cn in the CC sample) is dropped; real Chinese
    and Japanese sentences of the UDHR and Tatoeba are not."""
    from pipelines.io.documents import Document
    from pipelines.read.readers import read_records
    from pipelines.text.html import html_to_lines
    from pipelines.text.sentences import split_sentences
    from tests.conftest import require_file

    sample = require_file(labse_data, "commoncrawl/CC-MAIN-2020-34-sample.warc.gz")
    page = next(d for d in read_records(str(sample), "warc")
                if isinstance(d, Document) and d.url == "http://003338.cn/l41/481397.html")
    lines = html_to_lines(page.body)
    garbled = [s for line in lines for s in split_sentences(line, "zh") if "瑙勭殑" in s or "婢虫床" in s]
    assert garbled
    assert {first_failure(s, "zh") for s in garbled} <= {"gbk_mojibake", "too_short"}
    assert "gbk_mojibake" in {first_failure(s, "zh") for s in garbled}
    assert first_failure("我国卫生与健康领域有了“基本法”。", "zh") is None  # the page's own real Chinese

    from pipelines.text.filters import gbk_mojibake

    assert [text for text, lang in real_chinese_and_japanese_lines if gbk_mojibake(text, lang, FilterConfig())] == []


def test_real_chinese_and_japanese_lines_lose_script_only_to_latin_words(real_chinese_and_japanese_lines):
    """`script` drops a real Chinese or Japanese line only when it is mixed with Latin words: ー, 々
    and every other letter of CJK text is in the language's scripts (the Tatoeba line
    パスワードは「Muiriel」です。 was dropped while ー counted as off-script)."""
    from pipelines.text.filters import LATIN, expected_scripts, in_scripts, script

    lines = real_chinese_and_japanese_lines
    assert sum("ー" in text or "々" in text for text, _ in lines) > 100
    dropped = [(text, lang) for text, lang in lines if script(text, lang) is not None]
    assert 0 < len(dropped) < 20
    for text, lang in dropped:
        off_script = [ch for ch in text if ch.isalpha() and not in_scripts(ch, expected_scripts(lang))]
        assert all(in_scripts(ch, LATIN) for ch in off_script), text
