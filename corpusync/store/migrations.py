"""Migrations and views: numbered files in sql/migrations/ applied once each and never changed after they
land (their sha256 in sql/migrations.lock and in the database), and the re-appliable views and functions of
sql/views/, applied only when their files change. The bookkeeping SQL here is the one place outside
sql/queries/ that holds statements: it runs before any named query can (tests/test_layout.py)."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import psycopg

from corpusync.core.errors import MigrationError

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"
MIGRATIONS_DIR = SQL_DIR / "migrations"
VIEWS_DIR = SQL_DIR / "views"
MIGRATION_LOCK = SQL_DIR / "migrations.lock"

MIGRATE_LOCK_KEY = 0x436F7270_0001  # advisory lock (arbitrary, fixed) held while migrating

_MIGRATION_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


def list_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    found = []
    for path in sorted(directory.glob("*.sql")):
        m = _MIGRATION_NAME.match(path.name)
        if not m:
            raise MigrationError(f"migration file {path.name} does not match NNNN_name.sql")
        found.append(Migration(int(m.group(1)), path.name, path))
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise MigrationError(f"migrations must be numbered 1..n without gaps, found {versions}")
    return found


def views_checksum() -> str:
    """One sha256 over every re-appliable view/function file (names and contents, in order)."""
    return _view_files()[1]


def _view_files() -> tuple[list[str], str]:
    """The view/function files' texts in order, and their checksum: read once, so the checksum an upgrade
    stores is the one of the texts it applied (a file changed in between cannot pass as applied)."""
    texts, h = [], hashlib.sha256()
    for view in sorted(VIEWS_DIR.glob("*.sql")):
        data = view.read_bytes()
        h.update(view.name.encode() + b"\0" + data + b"\0")
        texts.append(data.decode())
    return texts, h.hexdigest()


def _up_to_date(conn: psycopg.Connection) -> bool:
    """Whether every migration is applied with its file's checksum and the views are the files' (plain
    SELECTs: a command on an up-to-date schema runs no DDL and takes no lock analysts' sessions would feel)."""
    tables = conn.execute("SELECT to_regclass('public.corpusync_migrations'), "
                          "to_regclass('public.corpusync_views')").fetchone()
    if tables is None or tables[0] is None or tables[1] is None:
        return False
    done: dict[str, str] = dict(conn.execute("SELECT name, checksum FROM public.corpusync_migrations").fetchall())
    if done != {m.name: m.checksum for m in list_migrations()}:
        return False
    row = conn.execute("SELECT checksum FROM public.corpusync_views").fetchone()
    return row is not None and row[0] == views_checksum()


_DEPENDENTS = """
SELECT DISTINCT dn.nspname || '.' || dc.relname
FROM pg_depend d
JOIN pg_rewrite r ON r.oid = d.objid
JOIN pg_class dc ON dc.oid = r.ev_class
JOIN pg_namespace dn ON dn.oid = dc.relnamespace
JOIN pg_class sc ON sc.oid = d.refobjid
JOIN pg_namespace sn ON sn.oid = sc.relnamespace
WHERE d.classid = 'pg_rewrite'::regclass AND sn.nspname = 'corpusync' AND dn.nspname <> 'corpusync'
  AND sc.relkind = 'v'
ORDER BY 1"""


def migrate(conn: psycopg.Connection) -> list[str]:
    """Apply pending migrations (each in its own transaction) and, when their files changed, the views and
    functions. Idempotent, and on an up-to-date schema it only reads: no DDL, no lock.

    A migration that was applied with a different checksum than the file now has is an error: landed
    migrations are immutable. Views are re-created only when sql/views/ changed (an upgrade); that drops
    objects users built on them, which is logged by name.
    """
    from pgvector.psycopg import register_vector

    if _up_to_date(conn):
        register_vector(conn)
        return []
    applied: list[str] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK_KEY,))
        conn.execute(
            """CREATE TABLE IF NOT EXISTS public.corpusync_migrations (
                   version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        done = {
            row[0]: (row[1], row[2])
            for row in conn.execute("SELECT version, name, checksum FROM public.corpusync_migrations")
        }
        for mig in list_migrations():
            if mig.version in done:
                _name, checksum = done[mig.version]
                if checksum != mig.checksum:
                    raise MigrationError(
                        f"migration {mig.name} was applied with checksum {checksum[:12]} but the file now "
                        f"has {mig.checksum[:12]}: landed migrations must never change; add a new one"
                    )
                continue
            conn.execute(mig.path.read_text())
            conn.execute(
                "INSERT INTO public.corpusync_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                (mig.version, mig.name, mig.checksum),
            )
            applied.append(mig.name)
        conn.execute("""CREATE TABLE IF NOT EXISTS public.corpusync_views (
                            singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton), checksum text NOT NULL,
                            applied_at timestamptz NOT NULL DEFAULT now())""")
        row = conn.execute("SELECT checksum FROM public.corpusync_views").fetchone()
        view_texts, checksum = _view_files()
        if row is None or row[0] != checksum:
            dropped = [r[0] for r in conn.execute(_DEPENDENTS).fetchall()]
            if dropped:
                log.warning(
                    "upgrading corpusync's views drops these objects built on them: %s; re-create them (and "
                    "grants on corpusync views) afterwards", ", ".join(dropped))
            for text in view_texts:
                conn.execute(text)
            conn.execute("INSERT INTO public.corpusync_views (checksum) VALUES (%s) ON CONFLICT (singleton) "
                         "DO UPDATE SET checksum = excluded.checksum, applied_at = now()", (checksum,))
    register_vector(conn)
    return applied


def lock_entries() -> dict[str, str]:
    return {m.name: m.checksum for m in list_migrations()}


if __name__ == "__main__":  # python -m corpusync.store.migrations --lock: record checksums of a NEW migration
    import sys

    if sys.argv[1:] == ["--lock"]:
        current = json.loads(MIGRATION_LOCK.read_text()) if MIGRATION_LOCK.exists() else {}
        entries = lock_entries()
        changed = [n for n in current if n in entries and current[n] != entries[n]]
        if changed:
            sys.exit(f"refusing to re-lock landed migrations whose content changed: {', '.join(changed)}")
        MIGRATION_LOCK.write_text(json.dumps(entries, indent=2) + "\n")
        print(f"locked {len(entries)} migrations")
