"""The refresh flow: discover -> diff -> build (parse -> chunk -> embed -> validate -> load, streamed in
bounded batches) -> evaluate -> publish -> prune.

Run it as `corpusync refresh PATH`, `python -m flows.refresh PATH`, or as a Prefect deployment (prefect.yaml,
README "Deployments"). Its parameters are public and typed (schemas/params.py); settings, secrets included,
come from the environment of the process that runs it. An in-process caller (the CLI, tests) may hand over a
Settings object, `refresh(path, settings=s)`: SettingsFlow takes it off the call before Prefect sees the
parameters, so it is neither stored with the flow run nor advertised by a deployment.

The pull step of every deployment (`enter_checkout`) and the flow base class are in flows/base.py.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from corpusync.core.offline import apply_offline_defaults

apply_offline_defaults()

from prefect.runtime import flow_run  # noqa: E402

from corpusync.app import pipeline  # noqa: E402
from corpusync.app.runtime import writer_session  # noqa: E402
from flows import fanout  # noqa: E402
from flows import steps as t  # noqa: E402
from flows.artifacts import publish_run_summary, tag_run  # noqa: E402
from flows.base import flow_settings, settings_flow  # noqa: E402
from flows.runners import SettingsTaskRunner  # noqa: E402
from schemas.params import (  # noqa: E402
    Floors,
    GoldSets,
    LockTimeout,
    Questions,
    Source,
    Tolerances,
)


@settings_flow(name="corpusync-refresh", log_prints=False, persist_result=True, result_serializer="json",
               task_runner=SettingsTaskRunner())
def refresh(
    source: Source,
    allow_mass_delete: bool = False,
    reembed: bool = False,
    skip_gate: bool = False,
    goldsets: GoldSets = None,
    gate_tolerances: Tolerances = None,
    gate_floors: Floors = None,
    eval_max_questions: Questions = None,
    lock_timeout_s: LockTimeout = None,
) -> dict[str, Any]:
    """Bring the index in step with the folder `source`; publish the new generation if anything changed.

    Args:
        source: Folder of documents to index (absolute, or relative to the checkout the worker runs in).
        allow_mass_delete: Publish even if the refresh removes more than CORPUSYNC_MAX_DELETE_FRACTION of the
            live documents (an unmounted folder looks empty).
        reembed: Embed every document again with the configured model.
        skip_gate: Publish even if the evaluation gate finds a regression (recorded with the run).
        goldsets: Gold sets evaluated before publishing (paths or names); unset: CORPUSYNC_GOLDSETS.
        gate_tolerances: Tolerated drop per metric ('metric' or 'goldset:metric'); unset:
            CORPUSYNC_GATE_TOLERANCES.
        gate_floors: Absolute minimum per metric; unset: CORPUSYNC_GATE_FLOORS.
        eval_max_questions: Evaluate at most this many questions per gold set; unset:
            CORPUSYNC_EVAL_MAX_QUESTIONS.
        lock_timeout_s: Seconds to wait for another refresh's writer lock before failing; unset:
            CORPUSYNC_LOCK_TIMEOUT_S.
    """
    settings = flow_settings(goldsets=goldsets, gate_tolerances=gate_tolerances, gate_floors=gate_floors,
                             eval_max_questions=eval_max_questions, lock_timeout_s=lock_timeout_s)
    tag_run(["corpusync", f"source:{Path(source).name or source}",
             *(f"goldset:{Path(g).stem}" for g in settings.goldsets)])
    try:
        with writer_session(settings, Path(source), allow_mass_delete=allow_mass_delete, reembed=reembed,
                            skip_gate=skip_gate, prefect_flow_run_id=flow_run.get_id()) as ctx:
            found = t.discover(ctx)
            plan = t.diff(ctx, found)
            if plan.to_process:  # tokenizer, torch, great_expectations load while parsing runs
                pipeline.warm_up(ctx.embedder, validate=settings.validate_chunks,
                                 model=settings.task_runner != "dask")  # Dask workers load theirs
            mapped = fanout.builds_by_tasks(settings)
            generation = t.build_mapped(ctx, plan) if mapped else t.build(ctx, plan)
            pipeline.release_workers()  # validation is done: the worker idles through the gate
            t.evaluate(ctx, generation)
            t.publish(ctx, generation)
            t.prune(ctx)
    except Exception as exc:  # refused or failed: the summary still shows in Prefect
        summary = getattr(exc, "summary", None)
        if isinstance(summary, dict):
            publish_run_summary(summary)
        raise
    finally:
        pipeline.release_workers()
    publish_run_summary(ctx.summary.model_dump())
    return ctx.summary.model_dump()


if __name__ == "__main__":  # `python -m flows.refresh PATH`: the flow alone (`corpusync refresh` is the CLI)
    import json

    print(json.dumps(refresh(sys.argv[1]), ensure_ascii=False, indent=2, default=str))
