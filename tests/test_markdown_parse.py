"""Markdown read directly with markdown-it-py (issue 13): headings and levels, lists, tables, code, front
matter, inline markup, Chinese, CRLF, empty files, the data: URI guard, deep nesting, the setting that keeps
the unstructured path, and the same chunk breadcrumbs as that path on the sample corpus."""

from __future__ import annotations

import base64
import hashlib
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from corpusync.adapters.embedding import Tokenizer
from corpusync.core.errors import ParseError
from schemas.records import Block, ParsedDocument, SourceFile
from tasks.chunk import ChunkConfig, chunk_document
from tasks.parse import ParseOptions, html_table_to_markdown, parse_document, parser_fingerprint, rows_to_markdown

SAMPLE = Path(__file__).resolve().parent.parent / "examples/sample-corpus"
UNSTRUCTURED = ParseOptions(markdown_parser="unstructured")


def parse(tmp_path: Path, text: str | bytes, name: str = "doc.md", options: ParseOptions | None = None
          ) -> ParsedDocument:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    data = path.read_bytes()
    src = SourceFile(name, path, len(data), datetime.now(UTC), hashlib.sha256(data).hexdigest())
    return parse_document(src, options or ParseOptions())


def shape(doc: ParsedDocument) -> list[tuple[str, int, str]]:
    return [(b.kind, b.level, b.text) for b in doc.blocks]


def test_headings_keep_their_levels(tmp_path: Path) -> None:
    doc = parse(tmp_path, "# One\n\ntext\n\n## Two *em* [link](http://x.org)\n\n###### Six\n\nSetext\n===\n\n"
                          "Under\n---\n\n#not a heading\n")
    assert doc.parser == "markdown-it" and doc.media_type == "text/markdown"
    assert [(b.level, b.text) for b in doc.blocks if b.kind == "title"] == [
        (1, "One"), (2, "Two em link"), (6, "Six"), (1, "Setext"), (2, "Under")]
    assert doc.blocks[-1] == Block("text", "#not a heading")


def test_nested_lists_one_block_per_item_in_order(tmp_path: Path) -> None:
    doc = parse(tmp_path, "- one\n- two\n  - two a\n    1. deep\n  - two b\n- three\n\n"
                          "1. first\n\n   more about first\n2. second\n")
    assert shape(doc) == [("list", 0, t) for t in ("one", "two", "two a", "deep", "two b", "three", "first")] + [
        ("text", 0, "more about first"), ("list", 0, "second")]  # a later paragraph of an item is text


def test_tables_as_the_existing_markdown_tables(tmp_path: Path) -> None:
    doc = parse(tmp_path, "Intro line:\n| Name | Cmd | Note |\n|:--|--:|---|\n| grep | `a|b` | x \\| y |\n"
                          "| **b** | [c](http://c) | |\n\n<table><tr><th colspan=\"2\">H</th></tr>"
                          "<tr><td>1</td><td>2</td></tr></table>\n")
    tables = [b.text for b in doc.blocks if b.kind == "table"]
    assert doc.blocks[0] == Block("text", "Intro line:")  # a table right after a paragraph line is a table
    # the code span's pipe stays inside its cell (GFM alone would split the cell there and drop the last one)
    assert tables[0] == rows_to_markdown([["Name", "Cmd", "Note"], ["grep", "a|b", "x | y"], ["b", "c", ""]])
    assert tables[1] == html_table_to_markdown('<table><tr><th colspan="2">H</th></tr><tr><td>1</td><td>2</td>'
                                               "</tr></table>") == "| H | H |\n|---|---|\n| 1 | 2 |"


def test_code_fences_are_text_not_markup(tmp_path: Path) -> None:
    doc = parse(tmp_path, "Before.\n\n```python\n# not a heading\nx = a | b\n```\n\n~~~\n- not a list\n~~~\n\n"
                          "    indented code\n")
    assert shape(doc) == [("text", 0, "Before."), ("text", 0, "# not a heading\nx = a | b"),
                          ("text", 0, "- not a list"), ("text", 0, "indented code")]


def test_front_matter_is_metadata_its_title_kept(tmp_path: Path) -> None:
    yaml = parse(tmp_path, '---\ntitle: "Release notes"\ntags: [a, b]\nlayout: post\n---\n\n## Fixes\n\nText.\n')
    assert shape(yaml) == [("title", 1, "Release notes"), ("title", 2, "Fixes"), ("text", 0, "Text.")]
    toml = parse(tmp_path, "+++\ntitle = 'Notes'\ndate = 2024-01-01\n+++\nBody.\n", "toml.md")
    assert shape(toml) == [("title", 1, "Notes"), ("text", 0, "Body.")]
    same = parse(tmp_path, "---\ntitle: Guide\n---\n# Guide\n\nBody.\n", "same.md")
    assert shape(same) == [("title", 1, "Guide"), ("text", 0, "Body.")]  # not twice
    # a rule then prose is not front matter: nothing is dropped
    rule = parse(tmp_path, "---\nJust a paragraph, then a rule.\n\n---\n\nEnd.\n", "rule.md")
    assert [b.text for b in rule.blocks] == ["Just a paragraph, then a rule.", "End."]


def test_inline_markup_reduced_to_its_text(tmp_path: Path) -> None:
    blob = base64.b64encode(os.urandom(30_000)).decode()
    doc = parse(tmp_path, f"See [the guide](http://example.com/g) and ![a chart](data:image/png;base64,{blob}) "
                          "or ![logo](logo.png), <http://example.org>, **bold**, ~~old~~, `code`, &amp; &copy;, "
                          "<span>inline html</span>.\nNext line.  \nHard break.\n\n<!-- a comment -->\n")
    (block,) = doc.blocks
    assert block.text == ("See the guide and a chart or logo, http://example.org, bold, old, code, & ©, inline html. "
                          "Next line.\nHard break.")
    assert "base64" not in block.text and "example.com" not in block.text


