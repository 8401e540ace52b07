"""Pure stage functions: discover, diff, parse errors, chunking, batching (lexical tokens: test_lexical.py)."""

from __future__ import annotations

import hashlib
import pickle
from datetime import UTC, datetime
from pathlib import Path

import pymupdf
import pytest

from corpusync.core.errors import MassDeleteRefused, ParseError
from schemas.records import Block, DiffPlan, LiveVersion, ParsedDocument, SourceFile
from tasks.chunk import ChunkConfig, chunk_document, sentence_spans
from tasks.diff import QuarantineState, diff, is_temporary
from tasks.discover import discover
from tasks.embed import token_budget_batches
from tasks.parse import ParseOptions, clean_text, detect_script, parse_document
from tasks.parsing.pdf import _document_class, _dominant_size, _page_blocks
from tasks.publish import check_mass_delete


def _src(path: str, content: bytes | str = b"x", tmp: Path | None = None) -> SourceFile:
    data = content.encode() if isinstance(content, str) else content
    abs_path = Path("/nonexistent") / path
    if tmp is not None:
        abs_path = tmp / path
        abs_path.parent.mkdir(parents=True, exist_ok=True)
        abs_path.write_bytes(data)
    return SourceFile(path, abs_path, len(data), datetime.now(UTC), hashlib.sha256(data).hexdigest())


def _live(path: str, sha: str, fp: str = "fp", doc_id: int = 1) -> LiveVersion:
    return LiveVersion(doc_id, doc_id * 10, path, sha, fp, 3)


