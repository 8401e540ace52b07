"""The writer session of a refresh: single-writer lock, run record, crash recovery, summary, finalisation.

The flow (flows/refresh.py) only wires tasks; this is the state those tasks share.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from typing import Any

import psycopg

from corpusync import __version__
from corpusync.adapters.embedders import FlagEmbedder, build_embedder
from corpusync.core.errors import EvalGateFailed, MassDeleteRefused, ModelMismatch, WriterBusy
from corpusync.store import generations, runs
from corpusync.store.db import open_database
from schemas.records import RunSummary
from schemas.settings import Settings, config_hash

log = logging.getLogger("corpusync.refresh")


@cache
def code_version() -> str:
    """Package version plus the git commit when running from a checkout."""
    here = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--short=12", "HEAD"],
            capture_output=True, text=True, timeout=5, check=False,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        commit = ""
    return f"{__version__}+{commit}" if commit else __version__


@dataclass
class RefreshContext:
    settings: Settings
    conn: psycopg.Connection
    run_id: int
    source_root: Path
    base_generation: int
    published_model_id: int | None
    published_model_label: str
    summary: RunSummary
    allow_mass_delete: bool = False
    reembed: bool = False
    skip_gate: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    model_id: int | None = None
    generation: int | None = None
    evaluation_report: str = ""
    validation_report: str = ""
    loaded_paths: set[str] = field(default_factory=set)  # documents loaded into the candidate so far
    started: float = field(default_factory=time.monotonic)

    @cached_property
    def embedder(self) -> FlagEmbedder:
        return build_embedder(self.settings)

    def timed(self, stage: str) -> AbstractContextManager[None]:
        return timed(self.timings, stage)

    def add_message(self, text: str | None) -> None:
        """Append to the run summary's message (once: a repeat is not appended again)."""
        if text and text not in self.summary.message:
            self.summary.message = "; ".join(m for m in (self.summary.message, text) if m)


@contextmanager
def timed(timings: dict[str, float], stage: str) -> Iterator[None]:
    """Add the seconds the block takes to timings[stage]."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        timings[stage] = round(timings.get(stage, 0.0) + time.perf_counter() - t0, 4)


def acquire_writer_lock(conn: psycopg.Connection, timeout_s: float) -> None:
    """Session-level advisory lock held for the whole refresh; released by PostgreSQL if we die."""
    deadline = time.monotonic() + timeout_s
    waiting = False
    while True:
        if runs.try_writer_lock(conn):
            return
        if not waiting and timeout_s > 0:
            waiting = True
            log.warning("another writer holds the lock of this index; waiting up to %.0f s for it", timeout_s)
        if time.monotonic() >= deadline:
            holder = runs.running_run(conn)
            who = (f" (run {holder[0]} started {holder[1]:%Y-%m-%d %H:%M:%S} on {holder[2]}, pid {holder[3]})"
                   if holder else "")
            longer = f" longer than {timeout_s:g} s" if timeout_s > 0 else ""
            raise WriterBusy(
                f"another refresh is writing to this index{who}; only one writer at a time. "
                "Wait for it to finish, or set CORPUSYNC_LOCK_TIMEOUT_S (a deployment's lock_timeout_s parameter) "
                f"to wait for the lock{longer}."
            )
        time.sleep(min(0.5, max(deadline - time.monotonic(), 0.01)))


@contextmanager
def writer_session(
    settings: Settings,
    source: Path,
    *,
    allow_mass_delete: bool = False,
    reembed: bool = False,
    skip_gate: bool = False,
    prefect_flow_run_id: str | None = None,
) -> Iterator[RefreshContext]:
    """Lock, record the run, recover from crashed candidates; on exit, finalise the run record."""
    from corpusync.store.runs import recover

    conn = open_database(settings)
    try:
        acquire_writer_lock(conn, settings.lock_timeout_s)
        state = generations.index_state(conn)
        assert state is not None
        config = settings.lineage_config() | {"allow_mass_delete": allow_mass_delete, "reembed": reembed,
                                              "skip_gate": skip_gate}
        run_id = runs.start_run(
            conn, kind="refresh", source_root=str(source.resolve()), config=config,
            config_hash=config_hash(config), code_version=code_version(),
            base_generation=state["published_generation"], model_id=state["model_id"],
            prefect_flow_run_id=prefect_flow_run_id, hostname=socket.gethostname(), pid=os.getpid())
        base = int(state["published_generation"])
        ctx = RefreshContext(
            settings=settings, conn=conn, run_id=run_id, source_root=source, base_generation=base,
            published_model_id=state["model_id"],
            published_model_label=f"{state['model_name']} ({state['dimension']}-d)" if state["model_id"] else "",
            summary=RunSummary(run_id=run_id, status="running", generation=base, published=False,
                               base_generation=base),
            allow_mass_delete=allow_mass_delete, reembed=reembed, skip_gate=skip_gate,
        )
        recovered = recover(conn, run_id)
        finished = recovered.pop("runs_finished_after_publish")
        if finished:
            log.warning("a previous run died after publishing, before recording its end; it is now recorded as "
                        "published")
        if recovered["runs_marked_crashed"]:  # a run died: say what was undone
            ctx.summary.message = "recovered from an interrupted run: " + ", ".join(
                f"{k}={v}" for k, v in recovered.items() if v)
        elif any(recovered.values()):  # routine: the rows of a refused or rolled-back candidate are let go
            log.info("cleared unpublished generations' rows: %s",
                     ", ".join(f"{k}={v}" for k, v in recovered.items() if v))
        try:
            yield ctx
        except Exception as exc:
            refused = isinstance(exc, MassDeleteRefused | ModelMismatch | EvalGateFailed)
            try:
                _finish(ctx, "refused" if refused else "failed",
                        str(exc) if isinstance(exc, MassDeleteRefused) else f"{type(exc).__name__}: {exc}")
            except psycopg.Error as lost:  # the database went away too: the next run records this one as crashed
                log.warning("could not record the end of run %s: %s", ctx.run_id, lost)
            exc.summary = ctx.summary.model_dump()  # type: ignore[attr-defined]  # the CLI's --json reports it
            raise
        else:
            _finish(ctx, ctx.summary.status, ctx.summary.message)
    finally:
        conn.close()  # also releases the advisory lock


def _finish(ctx: RefreshContext, status: str, message: str) -> None:
    s = ctx.summary
    s.status = status
    s.message = message
    s.timings = dict(ctx.timings)
    s.elapsed_s = round(time.monotonic() - ctx.started, 3)
    s.candidate_generation = ctx.generation
    if ctx.generation is not None and not s.published and status in {"failed", "refused"}:
        try:
            generations.mark_generation(ctx.conn, ctx.generation, "refused" if status == "refused" else "discarded")
        except psycopg.Error:
            ctx.conn.rollback()
    counts: dict[str, Any] = {"documents": s.documents.model_dump(), "chunks": s.chunks.model_dump(),
                              "quarantined": s.quarantined, "renamed": s.renamed,
                              "evaluation": s.evaluation, "validation": s.validation}
    runs.finish_run(ctx.conn, ctx.run_id, status=status, generation=s.generation, published=s.published,
                    counts=counts, timings=s.timings, message=message or None)
