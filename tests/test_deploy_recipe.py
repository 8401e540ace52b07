"""The README's deployment recipe, as written, against a real `prefect server` on 127.0.0.1: work pool and writer
queue, `prefect deploy --all`, an on-demand run executed by `prefect worker start --run-once`, the index checked
in PostgreSQL, and the flow run read back from the API: parameters typed, no secret stored or logged. Then
overlapping refreshes: nightly and on-demand share the writer queue's limit, and a refresh that meets the
writer lock waits for it. The thin evaluate / rollback / prune flows run in process."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from corpusync.app.runtime import acquire_writer_lock
from corpusync.core.errors import ConfigError
from corpusync.store import db
from tests.conftest import REPO
from tests.servers import PREFECT_DB, seed_prefect_db, wait_for_health

pytestmark = [pytest.mark.flow, pytest.mark.db, pytest.mark.slow]

PREFECT = str(Path(sys.executable).parent / "prefect")
SECRET = "Pa55-w0rd-never-in-parameters"
REFRESH_PARAMETERS = {"source", "allow_mass_delete", "reembed", "skip_gate", "goldsets", "gate_tolerances",
                      "gate_floors", "eval_max_questions", "lock_timeout_s"}


def readme_recipe() -> list[list[str]]:
    """The sh block of the README's Deployments section, one argv per line (comments dropped)."""
    section = (REPO / "README.md").read_text(encoding="utf-8").split("\n## Deployments\n", 1)[1].split("\n## ")[0]
    match = re.search(r"```sh\n(.*?)```", section, re.S)
    assert match, "README: the Deployments section has no ```sh recipe"
    return [shlex.split(line, comments=True) for line in match.group(1).splitlines() if line.strip()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _clean_env() -> dict[str, str]:
    """This process's environment without corpusync or Prefect settings (the test sets its own)."""
    drop = ("CORPUSYNC_", "PREFECT_", "DATABASE_URL")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def _run(argv: list[str], env: dict[str, str], timeout: float = 240) -> str:
    proc = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{shlex.join(argv)} exited {proc.returncode}:\n{out[-4000:]}"
    return out


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory: pytest.TempPathFactory, prefect_db: Path) -> Iterator[dict[str, str]]:
    """A real Prefect server (SQLite in a temporary PREFECT_HOME, migrated ahead); yields the environment that
    reaches it."""
    home = tmp_path_factory.mktemp("prefect-home")
    seed_prefect_db(prefect_db, home / PREFECT_DB)
    url = f"http://127.0.0.1:{_free_port()}/api"
    env = _clean_env() | {"PREFECT_HOME": str(home), "PREFECT_API_URL": url, "DO_NOT_TRACK": "1",
                          "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "HF_HUB_OFFLINE": "1"}
    port = url.rsplit(":", 1)[1].split("/")[0]
    with (home / "server.log").open("w") as log:
        server = subprocess.Popen([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", port], env=env,
                                  cwd=home, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_health(server, f"{url}/health", home / "server.log", 120)
        yield env
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


@pytest.fixture(scope="module")
def deployed(prefect_api: dict[str, str]) -> dict[str, list[str]]:
    """The recipe's set-up lines run as the README gives them; returns its run and worker lines."""
    steps = {"server": [], "run": [], "worker": []}  # type: dict[str, list[str]]
    for argv in readme_recipe():
        if argv[:3] == ["prefect", "server", "start"]:
            steps["server"] = argv  # the fixture's server (on a free port) stands in for it
        elif argv[0] == "export":
            assert argv[1].startswith("PREFECT_API_URL="), argv
        elif "prefect" in argv and argv[argv.index("prefect"):][:3] == ["prefect", "worker", "start"]:
            steps["worker"] = argv
        elif argv[:3] == ["prefect", "deployment", "run"]:
            steps["run"] = argv
        else:
            assert argv[0] == "prefect", f"README recipe line {shlex.join(argv)}: not a prefect command"
            _run([PREFECT, *argv[1:]], prefect_api)
    assert steps["server"] and steps["run"] and steps["worker"], f"README recipe incomplete: {steps}"
    return steps


def _client(env: dict[str, str]) -> Any:
    from prefect.client.orchestration import SyncPrefectClient

    return SyncPrefectClient(env["PREFECT_API_URL"])


def _worker(worker_line: list[str], env: dict[str, str], db_url: str, home: Path) -> tuple[list[str], dict[str, str]]:
    """The README's worker line with --run-once, in the environment it gives (VAR=value ...) plus this test's
    database URL, with a password in it: the server trusts the socket, so it is sent nowhere; the test only
    follows where the string goes."""
    at = worker_line.index("prefect")
    assert worker_line[at:at + 5] == ["prefect", "worker", "start", "--pool", "corpusync"], worker_line
    given = dict(a.split("=", 1) for a in worker_line[:at])
    secret_url = db_url.replace("://postgres:@", f"://postgres:{SECRET}@", 1)
    assert SECRET in secret_url
    return [PREFECT, *worker_line[at + 1:], "--run-once"], env | given | {"CORPUSYNC_DATABASE_URL": secret_url,
                                                                          "CORPUSYNC_HOME": str(home)}


def test_readme_recipe_runs_a_deployment(deployed, prefect_api, db_url: str, corpus: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.objects import StateType

    run_line = deployed["run"]
    assert run_line[3] == "corpusync-refresh/on-demand-refresh" and run_line[4:6] == ["--param",
                                                                                     "source=examples/sample-corpus"]
    # the README indexes the sample corpus; the test indexes a 6-file copy of part of it (OCR makes the whole slow)
    out = _run([PREFECT, *run_line[1:5], f"source={corpus}", *run_line[6:]], prefect_api)
    run_id = re.search(r"UUID: ([0-9a-f-]{36})", out)
    assert run_id, out
    worker, env = _worker(deployed["worker"], prefect_api, db_url, tmp_path / "home")
    worker_out = _run(worker, env)
    secret_url = env["CORPUSYNC_DATABASE_URL"]

    with _client(prefect_api) as client:
        fr = client.read_flow_run(run_id.group(1))
        assert fr.state is not None and fr.state.type == StateType.COMPLETED, worker_out[-4000:]
        assert fr.parameters == {"source": str(corpus), "lock_timeout_s": 3600}
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[fr.id])), limit=200)
    stored = json.dumps(fr.parameters)
    for leak in (SECRET, secret_url, "postgresql://", "database_url", "settings"):
        assert leak not in stored
    assert logs and "Finished in state Completed" in " ".join(log.message for log in logs)
    assert not [log.message for log in logs if SECRET in log.message]
    assert SECRET not in worker_out

    with db.connection(db_url, autocommit=True) as conn:
        state = db.fetch_one(conn, "index_state")
        assert state is not None and state["published_generation"] == 1
        documents = conn.execute("SELECT count(*) FROM corpusync.documents_current").fetchone()
        run = conn.execute("SELECT status, prefect_flow_run_id::text, source_root FROM corpusync.runs").fetchall()
    assert documents == (sum(1 for p in corpus.rglob("*") if p.is_file()),)
    assert run == [("published", str(fr.id), str(corpus.resolve()))]


def test_deployments_advertise_typed_parameters_only(deployed, prefect_api, corpus: Path) -> None:  # type: ignore[no-untyped-def]
    from prefect.exceptions import PrefectHTTPStatusError

    with _client(prefect_api) as client:
        deployments = {f"{client.read_flow(d.flow_id).name}/{d.name}": d for d in client.read_deployments()}
        assert set(deployments) == {"corpusync-refresh/nightly-refresh", "corpusync-refresh/on-demand-refresh",
                                    "corpusync-refresh/cluster-refresh", "corpusync-evaluate/evaluate",
                                    "corpusync-rollback/rollback", "corpusync-prune/prune"}
        env = deployments["corpusync-refresh/cluster-refresh"].job_variables["env"]
        assert env["CORPUSYNC_TASK_RUNNER"] == "dask"
        assert json.loads(env["CORPUSYNC_DASK_EMBED_RESOURCES"]) == {"GPU": 1}
        for name, dep in deployments.items():
            props = dep.parameter_openapi_schema.get("properties", {})
            assert not [p for p in props if re.search(r"settings|url|password|secret|key", p)], (name, props)
            assert dep.enforce_parameter_schema, name
            assert dep.work_queue_name == ("writer" if "refresh" in name or "prune" in name else "default")
        refresh = deployments["corpusync-refresh/on-demand-refresh"]
        props = refresh.parameter_openapi_schema["properties"]
        assert set(props) == REFRESH_PARAMETERS
        assert props["source"]["type"] == "string" and props["allow_mass_delete"]["type"] == "boolean"
        assert {"type": "number", "minimum": 0} in [a.get("additionalProperties") for a in
                                                   props["gate_tolerances"]["anyOf"]]
        assert "CORPUSYNC_GOLDSETS" in props["goldsets"]["description"]
        assert client.read_work_queue_by_name("writer", work_pool_name="corpusync").concurrency_limit == 1
        # the server refuses what the schema does not allow, before any worker sees it
        for bad in ({"source": str(corpus), "gate_tolerances": {"recall@5": -0.1}},
                    {"source": str(corpus), "allow_mass_delete": "yes please"}, {"source": ""}):
            with pytest.raises(PrefectHTTPStatusError, match=r"409|422"):
                client.create_flow_run_from_deployment(refresh.id, parameters=bad)


def test_overlapping_refreshes_queue_and_wait_for_the_writer_lock(deployed, prefect_api, db_url: str, corpus: Path,  # type: ignore[no-untyped-def]
                                                                  tmp_path: Path) -> None:
    from prefect.client.schemas.objects import StateType

    argv, env = _worker(deployed["worker"], prefect_api, db_url, tmp_path / "home")
    with _client(prefect_api) as client, db.connection(db_url, autocommit=True) as holder:
        acquire_writer_lock(holder, 0)  # another writer (a CLI refresh, say) is at work
        ids = [client.create_flow_run_from_deployment(client.read_deployment_by_name(name).id,
                                                      parameters={"source": str(corpus)}).id
               for name in ("corpusync-refresh/nightly-refresh", "corpusync-refresh/on-demand-refresh")]
        worker = subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 180
            while not _waiting_for_lock(holder):  # the first run polls the lock instead of failing
                assert worker.poll() is None, worker.communicate()[0][-4000:]
                assert time.monotonic() < deadline, "no refresh waited for the writer lock"
                time.sleep(0.5)
            states = [client.read_flow_run(i).state for i in ids]
            assert [s.type if s else None for s in states] == [StateType.RUNNING, StateType.SCHEDULED]
        finally:
            holder.execute("SELECT pg_advisory_unlock_all()")
        out, _ = worker.communicate(timeout=240)
        first, second = (client.read_flow_run(i) for i in ids)
        assert first.state is not None and first.state.type == StateType.COMPLETED, out[-4000:]
        assert second.state is not None and second.state.type == StateType.SCHEDULED  # queued, not failed
        out = _run(argv, env)
        second = client.read_flow_run(ids[1])
        assert second.state is not None and second.state.type == StateType.COMPLETED, out[-4000:]
    with db.connection(db_url, autocommit=True) as conn:
        runs = conn.execute("SELECT prefect_flow_run_id::text, status FROM corpusync.runs ORDER BY id").fetchall()
    assert runs == [(str(ids[0]), "published"), (str(ids[1]), "no_changes")]


def _waiting_for_lock(holder: psycopg.Connection) -> bool:
    row = holder.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> "
                         "pg_backend_pid() AND query LIKE 'SELECT pg_try_advisory_lock%'").fetchone()
    return bool(row and row[0])


