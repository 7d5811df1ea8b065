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
    tree = HTMLTree.parse(html)
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
    # " ".join(str.split()) collapses every Unicode whitespace run, in C (4x faster than re.sub).
    return [line for line in (" ".join(raw.split()) for raw in text.split("\n")) if line]
