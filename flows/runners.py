"""The refresh flow's task runner, chosen by the settings when each flow run starts (CORPUSYNC_TASK_RUNNER):
Prefect's ThreadPoolTaskRunner, or prefect-dask's DaskTaskRunner on a cluster (CORPUSYNC_DASK_ADDRESS) or on a
local one started for the run. A flow decorated with SettingsTaskRunner() takes whichever the settings of the
process (or of the in-process caller) ask for, for the CLI and deployments alike: Prefect duplicates the
flow's runner at the start of every run, and that is where the choice is made."""

from __future__ import annotations

import logging
from typing import Any

from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from flows.base import caller_settings
from schemas.settings import Settings


def build_task_runner(settings: Settings) -> TaskRunner[Any]:
    """The runner the settings ask for (not started)."""
    if settings.task_runner == "threads":
        return ThreadPoolTaskRunner(max_workers=settings.task_workers)
    import dask
    from prefect_dask import DaskTaskRunner

    # a Dask worker is a daemon process by default, and a daemon may not start processes: the parse workers.
    # distributed logs every start and stop of its scheduler and workers at INFO: warnings only, here and in
    # the workers (which take the config with them)
    dask.config.set({"distributed.worker.daemon": False, "logging.distributed": "warning"})
    logging.getLogger("distributed").setLevel(logging.WARNING)
    if settings.dask_address:
        return DaskTaskRunner(address=settings.dask_address)
    return DaskTaskRunner(cluster_kwargs={"n_workers": settings.task_workers, "threads_per_worker": 1,
                                          "processes": True, "dashboard_address": ":0"})  # any free port


class SettingsTaskRunner(TaskRunner[Any]):
    """A placeholder for the flow decorator: duplicate(), which Prefect calls to start each run's runner,
    returns the runner the run's settings choose. It never runs a task itself."""

    def duplicate(self) -> TaskRunner[Any]:  # type: ignore[override]  # another class by design
        return build_task_runner(caller_settings())

    def submit(self, task: Any, parameters: dict[str, Any], wait_for: Any = None,
               dependencies: Any = None) -> Any:
        raise RuntimeError("SettingsTaskRunner only chooses the run's task runner (duplicate()); it runs nothing")


def close_pools_with_dask_workers(runner: TaskRunner[Any]) -> None:
    """On a Dask runner: have each worker stop the parse workers it started for batches when it closes. A
    worker's interpreter otherwise waits for the pool's threads, and its nanny kills it after 4 s."""
    client = getattr(runner, "client", None) if type(runner).__name__ == "DaskTaskRunner" else None
    if client is None:
        return
    from distributed.diagnostics.plugin import WorkerPlugin

    class ClosePools(WorkerPlugin):
        idempotent = True

        def teardown(self, worker: Any) -> None:
            from corpusync.app.fanout import close_pools

            close_pools()

    client.register_plugin(ClosePools(), name="corpusync-close-pools")

