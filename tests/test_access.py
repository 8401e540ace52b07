"""Row-level access and validity dates, enforced in PostgreSQL: two reader roles see only the documents whose
access list names one of their groups (public ones too), in the views and inside search_text/search_hybrid,
with BM25 statistics counted over what they may see; validity and metadata ranges filter in every API."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from corpusync.core.errors import CorpusyncError
from corpusync.core.lexical import Analyzer
from query.search import Searcher, build_filter

pytestmark = [pytest.mark.flow, pytest.mark.db]

DOCS = {  # path -> (text, sidecar)
    "legal-only.md": ("# 保密协议\n\n保密条款：乙方不得披露甲方的商业秘密。违约金为合同总额的百分之二十。",
                      {"acl": ["legal"], "year": 2021}),
    "legal-and-finance.md": ("# 付款条款\n\n付款方式：甲方在验收后三十日内支付合同价款。保密义务同样适用。",
                             {"acl": ["legal", "finance"], "year": 2024}),
    "hr-only.md": ("# 人事制度\n\n员工保密承诺书：员工不得泄露公司的商业秘密和客户名单。",
                   {"acl": "hr", "year": 2024}),
    "public.md": ("# 公开说明\n\n本公司的公开信息披露制度，适用于所有公告。商业秘密另行规定。",
                  {"year": 2023, "valid_from": "2020-01-01"}),
    "expired.md": ("# 旧版办法\n\n已经废止的旧版信息披露办法，商业秘密条款不再适用。",
                   {"valid_from": "2010-01-01", "valid_until": "2020-01-01"}),
    "future.md": ("# 新版办法\n\n将来生效的新版信息披露办法，商业秘密条款另行规定。",
                  {"valid_from": "2999-01-01"}),
}


@pytest.fixture
def indexed(prefect_harness, settings, tmp_path: Path, embedder) -> Any:  # type: ignore[no-untyped-def]
    from flows.refresh import refresh

    corpus = tmp_path / "acl-corpus"
    corpus.mkdir()
    for name, (text, meta) in DOCS.items():
        (corpus / name).write_text(text, encoding="utf-8")
        (corpus / f"{name}.meta.json").write_text(json.dumps(meta, ensure_ascii=False), encoding="utf-8")
    assert refresh(str(corpus), settings=settings)["published"]
    return settings


@pytest.fixture
def readers(indexed, conn) -> Any:  # type: ignore[no-untyped-def]
    """Two login roles in corpusync_reader: one in group legal, one in group finance (names are generated)."""
    tag = uuid.uuid4().hex[:8]
    roles = {"legal": f"r_legal_{tag}", "finance": f"r_fin_{tag}"}
    for group, role in roles.items():
        conn.execute(f"CREATE ROLE {role} LOGIN IN ROLE corpusync_reader")  # generated identifiers
        conn.execute("INSERT INTO corpusync.access_groups (role_name, group_name) VALUES (%s, %s)", (role, group))
    yield roles
    for role in roles.values():
        conn.execute("DELETE FROM corpusync.access_groups WHERE role_name = %s", (role,))
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")


def as_role(settings: Any, role: str) -> psycopg.Connection:
    url = settings.database_dsn().replace("postgres:@", f"{role}:@", 1)
    return psycopg.connect(url, autocommit=True)


def sources(conn: psycopg.Connection, sql: str, *params: Any) -> set[str]:
    return {r[0] for r in conn.execute(sql, params).fetchall()}


VISIBLE = {"legal": {"legal-only.md", "legal-and-finance.md"}, "finance": {"legal-and-finance.md"}}
PUBLIC = {"public.md", "expired.md", "future.md"}


def test_readers_see_only_their_documents_in_views_and_search(indexed, conn, readers, embedder) -> None:  # type: ignore[no-untyped-def]
    q = Analyzer.from_settings(indexed).query("商业秘密 保密").sql_text()
    everyone = sources(conn, "SELECT source FROM corpusync.search_text(%s, 50)", q)
    assert "hr-only.md" in everyone and VISIBLE["legal"] <= everyone  # the owner sees all
    for group, role in readers.items():
        with as_role(indexed, role) as rc:
            want = VISIBLE[group] | PUBLIC
            assert sources(rc, "SELECT source_path FROM corpusync.live_chunks") == want
            assert sources(rc, "SELECT path FROM corpusync.documents_current") == want
            assert sources(rc, "SELECT path FROM corpusync.documents") == want
            assert sources(rc, "SELECT source FROM corpusync.search_text(%s, 50)", q) <= want
            assert "hr-only.md" not in sources(rc, "SELECT source FROM corpusync.search_text(%s, 50)", q)
            # no leak through BM25's statistics: N and df count only what the reader may see, so the same
            # chunk scores as it would in an index of the reader's documents alone
            n = rc.execute("SELECT count(*) FROM corpusync.live_chunks").fetchone()[0]
            total = conn.execute("SELECT count(*) FROM corpusync.live_chunks").fetchone()[0]
            assert n < total
            mine = dict(rc.execute("SELECT source, score FROM corpusync.search_text(%s, 50)", (q,)).fetchall())
            owner = dict(conn.execute("SELECT source, score FROM corpusync.search_text(%s, 50)", (q,)).fetchall())
            assert any(abs(mine[s] - owner[s]) > 1e-9 for s in mine)
            # the Python API over the reader's connection enforces the same (hybrid: dense channel too)
            hits = Searcher(indexed, rc, embedder).search("商业秘密 保密条款", k=20)
            assert hits and {h.source for h in hits} <= want
            # readers cannot write or change the schema
            for stmt in ("INSERT INTO corpusync.documents (path) VALUES ('x.md')",
                         "UPDATE corpusync.index_state SET published_generation = 0",
                         "DELETE FROM corpusync.chunks", "CREATE TABLE corpusync.mine (x int)",
                         "SELECT * FROM corpusync.access_groups"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    rc.execute(stmt)


def test_validity_dates_and_metadata_ranges_filter_every_channel(indexed, conn, embedder) -> None:  # type: ignore[no-untyped-def]
    s = Searcher(indexed, conn, embedder)
    cols = conn.execute("SELECT path, valid_from, valid_until, acl FROM corpusync.documents_current "
                        "WHERE path IN ('expired.md', 'hr-only.md')").fetchall()
    assert {(str(p), str(f), str(u), tuple(a or ())) for p, f, u, a in cols} == {
        ("expired.md", "2010-01-01", "2020-01-01", ()), ("hr-only.md", "None", "None", ("hr",))}
    for mode in ("lexical", "hybrid", "dense"):
        now = {h.source for h in s.search("信息披露办法 商业秘密", k=20, mode=mode, filters={"valid_at": "today"})}
        assert now and not now & {"expired.md", "future.md"}, mode
        then = {h.source for h in s.search("信息披露办法 商业秘密", k=20, mode=mode,
                                           filters={"valid_at": "2015-06-01"})}
        assert "expired.md" in then and "future.md" not in then and "public.md" not in then, mode
        recent = {h.source for h in s.search("商业秘密 保密 付款", k=20, mode=mode, filters={"year>=": 2024})}
        assert recent and recent <= {"legal-and-finance.md", "hr-only.md"}, mode
    # the same filters in SQL, values bound as parameters
    q = Analyzer.from_settings(indexed).query("信息披露办法 商业秘密").sql_text()
    rows = sources(conn, "SELECT source FROM corpusync.search_text(%s, 20, %s::jsonb)", q,
                   json.dumps(build_filter({"valid_at": "today", "year<": "2024"})))
    assert rows == {"public.md", "legal-only.md"}
    with pytest.raises(CorpusyncError, match="ISO date"):
        build_filter({"valid_at": "yesterday"})
    # a JSON null filter is no filter
    assert sources(conn, "SELECT source FROM corpusync.search_text(%s, 20, 'null'::jsonb)", q)


def test_bad_access_fields_quarantine_the_file_with_the_reason(prefect_harness, settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from flows.refresh import refresh

    corpus = tmp_path / "bad"
    corpus.mkdir()
    (corpus / "a.md").write_text("# A\n\n正文内容。", encoding="utf-8")
    (corpus / "a.md.meta.json").write_text(json.dumps({"valid_until": "next year"}), encoding="utf-8")
    (corpus / "b.md").write_text("# B\n\n正文内容。", encoding="utf-8")
    (corpus / "b.md.meta.json").write_text(json.dumps({"acl": [1, 2]}), encoding="utf-8")
    (corpus / "c.md").write_text("# C\n\n正文内容，一切正常。", encoding="utf-8")
    summary = refresh(str(corpus), settings=settings)
    reasons = {q["path"]: q["error"] for q in summary["quarantined"]}
    assert set(reasons) == {"a.md", "b.md"} and summary["published"]
    assert '"valid_until" must be an ISO date' in reasons["a.md"] and '"acl"' in reasons["b.md"]
