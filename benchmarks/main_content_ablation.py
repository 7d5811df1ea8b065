"""Main-content features: an ablation, F1 per feature set, on held-out pages per page type and on the
181 human-labelled article pages (issue 35, items 2 and 3).

Pages and labels: the HTML pages of the Common Crawl samples (``commoncrawl/*.warc.gz``), labelled
by the committee as ``labse-main-content build-data`` labels them (``labels.label_page``).
Held-out: the pages are split in two folds by a hash of their host name, so no site is on both
sides; a model trained on one fold scores the other, and every page is scored once by a model that
never saw its site. Reported: line F1 against the committee labels, over all held-out pages and per
page type (``page_types.page_type``). Human check: a model trained on all the CC pages scores the
181 article pages of ``maincontent/`` (never trained on); token F1 of the kept lines against their
human main text, as ``labse-main-content train`` and ``benchmarks/main_content.py`` measure it.

Feature sets: the model's features (``model.featurise_document``, set ``ctx2hw``) with groups of
tokens left out, and with candidate DOM block features added. Each DOM feature says, per line,
whether the line disappears when resiliparse extracts the page again without some elements
(``skip_elements``), which maps DOM facts onto ``html_to_lines``' lines without a node map:

  link      ``LK1``: the line holds link text (it changes without ``<a>``): link density, as a flag
  container ``NV1``: the line sits in ``nav``, ``header``, ``footer``, ``aside``, ``form`` or ``menu``
  tag       ``TL``/``TT``/``TH``: the line is (in) a list item, a table cell, a heading (tag path)

Training follows build-data: per page the classes are balanced (``balance_page``), disputed lines
are not trained on, and 25% of the pages (``drops_html_feature``) are featurised without the HTML
feature (and without the DOM features), so each model also serves text-only input. Also printed:
the CPU ms a page of each DOM feature's extra extraction (what it would add to labse-clean).

    .venv/bin/python benchmarks/main_content_ablation.py --data ../shared/data [--seeds 0,1]
"""
from __future__ import annotations

import argparse
import hashlib
import os
import random
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

CC = "commoncrawl/*.warc.gz"
ARTICLES = "maincontent/article-pages.warc.gz"
TRUTH = "maincontent/article-pages.ground-truth.json"

# The extraction options of html_to_lines, so a block of another extraction matches its line exactly.
_LINE_OPTIONS = dict(preserve_formatting=True, main_content=False, list_bullets=False, alt_texts=False,
                     links=False, form_fields=False, noscript=False)
# DOM features: name -> (elements skipped, token prefix). A line missing from the extraction without
# these elements is in (or holds) one of them.
DOM_FEATURES = {
    "link": (["a"], "LK"),
    "container": (["nav", "header", "footer", "aside", "form", "menu"], "NV"),
    "list": (["li"], "TL"),
    "table": (["td", "th"], "TT"),
    "heading": (["h1", "h2", "h3", "h4", "h5", "h6"], "TH"),
}
# Token groups of featurise_document, by prefix (model.py's docstring): what each ablation leaves out.
GROUPS = {
    "html": ("RM", "RW"),           # the HTML feature and its page context
    "window": ("RW",),              # only its page context (the ctx2hw addition)
    "prose": ("D", "S", "PD", "PM"),  # place among the page's prose lines
    "neighbours": ("pL", "p:", "nL", "n:"),  # previous / next line's length and first tokens
}
FEATURE_SETS = {
    "text only (no HTML feature)": ((GROUPS["html"]), ()),
    "ctx2h (without RW window)": (GROUPS["window"], ()),
    "ctx2hw, no prose context": (GROUPS["prose"], ()),
    "ctx2hw, no neighbour lines": (GROUPS["neighbours"], ()),
    "ctx2hw (the model's features)": ((), ()),
    "ctx2hw + link": ((), ("link",)),
    "ctx2hw + container": ((), ("container",)),
    "ctx2hw + tag (list, table, heading)": ((), ("list", "table", "heading")),
    "ctx2hw + link + container + tag": ((), ("link", "container", "list", "table", "heading")),
}


