"""Documented in the database: every table, view, function and column in schema corpusync has a comment
(sql/views/090_comments.sql and the comments of the migrations and view files)."""

from __future__ import annotations

MISSING_RELATIONS = """
SELECT c.relname
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'corpusync' AND c.relkind IN ('r', 'p', 'v', 'm')
  AND coalesce(btrim(obj_description(c.oid, 'pg_class')), '') = ''
ORDER BY 1"""

COLUMNS = """
SELECT c.relname, a.attname, coalesce(btrim(col_description(c.oid, a.attnum)), '') <> '' AS commented
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid
WHERE n.nspname = 'corpusync' AND c.relkind IN ('r', 'p', 'v', 'm') AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY 1, a.attnum"""

# functions of the schema, not those an extension installed there
MISSING_FUNCTIONS = """
SELECT p.oid::regprocedure::text
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'corpusync'
  AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                  AND d.deptype = 'e')
  AND coalesce(btrim(obj_description(p.oid, 'pg_proc')), '') = ''
ORDER BY 1"""


def test_every_relation_column_and_function_has_a_comment(conn) -> None:  # type: ignore[no-untyped-def]
    relations = [r[0] for r in conn.execute(MISSING_RELATIONS).fetchall()]
    columns = conn.execute(COLUMNS).fetchall()
    functions = [r[0] for r in conn.execute(MISSING_FUNCTIONS).fetchall()]
    missing_columns = [f"{rel}.{col}" for rel, col, ok in columns if not ok]
    assert len(columns) > 150  # every table and view of the schema was looked at
    problems = []
    if relations:
        problems.append("tables/views without a comment: " + ", ".join(relations))
    if missing_columns:
        problems.append(f"columns without a comment ({len(missing_columns)} of {len(columns)}): "
                        + ", ".join(missing_columns))
    if functions:
        problems.append("functions without a comment: " + ", ".join(functions))
    assert not problems, "add them to sql/views/090_comments.sql:\n" + "\n".join(problems)


def test_comments_survive_reapplying_the_views(conn) -> None:  # type: ignore[no-untyped-def]
    """The views folder is re-applied on an upgrade: the comments come back with it, guarded DO blocks and all."""
    from corpusync.store import migrations

    with conn.transaction():
        for view in sorted(migrations.VIEWS_DIR.glob("*.sql")):
            conn.execute(view.read_text())
    assert conn.execute(MISSING_FUNCTIONS).fetchall() == []
    assert conn.execute(MISSING_RELATIONS).fetchall() == []
    undocumented = [r for r in conn.execute(COLUMNS).fetchall() if not r[2]]
    assert undocumented == []
