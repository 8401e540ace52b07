"""The build mapped as Prefect tasks (flows/fanout.py). On a local Dask cluster of two worker processes
(prefect-dask's DaskTaskRunner, connected by address) whose workers have different resources (CPU, GPU), a
refresh publishes the same live index as the default streamed build; parsing runs only on the CPU worker and
embedding only on the GPU worker (the only process that loads the model). On the threads runner a batch
whose database connection drops is retried and the run publishes the same index; a batch that fails for
good fails the run after one attempt, and the live generation stays as it was. The settings choose the
flow's task runner."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest

from corpusync.app import fanout
from tests.conftest import make_settings, new_database, small_corpus

pytestmark = [pytest.mark.flow, pytest.mark.db]

LIVE = """SELECT v.source_path, c.ordinal, c.text, c.text_sha256, c.search_text, c.token_count, c.dense::real[]
          FROM corpusync.document_versions v JOIN corpusync.chunks c ON c.version_id = v.id
          WHERE corpusync.visible_in(v.gen_from, v.gen_to, corpusync.published_generation())
          ORDER BY v.source_path, c.ordinal"""


def refresh(settings: Any, corpus: Path) -> dict[str, Any]:
    from flows.refresh import refresh as flow

    result: dict[str, Any] = flow(str(corpus), settings=settings)
    return result


def live(url: str) -> tuple[list[tuple[Any, ...]], np.ndarray]:
    """The published chunks (everything but the vectors) and their dense vectors."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(LIVE).fetchall()
    return [r[:-1] for r in rows], np.array([r[-1] for r in rows], dtype=np.float32)


def assert_same_index(got: tuple[list[tuple[Any, ...]], np.ndarray],
                      want: tuple[list[tuple[Any, ...]], np.ndarray]) -> None:
    assert got[0] == want[0]
    assert got[1].shape == want[1].shape
    np.testing.assert_allclose(got[1], want[1], atol=2e-3)  # halfvec storage; batch padding differs


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, pg_server: str, template_db: str
              ) -> Any:
    """The sample corpus indexed by the default build (streamed, threads runner)."""
    root = tmp_path_factory.mktemp("fanout-ref")
    corpus = small_corpus(root / "corpus")
    with new_database(pg_server, template_db) as url:
        summary = refresh(make_settings(root / "home", url), corpus)
        assert summary["published"]
        yield corpus, live(url)


def test_the_settings_choose_the_flows_task_runner(tmp_path: Path) -> None:
    from prefect.task_runners import ThreadPoolTaskRunner
    from prefect_dask import DaskTaskRunner

    from flows.runners import build_task_runner
    from schemas.settings import Settings

    base = Settings(home=tmp_path)
    threads = build_task_runner(base.model_copy(update={"task_workers": 3}))
    assert isinstance(threads, ThreadPoolTaskRunner) and threads._max_workers == 3
    local = build_task_runner(base.model_copy(update={"task_runner": "dask"}))
    assert isinstance(local, DaskTaskRunner) and local.address is None
    assert local.cluster_kwargs["n_workers"] == 2 and local.cluster_kwargs["processes"] is True
    remote = build_task_runner(Settings(home=tmp_path, task_runner="dask", dask_address="tcp://10.0.0.5:8786"))
    assert isinstance(remote, DaskTaskRunner) and remote.address == "tcp://10.0.0.5:8786"
    assert Settings(home=tmp_path, dask_address=" ").dask_address is None  # prefect.yaml's unset variable


def worker_state() -> dict[str, int]:
    """Run in a Dask worker: its parse pools and its loaded models."""
    from corpusync.adapters.embedders import _EMBEDDERS

    return {"parse_pools": len(fanout._POOLS), "models": sum("model" in e.__dict__ for e in _EMBEDDERS.values())}


def test_cpu_workers_parse_and_the_gpu_worker_embeds(prefect_harness, reference, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                    pg_server: str, template_db: str) -> None:
    import dask
    from distributed import Client, Nanny, Scheduler, SpecCluster

    corpus, want = reference
    # two worker processes (nannies), one labelled CPU, one GPU, as `dask worker --resources ...` would start
    spec = {name: {"cls": Nanny, "options": {"nthreads": 1, "resources": {name.upper(): 1}}} for name in ("cpu", "gpu")}
    scheduler = {"cls": Scheduler, "options": {"dashboard_address": None}}
    with dask.config.set({"distributed.worker.daemon": False}), \
            SpecCluster(workers=spec, scheduler=scheduler) as cluster, Client(cluster) as client, \
            new_database(pg_server, template_db) as url:
        settings = make_settings(tmp_path / "home", url).model_copy(update={
            "task_runner": "dask", "dask_address": cluster.scheduler_address, "build_batch_documents": 2,
            "parse_workers": 1, "dask_parse_resources": {"CPU": 1}, "dask_embed_resources": {"GPU": 1}})
        summary = refresh(settings, corpus)
        assert summary["published"], summary
        assert_same_index(live(url), want)
        names = {w["name"]: addr for addr, w in client.scheduler_info()["workers"].items()}
        state = client.run(worker_state)
        assert state[names["cpu"]] == {"parse_pools": 1, "models": 0}, state
        assert state[names["gpu"]] == {"parse_pools": 0, "models": 1}, state


