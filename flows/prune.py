"""The prune flow: `corpusync prune` as a Prefect deployment (corpusync-prune/prune).

Deletes rows outside the retention window under the writer lock (a refresh prunes too); parameters and
settings as in flows/refresh.py.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from corpusync.app.runtime import acquire_writer_lock
from corpusync.store.db import open_database
from flows.base import flow_settings, settings_flow
from schemas.params import LockTimeout


@settings_flow(name="corpusync-prune", log_prints=False)
def prune(
    retention_generations: Annotated[int | None, Field(ge=0)] = None,
    lock_timeout_s: LockTimeout = None,
) -> dict[str, int]:
    """Delete the versions, chunks and documents no retained generation shows any more.

    Args:
        retention_generations: Generations before the published one kept restorable; unset:
            CORPUSYNC_RETENTION_GENERATIONS.
        lock_timeout_s: Seconds to wait for a refresh's writer lock; unset: CORPUSYNC_LOCK_TIMEOUT_S.
    """
    from corpusync.app.pruning import prune as do_prune

    settings = flow_settings(retention_generations=retention_generations, lock_timeout_s=lock_timeout_s)
    with open_database(settings) as conn:
        acquire_writer_lock(conn, settings.lock_timeout_s)
        return do_prune(conn, settings)
