"""Python analytics on the real embedded PostgreSQL after a real refresh: SQLAlchemy Core objects for the
views and search functions, polars DataFrames, Parquet exports of chunks (`corpusync export`) and of
per-question evaluation results (`corpusync eval --parquet`)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from corpusync.app import analytics
from corpusync.app.analytics import documents_current, live_chunks, run_summary, search_text, to_polars
from corpusync.cli import main

REPO = Path(__file__).resolve().parent.parent


def test_urls_and_function_sql_without_a_database() -> None:
    assert analytics.sqlalchemy_url("postgresql://postgres:@/postgres?host=/tmp/pg") == \
        "postgresql+psycopg://postgres:@/postgres?host=/tmp/pg"
    assert analytics.sqlalchemy_url("postgres://u:p@h:5433/db").startswith("postgresql+psycopg://u:p@h:5433/")
    h = search_text("付款 方式", 5, {"type": "md"})
    sql = str(sa.select(h.c.source).select_from(h).compile(dialect=sa.dialects.postgresql.dialect()))
    assert "corpusync.search_text(" in sql and "AS hits" in sql and "付款" not in sql  # values are bound
    assert live_chunks.fullname == "corpusync.live_chunks"


@pytest.mark.db
@pytest.mark.flow
def test_compose_query_export_and_eval_parquet(
        prefect_harness, settings, corpus: Path, embedder, conn, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from flows.refresh import refresh

    summary = refresh(str(corpus), settings=settings)
    assert summary["published"] and summary["documents"]["new"] == 6
    eng = analytics.engine(settings)
    try:
        # --- live_chunks filtered by source_path, as a polars DataFrame
        stmt = (sa.select(live_chunks.c.chunk_id, live_chunks.c.ordinal, live_chunks.c.page_start,
                          live_chunks.c.section_path, live_chunks.c.chunk_config, live_chunks.c.model_name)
                .where(live_chunks.c.source_path == "docs/contract-terms.md")
                .order_by(live_chunks.c.ordinal))
        df = to_polars(stmt, eng)
        expected = [r[0] for r in conn.execute(
            "SELECT chunk_id FROM corpusync.live_chunks WHERE source_path = 'docs/contract-terms.md' "
            "ORDER BY ordinal").fetchall()]
        assert isinstance(df, pl.DataFrame) and expected
        assert df.columns == ["chunk_id", "ordinal", "page_start", "section_path", "chunk_config", "model_name"]
        assert df["chunk_id"].to_list() == expected
        assert df["ordinal"].to_list() == sorted(df["ordinal"].to_list())
        assert df.schema["section_path"] == pl.List(pl.String)
        assert isinstance(json.loads(df["chunk_config"][0]), dict)

        # --- BM25 hits (a table-valued function) joined to documents_current, aggregated in SQL
        h = search_text("付款 方式", 5)
        joined = (sa.select(h.c.chunk_id, h.c.source, h.c.score, h.c.text, documents_current.c.status,
                            documents_current.c.content_sha256, documents_current.c.parser)
                  .select_from(h.join(documents_current, documents_current.c.path == h.c.source))
                  .order_by(h.c.score.desc()))
        hits = to_polars(joined, eng)
        assert 1 <= hits.height <= 5
        assert hits["source"][0] == "docs/contract-terms.md" and "付款方式" in hits["text"][0]
        assert set(hits["status"].to_list()) == {"live"}
        assert hits["content_sha256"].null_count() == 0
        direct = [r[0] for r in conn.execute(
            "SELECT chunk_id FROM corpusync.search_text('付款 方式', 5) ORDER BY score DESC").fetchall()]
        assert hits["chunk_id"].to_list() == direct
        en = search_text("付款 方式 super bowl", 5, {"path": "en/"}, name="en_hits")  # the filter is bound jsonb
        en_sources = to_polars(sa.select(en.c.source).select_from(en), eng)["source"].to_list()
        assert en_sources and all(src.startswith("en/") for src in en_sources)
        with eng.connect() as c:  # composes with other tables and aggregates too
            per_source = c.execute(sa.select(live_chunks.c.source_path, sa.func.count())
                                   .group_by(live_chunks.c.source_path)).all()
            runs = c.execute(sa.select(run_summary.c.status, run_summary.c.docs_new)).all()
        counts = {str(src): int(n) for src, n in per_source}
        assert counts["docs/contract-terms.md"] == len(expected)
        assert ("published", 6) in runs
    finally:
        eng.dispose()

    # --- Parquet export: library and CLI (the CLI reads its Settings from the environment)
    live = conn.execute("SELECT count(*) FROM corpusync.live_chunks").fetchone()[0]
    dim = conn.execute("SELECT m.dimension FROM corpusync.index_state s JOIN corpusync.embedding_models m "
                       "ON m.id = s.model_id").fetchone()[0]
    done = analytics.export_parquet(conn, tmp_path / "lib.parquet", batch_size=7)  # several batches
    t = pq.read_table(tmp_path / "lib.parquet")
    assert done["rows"] == t.num_rows == live and live > 7
    assert "dense" not in t.column_names and t.column_names[:3] == ["chunk_id", "document_id", "version_id"]
    assert sorted(t.column("chunk_id").to_pylist()) == sorted(
        r[0] for r in conn.execute("SELECT chunk_id FROM corpusync.live_chunks").fetchall())
    assert {"source_path", "content_sha256", "parser_version", "model_name", "run_id", "gen_from"} <= set(
        t.column_names)
    assert not list(tmp_path.glob("*.partial"))

    monkeypatch.setenv("CORPUSYNC_HOME", str(settings.home))
    monkeypatch.setenv("CORPUSYNC_DATABASE_URL", settings.database_dsn())
    monkeypatch.setenv("CORPUSYNC_CHUNK_MAX_TOKENS", str(settings.chunk_max_tokens))
    out = tmp_path / "out" / "chunks.parquet"
    assert main(["export", str(out), "--vectors"]) == 0
    tv = pq.read_table(out)
    assert tv.num_rows == live
    dense_type = tv.schema.field("dense").type
    assert pa.types.is_list(dense_type) and dense_type.value_type == pa.float32()
    assert {len(v) for v in tv.column("dense").to_pylist()} == {dim}
    assert tv.schema.metadata[b"corpusync.dimension"] == str(dim).encode()
    assert main(["export", str(tmp_path / "g1.parquet"), "--generation", "1"]) == 0
    assert pq.read_table(tmp_path / "g1.parquet").num_rows == live
    assert main(["export", str(tmp_path / "g9.parquet"), "--generation", "9"]) != 0
    assert not (tmp_path / "g9.parquet").exists()
    capsys.readouterr()

    # --- eval --json --parquet: one row per (gold set, mode, question)
    present = {p.relative_to(corpus).as_posix() for p in corpus.rglob("*") if p.is_file()}
    lines = [ln for ln in (REPO / "examples" / "goldset.jsonl").read_text().splitlines()
             if json.loads(ln)["gold_document"] in present][:4]
    gold = tmp_path / "gold.jsonl"
    gold.write_text("\n".join(lines) + "\n")
    pq_path = tmp_path / "eval.parquet"
    assert main(["eval", "--goldset", str(gold), "--json", "--parquet", str(pq_path)]) == 0
    report = json.loads(capsys.readouterr().out)  # the JSON stays clean: the Parquet note goes to stderr
    ev = pq.read_table(pq_path)
    modes = report[0]["modes"]
    assert ev.num_rows == len(lines) * len(modes) and ev.num_rows > 0
    rows = ev.to_pylist()
    assert {r["question_id"] for r in rows} == {json.loads(ln)["id"] for ln in lines}
    assert {r["mode"] for r in rows} == set(modes)
    metric_cols = [c for c in ev.column_names if "@" in c]
    assert any(c.startswith("recall@") for c in metric_cols) and "mrr@10" in metric_cols
    for mode in modes:  # the per-question scores average to the reported metrics
        mine = [r for r in rows if r["mode"] == mode]
        for metric in ("mrr@10", next(c for c in metric_cols if c.startswith("recall@"))):
            if metric in report[0]["metrics"][mode]:
                mean = sum(r[metric] for r in mine) / len(mine)
                assert mean == pytest.approx(report[0]["metrics"][mode][metric], abs=1e-3), (mode, metric)
    assert all(isinstance(r["retrieved"], list) and r["retrieved"] for r in rows)
    assert all(r["first_rank"] is None or r["retrieved"] for r in rows)
    assert ev.schema.field("retrieved").type.value_type.bit_width == 64
    assert {r["goldset"] for r in rows} == {report[0]["goldset"]}
