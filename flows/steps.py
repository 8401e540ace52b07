"""Thin Prefect @task wrappers around the refresh steps (retries off: a step is not blindly re-runnable
once it has written; the next refresh recovers instead). NO_CACHE: inputs hold live connections."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from corpusync.app import build as build_stage
from corpusync.app import pipeline
from corpusync.app.runtime import RefreshContext
from flows import fanout
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
    """parse -> chunk -> embed -> validate -> load in bounded batches, streamed in this process
    (corpusync/app/build.py)."""
    generation = build_stage.step_build(ctx, plan)
    publish_validation(ctx)
    return generation


def build_mapped(ctx: RefreshContext, plan: DiffPlan) -> int | None:
    """The same build, its batches mapped on the flow's task runner (flows/fanout.py). Called from the flow
    itself: a task's context (here, its live connection) would travel with every task it submits."""
    generation = fanout.build_mapped(ctx, plan)
    publish_validation(ctx)
    return generation


def publish_validation(ctx: RefreshContext) -> None:
    if ctx.validation_report:
        create_markdown_artifact(ctx.validation_report, key="corpusync-validation",
                                 description="Chunk data-quality suite")


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
