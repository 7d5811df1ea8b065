"""Teacher labels for the lines of a page, without hand labels (pure functions, no Beam).

The teacher is trafilatura, a slower and accurate main-text extractor run on the page's HTML. A line
(exactly as ``html_to_lines`` produces it, because that is what ``labse-clean`` scores) is *main
content* when the teacher kept it, *boilerplate* otherwise. "Kept" is decided on normalised text
(NFKC, lowercase, letters and digits only, single spaces), so punctuation, quotes, bullets and
whitespace differences between the two extractors do not matter:

1. the normalised line equals a normalised teacher line, or
2. the line is long enough to be specific (>= ``MIN_SUBSTRING_CHARS`` normalised characters) and is
   a substring of the teacher's normalised text (the teacher joined two of our blocks, or we
   joined inline elements it split), or
3. the line has at least ``MIN_OVERLAP_UNITS`` matching units and at least ``MIN_OVERLAP`` of its
   units occur in the teacher's text. Units are word bigrams, or character trigrams for text
   written without spaces (Chinese, Japanese, Thai). Bigrams, not single words: a navigation link
   "Home" or a footer "All rights reserved" shares words with almost any article but not bigrams.

Short lines (below the substring length) therefore count as main content only when the teacher
has them as a whole line (a heading, a byline, a list item), never because their words appear
somewhere in the article.

The default labelling scheme is a *committee* (``committee_votes``): four extractors vote on each
line by the rule above (trafilatura in precision mode, in recall mode, resiliparse's main-content
mode, and jusText without a stoplist, so it works in every language). A line is main content when
at least ``COMMITTEE_MAJORITY`` of the four keep it; a 2-2 tie is *disputed*: it keeps its (false)
label for evaluation but is not a training example. On the 181 human-labelled article pages the
committee's labels score token F1 0.950 against 0.947 for trafilatura alone; the four agree on
89.5% of the lines and split 2-2 on 2.0% (BENCHMARKS.md, section "Main content at the teacher's
quality")
"""
from __future__ import annotations

import hashlib
import random
import re
import unicodedata
from dataclasses import dataclass
from typing import Sequence

from pipelines.main_content.config import LABEL_SCHEMES, TeacherConfig

MIN_SUBSTRING_CHARS = 25
MIN_OVERLAP = 0.5
MIN_OVERLAP_UNITS = 3
_NON_WORD = re.compile(r"[\W_]+", re.UNICODE)


def normalise(text: str) -> str:
    """NFKC, lowercase, letters/digits only, single spaces."""
    return _NON_WORD.sub(" ", unicodedata.normalize("NFKC", text).lower()).strip()


# Scripts written without spaces between words: Thai, Lao, Myanmar, Khmer, kana, CJK ideographs.
_UNSPACED_CHARS = re.compile(r"[\u0E00-\u0EFF\u1000-\u109F\u1780-\u17FF\u3040-\u30FF\u3400-\u4DBF\u4E00-\u9FFF\uF900-\uFAFF]")


def _is_unspaced(norm: str) -> bool:
    return len(_UNSPACED_CHARS.findall(norm)) * 3 >= len(norm.replace(" ", "")) > 0


def _units(norm: str) -> list[str]:
    if _is_unspaced(norm):
        compact = norm.replace(" ", "")
        return [compact[i:i + 3] for i in range(len(compact) - 2)] or ([compact] if compact else [])
    words = norm.split()
    if len(words) < 2:
        return words
    return [f"{a} {b}" for a, b in zip(words, words[1:])]


@dataclass(frozen=True)
class TeacherText:
    """The teacher's output, prepared for matching lines against it."""

    lines: frozenset[str]
    joined: str
    units: frozenset[str]

    @classmethod
    def from_text(cls, text: str | None) -> "TeacherText":
        norm_lines = [normalise(line) for line in (text or "").split("\n")]
        norm_lines = [line for line in norm_lines if line]
        joined = " ".join(norm_lines)
        units: set[str] = set()
        for line in norm_lines:
            units.update(_units(line))
        # Bigrams across teacher line breaks: our block may span two of its paragraphs.
        units.update(_units(joined)) if not _is_unspaced(joined) else None
        return cls(lines=frozenset(norm_lines), joined=f" {joined} ", units=frozenset(units))


