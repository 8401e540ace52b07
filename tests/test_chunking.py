"""Structure-aware chunking: property tests (hypothesis) on random structured Chinese/English documents
with the real MiniLM tokenizer (budgets, exact spans, breadcrumbs, no fragments), hostile inputs (a 5 MB
line, base64 blobs, huge table rows), golden tests on legal structure and tables, citations in the
document's own characters, and the great-expectations gate quarantining a bad document while the others
load."""

from __future__ import annotations

import base64
import hashlib
import os
import unicodedata
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.records import Block, ParsedDocument, SourceFile
from tasks.chunk import ChunkConfig, chunk_document, classify_line
from tasks.parse import ParseOptions, clean_text, parse_document

BUDGET = 64
MIN = 16

ZH = ["买方应在收到发票后三十日内付款。", "卖方应按约定交付货物！", "本合同自签订之日起生效；", "双方另有约定的除外？",
      "违约方应承担相应责任。", "争议应提交仲裁委员会解决。"]
EN = ["The buyer shall pay within thirty days.", "Dr. Smith approved v2.5 of the spec on Jan. 3.",
      "See https://example.com/a.b for details.", "Payment of $1,234.56 is due!", "Is this clause void?",
      "The term is 12.5 months, e.g. until 2025."]
TITLES = ["第一章 总则", "Scope", "8.3 Payment terms", "中华人民共和国民法典"]
HEADINGS = ["第五章 收养", "第二节 一般规定", "8.4 Delivery", "一、总则"]


def _doc(blocks: list[Block], name: str = "doc.md") -> ParsedDocument:
    raw = "".join(b.text for b in blocks).encode()
    src = SourceFile(name, Path(name), len(raw), datetime.now(UTC), hashlib.sha256(raw).hexdigest())
    return ParsedDocument(src, blocks, parser="test", parser_version="1", media_type="text/markdown")


@st.composite
def structured_docs(draw: Any, hostile: bool = False) -> ParsedDocument:
    blocks: list[Block] = []
    kinds = ["title", "heading", "text", "article", "decimal", "table", "long"]
    for i in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(kinds + (["row", "blob", "unbroken"] if hostile else [])))
        lang = draw(st.sampled_from([ZH, EN]))
        if kind == "title":
            blocks.append(Block("title", draw(st.sampled_from(TITLES)), level=draw(st.integers(1, 3))))
        elif kind == "heading":
            blocks.append(Block("text", draw(st.sampled_from(HEADINGS))))
        elif kind == "article":
            body = "".join(draw(st.lists(st.sampled_from(ZH), min_size=1, max_size=8)))
            blocks.append(Block("text", f"第{i + 1}条 {body}"))
        elif kind == "decimal":
            body = " ".join(draw(st.lists(st.sampled_from(EN), min_size=1, max_size=6)))
            blocks.append(Block("text", f"8.{i}.1 {body}"))
        elif kind == "table":
            rows = draw(st.integers(1, 40))
            lines = ["| 编号 | Item | Amount |", "|---|---|---|"]
            items = ["bolt", "螺栓", "`a|b`", "x \\| y"]
            lines += [f"| {r} | {draw(st.sampled_from(items))} | {r * 3}.5 |" for r in range(rows)]
            blocks.append(Block("table", "\n".join(lines)))
        elif kind == "long":
            blocks.append(Block("text", "字" * draw(st.integers(100, 400))))  # one sentence over the budget
        elif kind == "row":  # one table row far over the budget
            cell = ("螺栓 bolt M8，镀锌；" * 200)[: draw(st.integers(300, 3000))]
            blocks.append(Block("table", f"| 编号 | 说明 |\n|---|---|\n| 1 | {cell} |\n| 2 | short |"))
        elif kind == "blob":  # token-dense: almost a token per character
            blocks.append(Block("text", base64.b64encode(draw(st.binary(min_size=100, max_size=1500))).decode()))
        elif kind == "unbroken":  # one [UNK] token for thousands of characters
            blocks.append(Block("text", draw(st.sampled_from(["x", "ab", "字z"])) * draw(st.integers(600, 20000))))
        else:
            sep = "" if lang is ZH else " "
            blocks.append(Block("text", sep.join(draw(st.lists(st.sampled_from(lang), min_size=1, max_size=15)))))
    return _doc(blocks)


def _heading_line(line: str) -> bool:
    kind = classify_line(line)
    return line in TITLES or (kind is not None and kind[0] == "heading")


def _only_headings(text: str) -> bool:
    return all(_heading_line(t) for line in text.split("\n") if (t := line.strip()))


