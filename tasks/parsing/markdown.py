"""Markdown read directly with markdown-it-py (CommonMark, GFM tables and strikethrough): the text is already
there, so the blocks come from the token stream, ~30x faster on small files than `unstructured`, which renders
Markdown to HTML and partitions that (bench/markdown_parse.py). The blocks are those the unstructured path
yields, so chunking stays the same: headings are titles with their level, each paragraph a text block, the
first paragraph of each list item a list block (nested items flattened in order), code and quotes text, tables
Markdown (rows_to_markdown; HTML tables through html_table_to_markdown). Inline markup gives its text (links
their text, images their alt text); front matter is metadata, only its title is kept (as the first heading).
CORPUSYNC_MARKDOWN_PARSER=unstructured keeps the old path."""

from __future__ import annotations

import bisect
import re
from functools import cache
from html.parser import HTMLParser
from typing import TYPE_CHECKING

from corpusync.core.unicode_text import CJK
from schemas.records import Block, ParsedDocument, ParseOptions, SourceFile
from tasks.parsing.common import _version, clean_text, rows_to_markdown
from tasks.parsing.limits import too_long
from tasks.parsing.markup import _DATA_URI, _MD_DELIMITER, _parse_markup, html_table_to_markdown
from tasks.parsing.text import decode_text

if TYPE_CHECKING:
    from markdown_it import MarkdownIt
    from markdown_it.token import Token

# markdown-it stops reading containers nested deeper than this (their content would be lost): a document
# that reaches it is read as plain paragraphs instead. Recursion stays well inside Python's limit.
MAX_NESTING = 64


@cache
def _markdown_it() -> MarkdownIt:
    from markdown_it import MarkdownIt

    return MarkdownIt("gfm-like", {"linkify": False, "maxNesting": MAX_NESTING})  # linkify needs linkify-it-py


def parse_markdown(src: SourceFile, data: bytes, options: ParseOptions) -> ParsedDocument:
    """The Markdown parser the settings choose (CORPUSYNC_MARKDOWN_PARSER)."""
    if options.markdown_parser == "unstructured":
        return _parse_markup(src, data, "md")
    return parse_markdown_direct(src, data, options.max_chars)


def parse_markdown_direct(src: SourceFile, data: bytes, max_chars: int) -> ParsedDocument:
    text = _DATA_URI.sub("", decode_text(data, src.path)).replace("\r\n", "\n").replace("\r", "\n")
    if len(text) > max_chars:
        raise too_long(src.path, len(text), max_chars)
    title, body = split_front_matter(text)
    tokens = _markdown_it().parse(_code_pipes_escaped(body))
    if any(t.level >= MAX_NESTING - 1 for t in tokens):
        blocks = [Block("text", t) for para in re.split(r"\n\s*\n", body) if (t := clean_text(para))]
    else:
        blocks = blocks_from_tokens(tokens)
    if title and not (blocks and blocks[0].kind == "title" and blocks[0].text == title):
        blocks.insert(0, Block("title", title, level=1))
    return ParsedDocument(src, blocks, parser="markdown-it", parser_version=_version("markdown-it-py"),
                          media_type="text/markdown")


# YAML (---) or TOML (+++) front matter: the first line, up to the closing line, keys first
_FRONT_MATTER = re.compile(r"\A(?:(---)|(\+\+\+))[ \t]*\n(?=[ \t]*(?:#|[\w.-]+[ \t]*[:=]))(.*?)\n"
                           r"(?(1)(?:---|\.\.\.)|\+\+\+)[ \t]*(?:\n|\Z)", re.S)
_FM_TITLE = re.compile(r"^title[ \t]*[:=][ \t]*(.+?)[ \t]*$", re.M)


def split_front_matter(text: str) -> tuple[str, str]:
    """(its title or "", the document without it). Front matter is metadata (layout, tags, dates) that
    Markdown would read as a rule and a heading; its title names the document, so it is kept."""
    m = _FRONT_MATTER.match(text[:65536])
    if m is None:
        return "", text
    t = _FM_TITLE.search(m.group(3))
    title = t.group(1) if t else ""
    if len(title) > 1 and title[0] == title[-1] and title[0] in "\"'":
        title = title[1:-1]
    return clean_text(title), text[m.end():]


_TICKS = re.compile(r"`+")


def _code_pipes_escaped(text: str) -> str:
    """Pipes inside code spans of table rows escaped: GFM splits cells there (a `a|b` command would lose
    the cells after it), Python-Markdown, the unstructured path, does not. Fenced code is left alone."""
    if "`" not in text or "|" not in text:
        return text
    lines = text.split("\n")
    fenced = in_table = False
    for k, line in enumerate(lines):
        if line.lstrip().startswith(("```", "~~~")):
            fenced, in_table = not fenced, False
        elif fenced or not line.strip():
            in_table = False
        elif not in_table and "|" in line and _MD_DELIMITER.match(line) and k and "|" in lines[k - 1]:
            in_table = True
            lines[k - 1] = _escape_code_pipes(lines[k - 1])
        elif in_table:
            lines[k] = _escape_code_pipes(line)
    return "\n".join(lines)


