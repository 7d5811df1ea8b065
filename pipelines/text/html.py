"""HTML to visible text, one block per line (contract 2).

Resiliparse's C-backed `extract_plain_text` keeps block structure (paragraphs, headings, list items,
table cells, `<br>`) as line breaks; we only collapse whitespace inside a line and drop empty lines.
"""
from __future__ import annotations

from resiliparse.extract.html2text import extract_plain_text
from resiliparse.parse.html import HTMLTree


def html_to_lines(html: str) -> list[str]:
    """Visible text of `html`, one block per line, whitespace-normalised, empty lines removed.

    List bullets and alt texts are left out: they are navigation decoration, not sentences.
    Never raises on odd markup (resiliparse is a tolerant HTML5 parser); an empty or
    unparseable page gives `[]`.
    """
    if not html:
        return []
    return tree_to_lines(parse_html(html))


def parse_html(html: str) -> HTMLTree:
    """The page's DOM, parsed once: `tree_to_lines` and the main-content model's HTML feature
    (`pipelines.main_content.model.html_main_flags`, which accepts a tree) share it, because
    parsing costs as much as one extraction."""
    return HTMLTree.parse(html)


def tree_to_lines(tree: HTMLTree) -> list[str]:
    """`html_to_lines` for an already parsed page (extraction does not modify the tree)."""
    text = extract_plain_text(
        tree,
        preserve_formatting=True,
        main_content=False,
        list_bullets=False,
        alt_texts=False,
        links=False,
        form_fields=False,
        noscript=False,
    )
    return normalise_lines(text)


def normalise_lines(text: str) -> list[str]:
    """Non-empty lines of `text`, each with every whitespace run collapsed to one space.

    Equal to `" ".join(raw.split())` per line (which collapses every Unicode whitespace run in C),
    skipped for a stripped line that is printable and has no double space: its only whitespace is
    single spaces already (every other whitespace character is non-printable). Most lines are.
    """
    out = []
    for raw in text.split("\n"):
        line = raw.strip()
        if line:
            out.append(line if "  " not in line and line.isprintable() else " ".join(line.split()))
    return out