def test_flows_take_settings_in_process_without_storing_them(prefect_harness, settings, corpus: Path,  # type: ignore[no-untyped-def]
                                                            tmp_path: Path) -> None:
    """The CLI's way: a Settings object handed to the flow in process. It reaches the flow (this database) and
    never the flow run's parameters; evaluate, rollback and prune are flows over today's code."""
    from prefect import get_client

    from flows.evaluate import evaluate
    from flows.prune import prune
    from flows.refresh import refresh
    from flows.rollback import rollback

    secret = settings.model_copy(update={"database_url": settings.database_dsn().replace(
        "://postgres:@", f"://postgres:{SECRET}@", 1)})
    assert refresh(str(corpus), settings=secret)["generation"] == 1
    (corpus / "en" / "Normans.md").write_text("The Normans gave their name to Normandy.\n", encoding="utf-8")
    second = refresh(str(corpus), settings=secret, lock_timeout_s=5)
    assert second["published"] and second["generation"] == 2
    goldset = tmp_path / "tiny.jsonl"
    goldset.write_text(json.dumps({"id": "q1", "question": "Who gave their name to Normandy?",
                                   "answers": ["The Normans"], "gold_document": "en/Normans.md"}) + "\n")
    (result,) = evaluate(goldsets=[str(goldset)], settings=secret)
    assert result["generation"] == 2 and result["n_questions"] == 1
    assert rollback(settings=secret) == {"from_generation": 2, "to_generation": 1}
    assert prune(retention_generations=0, settings=secret)["oldest_retained"] == 1
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(limit=200)
    mine = [r.parameters for r in runs if r.parameters.get("source") == str(corpus)]
    # both runs, every public parameter typed and stored (the API's order of runs is not guaranteed)
    assert sorted((p["lock_timeout_s"] for p in mine), key=lambda v: v is None) == [5, None]
    assert not [r.name for r in runs if "settings" in r.parameters or SECRET in json.dumps(r.parameters, default=str)]