def line_is_kept(line: str, teacher: TeacherText) -> bool:
    """Whether the teacher kept this line (see the module docstring for the exact rule)."""
    norm = normalise(line)
    if not norm:
        return False
    if norm in teacher.lines:
        return True
    if len(norm) >= MIN_SUBSTRING_CHARS and f" {norm} " in teacher.joined:
        return True
    if _is_unspaced(norm) and len(norm) >= MIN_SUBSTRING_CHARS // 2 and norm in teacher.joined:
        return True
    units = _units(norm)
    if len(units) < MIN_OVERLAP_UNITS:
        return False
    hits = sum(1 for unit in units if unit in teacher.units)
    return hits >= MIN_OVERLAP_UNITS and hits / len(units) >= MIN_OVERLAP


def teacher_extract(html: str, config: TeacherConfig = TeacherConfig()) -> str | None:
    """The teacher's main text for a page (None when trafilatura finds nothing)."""
    import trafilatura  # heavy import, only where the teacher runs

    return trafilatura.extract(
        html,
        fast=config.fast,
        favor_precision=config.favor_precision,
        favor_recall=config.favor_recall,
        include_comments=config.include_comments,
        include_tables=config.include_tables,
        deduplicate=False,
        with_metadata=False,
    )


COMMITTEE = ("trafilatura_precision", "trafilatura_recall", "resiliparse_main", "justext")
COMMITTEE_MAJORITY = 3  # of the four votes; a 2-2 tie is disputed


def justext_text(html: str) -> str:
    """jusText's non-boilerplate paragraphs, language-independent (no stoplist: the stopword
    thresholds at 0, as jusText's documentation advises for languages it has no list for)."""
    import justext

    try:
        paragraphs = justext.justext(html.encode("utf-8", "replace"), frozenset(), stopwords_low=0,
                                     stopwords_high=0)
    except Exception:  # lxml gives up on some pages (empty document, odd encodings): no vote for any line
        return ""
    return "\n".join(paragraph.text for paragraph in paragraphs if not paragraph.is_boilerplate)


def committee_votes(lines: Sequence[str], html: str, html_main: Sequence[bool] | None,
                    config: TeacherConfig = TeacherConfig(), precise_text: str | None = None) -> list[int]:
    """How many of the ``COMMITTEE`` extractors keep each line (0 to 4).

    ``html_main``: resiliparse's main-content flags per line (``model.html_main_flags``), already
    computed for the model's HTML feature; None counts as resiliparse keeping nothing.
    trafilatura runs twice, in precision and in recall mode (the other settings from ``config``);
    ``precise_text``: the precision mode's text when the caller has it already.
    """
    from dataclasses import replace

    if precise_text is None:
        precise_text = teacher_extract(html, replace(config, favor_precision=True, favor_recall=False))
    precise = TeacherText.from_text(precise_text)
    generous = TeacherText.from_text(teacher_extract(html, replace(config, favor_precision=False, favor_recall=True)))
    paragraphs = TeacherText.from_text(justext_text(html))
    flags = html_main if html_main is not None else [False] * len(lines)
    return [line_is_kept(line, precise) + line_is_kept(line, generous) + line_is_kept(line, paragraphs) + bool(flag)
            for line, flag in zip(lines, flags)]


def label_lines(lines: Sequence[str], teacher_text: str | None) -> list[bool]:
    """True (main content) / False (boilerplate) for each line, given the teacher's text."""
    teacher = TeacherText.from_text(teacher_text)
    return [line_is_kept(line, teacher) for line in lines]


def split_of(url: str, dev_fraction: float = 0.1, test_fraction: float = 0.1) -> str:
    """"train", "dev" or "test" from a hash of the page URL: all lines of a page go to one split."""
    bucket = int.from_bytes(hashlib.sha1(url.encode("utf-8", "replace")).digest()[:8], "big") / 2**64
    if bucket < test_fraction:
        return "test"
    if bucket < test_fraction + dev_fraction:
        return "dev"
    return "train"


