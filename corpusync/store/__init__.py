"""The data-access layer: every SQL statement the code runs against corpusync's schema is a function here.

Each function takes a psycopg.Connection and typed arguments and returns typed records or plain values; its
statements are named queries in sql/queries/ (corpusync.store.db.q / fetch_one / fetch_all / execute). Where a
step must be atomic the transaction is opened here (`with conn.transaction()`), so callers (the refresh
steps in corpusync.app.pipeline, the CLI, flows, query) never write SQL. tasks/ never imports this package: the
stages stay pure; this package may use their pure helpers (tasks.load's COPY encoders, tasks.diff's
quarantine record, tasks.discover's access columns), never the reverse (tests/test_layout.py).

Modules import nothing here on purpose: `from corpusync.store import runs` loads only what it needs.
"""