def dom_flags(tree, lines: list[str], skip: list[str]) -> list[bool]:
    """Per line: is it missing from the extraction without the ``skip`` elements?"""
    from resiliparse.extract.html2text import extract_plain_text

    from pipelines.text.html import normalise_lines

    kept = set(normalise_lines(extract_plain_text(tree, skip_elements=skip, **_LINE_OPTIONS)))
    return [line not in kept for line in lines]


def fold_of(url: str) -> int:
    host = urlsplit(url).hostname or url
    return hashlib.sha1(host.encode("utf-8", "replace")).digest()[0] % 2


def _drop(features: str, prefixes: tuple[str, ...]) -> str:
    if not prefixes:
        return features
    return " ".join(token for token in features.split(" ") if not token.startswith(prefixes))


class Page:
    """A page's lines, labels (None for the human-checked pages), HTML and DOM flags, page type."""

    def __init__(self, url, lines, labels, disputed, html_main, html, kind, timings):
        from pipelines.text.html import parse_html

        self.url, self.lines, self.labels, self.disputed = url, lines, labels, disputed
        self.html_main, self.kind = html_main, kind
        tree = parse_html(html)
        self.dom = {}
        for name, (skip, _prefix) in DOM_FEATURES.items():
            started = time.process_time()
            self.dom[name] = dom_flags(tree, lines, skip)
            timings[name] += time.process_time() - started

    def features(self, drop: tuple[str, ...], extras: tuple[str, ...], text_only: bool) -> list[str]:
        from pipelines.main_content.model import featurise_document

        base = featurise_document(self.lines, None if text_only else self.html_main)
        rows = [_drop(row, drop) for row in base]
        for name in extras:
            prefix = DOM_FEATURES[name][1]
            tokens = [f"{prefix}x"] * len(rows) if text_only else [f"{prefix}{int(f)}" for f in self.dom[name]]
            rows = [f"{row} {token}" for row, token in zip(rows, tokens)]
        return rows


def training_rows(pages, drop, extras) -> list[str]:
    from pipelines.main_content.config import BuildConfig
    from pipelines.main_content.labels import balance_page
    from pipelines.main_content.model import LABEL_BOILERPLATE, LABEL_MAIN
    from pipelines.main_content.transforms import drops_html_feature

    config = BuildConfig()
    rows = []
    for page in pages:
        feats = page.features(drop, extras, drops_html_feature(page.url, config.html_feature_dropout))
        candidates = [i for i, disputed in enumerate(page.disputed) if not disputed]
        sampled = balance_page([page.lines[i] for i in candidates], [page.labels[i] for i in candidates],
                               seed=page.url, max_lines_per_page=config.max_lines_per_page,
                               max_ratio=config.max_class_ratio)
        rows += [f"{LABEL_MAIN if page.labels[candidates[k]] else LABEL_BOILERPLATE} {feats[candidates[k]]}"
                 for k in sampled]
    return rows


def train(rows: list[str], work: str, seed: int):
    import fasttext

    from pipelines.main_content.config import MainContentTrainConfig
    from pipelines.main_content.train import train_fasttext

    random.Random(seed).shuffle(rows)
    path = os.path.join(work, "train.txt")
    Path(path).write_text("\n".join(rows) + "\n", encoding="utf-8")
    train_fasttext(path, os.path.join(work, "model.bin"), MainContentTrainConfig(threads=1, seed=seed))
    return fasttext.load_model(os.path.join(work, "model.bin"))


def kept(model, page: Page, drop, extras) -> list[bool]:
    """The lines the model keeps on a page, with the HTML (and DOM) features, smoothed as labse-clean does."""
    from pipelines.main_content.config import MAIN_CONTENT_THRESHOLD
    from pipelines.main_content.model import LABEL_MAIN, _postprocess

    feats = page.features(drop, extras, text_only=False)
    labels, probs = model.f.multilinePredict([f"{row}\n" for row in feats], 1, 0.0, "replace")
    top = np.clip(np.concatenate(probs).astype(np.float64), 0.0, 1.0)
    main = np.where([label == [LABEL_MAIN] for label in labels], top, 1.0 - top)
    return [bool(score >= MAIN_CONTENT_THRESHOLD) for score in _postprocess(main, page.lines)]


