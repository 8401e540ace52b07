"""The rollback flow: `corpusync rollback` as a Prefect deployment (corpusync-rollback/rollback).

Makes the previous retained generation live again (one UPDATE); settings as in flows/refresh.py.
"""

from __future__ import annotations

from corpusync.store.db import open_database
from flows.base import flow_settings, settings_flow


@settings_flow(name="corpusync-rollback", log_prints=False)
def rollback() -> dict[str, int]:
    """Make the previous generation live again; fails (RollbackError) when no earlier one is retained."""
    from corpusync.store.generations import rollback as do_rollback

    with open_database(flow_settings()) as conn:
        before, after = do_rollback(conn)
    return {"from_generation": before, "to_generation": after}