def _longest_heading_run(embedder: Any, doc: ParsedDocument) -> int:
    """Tokens of the longest run of consecutive heading blocks."""
    runs, run = [0], ""
    for b in doc.blocks:
        run = (run + "\n\n" + b.text) if b.kind == "title" or _heading_line(b.text) else ""
        runs.append(embedder.count_tokens([run])[0] - 2 if run else 0)
    return max(runs)


def _fits_merged(embedder: Any, text: str, a: Any, b: Any, config: ChunkConfig) -> bool:
    """Whether chunks a and b (in this order) would fit the budget as one, breadcrumb reserve included
    (2 tokens of slack: the chunker plans merges with per-piece counts)."""
    body = a.prefix + text[a.char_start:max(a.char_end, b.char_end)]
    crumb = " > ".join(a.section_path)
    reserve = min(embedder.count_tokens([crumb])[0] - 1, config.max_tokens // 4) if crumb else 0
    return embedder.count_tokens([body])[0] + reserve + 2 <= config.max_tokens and (
        len(body) + len(crumb) + 1 <= config.max_chars)


def _check_chunks(embedder: Any, doc: ParsedDocument, config: ChunkConfig) -> Any:
    """Invariants of every chunking: exact spans, full coverage, model text within both budgets, hash and
    count of the model text, deterministic unique keys."""
    text, _ = doc.layout()
    out = chunk_document(doc, embedder, config)
    assert out.chunks, "no chunk"
    covered = bytearray(len(text))
    models = [c.model_text for c in out.chunks]
    counts = embedder.count_tokens(models)
    nfkc = embedder.count_tokens([unicodedata.normalize("NFKC", m) for m in models])
    for c, n, n2 in zip(out.chunks, counts, nfkc, strict=True):
        assert c.text.strip(), "empty chunk"
        assert c.text == c.prefix + text[c.char_start:c.char_end], "span does not map back to the chunk text"
        assert c.model_text == (f"{c.context}\n{c.text}" if c.context else c.text)
        assert c.text_sha256 == hashlib.sha256(c.model_text.encode()).hexdigest()
        assert c.token_count == n <= config.max_tokens and n2 <= config.max_tokens, (n, n2, c.model_text[:80])
        assert len(c.model_text) <= config.max_chars
        covered[c.char_start:c.char_end] = b"\x01" * (c.char_end - c.char_start)
    missing = [i for i, ch in enumerate(text) if not ch.isspace() and not covered[i]]
    assert not missing, f"uncovered characters: {text[missing[0]:missing[0] + 30]!r}"
    for a, b in zip(out.chunks, out.chunks[1:], strict=False):
        if b.char_start < a.char_end:  # overlap: free text only, within the overlap budget
            shared = text[b.char_start:a.char_end]
            budget = int(config.max_tokens * config.overlap) + 2
            assert "|" not in shared and embedder.count_tokens([shared])[0] - 2 <= budget
    again = chunk_document(doc, embedder, config)
    assert [(c.key, c.model_text) for c in again.chunks] == [(c.key, c.model_text) for c in out.chunks]
    assert len({c.key for c in out.chunks}) == len(out.chunks)
    return out


_SETTINGS = settings(max_examples=60, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@_SETTINGS
@given(doc=structured_docs(), overlap=st.sampled_from([0.0, 0.12]))
def test_chunk_properties(embedder, doc: ParsedDocument, overlap: float) -> None:  # type: ignore[no-untyped-def]
    config = ChunkConfig(max_tokens=BUDGET, overlap=overlap, min_tokens=MIN)
    out = _check_chunks(embedder, doc, config)
    text, _ = doc.layout()
    if embedder.count_tokens([text])[0] < MIN:  # a short document is one chunk
        assert len(out.chunks) == 1
    if _longest_heading_run(embedder, doc) > BUDGET // 2:
        return  # headings that alone fill half a chunk cannot all head their content in one chunk
    chunks = out.chunks
    for k, (c, n) in enumerate(zip(chunks, embedder.count_tokens([c.text for c in chunks]), strict=True)):
        if n < MIN:  # a small chunk: only where merging with either neighbour would not fit
            assert not any(_fits_merged(embedder, text, a, b, config) for a, b in zip(
                chunks[max(k - 1, 0):k + 1], chunks[k:k + 2], strict=False) if a is not b), f"fragment {c.text!r}"
        if _only_headings(c.text):  # a heading-only chunk: only when no content follows
            assert _only_headings(text[c.char_end:]), c.text
        assert not c.context or not c.text.startswith(c.context.rsplit(" > ", 1)[-1])


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(doc=structured_docs(hostile=True), overlap=st.sampled_from([0.0, 0.12]))
def test_chunk_properties_hostile(embedder, doc: ParsedDocument, overlap: float) -> None:  # type: ignore[no-untyped-def]
    _check_chunks(embedder, doc, ChunkConfig(max_tokens=BUDGET, overlap=overlap, min_tokens=MIN))


def test_hostile_inputs_stay_within_budgets(embedder) -> None:  # type: ignore[no-untyped-def]
    rng = "".join(chr(0x61 + b % 26) for b in os.urandom(5 * 1024 * 1024))  # a 5 MB line, no spaces
    blob = base64.b64encode(os.urandom(1000)).decode()
    row = "| 1 | " + ("长句子没有空格" * 500)[:3000] + " |"
    for doc in (_doc([Block("text", rng)]), _doc([Block("text", f"附件：{blob}")]),
                _doc([Block("title", "附表", level=1), Block("table", f"| 编号 | 说明 |\n|---|---|\n{row}")])):
        out = _check_chunks(embedder, doc, ChunkConfig(max_tokens=BUDGET, overlap=0.12, min_tokens=MIN))
        assert len(out.chunks) > 1
    table = [c for c in out.chunks if c.chunk_type == "table"]
    assert len(table) == len(out.chunks) and all(c.text.startswith("| 编号 | 说明 |\n|---|---|\n") for c in table[1:])


CIVIL_CODE = ("第一千零九十三条 下列未成年人，可以被收养：（一）丧失父母的孤儿；（二）查找不到生父母的未成年人；"
              "（三）生父母有特殊困难无力抚养的子女。")


def test_heading_joins_its_content(embedder) -> None:  # type: ignore[no-untyped-def]
    config = ChunkConfig(max_tokens=BUDGET, overlap=0.12, min_tokens=MIN)
    alone = chunk_document(_doc([Block("text", "第五章 收养")]), embedder, config).chunks
    assert [c.text for c in alone] == ["第五章 收养"]  # a document that is only a heading: one chunk
    short = _doc([Block("title", "中华人民共和国民法典", level=1), Block("text", "第五章 收养"),
                  Block("text", CIVIL_CODE)])
    chunks = chunk_document(short, embedder, config).chunks
    assert not any(_only_headings(c.text) for c in chunks)
    assert chunks[0].text.startswith("中华人民共和国民法典\n\n第五章 收养\n\n第一千零九十三条")
    assert chunks[0].context == ""  # its text opens with the whole breadcrumb
    # a long chapter: every later chunk carries the breadcrumb in its model text, the text stays exact
    articles = "\n".join(CIVIL_CODE.replace("九十三", n) for n in ("九十三", "九十四", "九十五", "九十六"))
    doc = _doc([Block("title", "中华人民共和国民法典", level=1), Block("text", "第五编 婚姻家庭"),
                Block("text", "第五章 收养"), Block("text", articles)])
    text, _ = doc.layout()
    chunks = _check_chunks(embedder, doc, config).chunks
    assert len(chunks) > 3 and chunks[0].text.startswith("中华人民共和国民法典\n\n第五编 婚姻家庭\n\n第五章 收养\n\n")
    later = next(c for c in chunks if c.text.startswith("第一千零九十五条"))
    assert later.context.endswith("第五章 收养") and "第一千零九十五条" not in later.context
    assert later.model_text == later.context + "\n" + later.text and later.text == text[later.char_start:later.char_end]
    assert later.section_path[-2:] == ("第五章 收养", "第一千零九十五条")


def test_breadcrumb_is_capped_oldest_level_first(embedder) -> None:  # type: ignore[no-untyped-def]
    titles = [f"第{n}层标题较长" for n in range(1, 6)]
    doc = _doc([*(Block("title", t, level=n) for n, t in enumerate(titles, 1)), Block("text", "".join(ZH * 6))])
    chunks = _check_chunks(embedder, doc, ChunkConfig(max_tokens=128, overlap=0.0, min_tokens=MIN)).chunks
    assert chunks[0].text.startswith("\n\n".join(titles)) and chunks[0].context == ""
    full = embedder.count_tokens([" > ".join(titles)])[0] - 2
    assert full >= 128 // 4  # the whole path would not fit in a quarter of the budget ...
    for c in chunks[1:]:  # ... so the oldest levels give way, the deepest stays
        assert c.context.endswith(titles[-1]) and titles[0] not in c.context
        assert embedder.count_tokens([c.context])[0] - 2 < 128 // 4


def test_citations_keep_the_documents_characters(embedder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    original = "第一条　甲方：张三；乙方，李四（以下简称“乙方”）。合同金额为１２３元，分两期支付！"
    assert clean_text(original) == original.replace("\u3000", " ")
    path = tmp_path / "合同.txt"
    path.write_text(f"买卖合同\n\n{original}\n")
    data = path.read_bytes()
    src = SourceFile("合同.txt", path, len(data), datetime.now(UTC), hashlib.sha256(data).hexdigest())
    parsed = parse_document(src, ParseOptions(max_bytes=1 << 20))
    chunks = chunk_document(parsed, embedder, ChunkConfig(max_tokens=BUDGET, overlap=0.0, min_tokens=MIN)).chunks
    joined = "".join(c.text for c in chunks)
    for ch in "，：；（）“”１２３！":
        assert ch in joined, ch
    assert "," not in joined and ":" not in joined and ";" not in joined


TABLE_MD = """# 命令参考

常用命令如下。

| 命令 | 说明 | 示例 |
| :--- | --- | ---: |
{rows}

以上命令均需管理员权限。
"""


def test_markdown_table_with_code_and_escaped_pipes(embedder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    rows = [f"| `cmd{i} a|b` | 管道 x \\| y，第{i}项 | `grep -E 'a\\|b'` |" for i in range(30)]
    path = tmp_path / "cmds.md"
    path.write_text(TABLE_MD.format(rows="\n".join(rows)))
    data = path.read_bytes()
    src = SourceFile("cmds.md", path, len(data), datetime.now(UTC), hashlib.sha256(data).hexdigest())
    parsed = parse_document(src, ParseOptions(max_bytes=1 << 20))
    (table,) = [b for b in parsed.blocks if b.kind == "table"]
    lines = table.text.split("\n")
    assert len(lines) == 32 and lines[0] == "| 命令 | 说明 | 示例 |"
    assert all(len(_cells(line)) == 3 for line in lines)  # the code span's pipe and the escaped one stay in cells
    out = _check_chunks(embedder, parsed, ChunkConfig(max_tokens=128, overlap=0.12, min_tokens=MIN))
    tables = [c for c in out.chunks if c.chunk_type == "table"]
    header = "\n".join(lines[:2]) + "\n"
    assert tables[0].text.startswith("命令参考\n\n常用命令如下。\n\n" + header)  # small intro joins the table
    assert len(tables) > 2 and all(c.prefix == header and c.text.startswith(header) for c in tables[1:])
    body = [r for c in tables for r in c.text.split("\n") if r.startswith("| ") and r not in lines[:2]]
    assert body == lines[2:]  # every row once, in order, never cut


def _cells(line: str) -> list[str]:
    import re

    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


REGULATION = """第一章 总则
第一条 为了规范合同管理，保护当事人的合法权益，制定本办法。
第二条 本办法适用于本公司签订的采购合同。采购合同应当采用书面形式。合同文本由法务部统一制定。
第二章 付款
第三条 付款方式 买方应在收到合格发票后三十日内付款。逾期付款的，每日按未付金额的万分之五支付违约金。
（一）银行转账；
（二）承兑汇票。
第四条 质量保证金为合同价款的百分之十，在验收合格满十二个月后支付。
8.3.4 The supplier shall keep records of all deliveries for five years after the last delivery."""


def test_regulation_articles_stay_whole(embedder) -> None:  # type: ignore[no-untyped-def]
    doc = _doc([Block("text", REGULATION)], "办法.txt")
    text, _ = doc.layout()
    out = chunk_document(doc, embedder, ChunkConfig(max_tokens=128, overlap=0.12, min_tokens=0))
    for article in ("第一条", "第二条", "第三条", "第四条"):
        start = text.index(article)
        nxt = min([text.index(m) for m in ("第二条", "第三条", "第四条", "第二章", "8.3.4") if text.index(m) > start]
                  + [len(text)])
        span = text[start:nxt].strip()
        assert any(span in c.text for c in out.chunks), f"{article} was split"
    third = next(c for c in out.chunks if "第三条" in c.text)
    assert third.section_path[0] == "第二章 付款" and third.text.startswith("第二章 付款\n第三条")  # heading glued
    # the breadcrumb goes down to articles and numbered clauses
    assert out.chunks[-1].section_path == ("第二章 付款", "第四条", "8.3.4")
    assert out.chunks[-1].context == "第二章 付款 > 第四条"
    assert classify_line("第十二条 付款方式") == ("clause", 10, "第十二条")
    assert classify_line("第二章 付款与交付")[0] == "heading"  # type: ignore[index]
    assert classify_line("8.3 Payment terms") == ("heading", 8, "8.3 Payment terms")
    assert classify_line("８．３ 付款条件") == ("heading", 8, "８．３ 付款条件")  # full-width numbering
    assert classify_line("3.5 million people live there.") is None  # a number, not a clause (needs two dots)
    # with a minimum size, the short clause joins its neighbour instead of standing alone
    merged = chunk_document(doc, embedder, ChunkConfig(max_tokens=128, overlap=0.12, min_tokens=32))
    assert all(embedder.count_tokens([c.text])[0] >= 32 for c in merged.chunks)


def test_long_table_split_by_rows_with_header(embedder) -> None:  # type: ignore[no-untyped-def]
    header = "| 编号 | 名称 | 数量 | 单价 |\n|---|---|---|---|"
    rows = [f"| {i} | 六角螺栓 M{i % 20 + 4} | {i * 10} | {i}.25 |" for i in range(1, 81)]
    doc = _doc([Block("title", "附件一 设备清单", level=1), Block("table", header + "\n" + "\n".join(rows))])
    text, _ = doc.layout()
    out = chunk_document(doc, embedder, ChunkConfig(max_tokens=128, overlap=0.12))
    tables = [c for c in out.chunks if c.chunk_type == "table"]
    assert len(tables) > 3 and tables[0].text.startswith("附件一 设备清单\n\n" + header + "\n")  # title glued
    for c in tables[1:]:
        assert c.text.startswith(header + "\n") and c.context == "附件一 设备清单"
    for c in tables:
        assert c.token_count <= 128 and c.text == c.prefix + text[c.char_start:c.char_end]
    body_rows = [r for c in tables for r in c.text.split("\n") if r.startswith("| ") and r not in header]
    assert body_rows == rows  # every row exactly once, in order, never cut


def test_fixed_strategy_ignores_structure(embedder) -> None:  # type: ignore[no-untyped-def]
    doc = _doc([Block("text", REGULATION)])
    fixed = chunk_document(doc, embedder, ChunkConfig(max_tokens=64, overlap=0.0, strategy="fixed"))
    assert all(c.section_path == () for c in fixed.chunks) and all(c.token_count <= 64 for c in fixed.chunks)
    assert ChunkConfig(64, 0.0, "fixed").fingerprint != ChunkConfig(64, 0.0).fingerprint
    assert ChunkConfig(64, 0.0, min_tokens=8).fingerprint != ChunkConfig(64, 0.0).fingerprint
    assert ChunkConfig(64, 0.0).as_dict()["max_chars"] == 64 * 8


@pytest.mark.flow
@pytest.mark.db
def test_gx_gate_quarantines_bad_document_only(prefect_harness, settings, corpus: Path, conn,  # type: ignore[no-untyped-def]
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault injection: the chunker emits an empty chunk for one document; the suite names the failed
    expectation, that document is quarantined, the other five load and publish."""
    import dataclasses

    from flows.refresh import refresh
    from tasks import chunk as chunk_stage

    original = chunk_stage.chunk_document

    def broken(doc: ParsedDocument, tok: Any, config: ChunkConfig) -> Any:
        out = original(doc, tok, config)
        if doc.source.path == "zh/DEV_1.txt":
            out.chunks[0] = dataclasses.replace(out.chunks[0], text="", prefix="")
        return out

    monkeypatch.setattr(chunk_stage, "chunk_document", broken)
    summary = refresh(str(corpus), settings=settings)
    assert summary["published"] and summary["documents"]["new"] == 6
    (q,) = summary["quarantined"]
    assert q["path"] == "zh/DEV_1.txt" and q["stage"] == "validate" and q["reason"] == "data-quality"
    assert "expect_column_value_lengths_to_be_between(text)" in q["error"]
    assert "expect_column_values_to_be_in_set(span_ok)" in q["error"]
    live = {r[0] for r in conn.execute("SELECT DISTINCT source_path FROM corpusync.live_chunks")}
    assert "zh/DEV_1.txt" not in live and len(live) == 5
    failed = [e for e in summary["validation"]["expectations"] if not e["success"]]
    assert failed and summary["validation"]["quarantined"] == ["zh/DEV_1.txt"]
    stored = conn.execute("SELECT counts->'validation' FROM corpusync.runs ORDER BY id DESC LIMIT 1").fetchone()[0]
    assert stored["quarantined"] == ["zh/DEV_1.txt"]
