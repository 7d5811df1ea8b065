"""The page: escaped HTML from small blocks, one inline stylesheet, no script, nothing fetched."""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0 auto; padding: 16px 24px; max-width: 1180px;
       color: #222; box-sizing: border-box; }
h1 { font-size: 22px; } h2 { font-size: 18px; border-bottom: 1px solid #ccc; padding-bottom: 4px; margin-top: 32px; }
h3 { font-size: 15px; margin-bottom: 4px; }
table { border-collapse: collapse; margin: 6px 0 12px; }
td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: right; vertical-align: top; }
td:first-child, th:first-child { text-align: left; }
.scroll { max-width: 100%; overflow-x: auto; }
.wrap { overflow-wrap: anywhere; word-break: break-word; }
img { max-width: 100%; height: auto; display: block; margin: 6px 0; }
table.overview td, table.overview th { text-align: left; } .nowrap { white-space: nowrap; }
.flag { background: #fdecea; border-left: 4px solid #c44e52; padding: 6px 10px; margin: 6px 0; }
.ok { color: #2e7d32; } .bad { color: #c44e52; font-weight: 600; }
details { margin: 6px 0; } pre { white-space: pre-wrap; overflow-wrap: anywhere; background: #f6f6f6; padding: 6px; }
"""


def escape(value: Any) -> str:
    return html.escape(str(value), quote=True)


def number(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return escape(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e6 else f"{value:,.0f}"
    return escape(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td class=\"wrap\">{number(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def image(data_uri: str, alt: str) -> str:
    return f'<img src="{data_uri}" alt="{escape(alt)}">'


def paragraph(text: str) -> str:
    return f"<p class=\"wrap\">{escape(text)}</p>"


def heading(text: str) -> str:
    return f"<h3>{escape(text)}</h3>"


def details(summary: str, inner: str) -> str:
    return f"<details><summary>{escape(summary)}</summary>{inner}</details>"


def preformatted(text: str) -> str:
    return f"<pre>{escape(text)}</pre>"


@dataclass
class Section:
    """One output of the run on the page: what it is, where, whether its books balance, its blocks."""

    title: str
    path: str
    flags: list[str] = field(default_factory=list)  # problems a curator must see first
    blocks: list[str] = field(default_factory=list)  # HTML made by the helpers above
    completed_at: str | None = None
    summary: str = ""  # one line for the overview table, e.g. "37,904 of 95,130 sentences"

    @property
    def anchor(self) -> str:
        return "s-" + "".join(ch if ch.isalnum() else "-" for ch in f"{self.title}-{self.path}").strip("-").lower()


def relative(root: str, path: str) -> str:
    root = root.rstrip("/")
    return path[len(root) + 1:] if path.startswith(root + "/") else path


def overview_table(root: str, sections: Sequence[Section]) -> str:
    """Every output on one line: where it is under the root, whether it is flagged, what it kept."""
    rows = "".join(
        f'<tr><td><a href="#{s.anchor}">{escape(s.title)}</a></td><td class="wrap">{escape(relative(root, s.path))}</td>'
        f'<td class="{"bad" if s.flags else "ok"}">{"flagged" if s.flags else "ok"}</td>'
        f'<td class="text wrap">{escape(s.summary or "—")}</td>'
        f'<td class="nowrap">{escape((s.completed_at or "—").replace("T", " ")[:16])}</td></tr>'
        for s in sections)
    return ('<div class="scroll"><table class="overview"><thead><tr><th>output</th><th>where</th><th>status</th>'
            f'<th>what it kept</th><th>completed (UTC)</th></tr></thead><tbody>{rows}</tbody></table></div>')


def render(title: str, root: str, generated_at: str, sections: Sequence[Section]) -> str:
    """The whole page: flags of every section first, then a contents line, then each section."""
    flagged = [(section, flag) for section in sections for flag in section.flags]
    top = "".join(f'<div class="flag"><a href="#{section.anchor}">{escape(section.title)}</a>: {escape(flag)}</div>'
                  for section, flag in flagged)
    if not sections:
        top += '<div class="flag">no stage output found under this root</div>'
    elif not flagged:
        top += '<p class="ok">Every stage found has balanced books (read = kept + dropped + errored).</p>'
    overview = overview_table(root, sections) if sections else ""
    body = "".join(
        f'<section id="{s.anchor}"><h2>{escape(s.title)}</h2>'
        f'<p class="wrap">{escape(s.path)}' + (f" · completed {escape(s.completed_at)}" if s.completed_at else "") + "</p>"
        + "".join(f'<div class="flag">{escape(flag)}</div>' for flag in s.flags)
        + "".join(s.blocks) + "</section>"
        for s in sections)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>"
        f"<h1>{escape(title)}</h1><p class=\"wrap\">{escape(root)} · report written {escape(generated_at)}</p>"
        f"{top}{overview}{body}</body></html>\n"
    )
