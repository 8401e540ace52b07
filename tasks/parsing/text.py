"""Plain text and CSV/TSV: charset detection, paragraphs, a delimited file as one Markdown table."""

from __future__ import annotations

import re
from typing import Any

from corpusync.core.errors import ParseError
from schemas.records import Block, ParsedDocument, SourceFile
from tasks.parsing.common import PARSE_LOGIC_VERSION, clean_text, rows_to_markdown
from tasks.parsing.limits import too_long


def decode_text(data: bytes, path: str) -> str:
    """Decode bytes of a text file: BOM / UTF-8 first, then charset detection (GB18030, Big5, cp1252...)."""
    if b"\x00" in data[:8192] and not data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ParseError(path, "binary", "the file contains NUL bytes: not a text file")
    for bom, enc in ((b"\xef\xbb\xbf", "utf-8-sig"), (b"\xff\xfe", "utf-16"), (b"\xfe\xff", "utf-16")):
        if data.startswith(bom):
            return data.decode(enc)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    # UTF-8 with a few damaged sequences (a bad copy, a truncated write): keep the text, mark the damage with
    # U+FFFD, rather than guess another charset for the whole file or lose it
    text = data.decode("utf-8", errors="replace")
    if text.count("\ufffd") * 200 <= len(text):  # at most 0.5% damaged: another charset would read it all
        return text
    from charset_normalizer import from_bytes

    best = from_bytes(data).best()
    if best is None:
        raise ParseError(path, "undecodable", "no text encoding fits the bytes")
    return str(best)


def _parse_text(src: SourceFile, data: bytes, max_chars: int) -> ParsedDocument:
    text = decode_text(data, src.path)
    if len(text) > max_chars:
        raise too_long(src.path, len(text), max_chars)
    blocks = [Block("text", t) for para in re.split(r"\n\s*\n", text) if (t := clean_text(para))]
    return ParsedDocument(src, blocks, parser="text", parser_version=PARSE_LOGIC_VERSION, media_type="text/plain")


def _parse_csv(src: SourceFile, data: bytes, max_chars: int) -> ParsedDocument:
    import csv

    text = decode_text(data, src.path)
    if len(text) > max_chars:
        raise too_long(src.path, len(text), max_chars)
    try:
        dialect: Any = csv.Sniffer().sniff(text[:8192], delimiters=",;\t|")
    except csv.Error:
        dialect = csv.excel
    table = rows_to_markdown(list(csv.reader(text.splitlines(), dialect)))
    return ParsedDocument(src, [Block("table", table)] if table else [], parser="csv",
                          parser_version=PARSE_LOGIC_VERSION, media_type="text/csv")
