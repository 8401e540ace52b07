"""What Prefect shows of a refresh, read back from the API: a run-summary artifact for every run and the
evaluation report inline (also when the gate refused), corpusync's own log records in the run's logs, tags,
a persisted result, and no secret anywhere."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from corpusync.core.errors import EvalGateFailed
from tests.faults import scramble_parses
from tests.test_eval_gate import env, goldset  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.flow, pytest.mark.db]


def _flow_run_of(conn: Any, run_id: int) -> UUID:
    row = conn.execute("SELECT prefect_flow_run_id FROM corpusync.runs WHERE id = %s", (run_id,)).fetchone()
    assert row and row[0], "the run records its Prefect flow run"
    return UUID(row[0])


def _view(flow_run_id: UUID) -> dict[str, Any]:
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, LogFilter, LogFilterFlowRunId

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run_id)
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return {"run": run, "artifacts": {a.key: a for a in artifacts}, "logs": [entry.message for entry in logs]}


def test_prefect_shows_summary_evaluation_logs_and_tags(  # type: ignore[no-untyped-def]
        prefect_harness, env, goldset: Path, corpus: Path, conn,  # noqa: F811 (fixtures)
        monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.refresh import refresh

    settings = env.model_copy(update={"goldsets": [str(goldset)], "parse_isolation": False})
    (corpus / "empty.txt").write_bytes(b"")  # quarantined: a corpusync warning that must reach the run's logs
    first = refresh(str(corpus), settings=settings)
    assert first["published"]
    view = _view(_flow_run_of(conn, first["run_id"]))
    summary = view["artifacts"]["corpusync-run-summary"].data
    assert f"run {first['run_id']}: published" in summary and "empty.txt" in summary and "| empty |" in summary
    assert f"Run time {first['elapsed_s']:.2f} s; the stage times overlap" in summary and first["elapsed_s"] > 0
    assert "corpusync-evaluation" in view["artifacts"]
    assert any("empty.txt" in m and "empty" in m for m in view["logs"]), "corpusync's log records are in the run"
    tags = set(view["run"].tags)
    assert "corpusync" in tags and f"source:{corpus.name}" in tags and "goldset:gold" in tags
    assert view["run"].state.data is not None, "the flow's result is persisted"
    assert "settings" not in view["run"].parameters and settings.database_dsn() not in json.dumps(
        view["run"].parameters, default=str)

    # a refused candidate: the summary and the evaluation report (inline, marked refused) still show
    scramble_parses(monkeypatch)
    with pytest.raises(EvalGateFailed):
        refresh(str(corpus), settings=settings)
    refused_run = conn.execute("SELECT max(id) FROM corpusync.runs").fetchone()[0]
    view = _view(_flow_run_of(conn, refused_run))
    assert f"run {refused_run}: refused" in view["artifacts"]["corpusync-run-summary"].data
    evaluation = view["artifacts"]["corpusync-evaluation"]
    assert "REFUSED" in (evaluation.description or "") and "recall@5" in evaluation.data
    everything = json.dumps([str(a.data) for a in view["artifacts"].values()] + view["logs"])
    assert settings.database_dsn() not in everything and "postgresql://" not in everything

    # the run after a refusal is not a recovery from an interrupted run
    monkeypatch.undo()
    after = refresh(str(corpus), settings=settings)
    assert "recovered" not in (after["message"] or ""), after["message"]
