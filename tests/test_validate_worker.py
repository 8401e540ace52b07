"""The chunk suite in its own process (tasks/validate_worker.py): the same findings as in this process, and a
worker that dies costs a warning and an in-process run, never a wrong or lost result."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from tasks import validate_worker
from tasks.validate import Thresholds, validate_chunks
from tests.test_embed import broken_vectors

LIMITS = Thresholds(max_tokens=64, dimension=384, normalized=True)


@pytest.fixture
def worker() -> Iterator[None]:
    validate_worker.start()
    try:
        yield
    finally:
        validate_worker.stop()


def test_worker_finds_what_the_suite_finds_in_process(embedder, worker) -> None:  # type: ignore[no-untyped-def]
    docs = broken_vectors(embedder)
    here = validate_chunks(docs, LIMITS)
    suite = validate_worker.suite()
    assert suite is not validate_worker.run_suite  # the worker's runner, not the in-process one
    there = validate_chunks(docs, LIMITS, suite=suite)
    assert there.failures == here.failures and there.results == here.results
    assert [d.doc.parsed.source.path for d in there.passed] == ["ok.md"]
    assert set(there.failures) == {"nan.md", "long.md"}


def test_a_dead_worker_falls_back_to_this_process(embedder, caplog) -> None:  # type: ignore[no-untyped-def]
    """Fault injection: the worker process dies (os._exit) while it runs the suite."""
    from tests.faults import exit_process

    dying = validate_worker._SuiteWorker(target=exit_process)
    try:
        with caplog.at_level(logging.WARNING, logger="corpusync.validate"):
            outcome = validate_chunks(broken_vectors(embedder), LIMITS, suite=dying.run)
    finally:
        dying.close()
    assert set(outcome.failures) == {"nan.md", "long.md"}
    assert [d.doc.parsed.source.path for d in outcome.passed] == ["ok.md"]
    assert any("validation worker failed" in r.getMessage() for r in caplog.records)


def test_without_a_worker_the_suite_runs_here() -> None:
    validate_worker.stop()
    assert validate_worker.suite() is validate_worker.run_suite


def test_a_released_worker_serves_the_next_run_then_exits(embedder) -> None:  # type: ignore[no-untyped-def]
    """A refresh releases the worker: the next refresh of the process within the linger finds the same worker
    (no second great_expectations import), and one that does not come lets it exit."""
    import time

    docs = broken_vectors(embedder)
    validate_worker.start()
    try:
        first = validate_worker.suite()
        validate_chunks(docs, LIMITS, suite=first)
        validate_worker.release(linger_s=1.0)
        validate_worker.start()  # within the linger: kept, and the stop it armed disarmed
        time.sleep(1.5)
        assert validate_worker.suite() == first
        assert set(validate_chunks(docs, LIMITS, suite=validate_worker.suite()).failures) == {"nan.md", "long.md"}
        validate_worker.release(linger_s=0.2)
        deadline = time.monotonic() + 10
        while validate_worker.suite() is not validate_worker.run_suite and time.monotonic() < deadline:
            time.sleep(0.05)
        assert validate_worker.suite() is validate_worker.run_suite  # gone after the linger
    finally:
        validate_worker.stop()