def _escape_code_pipes(line: str) -> str:
    """A code span runs from a backtick string to the next one of the same length (found by bisection: a
    line of backticks stays linear); an escaped one opens none."""
    if "`" not in line:
        return line
    runs = [(m.start(), m.end()) for m in _TICKS.finditer(line)]
    same: dict[int, list[int]] = {}
    for k, (a, b) in enumerate(runs):
        same.setdefault(b - a, []).append(k)
    out: list[str] = []
    pos = k = 0
    while k < len(runs):
        a, b = runs[k]
        later = same[b - a]
        nxt = bisect.bisect_right(later, k)
        if (a and line[a - 1] == "\\") or nxt == len(later):
            k += 1
            continue
        c = runs[later[nxt]][0]
        out += [line[pos:b], re.sub(r"(?<!\\)\|", r"\\|", line[b:c])]
        pos, k = c, later[nxt] + 1
    return "".join(out) + line[pos:]


def blocks_from_tokens(tokens: list[Token]) -> list[Block]:
    """markdown-it's block tokens as Blocks (the token stream is flat: open/close pairs around inlines)."""
    blocks: list[Block] = []
    items: list[int] = []  # paragraphs seen so far in each open list item, innermost last
    rows: list[list[str]] | None = None
    heading = 0
    for t in tokens:
        kind = t.type
        if kind == "list_item_open":
            items.append(0)
        elif kind == "list_item_close":
            items.pop()
        elif kind == "heading_open":
            heading = int(t.tag[1:])
        elif kind == "heading_close":
            heading = 0
        elif kind == "table_open":
            rows = []
        elif kind == "tr_open" and rows is not None:
            rows.append([])
        elif kind == "table_close" and rows is not None:
            if table := rows_to_markdown(rows):
                blocks.append(Block("table", table))
            rows = None
        elif kind == "inline":
            if rows is not None:
                rows[-1].append(inline_text(t.children or []))
            elif (text := clean_text(inline_text(t.children or []))) and any(ch.isalnum() for ch in text):
                if heading:  # (a paragraph of punctuation only, a figure's stray ".", is no text)
                    blocks.append(Block("title", text, level=heading))
                else:
                    blocks.append(Block("list" if items and items[-1] == 0 else "text", text))
                if items:
                    items[-1] += 1
        elif kind in ("fence", "code_block"):
            if text := clean_text(t.content):
                blocks.append(Block("text", text))
        elif kind == "html_block":
            blocks += html_blocks(t.content)
    return blocks


_CJK_CHAR = re.compile(f"[{CJK}\u3000-\u303f\uff00-\uffef]")


def inline_text(children: list[Token]) -> str:
    """An inline's text: markup dropped, link text and image alt text kept, a soft line break a space; one
    before a Chinese line stays a line break, which clean_text joins to a Chinese line before it unless
    the line opens a legal unit (第X条), so the chunker still sees the article start."""
    parts: list[str] = []
    soft: list[int] = []  # where the soft breaks are in the text (a space for now)
    size = 0
    for c in children:
        if c.type in ("text", "code_inline"):
            part = c.content
        elif c.type == "image":
            part = inline_text(c.children or [])
        elif c.type == "softbreak":
            soft.append(size)
            part = " "
        elif c.type == "hardbreak" or (c.type == "html_inline" and re.match(r"(?i)<br\b", c.content)):
            part = "\n"
        else:
            continue
        parts.append(part)
        size += len(part)
    text = "".join(parts)
    cuts = [i for i in soft if _CJK_CHAR.match(text[i + 1:i + 2])]
    if not cuts:
        return text
    return "\n".join(text[a + 1:b] for a, b in zip([-1, *cuts], [*cuts, len(text)], strict=True))


_HTML_TABLE = re.compile(r"(?is)<table\b.*?</table\s*>")


def html_blocks(html: str) -> list[Block]:
    """Raw HTML in Markdown: its tables as Markdown tables, the rest as text (comments, scripts, styles out)."""
    blocks: list[Block] = []
    pos = 0
    for m in [*_HTML_TABLE.finditer(html), None]:
        if text := clean_text(_html_text(html[pos:m.start() if m else len(html)])):
            blocks.append(Block("text", text))
        if m is not None:
            if table := html_table_to_markdown(m.group()):
                blocks.append(Block("table", table))
            pos = m.end()
    return blocks


def _html_text(html: str) -> str:
    parts: list[str] = []
    skip = [0]

    class _Text(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list) -> None:
            if tag in ("script", "style"):
                skip[0] += 1
            elif tag in ("br", "p", "div", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6"):
                parts.append("\n")

        def handle_endtag(self, tag: str) -> None:
            if tag in ("script", "style"):
                skip[0] = max(skip[0] - 1, 0)

        def handle_data(self, data: str) -> None:
            if not skip[0]:
                parts.append(data)

    parser = _Text()
    parser.feed(html)
    parser.close()
    return "".join(parts)
