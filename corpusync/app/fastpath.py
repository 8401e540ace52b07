"""A refresh that has nothing to do, decided before a Prefect flow run is started.

Most scheduled refreshes find the corpus unchanged. Their stage work is milliseconds; what costs seconds is
starting Prefect's API server, importing the flow machinery and the parsers. So the CLI first compares the
folder with the published generation read-only (discover + diff, the same functions the flow uses); when
nothing changed it records the run under the writer lock exactly as the flow would (status no_changes, its
quarantine reports, prune) without a flow run. Any change at all goes through the flow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from corpusync.adapters.embedders import build_embedder
from corpusync.adapters.embedding import Embedder
from corpusync.app import build, pipeline
from corpusync.app.runtime import writer_session
from corpusync.store import generations, versions
from corpusync.store.db import open_database
from schemas.settings import Settings
from tasks import discover as discover_stage
from tasks.diff import RetryPolicy, diff


class _Configured:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.embedder: Embedder = build_embedder(settings)  # reads the model's files; loads no weights


class Checked(NamedTuple):
    """What the check found: the run's summary when nothing changed (recorded), else the folder as found."""

    summary: dict[str, Any] | None
    found: pipeline.Discovered | None


def looks_unchanged(settings: Settings, source: Path) -> tuple[bool, pipeline.Discovered | None]:
    """Whether the published generation already serves `source` as the pipeline would build it (nothing
    new, changed, deleted, or due for a retry), and the folder as found. Read-only: no lock, no run record."""
    with open_database(settings) as conn:
        published = generations.published_generation(conn)
        if not published:
            return False, None
        files, problems = discover_stage.discover(source, settings.include_globs, settings.exclude_globs)
        configured = _Configured(settings)
        plan = diff(files, versions.live_versions(conn, published), pipeline.pipeline_fingerprint(configured),
                    versions.latest_quarantine(conn), retry=RetryPolicy.from_settings(settings),
                    stage_fingerprints=pipeline.stage_fingerprints(configured),
                    unreadable={p.path for p in problems})
    unchanged = not (plan.new or plan.changed or plan.to_process or plan.deleted)
    return unchanged, pipeline.Discovered(files, problems)


def refresh_if_unchanged(settings: Settings, source: Path, *, allow_mass_delete: bool = False,
                         skip_gate: bool = False) -> Checked:
    """The run summary of a refresh that found nothing to do, recorded without a flow run; else no summary
    and the folder as found, for the caller to run the refresh flow (pipeline.discovered hands it on)."""
    unchanged, found = looks_unchanged(settings, source)
    if not unchanged:
        return Checked(None, found)
    with writer_session(settings, source, allow_mass_delete=allow_mass_delete, skip_gate=skip_gate) as ctx:
        plan = pipeline.step_diff(ctx, pipeline.step_discover(ctx))  # again, under the lock
        if plan.has_changes or plan.to_process:
            # the folder changed since the check: do the work here rather than leave the run half done
            try:
                generation = build.step_build(ctx, plan)
            finally:
                pipeline.release_workers()
            pipeline.step_evaluate(ctx, generation)
            pipeline.step_publish(ctx, generation)
        else:
            pipeline.step_publish(ctx, None)
        pipeline.step_prune(ctx)
    return Checked(ctx.summary.model_dump(), None)
