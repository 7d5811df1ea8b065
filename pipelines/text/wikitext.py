"""Wikitext to plain text: one paragraph (or heading, or list item) per line.

mwparserfromhell (C tokenizer) parses the page; the node tree is rendered keeping only readable
text: templates, tables, references, files and images, categories, interlanguage links, comments,
math and other non-prose tags are removed; link labels, bold/italic contents and section headings
are kept. Editors write one paragraph per source line, so source lines become output lines.
"""
from __future__ import annotations

import html
import re

import mwparserfromhell
from mwparserfromhell.nodes import (
    Argument,
    Comment,
    ExternalLink,
    Heading,
    HTMLEntity,
    Tag,
    Template,
    Text,
    Wikilink,
)

from pipelines.text.languages import is_interlanguage_prefix

# Canonical namespace names valid on every wiki; a dump's own localised names are added per call.
FILE_NAMESPACES = frozenset({"file", "image", "media"})
CATEGORY_NAMESPACES = frozenset({"category"})
# Other namespaces whose links are not part of the prose ([[Wikipedia:...]] in hatnotes, etc.).
OTHER_NAMESPACES = frozenset(
    {"wikipedia", "wp", "help", "template", "portal", "user", "talk", "special", "mediawiki", "module",
     "draft", "book", "wikt", "wiktionary", "commons", "meta", "s", "q", "n", "b", "v", "voy", "d", "m", "w"}
)
# Tags whose contents are not prose.
DROP_TAGS = frozenset(
    {"ref", "references", "table", "gallery", "math", "chem", "ce", "code", "pre", "syntaxhighlight",
     "source", "score", "timeline", "imagemap", "graph", "mapframe", "maplink", "templatedata",
     "noinclude", "includeonly", "onlyinclude", "nowiki", "hiero", "inputbox", "categorytree", "poem_ignored",
     "style", "script", "templatestyles", "section"}
)
# Section headings (English Wikipedia's conventional appendix sections) whose text is lists of
# citations and links rather than prose; they and their section bodies are dropped.
APPENDIX_SECTIONS = frozenset(
    {"references", "external links", "see also", "further reading", "notes", "bibliography",
     "sources", "citations", "footnotes", "notes and references", "references and notes", "works cited"}
)
# Templates whose last positional argument is running text ({{lang|fr|le mot}}, {{nowrap|...}}).
TEXT_TEMPLATES = frozenset({"lang", "nowrap", "nobr", "small", "big", "sic", "transl", "transliteration", "linktext", "nobold", "noitalic", "abbr", "em"})

_MAGIC_WORD = re.compile(r"__[A-Z]+__")
_LEFTOVER_QUOTES = re.compile(r"'{2,}")
_SPACES = re.compile(r"[ \t\u00a0\u2009\u200b]+")
# Every pattern over page text runs in linear time (issue 34 item 3): no two adjacent repeats that can
# share characters (`\s*/?\s*` splits a run of spaces n ways), a tag's body stops at the next "<"
# (else each unclosed "<a" rescans the rest of the line), and a repeat that may fail at its end is
# tried only from the start of its run (the look-behinds).
_MARKUP_LEFT = re.compile(r"\{\{|\}\}|\[\[|\]\]|\{\||\|\}|<ref|</ref|<\s*(?:/\s*)?[a-z]+[^<>]*>", re.I)
# Rows of tables the parser did not recognise, parameters of unpaired file links.
_TABLE_OR_FILE_LEFT = re.compile(r"\|\||\|\s*-|(^|\|)\s*(thumb|thumbnail|frame|frameless|left|right|center|upright|\d+px)\s*\|")
_EMPTY_BRACKETS = re.compile(r"\(\s*(?:[,;]\s*)?\)|\[\s*\]")
_BRACKET_OPEN_PUNCT = re.compile(r"\(\s*[;,]\s*")
_BRACKET_CLOSE_PUNCT = re.compile(r"(?<!\s)\s*[;,]\s*\)")
_SPACE_BEFORE_PUNCT = re.compile(r"(?<! ) +([,.;:!?)])")


def _namespace(title: str) -> str | None:
    title = title.strip().lstrip(":")
    if ":" not in title:
        return None
    return title.split(":", 1)[0].strip().lower()


