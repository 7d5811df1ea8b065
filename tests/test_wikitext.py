"""wikitext_to_text and the edition -> language mapping, without Beam."""
from __future__ import annotations

import pytest

from pipelines.text.languages import LID176_LABELS, edition_from_url, edition_to_lang
from pipelines.text.wikitext import wikitext_to_text

ARTICLE = """{{Infobox person
| name = Achilles
| image = {{nowrap|x}}
}}
In Greek mythology, '''Achilles''' ({{IPAc-en|ə|ˈ|k|ɪ|l|iː|z}}; {{lang-grc|Ἀχιλλεύς}}, ''Akhilleus'') was a [[hero]] of the [[Trojan War|war at Troy]].<ref name="a">{{cite book|title=Iliad}}</ref> <!-- a comment -->
[[File:Achilles.jpg|thumb|left|A [[statue]] of Achilles]]
[[Image:Other.png|200px]]
__TOC__
== Life ==
{| class="wikitable"
|-
! Year !! Event
|-
| 1200 BC || born
|}
* He was {{nowrap|very strong}}&nbsp;indeed.<ref>Note.</ref>
* Second item with [http://example.com an external link] and [http://example.org].
<gallery>
A.jpg|caption
</gallery>
<math>E = mc^2</math>
== References ==
{{reflist}}
* Smith, ''A Book''.
[[Category:Heroes]]
[[de:Achilleus]]
"""


def test_article_to_lines():
    lines = wikitext_to_text(ARTICLE).split("\n")
    assert lines == [
        "In Greek mythology, Achilles (Ἀχιλλεύς, Akhilleus) was a hero of the war at Troy.",
        "Life",
        "He was very strong indeed.",
        "Second item with an external link and.",
    ]


@pytest.mark.parametrize(
    "wikitext,expected",
    [
        ("[[Kategoreja:Latgola]]Teksts.", "Teksts."),  # localised category namespace
        ("[[Fails:Bilde.jpg|thumb|Paraksts]]Teksts.", "Teksts."),  # localised file namespace
        ("A [[:Category:Heroes|category link]] stays.", "A category link stays."),
        ("{{unclosed template\nNext paragraph.", "Next paragraph."),  # never swallows the page
        ("Line one.<br />Line two.", "Line one.\nLine two."),
        ("''Italic'' and '''bold''' and '''''both'''''.", "Italic and bold and both."),
        ("Price &amp;nbsp;10 &lt; 20.", "Price 10 < 20."),
        ("<TABLE border=0 width=\"600px\">\nProse.", "Prose."),
        ("| stray || table row\nProse.", "Prose."),
        ("{{lang|fr|le mot}} means the word.", "le mot means the word."),
        ("Code follows:\n int main() {\n   return 0;\n }\nProse again.", "Code follows:\nProse again."),
        ("{{Infobox x}} Text after a template.", "Text after a template."),
    ],
)
def test_markup_cases(wikitext, expected):
    assert wikitext_to_text(wikitext, file_namespaces=frozenset({"fails"}), category_namespaces=frozenset({"kategoreja"})) == expected


def test_templates_nested_in_tables_and_references():
    text = "Start.{{a|{{b|{{c}}}}}}<ref>{{cite|x=[[y|z]]}}</ref> End.\n{|\n|{{x}}\n{|\n|inner\n|}\n|}\nAfter."
    assert wikitext_to_text(text) == "Start. End.\nAfter."


@pytest.mark.parametrize(
    "edition,lang",
    [
        ("enwiki", "en"), ("en", "en"), ("dewiki", "de"), ("ltgwiki", "ltg"), ("zh_yuewiki", "yue"),
        ("zh-yue", "yue"), ("simplewiki", "en"), ("be_x_oldwiki", "be"), ("zh_min_nanwiki", "nan"),
        ("zh_classicalwiki", "lzh"), ("alswiki", "als"), ("nowiki", "no"), ("bat_smgwiki", "sgs"),
        ("szlwiki", "szl"), ("enwikisource", "en"), ("frwiktionary", "fr"),
    ],
)
def test_edition_to_lang(edition, lang):
    assert edition_to_lang(edition) == lang


def test_edition_codes_in_lid176_map_to_themselves():
    assert all(edition_to_lang(code + "wiki") == code for code in LID176_LABELS)
    assert len(LID176_LABELS) == 176


def test_edition_from_url():
    assert edition_from_url("https://zh-yue.wikipedia.org/wiki/Main_Page") == "yue"
    assert edition_from_url("https://ltg.wikipedia.org/wiki/Suoku_puslopa") == "ltg"
    assert edition_from_url("https://example.com/wiki/X") is None
