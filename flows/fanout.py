"""The build mapped on the flow's task runner: the plan cut into batches of documents, each a `prepare-batch`
task run (parse, chunk, embed into the vector cache, wherever the runner puts it: a thread, a Dask worker on
another machine), retried after a transient fault. The flow, the one writer, takes each result as it
finishes (validate, load into the candidate) and publishes once, as a streamed build does: readers never see
a half-built generation, and a crash or a refusal leaves the embedded batches in the vector cache for the
next run. At most two batches per worker are in flight, so the results waiting for the writer are bounded."""

from __future__ import annotations

from collections import deque
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import psycopg
from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.context import FlowRunContext
from prefect.futures import PrefectFuture, as_completed

from corpusync.app import build as build_stage
from corpusync.app import fanout
from corpusync.app.runtime import RefreshContext
from corpusync.core import progress
from flows.runners import close_pools_with_dask_workers
from schemas.records import DiffPlan
from schemas.settings import Settings
from tasks.embed import is_oom


def transient(_task: Any, _run: Any, state: Any) -> bool:
    """Retry a batch after a fault that can pass (a dropped or refused database connection, out of memory),
    not after a bug or bad configuration, which would fail the same way again."""
    try:
        state.result()
    except (psycopg.OperationalError, MemoryError, ConnectionError, TimeoutError):
        return True
    except BaseException as exc:
        return is_oom(exc)
    return False


def prepare_batch(job: fanout.BatchJob) -> fanout.BatchResult:
    """Parse, chunk and embed one batch where the task runner runs it."""
    return fanout.prepare_batch(job)


def parse_batch(job: fanout.BatchJob) -> fanout.ChunkedBatch:
    """Parse and chunk one batch (on a worker with CORPUSYNC_DASK_PARSE_RESOURCES)."""
    return fanout.parse_batch(job)


def embed_batch(job: fanout.BatchJob, part: fanout.ChunkedBatch) -> fanout.BatchResult:
    """Embed one parsed batch (on a worker with CORPUSYNC_DASK_EMBED_RESOURCES: a GPU)."""
    return fanout.embed_chunked(job, part)


# The tasks under other names than their functions: a Dask worker unpickles a task's function by its
# qualified name, which must lead to the function, not to the Task.
prepare_batch_task = task(name="prepare-batch", cache_policy=NO_CACHE, retry_condition_fn=transient,
                          task_run_name="prepare-batch-{job.number}")(prepare_batch)
parse_batch_task = task(name="parse-batch", cache_policy=NO_CACHE, retry_condition_fn=transient,
                        task_run_name="parse-batch-{job.number}")(parse_batch)
embed_batch_task = task(name="embed-batch", cache_policy=NO_CACHE, retry_condition_fn=transient,
                        task_run_name="embed-batch-{job.number}")(embed_batch)


def _annotated(resources: dict[str, float]) -> AbstractContextManager[Any]:
    import dask

    return dask.annotate(resources=resources) if resources else nullcontext()


def _submit(settings: Settings, job: fanout.BatchJob) -> PrefectFuture[fanout.BatchResult]:
    """One batch on the task runner: one task, or with Dask worker resources two, parse then embed, each
    only on the workers that have its resources (CPU machines parse and OCR, a GPU machine embeds)."""
    retries, delay = settings.batch_retries, settings.batch_retry_delay_s
    if settings.task_runner != "dask" or not (settings.dask_parse_resources or settings.dask_embed_resources):
        return prepare_batch_task.with_options(retries=retries, retry_delay_seconds=delay).submit(job)
    with _annotated(settings.dask_parse_resources):
        part = parse_batch_task.with_options(retries=retries, retry_delay_seconds=delay).submit(job)
    with _annotated(settings.dask_embed_resources):
        return embed_batch_task.with_options(retries=retries, retry_delay_seconds=delay).submit(  # type: ignore[call-overload]
            job, part)  # Prefect hands the embed task the parse task's result


def builds_by_tasks(settings: Settings) -> bool:
    return settings.build_tasks or settings.task_runner == "dask"


def build_mapped(ctx: RefreshContext, plan: DiffPlan) -> int | None:
    """The candidate built from batch tasks on the flow's task runner; returns its number (None when nothing
    would change)."""
    s = ctx.settings
    todo = plan.to_process
    replaces = {src.path: live for src, live in plan.changed}
    validation = build_stage.Validation()
    size = s.build_batch_documents
    model_id = build_stage.register_model(ctx) if todo else 0
    jobs = deque(fanout.BatchJob(n, s, todo[i:i + size], model_id, ctx.reembed)
                 for n, i in enumerate(range(0, len(todo), size), start=1))
    run = FlowRunContext.get()
    if run is not None and run.task_runner is not None:
        close_pools_with_dask_workers(run.task_runner)
    in_flight: list[PrefectFuture[fanout.BatchResult]] = []
    workers: set[str] = set()
    with progress.stage("build", len(todo)) as bar:
        while jobs or in_flight:
            while jobs and len(in_flight) < 2 * s.task_workers:
                in_flight.append(_submit(s, jobs.popleft()))
            done = next(as_completed(in_flight))
            in_flight.remove(done)
            result = done.result()  # a batch that failed past its retries fails the run (the next recovers)
            workers.update((result.parsed_on, result.embedded_on))
            build_stage.load_prepared(ctx, result, replaces, validation)
            bar.advance(len(result.embedded) + len(result.failures))
    if len(workers) > 1:
        ctx.add_message(f"batches built on {len(workers)} workers: {', '.join(sorted(workers))}")
    return build_stage.finish_build(ctx, plan, validation)