class _Renderer:
    def __init__(self, file_namespaces: frozenset[str], category_namespaces: frozenset[str], other_namespaces: frozenset[str]):
        self.file_namespaces = FILE_NAMESPACES | file_namespaces
        self.category_namespaces = CATEGORY_NAMESPACES | category_namespaces
        self.other_namespaces = OTHER_NAMESPACES | other_namespaces

    def render(self, wikicode) -> str:
        out: list[str] = []
        for node in wikicode.nodes:
            self._node(node, out)
        return "".join(out)

    def _node(self, node, out: list[str]) -> None:
        if isinstance(node, Text):
            out.append(str(node.value))
        elif isinstance(node, HTMLEntity):
            out.append(html.unescape(str(node)))
        elif isinstance(node, Wikilink):
            self._wikilink(node, out)
        elif isinstance(node, ExternalLink):
            if node.title is not None:
                out.append(self.render(node.title))
        elif isinstance(node, Heading):
            out.append("\n" + self.render(node.title).strip() + "\n")
        elif isinstance(node, Tag):
            self._tag(node, out)
        elif isinstance(node, Template):
            self._template(node, out)
        elif isinstance(node, (Comment, Argument)):
            pass

    def _wikilink(self, node: Wikilink, out: list[str]) -> None:
        title = str(node.title).strip()
        namespace = _namespace(title)
        if namespace is not None:
            if title.startswith(":") and namespace not in self.file_namespaces:
                pass  # [[:Category:X]] is a visible link to a category page
            elif (
                namespace in self.file_namespaces
                or namespace in self.category_namespaces
                or namespace in self.other_namespaces
                or is_interlanguage_prefix(namespace)
            ):
                return
        if node.text is not None:
            out.append(self.render(node.text))
        else:
            out.append(title.lstrip(":").split("#", 1)[0] or title.split("#", 1)[-1])

    def _tag(self, node: Tag, out: list[str]) -> None:
        tag = str(node.tag).strip().lower()
        if tag in DROP_TAGS:
            return
        if tag == "br":
            out.append("\n")
            return
        if tag in ("li", "dt", "dd") and node.wiki_markup:
            out.append("\n")  # list items and definitions are lines of their own
            return
        if tag == "hr":
            out.append("\n")
            return
        if node.contents is not None:
            out.append(self.render(node.contents))

    def _template(self, node: Template, out: list[str]) -> None:
        name = str(node.name).strip().lower().replace("_", " ")
        if name in TEXT_TEMPLATES or name.startswith("lang-"):
            positional = [p for p in node.params if not p.showkey]
            if positional:
                out.append(self.render(positional[-1].value))


def _clean_line(line: str) -> str:
    if "&" in line:
        line = html.unescape(line)  # entities escaped twice in the source ("&amp;nbsp;")
    line = _MAGIC_WORD.sub("", line)
    line = _LEFTOVER_QUOTES.sub("", line)
    line = _SPACES.sub(" ", line)
    line = _EMPTY_BRACKETS.sub("", line)  # "(; )" left where a template or reference was
    line = _BRACKET_OPEN_PUNCT.sub("(", line)
    line = _BRACKET_CLOSE_PUNCT.sub(")", line)
    line = _SPACE_BEFORE_PUNCT.sub(r"\1", line)
    line = _SPACES.sub(" ", line).strip()
    return line


_REMOVED = "\x01"
_BRACES = re.compile(r"\{\{|\}\}")
_TABLE_EDGES = re.compile(r"^[ \t]*(\{\||\|\})", re.M)
_REF_OPEN = re.compile(r"<ref\b[^<>]*>", re.I)
_REF_CLOSE = re.compile(r"</ref\s*>", re.I)
_COMMENTS = re.compile(r"<!--.*?(-->|$)", re.S)


def _template_text(template: str) -> str:
    """The running text a top-level template stands for: only for TEXT_TEMPLATES, else nothing."""
    inner = template[2:-2]
    if "{{" in inner or "[[" in inner and "|" in inner.split("[[", 1)[1].split("]]", 1)[0]:
        parsed = mwparserfromhell.parse(template).filter_templates(recursive=False)
        if not parsed:
            return ""
        name = str(parsed[0].name).strip().lower().replace("_", " ")
        if name in TEXT_TEMPLATES or name.startswith("lang-"):
            return template  # leave it to the full parser
        return ""
    parts = inner.split("|")
    name = parts[0].strip().lower().replace("_", " ")
    if name in TEXT_TEMPLATES or name.startswith("lang-"):
        positional = [p for p in parts[1:] if "=" not in p]
        return positional[-1] if positional else ""
    return ""


