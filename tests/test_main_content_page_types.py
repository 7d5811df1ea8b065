"""Page types (pipelines.main_content.page_types), the per-type report and the learning curve."""
import json

import pytest

from pipelines.main_content.page_types import PAGE_TYPES, page_type
from tests.conftest import require_file


@pytest.mark.parametrize("url, html, expected", [
    ("https://news.example/2019/11/12/storm", "<html><body><p>x</p></body></html>", "article"),
    ("https://shop.example/x", '<script type="application/ld+json">{"@type": "Product"}</script>', "product"),
    ("https://board.example/viewtopic.php?t=12", "<html></html>", "forum"),
    ("https://blog.example/category/travel/", "<html></html>", "listing"),
    ("https://blog.example/", "<article>a</article>" * 6, "listing"),
    ("https://shop.example/brush", "<button>Add to cart</button>", "product"),
    ("https://example.org/about", "<html><body>about us</body></html>", "other"),
    # the page's own declaration wins over its URL
    ("https://forum.example/x", '<meta property="og:type" content="article">', "article"),
])
def test_page_type_rule(url, html, expected):
    assert page_type(url, html) == expected


def test_real_article_pages_are_mostly_articles(labse_data):
    from collections import Counter

    from pipelines.main_content.evaluate import html_pages

    pages = html_pages(str(require_file(labse_data, "maincontent/article-pages.warc.gz")))
    counts = Counter(page_type(url, html) for url, html in pages)
    assert set(counts) <= set(PAGE_TYPES) and counts["article"] >= 0.9 * len(pages)


@pytest.mark.slow
def test_learning_curve_and_per_type_report_on_real_pages(labse_data, tmp_path, capsys):
    from pipelines.main_content import learning_curve

    cc = str(require_file(labse_data, "commoncrawl/CC-MAIN-2020-34-sample.warc.gz"))
    articles = require_file(labse_data, "maincontent/article-pages.warc.gz")
    truth = require_file(labse_data, "maincontent/article-pages.ground-truth.json")
    out = tmp_path / "curve.json"
    assert learning_curve.main(["--input", cc, "--sizes", "2,100", "--truth-input", str(articles),
                                "--truth", str(truth), "--json", str(out)]) == 0
    curve = json.loads(out.read_text())["curve"]
    assert [row["train_pages"] for row in curve][0] == 2 and len(curve) == 2
    assert curve[0]["train_examples"] < curve[1]["train_examples"]
    for row in curve:
        assert row["human_pages"] == 181 and 0.5 < row["f1_vs_human"] <= 1.0
        per_type = row["held_out"]["per_page_type"]
        assert set(per_type) <= set(PAGE_TYPES)
        assert sum(t["pages"] for t in per_type.values()) == row["held_out"]["pages"]
    printed = capsys.readouterr().out
    assert "| training pages |" in printed and "F1 vs human" in printed