def test_parameters_are_validated_before_the_flow_starts() -> None:
    from prefect.exceptions import ParameterTypeError, SignatureMismatchError

    from flows.refresh import refresh

    assert refresh.validate_parameters({"source": "x", "gate_tolerances": {"recall@5": "0.05"}})[
        "gate_tolerances"] == {"recall@5": 0.05}
    for bad, why in (({"gate_tolerances": {"recal@5": 0.1}}, "unknown metric"),
                     ({"gate_floors": {"recall@5": 2}}, "0..1"), ({"goldsets": []}, "at least 1"),
                     ({"lock_timeout_s": -1}, "greater than or equal")):
        with pytest.raises(ParameterTypeError, match=why):
            refresh.validate_parameters({"source": "x", **bad})
    with pytest.raises(SignatureMismatchError, match="settings"):  # not a parameter: in process only
        refresh.validate_parameters({"source": "x", "settings": {}})


def test_pull_step_finds_the_checkout_or_names_the_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.base import CHECKOUT, enter_checkout

    monkeypatch.chdir(tmp_path)
    assert enter_checkout("") == {"directory": str(CHECKOUT)} and Path.cwd() == CHECKOUT
    assert enter_checkout(str(REPO)) == {"directory": str(REPO.resolve())}
    with pytest.raises(ConfigError, match=re.escape(str(tmp_path)) + r".*CORPUSYNC_CHECKOUT.*flows/refresh.py"):
        enter_checkout(str(tmp_path))