def _strip_balanced(text: str, pattern: re.Pattern, opener: str, replace) -> str:
    """Replace each outermost balanced region (opened by `opener`) with replace(region).

    An opener that is never closed is left alone (the line is later dropped as leftover markup)
    rather than swallowing the rest of the page.
    """
    out = []
    depth = 0
    start = last = 0
    for match in pattern.finditer(text):
        if match.group(0).strip().startswith(opener):
            if depth == 0:
                start = match.start()
            depth += 1
        elif depth > 0:
            depth -= 1
            if depth == 0:
                out.append(text[last:start])
                out.append(replace(text[start:match.end()]))
                last = match.end()
    out.append(text[last:])
    return "".join(out)


def _strip_references(text: str) -> str:
    """Remove each reference: `<ref .../>`, or `<ref ...>` up to the first `</ref>` after it (as
    MediaWiki pairs them); an opening never closed stays. One scan: once no `</ref>` follows an
    opening, none follows a later one either, so it is not looked for again (a lazy `.*?</ref>`
    rescans the rest of the page from every unclosed opening)."""
    out, position, closable = [], 0, True
    while (opening := _REF_OPEN.search(text, position)) is not None:
        closing = None
        if not opening.group(0).endswith("/>") and closable:
            closing = _REF_CLOSE.search(text, opening.end())
            closable = closing is not None
        if opening.group(0).endswith("/>") or closing is not None:
            out.append(text[position:opening.start()])
        else:  # never closed: kept (the line is later dropped as leftover markup)
            out.append(text[position:opening.end()])
        position = opening.end() if closing is None else closing.end()
    out.append(text[position:])
    return "".join(out)


def _prestrip(wikitext: str) -> str:
    """Remove comments, references, templates and tables with linear scans before parsing.

    mwparserfromhell builds Python objects for every node; on large articles most nodes are inside
    templates, tables and references that are thrown away anyway, and skipping them makes the
    conversion several times faster.
    """
    text = _COMMENTS.sub("", wikitext)
    text = _strip_references(text)
    # Removed templates leave a marker so that a line starting with one is not mistaken below
    # for a preformatted line (a line starting with a space: code, ASCII art), which is dropped.
    text = _strip_balanced(text, _BRACES, "{{", lambda region: _template_text(region) or _REMOVED)
    text = _strip_balanced(text, _TABLE_EDGES, "{|", lambda region: "\n")
    lines = [line for line in text.split("\n") if not (line.startswith(" ") and line.strip())]
    return "\n".join(lines).replace(_REMOVED, "")


def _drop_appendix_sections(wikicode) -> None:
    for section in wikicode.get_sections(levels=[2]):
        headings = section.filter_headings(recursive=False)
        if headings and headings[0].title.strip_code().strip().lower() in APPENDIX_SECTIONS:
            try:
                wikicode.remove(section)
            except ValueError:
                pass


def wikitext_to_text(
    wikitext: str,
    *,
    file_namespaces: frozenset[str] = frozenset(),
    category_namespaces: frozenset[str] = frozenset(),
    other_namespaces: frozenset[str] = frozenset(),
) -> str:
    """Plain text of one page, one paragraph, heading or list item per line.

    `file_namespaces`/`category_namespaces`/`other_namespaces`: the dump's localised namespace
    names (lower case) in addition to the canonical English ones, e.g. Latgalian "fails",
    "kategoreja"; links into them are not prose and are removed.
    Lines that still contain wiki or HTML markup after rendering (broken markup the parser could
    not pair) are dropped rather than passed on.
    """
    wikicode = mwparserfromhell.parse(_prestrip(wikitext))
    _drop_appendix_sections(wikicode)
    rendered = _Renderer(
        frozenset(file_namespaces), frozenset(category_namespaces), frozenset(other_namespaces)
    ).render(wikicode)
    lines = []
    for raw_line in rendered.split("\n"):
        line = _clean_line(raw_line)
        if not line or _MARKUP_LEFT.search(line) or _TABLE_OR_FILE_LEFT.search(line):
            continue
        if line.startswith(("|", "!")) or line.endswith("|"):
            continue  # a table row whose table the parser did not recognise
        line = _SPACES.sub(" ", line.replace("|", " ")).strip()  # a stray pipe in the source text
        if not any(ch.isalnum() for ch in line):
            continue
        lines.append(line)
    return "\n".join(lines)