def balance_page(lines: Sequence[str], labels: Sequence[bool], *, seed: str,
                 max_lines_per_page: int = 200, max_ratio: float = 1.0) -> list[int]:
    """Indices of the lines to keep as training examples for one page, in page order.

    The majority class is downsampled to at most ``max_ratio`` times the minority class, so a page
    with three main lines and 300 navigation links does not teach "everything is boilerplate";
    a page whose lines all have one label keeps at most ``max_lines_per_page // 4`` of them (it
    still teaches what such a page looks like). Then at most ``max_lines_per_page`` lines are kept,
    so a few huge pages cannot dominate. Sampling is deterministic (seeded by ``seed``, the URL).
    """
    rng = random.Random(seed)
    main = [i for i, is_main in enumerate(labels) if is_main]
    boiler = [i for i, is_main in enumerate(labels) if not is_main]
    if not main or not boiler:
        only = main or boiler
        keep = rng.sample(only, min(len(only), max(1, max_lines_per_page // 4)))
        return sorted(keep)
    minority, majority = (main, boiler) if len(main) <= len(boiler) else (boiler, main)
    majority = rng.sample(majority, min(len(majority), max(1, int(len(minority) * max_ratio))))
    half = max_lines_per_page // 2
    if len(minority) > half:
        minority = rng.sample(minority, half)
        majority = rng.sample(majority, min(len(majority), half))
    return sorted(minority + majority)


@dataclass(frozen=True)
class LabelledPage:
    """One page's lines (as ``html_to_lines`` gives them), the teacher's labels and main text."""

    url: str
    lines: list[str]
    labels: list[bool]
    teacher_text: str
    lang: str | None = None
    html_main: list[bool] | None = None  # the HTML feature per line (model.html_main_flags)
    disputed: list[bool] | None = None  # committee labels: lines the committee split 2-2 (not trained on)
    page_type: str | None = None  # page_types.page_type: article, forum, product, listing, other

    def to_json(self) -> dict:
        row = {"url": self.url, "lang": self.lang, "lines": self.lines,
               "labels": [int(x) for x in self.labels], "teacher_text": self.teacher_text}
        if self.html_main is not None:
            row["html_main"] = [int(x) for x in self.html_main]
        if self.disputed is not None:
            row["disputed"] = [int(x) for x in self.disputed]
        if self.page_type is not None:
            row["page_type"] = self.page_type
        return row

    @classmethod
    def from_json(cls, row: dict) -> "LabelledPage":
        html_main, disputed = row.get("html_main"), row.get("disputed")
        return cls(url=row["url"], lines=list(row["lines"]), labels=[bool(x) for x in row["labels"]],
                   teacher_text=row.get("teacher_text") or "", lang=row.get("lang"),
                   html_main=None if html_main is None else [bool(x) for x in html_main],
                   disputed=None if disputed is None else [bool(x) for x in disputed],
                   page_type=row.get("page_type"))


def label_page(url: str, html: str, config: TeacherConfig = TeacherConfig(), scheme: str = "committee") -> LabelledPage:
    """Lines of an HTML page with their labels (``scheme``: "committee" or "teacher", module
    docstring) and the HTML feature (language: filled in by the caller). ``teacher_text`` is
    trafilatura's text with ``config`` in both schemes."""
    from pipelines.main_content.model import html_main_flags
    from pipelines.main_content.page_types import page_type
    from pipelines.text.html import html_to_lines

    if scheme not in LABEL_SCHEMES:
        raise ValueError(f"unknown label scheme {scheme!r}: expected one of {LABEL_SCHEMES}")
    lines = html_to_lines(html)
    if not lines:
        return LabelledPage(url=url, lines=[], labels=[], teacher_text="", html_main=[])
    teacher_text = teacher_extract(html, config)
    html_main = html_main_flags(lines, html)
    kind = page_type(url, html)
    if scheme == "teacher":
        return LabelledPage(url=url, lines=lines, labels=label_lines(lines, teacher_text),
                            teacher_text=teacher_text or "", html_main=html_main, page_type=kind)
    votes = committee_votes(lines, html, html_main, config,
                            precise_text=teacher_text if config.favor_precision and not config.favor_recall else None)
    return LabelledPage(url=url, lines=lines, labels=[vote >= COMMITTEE_MAJORITY for vote in votes],
                        teacher_text=teacher_text or "", html_main=html_main,
                        disputed=[vote * 2 == len(COMMITTEE) for vote in votes], page_type=kind)