def line_f1(pairs) -> float:
    tp = fp = fn = 0
    for predicted, truth in pairs:
        tp += sum(p and t for p, t in zip(predicted, truth))
        fp += sum(p and not t for p, t in zip(predicted, truth))
        fn += sum(t and not p for p, t in zip(predicted, truth))
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def main(argv=None) -> int:
    import json

    from pipelines.main_content.evaluate import labelled_pages_from_warc, token_f1
    from pipelines.main_content.model import html_main_flags
    from pipelines.main_content.page_types import PAGE_TYPES, page_type
    from pipelines.read.readers import check_pattern_matches
    from pipelines.text.html import html_to_lines

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("LABSE_DATA", "../shared/data")))
    parser.add_argument("--seeds", default="0", help="fastText seeds, comma-separated; F1 is their mean")
    parser.add_argument("--sets", default=None, help="only these feature sets (substrings of their names, ';'-separated)")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    sets = {name: spec for name, spec in FEATURE_SETS.items()
            if not args.sets or any(part.strip() in name for part in args.sets.split(";"))}

    from pipelines.main_content.evaluate import html_pages

    timings = defaultdict(float)
    htmls = dict(html_pages(str(args.data / CC)))
    check_pattern_matches(str(args.data / CC))
    cc = [Page(p.url, p.lines, p.labels, p.disputed, p.html_main, htmls[p.url], p.page_type, timings)
          for p in labelled_pages_from_warc(str(args.data / CC))]
    truth = json.loads((args.data / TRUTH).read_text(encoding="utf-8"))
    articles = []
    for url, html in html_pages(str(args.data / ARTICLES)):
        lines = html_to_lines(html)
        if url in truth and lines:
            articles.append(Page(url, lines, None, None, html_main_flags(lines, html), html, page_type(url, html),
                                 defaultdict(float)))
    folds = [[p for p in cc if fold_of(p.url) == k] for k in (0, 1)]
    types = [kind for kind in PAGE_TYPES if any(p.kind == kind for p in cc)]
    print(f"{len(cc)} CC pages in 2 folds by host ({len(folds[0])} + {len(folds[1])}), "
          f"{', '.join(f'{sum(p.kind == kind for p in cc)} {kind}' for kind in types)}; "
          f"{len(articles)} human-labelled article pages; seeds {seeds}")
    print("CPU ms a page of each DOM feature's extra extraction (CC pages): " + ", ".join(
        f"{name} {1000 * seconds / len(cc):.2f}" for name, seconds in timings.items()))
    header = ["feature set", "held-out line F1", *(f"{kind} ({sum(p.kind == kind for p in cc)})" for kind in types),
              "F1 vs human (181)"]
    print("\n| " + " | ".join(header) + " |\n|" + " --- |" * len(header))
    with tempfile.TemporaryDirectory(prefix="main-content-ablation-") as work:
        for name, (drop, extras) in sets.items():
            held_out, human = defaultdict(list), []
            for seed in seeds:
                pairs = []
                for k in (0, 1):
                    model = train(training_rows(folds[1 - k], drop, extras), work, seed)
                    pairs += [(page, kept(model, page, drop, extras)) for page in folds[k]]
                held_out["all"].append(line_f1((keep, page.labels) for page, keep in pairs))
                for kind in types:
                    held_out[kind].append(line_f1((keep, page.labels) for page, keep in pairs if page.kind == kind))
                model = train(training_rows(cc, drop, extras), work, seed)
                human.append(float(np.mean([
                    token_f1("\n".join(line for line, keep in zip(page.lines, kept(model, page, drop, extras)) if keep),
                             truth[page.url]) for page in articles])))
            cells = [f"{np.mean(held_out['all']):.3f}", *(f"{np.mean(held_out[kind]):.3f}" for kind in types),
                     f"{np.mean(human):.3f}"]
            print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