ARTICLE_3 = "第三条 付款方式见附件。买方应在收到合格发票后三十日内以银行转账方式支付合同价款的百分之九十。"


def test_chinese_document(embedder: Tokenizer, tmp_path: Path) -> None:
    text = ("# 采购合同\n\n## 第一章 总则\n\n本合同由甲方与乙方\n签订，自签订之日起生效。\n"
            "第一条 为明确双方的权利和义务，订立本合同。\n第二条 本合同所称货物，是指乙方交付的设备，型号 X-100\n"
            f"{ARTICLE_3}\n\n| 项目 | 金额 |\n|---|---|\n| 设备 | 100 万元 |\n\n中文 and\nEnglish 混排\n")
    doc = parse(tmp_path, text)
    assert shape(doc) == [
        ("title", 1, "采购合同"), ("title", 2, "第一章 总则"),
        # a wrapped Chinese line joins without a space; a line that opens an article stays a line
        ("text", 0, "本合同由甲方与乙方签订，自签订之日起生效。\n第一条 为明确双方的权利和义务，订立本合同。\n"
                    f"第二条 本合同所称货物，是指乙方交付的设备，型号 X-100\n{ARTICLE_3}"),
        ("table", 0, "| 项目 | 金额 |\n|---|---|\n| 设备 | 100 万元 |"),
        ("text", 0, "中文 and English 混排")]  # a space before a Latin line, as unstructured gave
    assert doc.metadata["lang"] == "zh"
    chunks = chunk_document(doc, embedder, ChunkConfig(max_tokens=64, overlap=0.0, min_tokens=0)).chunks
    third = next(c for c in chunks if "第三条" in c.text)  # the article after a Latin line is still an article
    assert third.section_path == ("采购合同", "第一章 总则", "第三条") and third.text == ARTICLE_3


def test_crlf_and_lf_read_the_same(tmp_path: Path) -> None:
    text = "---\ntitle: T\n---\n# H\n\nline one\nline two\n\n- a\n- b\n\n| x | y |\n|---|---|\n| 1 | 2 |\n"
    lf = parse(tmp_path, text, "lf.md")
    assert shape(parse(tmp_path, text.replace("\n", "\r\n"), "crlf.md")) == shape(lf)
    assert shape(parse(tmp_path, text.replace("\n", "\r"), "cr.md")) == shape(lf)
    assert shape(lf)[2] == ("text", 0, "line one line two")


@pytest.mark.parametrize("content", [b"", b"  \n\n \t \r\n"])
def test_empty_markdown_has_the_same_reason_as_before(tmp_path: Path, content: bytes) -> None:
    for options in (ParseOptions(), UNSTRUCTURED):
        with pytest.raises(ParseError) as info:
            parse(tmp_path, content, options=options)
        assert info.value.reason == "empty"


@pytest.mark.parametrize("content", [b"<!-- only a comment -->\n", b"---\nlayout: x\n---\n"])
def test_markup_without_text_is_empty(tmp_path: Path, content: bytes) -> None:
    """(unstructured called the comment 'unparseable' and read the front matter as a title "layout: x")"""
    with pytest.raises(ParseError) as info:
        parse(tmp_path, content)
    assert info.value.reason == "empty"


def test_deep_nesting_loses_no_text(tmp_path: Path) -> None:
    """markdown-it drops what lies past its nesting limit; such a document is read as paragraphs."""
    doc = parse(tmp_path, "> " * 200 + "the deepest words\n\nafter\n")
    assert "the deepest words" in doc.blocks[0].text and doc.blocks[-1].text == "after"


def test_oversized_text_is_refused_before_parsing(tmp_path: Path) -> None:
    with pytest.raises(ParseError) as info:
        parse(tmp_path, "# T\n\n" + "word " * 1000, options=ParseOptions(max_chars=1000))
    assert info.value.reason == "oversized"


def test_the_setting_keeps_the_unstructured_path_and_reparses(tmp_path: Path) -> None:
    from schemas.settings import Settings

    options = Settings(home=tmp_path, markdown_parser="unstructured").parse_options()
    assert options.markdown_parser == "unstructured" and Settings(home=tmp_path).parse_options().markdown_parser == (
        "direct")
    assert parse(tmp_path, "# T\n\nText.\n", options=options).parser == "unstructured"
    assert parser_fingerprint(options) != parser_fingerprint(ParseOptions())  # switching re-parses


@pytest.mark.parametrize("path", sorted(SAMPLE.glob("*/*.md")), ids=lambda p: p.name)
def test_same_chunks_and_breadcrumbs_as_unstructured(embedder: Tokenizer, path: Path) -> None:
    """The sample corpus's Markdown (SQuAD articles, the bilingual contract) chunks exactly as before."""
    data = path.read_bytes()
    src = SourceFile(path.name, path, len(data), datetime.now(UTC), hashlib.sha256(data).hexdigest())
    config = ChunkConfig(max_tokens=128, overlap=0.12)
    direct, old = (chunk_document(parse_document(src, o), embedder, config) for o in (ParseOptions(), UNSTRUCTURED))
    assert direct.parsed.parser == "markdown-it" and old.parsed.parser == "unstructured"
    assert [c.section_path for c in direct.chunks] == [c.section_path for c in old.chunks]
    assert [c.context for c in direct.chunks] == [c.context for c in old.chunks]
    assert [c.text for c in direct.chunks] == [c.text for c in old.chunks]