def test_threads_runner_retries_a_dropped_connection_and_fails_on_a_bug(  # type: ignore[no-untyped-def]
        prefect_harness, reference, tmp_path: Path, pg_server: str, template_db: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    ref_corpus, want = reference
    corpus = tmp_path / "corpus"
    shutil.copytree(ref_corpus, corpus)
    calls: list[str] = []
    real_open = fanout.open_database

    def flaky_open(settings: Any, **kw: Any) -> psycopg.Connection:
        calls.append("open")
        if len(calls) == 1:
            raise psycopg.OperationalError("connection to server was lost (injected)")
        return real_open(settings, **kw)

    monkeypatch.setattr(fanout, "open_database", flaky_open)
    with new_database(pg_server, template_db) as url:
        settings = make_settings(tmp_path / "home", url).model_copy(update={
            "build_tasks": True, "build_batch_documents": 3, "batch_retries": 2, "batch_retry_delay_s": 0})
        summary = refresh(settings, corpus)
        assert summary["published"], summary
        assert len(calls) == 3  # two batches, the first one twice
        assert_same_index(live(url), want)

        # a bug is not retried: the run fails, the published generation stays live
        (corpus / "en" / "Normans.md").write_text("# Normans\n\nA changed page about the Normans.\n", encoding="utf-8")

        def broken(job: fanout.BatchJob) -> fanout.BatchResult:
            calls.append("bug")
            raise ValueError("a bug in the batch (injected)")

        monkeypatch.setattr(fanout, "prepare_batch", broken)
        with pytest.raises(ValueError, match="injected"):
            refresh(settings, corpus)
        assert calls.count("bug") == 1
        assert_same_index(live(url), want)


def test_the_next_batch_embeds_while_the_last_one_loads(  # type: ignore[no-untyped-def]
        prefect_harness, reference, tmp_path: Path, pg_server: str, template_db: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The streamed build (one document per batch here) loads each batch while the next one is embedded: the
    embedding of batch k+1 waits (up to 20 s) for the load of batch k to start, and that load waits for the
    embedding to start. A build that embeds and loads in turn, in either order, times out here."""
    import threading

    from corpusync.app import build
    from corpusync.store import versions

    corpus, want = reference
    state = threading.Condition()
    started = {"embed": 0, "load": 0}
    waits: list[bool] = []
    real_embed, real_load = build.step_embed, versions.load_documents

    def begin(step: str, wait_for: str, count: int) -> None:
        with state:
            started[step] += 1
            state.notify_all()
            if count:
                waits.append(state.wait_for(lambda: started[wait_for] >= count, timeout=20))

    def embed(*a: Any, **kw: Any) -> Any:
        begin("embed", "load", started["embed"])  # batch k+1: once batch k's load has started
        return real_embed(*a, **kw)

    def load(*a: Any, **kw: Any) -> Any:
        n = started["load"] + 1
        begin("load", "embed", n + 1 if n < 6 else 0)  # six documents: the last load has no next batch
        return real_load(*a, **kw)

    monkeypatch.setattr(build, "step_embed", embed)
    monkeypatch.setattr(versions, "load_documents", load)
    with new_database(pg_server, template_db) as url:
        settings = make_settings(tmp_path / "home", url).model_copy(update={"build_batch_documents": 1})
        summary = refresh(settings, corpus)
        assert summary["published"], summary
        assert waits == [True] * 10
        assert_same_index(live(url), want)


def test_a_failed_load_stops_the_batch_being_embedded_and_the_next_run_converges(  # type: ignore[no-untyped-def]
        prefect_harness, reference, tmp_path: Path, pg_server: str, template_db: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault injection: the first load fails while the next batch is in the model. The run fails with that
    error (not the embedding's); the embedding stops after its model batch at hand, its thread ends and its
    connection closes; the next run publishes the same index as the reference."""
    import threading

    from corpusync.app import build
    from corpusync.store import versions

    corpus, want = reference
    real_load, real_open = versions.load_documents, build.open_database
    opened: list[psycopg.Connection] = []

    def failing_load(*a: Any, **kw: Any) -> Any:
        raise RuntimeError("the load failed (injected)")

    def open_database(*a: Any, **kw: Any) -> psycopg.Connection:
        opened.append(real_open(*a, **kw))
        return opened[-1]

    monkeypatch.setattr(versions, "load_documents", failing_load)
    monkeypatch.setattr(build, "open_database", open_database)
    with new_database(pg_server, template_db) as url:
        settings = make_settings(tmp_path / "home", url).model_copy(update={"build_batch_documents": 1})
        with pytest.raises(RuntimeError, match="injected"):
            refresh(settings, corpus)
        assert len(opened) == 1 and opened[0].closed
        assert not [t for t in threading.enumerate() if t.name.startswith("corpusync-embed")]
        monkeypatch.setattr(versions, "load_documents", real_load)
        assert refresh(settings, corpus)["published"]
        assert_same_index(live(url), want)
