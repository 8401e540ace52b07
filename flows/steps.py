"""Thin Prefect @task wrappers around the refresh steps (retries off: a step is not blindly re-runnable
once it has written; the next refresh recovers instead). NO_CACHE: inputs hold live connections."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from corpusync import build as build_stage
from corpusync import pipeline
from corpusync.runtime import RefreshContext
from flows.artifacts import publish_evaluation
from schemas.records import DiffPlan


@task(name="discover", cache_policy=NO_CACHE)
def discover(ctx: RefreshContext) -> pipeline.Discovered:
    return pipeline.step_discover(ctx)


@task(name="diff", cache_policy=NO_CACHE)
def diff(ctx: RefreshContext, found: pipeline.Discovered) -> DiffPlan:
    return pipeline.step_diff(ctx, found)


@task(name="build", cache_policy=NO_CACHE)
def build(ctx: RefreshContext, plan: DiffPlan) -> int | None:
    """parse -> chunk -> embed -> validate -> load in bounded batches (corpusync/build.py)."""
    generation = build_stage.step_build(ctx, plan)
    if ctx.validation_report:
        create_markdown_artifact(ctx.validation_report, key="corpusync-validation",
                                 description="Chunk data-quality suite")
    return generation


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
