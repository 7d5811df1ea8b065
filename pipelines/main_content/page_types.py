"""The type of a web page (article, forum, product, listing, other) from its URL and markup.

Main-content extractors are good on articles and much worse on forums, product and listing pages
(the WCXB benchmark: 0.93 on articles, 0.41-0.84 on the others), so quality is reported per type.
The rule is deliberately simple and cheap, in this order (the first match wins):

1. the page's own declaration: schema.org ``@type`` / ``itemtype`` and Open Graph ``og:type``
   (DiscussionForumPosting / QAPage -> forum; Product / og:type product -> product;
   CollectionPage / SearchResultsPage / ItemList -> listing; NewsArticle / Article / BlogPosting /
   og:type article -> article);
2. the URL path (``forum``, ``thread``, ``viewtopic``, ``/questions/`` -> forum; ``/product``,
   ``/dp/``, ``/item/`` -> product; ``/category/``, ``/tag/``, ``/search``, ``/page/N``,
   ``?page=`` -> listing; a dated path ``/2019/11/`` or a long hyphenated slug -> article);
3. the markup: an "add to cart" button -> product; five or more ``<article>`` elements -> listing;
   otherwise "other".
"""
from __future__ import annotations

import re

PAGE_TYPES = ("article", "forum", "product", "listing", "other")

_HEAD_BYTES = 200_000  # declarations sit in the head or early in the body; long pages are cut

_DECLARED = (
    ("forum", re.compile(r"DiscussionForumPosting|schema\.org/QAPage|\"@type\"\s*:\s*\"QAPage\"", re.I)),
    ("product", re.compile(r"schema\.org/Product\b|\"@type\"\s*:\s*\"Product\"|og:type\"?\s+content=\"?(og:)?product",
                           re.I)),
    ("listing", re.compile(r"schema\.org/(CollectionPage|SearchResultsPage|ItemList)\b|"
                           r"\"@type\"\s*:\s*\"(CollectionPage|SearchResultsPage)\"", re.I)),
    ("article", re.compile(r"schema\.org/(NewsArticle|Article|BlogPosting|ReportageNewsArticle)\b|"
                           r"\"@type\"\s*:\s*\"(NewsArticle|Article|BlogPosting|ReportageNewsArticle)\"|"
                           r"og:type\"?\s+content=\"?article", re.I)),
)
_URL = (
    ("forum", re.compile(r"forum|/threads?/|showthread|viewtopic|/topic/|/questions/\d|/t/[^/]+/\d|/discussion", re.I)),
    ("product", re.compile(r"/products?/|/dp/|/item/|/p/\d|/shop/[^/]+/.|[?&]product_id=", re.I)),
    ("listing", re.compile(r"/categor(y|ies)/|/tags?/|/search|/page/\d+/?$|[?&]page=\d|/archives?/?$", re.I)),
    ("article", re.compile(r"/(19|20)\d\d/\d\d?/|/[a-z0-9]+(-[a-z0-9]+){4,}(\.html?)?/?$|/articles?/|/news/.", re.I)),
)
_ADD_TO_CART = re.compile(r"add[ _-]?to[ _-]?(cart|basket|bag)|in den warenkorb|ajouter au panier", re.I)
_ARTICLE_TAG = re.compile(r"<article[\s>]", re.I)


def page_type(url: str, html: str) -> str:
    """One of ``PAGE_TYPES`` for a page (module docstring for the rule)."""
    head = html[:_HEAD_BYTES]
    for kind, pattern in _DECLARED:
        if pattern.search(head):
            return kind
    path = (url or "").split("://", 1)[-1]
    path = path[path.find("/"):] if "/" in path else ""
    for kind, pattern in _URL:
        if pattern.search(path):
            return kind
    if _ADD_TO_CART.search(head):
        return "product"
    if len(_ARTICLE_TAG.findall(head)) >= 5:
        return "listing"
    return "other"