def test_discover_applies_globs_and_hashes(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.md").write_text("hello")
    (tmp_path / ".hidden.md").write_text("no")
    (tmp_path / "SOURCE.md").write_text("provenance")
    (tmp_path / "b.txt").write_text("b")
    files, problems = discover(tmp_path, ["**/*"], ["**/.*", "**/SOURCE.md"])
    assert [f.path for f in files] == ["a/x.md", "b.txt"]
    assert files[0].sha256 == hashlib.sha256(b"hello").hexdigest()
    assert problems == []


def test_diff_classifies_every_case() -> None:
    a, b, c, d = _src("a.md", "A"), _src("b.md", "B2"), _src("c.md", "C"), _src("moved/d.md", "D")
    live = [_live("a.md", a.sha256, doc_id=1), _live("b.md", _src("b.md", "B1").sha256, doc_id=2),
            _live("gone.md", "zzz", doc_id=3), _live("d.md", d.sha256, doc_id=4)]
    plan = diff([a, b, c, d], live, "fp")
    assert [v.path for v in plan.unchanged] == ["a.md"]
    assert [f.path for f, _ in plan.changed] == ["b.md"]
    assert sorted(f.path for f in plan.new) == ["c.md", "moved/d.md"]
    assert sorted(v.path for v in plan.deleted) == ["d.md", "gone.md"]
    assert [(old.path, new.path) for old, new in plan.renamed] == [("d.md", "moved/d.md")]


def test_diff_reprocesses_when_pipeline_changes_and_skips_known_bad_files() -> None:
    a, bad = _src("a.md", "A"), _src("bad.pdf", "%PDF-broken")
    plan = diff([a, bad], [_live("a.md", a.sha256, fp="old")], "new", {"bad.pdf": (bad.sha256, "new")})
    assert [f.path for f, _ in plan.changed] == ["a.md"]
    assert [q.path for q in plan.still_quarantined] == ["bad.pdf"]
    assert not plan.new


def test_a_validate_quarantine_is_tried_again_when_validation_changes_not_the_pipeline() -> None:
    """A record of a stage with its own fingerprint (validation: its settings and logic) is still quarantined
    while that fingerprint holds and tried again when it changes; the live documents and the other stages'
    records go by the pipeline fingerprint alone."""
    a, checked, bad = _src("a.md", "A"), _src("checked.pdf", "%PDF-1"), _src("bad.pdf", "%PDF-broken")
    records = {"checked.pdf": QuarantineState(checked.sha256, "suite-1", "validate", "data-quality"),
               "bad.pdf": QuarantineState(bad.sha256, "fp", "parse", "corrupt")}
    live = [_live("a.md", a.sha256)]
    same = diff([a, checked, bad], live, "fp", records, stage_fingerprints={"validate": "suite-1"})
    assert sorted(q.path for q in same.still_quarantined) == ["bad.pdf", "checked.pdf"] and not same.new
    looser = diff([a, checked, bad], live, "fp", records, stage_fingerprints={"validate": "suite-2"})
    assert [f.path for f in looser.new] == ["checked.pdf"] and [q.path for q in looser.still_quarantined] == [
        "bad.pdf"]
    assert [v.path for v in looser.unchanged] == ["a.md"]


def test_the_validation_fingerprint_follows_its_settings_and_not_the_pipeline_s() -> None:
    from corpusync.app.fastpath import _Configured  # the model's files read, no weights loaded
    from corpusync.app.pipeline import pipeline_fingerprint, validation_fingerprint
    from schemas.settings import Settings

    home = Path(".corpusync")
    configs = [_Configured(Settings(home=home, embedder="minilm")),
               _Configured(Settings(home=home, embedder="minilm", validate_norm_tolerance=0.05)),
               _Configured(Settings(home=home, embedder="minilm", validate_chunks=False))]
    assert len({pipeline_fingerprint(c) for c in configs}) == 1
    assert len({validation_fingerprint(c) for c in configs}) == 3


def test_mass_delete_guard() -> None:
    plan = DiffPlan(deleted=[_live(f"{i}.md", "x") for i in range(6)], live_before=10)
    with pytest.raises(MassDeleteRefused, match="6 of 10"):
        check_mass_delete(plan, 0.5, allow=False)
    check_mass_delete(plan, 0.5, allow=True)
    check_mass_delete(plan, 0.7, allow=False)
    # a reorganised corpus: the documents moved are not removed, the one deleted alone is
    old = [_live(f"{i}.md", f"sha{i}", doc_id=i + 1) for i in range(8)]
    new = [_src(f"archive/{i}.md", f"{i}") for i in range(7)]
    moved = DiffPlan(new=new, deleted=old, renamed=list(zip(old, new, strict=False)), live_before=10)
    assert [v.path for v in moved.removed] == ["7.md"] and moved.added == []
    check_mass_delete(moved, 0.5, allow=False)


def test_renames_pair_copies_one_to_one_by_their_paths() -> None:
    """A moved folder whose files are copies of each other is as many renames, each file to its own new
    path; a content that lost a path but gained none is a deletion, one that gained two paths one new."""
    same = ("a/x.md", "b/x.md", "b/y.md")
    files = [_src(f"old/{p}", "S") for p in same] + [_src("old/b/z.md", "S"), _src("lone.md", "L")]
    live = [_live(p, files[0].sha256, doc_id=i + 1) for i, p in enumerate(same)] + [
        _live("gone.md", "nothing", doc_id=9)]
    plan = diff(files, live, "fp")
    assert sorted((old.path, new.path) for old, new in plan.renamed) == [
        ("a/x.md", "old/a/x.md"), ("b/x.md", "old/b/x.md"), ("b/y.md", "old/b/y.md")]
    assert sorted(f.path for f in plan.added) == ["lone.md", "old/b/z.md"]
    assert [v.path for v in plan.removed] == ["gone.md"]
    # a live path discover could not read is neither deleted nor renamed, so its copy is free for a real move
    locked = diff([_src("new/x.md", "S")], [_live("a/x.md", files[0].sha256, doc_id=1),
                                             _live("b/x.md", files[0].sha256, doc_id=2)], "fp", unreadable={"a/x.md"})
    assert [(old.path, new.path) for old, new in locked.renamed] == [("b/x.md", "new/x.md")]
    assert locked.deleted == [locked.renamed[0][0]] and not locked.removed


def test_clean_text_normalises() -> None:
    # the document's own characters stay (citations quote them); compatibility folding is for search only
    assert clean_text("ＡＢＣ１２３\u3000全角") == "ＡＢＣ１２３ 全角"
    assert clean_text("甲方：张三；乙方，李四（签字）") == "甲方：张三；乙方，李四（签字）"
    assert clean_text("合同⾦额\ufb01nal e\u0301") == "合同金额final é"  # PDF glyph artefacts, canonical forms
    assert clean_text("a\u2003b\u202fc") == "a b c"
    # Chinese lines re-join, but not before a line that opens an article, chapter or item
    assert clean_text("第一条 甲方应付款，\n逾期的按日计息。\n第二条 乙方应交货。\n（一）按期；") == (
        "第一条 甲方应付款，逾期的按日计息。\n第二条 乙方应交货。\n（一）按期；")
    from tasks.parse import strip_running_lines

    assert strip_running_lines([[("第３页 共９页", 0.97), ("正文", None)]])[0] == [["正文"]]  # full-width digits
    assert clean_text("inter-\nnational") == "international"
    assert clean_text("中华人民\n共和国") == "中华人民共和国"
    assert clean_text("a\x00b  \t c\n\n\n\nd") == "ab c\n\nd"


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("empty.md", b"", "empty"),
        ("fake.pdf", b"this is not a pdf at all", "wrong-format"),
        ("trunc.pdf", b"%PDF-1.7\n1 0 obj <<", "corrupt"),
        ("bin.txt", b"\x00\x01\x02binary\x00garbage", "binary"),
        ("x.xyz", b"data", "unsupported-format"),
    ],
)
def test_parse_errors_name_file_and_reason(tmp_path: Path, name: str, content: bytes, reason: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_document(_src(name, content, tmp_path), ParseOptions(max_bytes=1 << 20))
    assert info.value.reason == reason
    assert name in str(info.value)


def test_parse_encrypted_and_oversized_pdf(tmp_path: Path) -> None:
    doc = pymupdf.open()
    doc.new_page().insert_text((72, 72), "secret text")
    path = tmp_path / "locked.pdf"
    doc.save(path, encryption=pymupdf.PDF_ENCRYPT_AES_256, user_pw="pw", owner_pw="owner")
    data = path.read_bytes()
    src = SourceFile("locked.pdf", path, len(data), datetime.now(UTC), hashlib.sha256(data).hexdigest())
    with pytest.raises(ParseError) as info:
        parse_document(src, ParseOptions(max_bytes=1 << 20))
    assert info.value.reason == "encrypted"
    with pytest.raises(ParseError) as info:
        parse_document(src, ParseOptions(max_bytes=10))
    assert info.value.reason == "oversized"


def test_parse_refuses_bytes_other_than_those_discover_hashed(tmp_path: Path) -> None:
    """The file was written between discover and the parse: its version would record one content and index
    another, so the parse refuses it with a reason that can pass (tasks/diff.py: due again at the next run)."""
    (tmp_path / "notes.md").write_text("# Tolls\n\nThe bridge of Caen charged a toll on salt.\n")
    (tmp_path / "notes.md.meta.json").write_text('{"department": "archive"}')
    files, _ = discover(tmp_path)
    assert parse_document(files[0], ParseOptions()).blocks  # a sidecar's hash is part of the content hash
    grown, same_size = ("# Tolls\n\nThe bridge of Caen charged a toll on salt and wine.\n",
                        "# Tolls\n\nThe bridge of Caen charged a toll on wine.\n")
    for content, how in ((grown, "bytes then"), (same_size, "other bytes of the same size")):
        (tmp_path / "notes.md").write_text(content)
        with pytest.raises(ParseError) as info:
            parse_document(files[0], ParseOptions())
        assert info.value.reason == "changed-during-run" and how in info.value.detail, info.value.detail
        assert is_temporary(info.value.reason)
    (tmp_path / "notes.md").write_text(grown + "x" * 100)  # grown past the limit: not read whole
    with pytest.raises(ParseError) as info:
        parse_document(files[0], ParseOptions(max_bytes=files[0].size + 10))
    assert info.value.reason == "changed-during-run" and f"{files[0].size + 10 + 1:,}+ now" in info.value.detail


def test_parse_text_pdf_keeps_pages(tmp_path: Path) -> None:
    doc = pymupdf.open()
    for i in range(3):
        doc.new_page().insert_text((72, 72), f"Page {i + 1} says hello.")
    path = tmp_path / "three.pdf"
    doc.save(path)
    data = path.read_bytes()
    parsed = parse_document(
        SourceFile("three.pdf", path, len(data), datetime.now(UTC), hashlib.sha256(data).hexdigest()),
        ParseOptions(max_bytes=1 << 20),
    )
    assert parsed.page_count == 3
    assert [b.page for b in parsed.blocks] == [1, 2, 3]
    assert parsed.parser == "pymupdf"


def test_pdf_headings_by_dominant_font_size(tmp_path: Path) -> None:
    # 10.02 pt and 9.98 pt are both 10.0 to a tenth: together they outweigh 14 pt; a tie goes to the first seen
    assert _dominant_size({14.0: 8, 10.02: 5, 9.98: 5}) == 10.0
    assert _dominant_size({12.0: 3, 9.0: 3}) == 12.0 and _dominant_size({}) == 0.0
    doc = pymupdf.open()
    page = doc.new_page()
    page.insert_text((72, 72), "Annual Report", fontsize=20)
    for i in range(12):
        page.insert_text((72, 140 + 16 * i), f"Line {i} of the body text, set in the body's size.", fontsize=11)
    path = tmp_path / "report.pdf"
    doc.save(path)
    data = path.read_bytes()
    parsed = parse_document(SourceFile("report.pdf", path, len(data), datetime.now(UTC),
                                       hashlib.sha256(data).hexdigest()), ParseOptions(max_bytes=1 << 20))
    assert [(b.kind, b.text, b.level) for b in parsed.blocks if b.kind == "title"] == [("title", "Annual Report", 1)]
    assert "Line 11 of the body text" in parsed.blocks[-1].text


def test_pdf_page_blocks_from_mupdf_json() -> None:
    # Blocks come from MuPDF's JSON (bboxes and sizes in 1/1000 pt): they match what get_text("dict") gives,
    # text off the page is left out as the dict left it out, and the image cover comes from the same page.
    doc = pymupdf.open()
    page = doc.new_page(width=600, height=800)
    page.insert_text((72, 100), "Heading set large", fontsize=17.96)
    page.insert_text((72, 300), "Body text in a size that rounds up", fontsize=10.96)
    page.insert_text((72, -40), "Above the page", fontsize=12)
    page.insert_text((650, 200), "Right of the page", fontsize=12)
    pix = pymupdf.Pixmap(pymupdf.csRGB, pymupdf.IRect(0, 0, 4, 4), False)
    pix.clear_with(200)
    page.insert_image(pymupdf.Rect(150, 400, 450, 800), pixmap=pix, keep_proportion=False)  # a quarter
    page = pymupdf.open("pdf", doc.tobytes())[0]
    blocks, cover = _page_blocks(page)
    expected = [(b["bbox"], "\n".join("".join(s["text"] for s in ln["spans"]) for ln in b["lines"]),
                 round(b["lines"][0]["spans"][0]["size"], 1))
                for b in page.get_text("dict", flags=0)["blocks"] if b["type"] == 0]
    assert [(t, size) for _, t, size in blocks] == [(t, size) for _, t, size in expected] == [
        ("Heading set large", 18.0), ("Body text in a size that rounds up", 11.0)]
    for (bbox, _, _), (want, _, _) in zip(blocks, expected, strict=True):
        assert bbox == pytest.approx(want, abs=0.002)
    assert cover == pytest.approx(0.25, abs=0.001)


def test_pdf_opened_without_outline_or_metadata_and_blocks_pickle_whole() -> None:
    # The parser's document skips PyMuPDF's init_doc (outline and Info dictionary, unused): should PyMuPDF
    # rename it, this fails rather than the parse silently paying for them again. Blocks cross the worker
    # boundary pickled as their constructor's arguments.
    src = pymupdf.open()
    src.new_page().insert_text((72, 72), "Body")
    src.set_metadata({"title": "A title"})
    src.set_toc([[1, "Chapter", 1]])
    data = src.tobytes()
    assert pymupdf.open(stream=data).metadata["title"] == "A title"
    with _document_class()(stream=data, filetype="pdf") as doc:
        assert doc.metadata is None and doc.outline is None
        assert doc.page_count == 1 and doc[0].get_text().strip() == "Body"
    blocks = [Block("title", "Heading", 3, level=2), Block("text", "Body", None)]
    assert pickle.loads(pickle.dumps(blocks, protocol=pickle.HIGHEST_PROTOCOL)) == blocks


@pytest.mark.parametrize(("text", "tag"), [
    ("第十二条 付款方式：买方应在收到发票后三十日内付款。", "zh"),
    ("東京は日本の首都です。ひらがなとカタカナ", "ja"),  # kana beats Han
    ("서울은 한국의 수도입니다", "ko"), ("مرحبا بالعالم", "ar"), ("Привет, мир", "ru"),
    ("The buyer pays within 30 days. 合同", "latin"),
    ("2024 — 12 ½ ² Ⅷ ___ ...", "und"),  # digits, numerals, punctuation: no letters
    ("2024-12-03 | 42 _ ...", "und"),  # ASCII without a letter
    ("Terms and conditions, v2", "latin"),
    ("〇〇〇 abc", "latin"),  # 〇 is Han to the analyser but a numeral (not a letter) here
    ("abc " * 6000 + "中文" * 9000, "latin"),  # only the first 20,000 characters count
])
def test_detect_script(text: str, tag: str) -> None:
    assert detect_script(text) == tag


def test_parse_gb18030_text(tmp_path: Path) -> None:
    text = "第十二条 付款方式 买方应在收到发票后三十日内付款。" * 3
    parsed = parse_document(_src("gbk.txt", text.encode("gb18030"), tmp_path), ParseOptions(max_bytes=1 << 20))
    assert "付款方式" in parsed.blocks[0].text


def test_sentence_spans_zh_en() -> None:
    text = "第一条 本办法适用于全体员工。第二条 员工应遵守纪律！Dr. Smith signs it. Then e.g. more follows. End"
    spans = [text[s:e] for s, e in sentence_spans(text, 0, len(text))]
    assert spans == ["第一条 本办法适用于全体员工。", "第二条 员工应遵守纪律！", "Dr. Smith signs it.",
                     "Then e.g. more follows.", "End"]


def _doc(blocks: list[Block]) -> ParsedDocument:
    return ParsedDocument(_src("d.md", "x"), blocks, parser="test", parser_version="0", media_type="text/markdown")


def test_chunks_respect_budget_spans_and_are_deterministic(embedder) -> None:  # type: ignore[no-untyped-def]
    body_en = " ".join(f"Sentence number {i} talks about retrieval indexes and their upkeep." for i in range(60))
    body_zh = "".join(f"第{i}条 本合同的付款方式为银行转账，买方应在三十日内付款。" for i in range(40))
    doc = _doc([Block("title", "Terms", level=1), Block("text", body_en), Block("title", "条款", level=2),
                Block("text", body_zh)])
    config = ChunkConfig(max_tokens=64, overlap=0.12)
    chunked = chunk_document(doc, embedder, config)
    text, _ = doc.layout()
    assert len(chunked.chunks) > 5
    counts = embedder.count_tokens([c.model_text for c in chunked.chunks])  # breadcrumb + text
    for c, n in zip(chunked.chunks, counts, strict=True):
        assert c.text == text[c.char_start:c.char_end]
        assert n <= 64 and c.token_count == n
        assert c.text.strip()
    # every non-space character is covered by some chunk
    covered = set()
    for c in chunked.chunks:
        covered.update(range(c.char_start, c.char_end))
    assert all(i in covered for i, ch in enumerate(text) if not ch.isspace())
    # no chunk crosses a section boundary; the Chinese section carries its breadcrumb
    assert any(c.section_path[:2] == ("Terms", "条款") for c in chunked.chunks)
    assert all(not ("retrieval" in c.text and "付款" in c.text) for c in chunked.chunks)
    again = chunk_document(doc, embedder, config)
    assert [c.key for c in again.chunks] == [c.key for c in chunked.chunks]


def test_overlong_sentence_is_split_under_budget(embedder) -> None:  # type: ignore[no-untyped-def]
    doc = _doc([Block("text", "word " * 500)])
    chunked = chunk_document(doc, embedder, ChunkConfig(max_tokens=50, overlap=0.0))
    assert len(chunked.chunks) >= 10
    assert max(embedder.count_tokens([c.text for c in chunked.chunks])) <= 50


def test_token_budget_batches() -> None:
    lengths = [5, 100, 7, 50, 50, 3, 120, 1]
    batches = token_budget_batches(lengths, budget=200)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 200
    assert batches[0][0] == 6  # longest first
