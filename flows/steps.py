"""Thin Prefect @task wrappers around the refresh steps (retries off: a step is not blindly re-runnable
once it has written; the next refresh recovers instead). NO_CACHE: inputs hold live connections."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from corpusync import pipeline
from corpusync.runtime import RefreshContext
from flows.artifacts import publish_evaluation
from schemas.records import ChunkedDocument, DiffPlan, EmbeddedDocument, ParsedDocument


@task(name="discover", cache_policy=NO_CACHE)
def discover(ctx: RefreshContext) -> pipeline.Discovered:
    return pipeline.step_discover(ctx)


@task(name="diff", cache_policy=NO_CACHE)
def diff(ctx: RefreshContext, found: pipeline.Discovered) -> DiffPlan:
    return pipeline.step_diff(ctx, found)


@task(name="parse", cache_policy=NO_CACHE)
def parse(ctx: RefreshContext, plan: DiffPlan) -> list[ParsedDocument]:
    return pipeline.step_parse(ctx, plan)


@task(name="chunk", cache_policy=NO_CACHE)
def chunk(ctx: RefreshContext, parsed: list[ParsedDocument], plan: DiffPlan) -> list[ChunkedDocument]:
    return pipeline.step_chunk(ctx, parsed, plan)


@task(name="embed", cache_policy=NO_CACHE)
def embed(ctx: RefreshContext, chunked: list[ChunkedDocument]) -> list[EmbeddedDocument]:
    return pipeline.step_embed(ctx, chunked)


@task(name="validate", cache_policy=NO_CACHE)
def validate(ctx: RefreshContext, embedded: list[EmbeddedDocument]) -> list[EmbeddedDocument]:
    passed, report = pipeline.step_validate(ctx, embedded)
    if report:
        create_markdown_artifact(report, key="corpusync-validation", description="Chunk data-quality suite")
    return passed


@task(name="load", cache_policy=NO_CACHE)
def load(ctx: RefreshContext, embedded: list[EmbeddedDocument], plan: DiffPlan) -> int | None:
    return pipeline.step_load(ctx, embedded, plan)


@task(name="evaluate", cache_policy=NO_CACHE)
def evaluate(ctx: RefreshContext, generation: int | None) -> None:
    try:
        pipeline.step_evaluate(ctx, generation)
    finally:  # the report inline, also when the gate refused the candidate
        if ctx.evaluation_report:
            publish_evaluation(ctx.evaluation_report,
                               refused=any(e.get("passed") is False for e in ctx.summary.evaluation))


@task(name="publish", cache_policy=NO_CACHE)
def publish(ctx: RefreshContext, generation: int | None) -> None:
    pipeline.step_publish(ctx, generation)


@task(name="prune", cache_policy=NO_CACHE)
def prune(ctx: RefreshContext) -> None:
    pipeline.step_prune(ctx)
