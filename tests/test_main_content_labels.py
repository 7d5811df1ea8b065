"""Teacher labelling, page-disjoint splits and balancing (pure functions, no Beam)."""
from collections import Counter

from pipelines.main_content.labels import (
    LabelledPage,
    TeacherText,
    balance_page,
    label_lines,
    label_page,
    line_is_kept,
    split_of,
)

# A hand-made page: navigation, one article (heading + 3 paragraphs), a "most read" box, a footer.
PAGE = """<!DOCTYPE html>
<html lang="en"><head><title>River restoration brings salmon back | Valley Gazette</title></head>
<body>
<header><nav><ul>
<li><a href="/">Home</a></li><li><a href="/news">News</a></li><li><a href="/sport">Sport</a></li>
<li><a href="/weather">Weather</a></li><li><a href="/contact">Contact us</a></li>
</ul></nav></header>
<main><article>
<h1>River restoration brings salmon back to the upper valley</h1>
<p>For the first time in forty years, wild salmon have been counted above the old mill weir, after
volunteers and engineers spent three summers removing concrete barriers from the river bed.</p>
<p>The project, funded by the regional water board and several local fishing clubs, replaced the weir
with a series of shallow stone steps that allow fish to swim upstream during the autumn floods.</p>
<p>Biologists from the university counted more than two hundred adult fish in October and expect the
numbers to grow as young salmon born this winter return to the river in three or four years.</p>
</article></main>
<aside><h3>Most read</h3><ul><li><a href="/a">Council approves new bus timetable</a></li>
<li><a href="/b">Bakery wins national award</a></li></ul></aside>
<footer><p>Copyright 2024 Valley Gazette. All rights reserved.</p>
<p><a href="/privacy">Privacy policy</a> | <a href="/terms">Terms of use</a></p></footer>
</body></html>"""


def test_hand_made_page_gets_the_expected_labels():
    page = label_page("https://gazette.example/salmon", PAGE)
    labels = dict(zip(page.lines, page.labels))
    for nav in ("Home", "News", "Sport", "Weather", "Contact us", "Most read",
                "Council approves new bus timetable", "Bakery wins national award",
                "Copyright 2024 Valley Gazette. All rights reserved.", "Privacy policy | Terms of use"):
        assert labels[nav] is False, nav
    main = [line for line in page.lines if labels[line]]
    assert main[0] == "River restoration brings salmon back to the upper valley"
    assert len(main) == 4 and all(line.startswith(("River", "For the first", "The project", "Biologists"))
                                  for line in main)
    assert "salmon" in page.teacher_text


def test_short_lines_need_a_whole_teacher_line_not_shared_words():
    teacher = TeacherText.from_text("We went home after the news.\nAll rights were reserved by the court today.")
    assert not line_is_kept("Home", teacher)
    assert not line_is_kept("News", teacher)
    assert not line_is_kept("All rights reserved", teacher)  # shares words, not bigrams in order
    assert line_is_kept("we went HOME after the news!", teacher)  # normalisation: case, punctuation


def test_long_lines_match_across_teacher_line_breaks_and_partially():
    teacher = TeacherText.from_text("The first paragraph of the story is here.\nAnd the second one follows it directly.")
    assert line_is_kept("The first paragraph of the story is here. And the second one follows it directly.", teacher)
    # our block holds the teacher's paragraph plus a trailing "Read more" link text
    assert line_is_kept("The first paragraph of the story is here. Read more", teacher)
    assert not line_is_kept("Subscribe to our newsletter for the best stories every morning", teacher)


def test_text_without_spaces_matches_by_character_trigrams():
    teacher = TeacherText.from_text("北京时间今天上午，国家统计局发布了最新的经济数据，显示经济稳步增长。")
    assert line_is_kept("国家统计局发布了最新的经济数据，显示经济稳步增长。", teacher)
    assert not line_is_kept("首页 新闻 体育 财经 娱乐 科技 汽车 房产 教育 旅游", teacher)


def test_no_teacher_text_means_all_boilerplate():
    assert label_lines(["a line", "another line"], None) == [False, False]


def test_split_is_by_page_and_deterministic():
    urls = [f"https://site{i}.example/page/{i}" for i in range(2000)]
    splits = [split_of(u) for u in urls]
    assert splits == [split_of(u) for u in urls]
    shares = Counter(splits)
    assert 0.07 < shares["test"] / 2000 < 0.13 and 0.07 < shares["dev"] / 2000 < 0.13
    assert split_of("https://a.example/", dev_fraction=0.0, test_fraction=0.0) == "train"


def test_balance_downsamples_the_majority_and_caps_the_page():
    labels = [False] * 90 + [True] * 10
    keep = balance_page([str(i) for i in range(100)], labels, seed="u")
    kept = Counter(labels[i] for i in keep)
    assert kept[True] == 10 and kept[False] == 10 and keep == sorted(keep)
    assert balance_page([str(i) for i in range(100)], labels, seed="u") == keep  # deterministic
    big = [False] * 600 + [True] * 400
    kept = Counter(big[i] for i in balance_page(["x"] * 1000, big, seed="v", max_lines_per_page=200))
    assert kept[True] == 100 and kept[False] == 100
    only_boiler = balance_page(["x"] * 300, [False] * 300, seed="w", max_lines_per_page=200)
    assert len(only_boiler) == 50


def test_labelled_page_json_round_trip():
    page = LabelledPage(url="u", lines=["a", "b"], labels=[True, False], teacher_text="a", lang="en")
    assert LabelledPage.from_json(page.to_json()) == page


def test_committee_labels_real_article_pages_better_than_all_text(labse_data):
    """The committee's votes on real pages: majority labels, 2-2 ties disputed and never trained on,
    and the labelled text close to the human main text."""
    import json

    from pipelines.main_content.config import BuildConfig
    from pipelines.main_content.evaluate import html_pages, token_f1
    from pipelines.main_content.labels import COMMITTEE_MAJORITY, committee_votes
    from pipelines.main_content.transforms import training_examples
    from tests.conftest import require_file

    truth = json.loads(require_file(labse_data, "maincontent/article-pages.ground-truth.json").read_text())
    pages = html_pages(str(require_file(labse_data, "maincontent/article-pages.warc.gz")))[:8]
    committee_f1, all_text_f1, disputed_seen = [], [], 0
    for url, html in pages:
        page = label_page(url, html)
        votes = committee_votes(page.lines, html, page.html_main)
        assert page.labels == [vote >= COMMITTEE_MAJORITY for vote in votes]
        assert page.disputed == [vote == 2 for vote in votes]
        disputed_seen += sum(page.disputed)
        examples = [row for _lang, (_digest, row) in training_examples(page.to_json(), BuildConfig())]
        assert len(examples) <= len(page.lines) - sum(page.disputed)
        committee_f1.append(token_f1("\n".join(l for l, k in zip(page.lines, page.labels) if k), truth[url]))
        all_text_f1.append(token_f1("\n".join(page.lines), truth[url]))
    assert disputed_seen > 0
    assert sum(committee_f1) / len(pages) > 0.9 > sum(all_text_f1) / len(pages)
    teacher_only = label_page(*pages[0], scheme="teacher")
    assert teacher_only.disputed is None and teacher_only.lines == label_page(*pages[0]).lines
