"""Structure-aware chunking: property tests (hypothesis) on random structured Chinese/English documents
with the real MiniLM tokenizer, golden tests on legal structure and long tables, and the great-expectations
gate quarantining a bad document while the others load."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.records import Block, ParsedDocument, SourceFile
from tasks.chunk import ChunkConfig, chunk_document, classify_line

BUDGET = 64

ZH = ["买方应在收到发票后三十日内付款。", "卖方应按约定交付货物！", "本合同自签订之日起生效；", "双方另有约定的除外？",
      "违约方应承担相应责任。", "争议应提交仲裁委员会解决。"]
EN = ["The buyer shall pay within thirty days.", "Dr. Smith approved v2.5 of the spec on Jan. 3.",
      "See https://example.com/a.b for details.", "Payment of $1,234.56 is due!", "Is this clause void?",
      "The term is 12.5 months, e.g. until 2025."]


def _doc(blocks: list[Block], name: str = "doc.md") -> ParsedDocument:
    raw = "".join(b.text for b in blocks).encode()
    src = SourceFile(name, Path(name), len(raw), datetime.now(UTC), hashlib.sha256(raw).hexdigest())
    return ParsedDocument(src, blocks, parser="test", parser_version="1", media_type="text/markdown")


@st.composite
def structured_docs(draw: Any) -> ParsedDocument:
    blocks: list[Block] = []
    for i in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["title", "text", "article", "decimal", "table", "long"]))
        lang = draw(st.sampled_from([ZH, EN]))
        if kind == "title":
            blocks.append(Block("title", draw(st.sampled_from(["第一章 总则", "Scope", "8.3 Payment terms"])),
                                level=draw(st.integers(1, 3))))
        elif kind == "article":
            body = "".join(draw(st.lists(st.sampled_from(ZH), min_size=1, max_size=8)))
            blocks.append(Block("text", f"第{i + 1}条 {body}"))
        elif kind == "decimal":
            body = " ".join(draw(st.lists(st.sampled_from(EN), min_size=1, max_size=6)))
            blocks.append(Block("text", f"8.{i}.1 {body}"))
        elif kind == "table":
            rows = draw(st.integers(1, 40))
            lines = ["| 编号 | Item | Amount |", "|---|---|---|"]
            lines += [f"| {r} | {draw(st.sampled_from(['bolt', '螺栓', 'washer']))} | {r * 3}.5 |" for r in range(rows)]
            blocks.append(Block("table", "\n".join(lines)))
        elif kind == "long":
            blocks.append(Block("text", "字" * draw(st.integers(100, 400))))  # one sentence over the budget
        else:
            sep = "" if lang is ZH else " "
            blocks.append(Block("text", sep.join(draw(st.lists(st.sampled_from(lang), min_size=1, max_size=15)))))
    return _doc(blocks)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                    HealthCheck.too_slow])
@given(doc=structured_docs(), overlap=st.sampled_from([0.0, 0.12]))
def test_chunk_properties(embedder, doc: ParsedDocument, overlap: float) -> None:  # type: ignore[no-untyped-def]
    config = ChunkConfig(max_tokens=BUDGET, overlap=overlap)
    text, _ = doc.layout()
    out = chunk_document(doc, embedder, config)
    assert out.chunks, "no chunk"
    covered = bytearray(len(text))
    for c in out.chunks:
        assert c.text.strip(), "empty chunk"
        assert c.text == c.prefix + text[c.char_start:c.char_end], "span does not map back to the chunk text"
        assert c.token_count <= BUDGET and embedder.count_tokens([c.text])[0] == c.token_count
        for i in range(c.char_start, c.char_end):
            covered[i] = 1
    missing = [i for i, ch in enumerate(text) if not ch.isspace() and not covered[i]]
    assert not missing, f"uncovered characters: {text[missing[0]:missing[0] + 30]!r}"
    for a, b in zip(out.chunks, out.chunks[1:], strict=False):
        if b.char_start < a.char_end:  # overlap: only inside a section, within the overlap budget
            assert a.chunk_type == b.chunk_type != "table"
            shared = embedder.count_tokens([text[b.char_start:a.char_end]])[0] - 2
            assert shared <= int(BUDGET * overlap) + 2
    again = chunk_document(doc, embedder, config)
    assert [(c.key, c.text) for c in again.chunks] == [(c.key, c.text) for c in out.chunks]
    assert len({c.key for c in out.chunks}) == len(out.chunks)


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
    out = chunk_document(doc, embedder, ChunkConfig(max_tokens=128, overlap=0.12))
    for article in ("第一条", "第二条", "第三条", "第四条"):
        start = text.index(article)
        nxt = min([text.index(m) for m in ("第二条", "第三条", "第四条", "第二章", "8.3.4") if text.index(m) > start]
                  + [len(text)])
        span = text[start:nxt].strip()
        assert any(span in c.text for c in out.chunks), f"{article} was split"
    third = next(c for c in out.chunks if "第三条" in c.text)
    assert third.section_path[0] == "第二章 付款"  # the chunk opens with the chapter heading
    # the breadcrumb goes down to articles and numbered clauses
    assert out.chunks[-1].section_path == ("第二章 付款", "第四条", "8.3.4")
    assert classify_line("第十二条 付款方式") == ("clause", 10, "第十二条")
    assert classify_line("第二章 付款与交付")[0] == "heading"  # type: ignore[index]
    assert classify_line("8.3 Payment terms") == ("heading", 8, "8.3 Payment terms")
    assert classify_line("3.5 million people live there.") is None  # a number, not a clause (needs two dots)


def test_long_table_split_by_rows_with_header(embedder) -> None:  # type: ignore[no-untyped-def]
    header = "| 编号 | 名称 | 数量 | 单价 |\n|---|---|---|---|"
    rows = [f"| {i} | 六角螺栓 M{i % 20 + 4} | {i * 10} | {i}.25 |" for i in range(1, 81)]
    doc = _doc([Block("title", "附件一 设备清单", level=1), Block("table", header + "\n" + "\n".join(rows))])
    text, _ = doc.layout()
    out = chunk_document(doc, embedder, ChunkConfig(max_tokens=128, overlap=0.12))
    tables = [c for c in out.chunks if c.chunk_type == "table"]
    assert len(tables) > 3
    for c in tables:
        assert c.text.startswith(header + "\n") and c.token_count <= 128
        assert c.text == c.prefix + text[c.char_start:c.char_end]
    body_rows = [r for c in tables for r in c.text.split("\n")[2:]]
    assert body_rows == rows  # every row exactly once, in order, never cut


def test_fixed_strategy_ignores_structure(embedder) -> None:  # type: ignore[no-untyped-def]
    doc = _doc([Block("text", REGULATION)])
    fixed = chunk_document(doc, embedder, ChunkConfig(max_tokens=64, overlap=0.0, strategy="fixed"))
    assert all(c.section_path == () for c in fixed.chunks) and all(c.token_count <= 64 for c in fixed.chunks)
    assert ChunkConfig(64, 0.0, "fixed").fingerprint != ChunkConfig(64, 0.0).fingerprint


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
