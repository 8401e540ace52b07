"""Work survives: every embedded batch is kept in corpusync.vector_cache as soon as it exists (committed on
its own, outside the candidate), so a refresh killed while embedding (fault injection, and a real SIGKILL of
the process group) or refused by the gate costs the next run only the text not embedded yet; the next run
still converges to what an uninterrupted one publishes. Prune bounds the cache; readers never see it."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest

from corpusync.core.errors import EvalGateFailed
from corpusync.store import db
from tests.conftest import REPO, SAMPLE, _db_url
from tests.faults import scramble_parses
from tests.test_refresh_flow import live, run

pytestmark = [pytest.mark.flow, pytest.mark.db]

BATCH_TOKENS = 128  # about one chunk per embedding batch: many batches, so a kill lands near a chosen share


class SimulatedKill(Exception):
    """What the process 'dies' of in the fault-injection embedder."""


class CountingEmbedder:
    """Fault injection: the real MiniLM, counting the texts it is given; once `die_after` texts are embedded,
    the next batch raises instead (the run dies there, like a kill -9 at that point of embedding). prepare/
    forward/workers are hidden, so every batch goes through embed()."""

    def __init__(self, inner: Any, die_after: int | None = None) -> None:
        self.inner, self.die_after = inner, die_after
        self.embedded = 0

    def __getattr__(self, name: str) -> Any:
        if name in {"prepare", "forward", "workers"}:
            raise AttributeError(name)
        return getattr(self.inner, name)

    def embed(self, texts: Sequence[str]) -> Any:
        if self.die_after is not None and self.embedded >= self.die_after:
            raise SimulatedKill(f"killed after {self.embedded} embedded texts")
        out = self.inner.embed(texts)
        self.embedded += len(texts)
        return out


def cached(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT count(*) FROM corpusync.vector_cache").fetchone()
    assert row is not None
    return int(row[0])


def live_vectors(conn: psycopg.Connection) -> dict[str, np.ndarray]:
    """text hash -> dense vector of the published generation's chunks."""
    rows = conn.execute("SELECT c.text_sha256, c.dense FROM corpusync.chunks c JOIN corpusync.live_chunks l "
                        "ON l.chunk_id = c.id").fetchall()
    return {h: v.to_numpy().astype(np.float32) for h, v in rows}


@contextmanager
def fresh_index(pg_server: str, settings: Any) -> Iterator[Any]:
    """Settings for another, empty index on the same server (the uninterrupted reference run)."""
    name = f"f_{uuid.uuid4().hex[:12]}"
    with db.connection(pg_server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE corpusync_template')  # generated name
    try:
        yield settings.model_copy(update={"database_url": _db_url(pg_server, name)})
    finally:
        with db.connection(pg_server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def reference(pg_server: str, settings: Any, corpus: Path) -> tuple[int, dict[str, list[str]], dict[str, np.ndarray]]:
    """What an uninterrupted refresh of corpus into an empty index embeds and publishes."""
    with fresh_index(pg_server, settings) as fresh:
        summary = run(fresh, corpus)
        with db.connection(fresh.database_dsn() or "", autocommit=True) as fc:
            return int(summary["chunks"]["embedded"]), live(fc), live_vectors(fc)


def assert_converged(conn: psycopg.Connection, content: dict[str, list[str]], vectors: dict[str, np.ndarray]) -> None:
    assert live(conn) == content
    got = live_vectors(conn)
    assert set(got) == set(vectors)
    worst = max(float(np.abs(got[h] - vectors[h]).max()) for h in got)
    assert worst < 2e-3, f"cached vectors differ from freshly computed ones by {worst}"  # halfvec rounding


def test_killed_while_embedding_next_run_embeds_only_the_rest(  # type: ignore[no-untyped-def]
        prefect_harness, pg_server: str, settings, corpus: Path, conn, embedder, monkeypatch) -> None:
    total, content, vectors = reference(pg_server, settings, corpus)
    small = settings.model_copy(update={"embed_batch_tokens": BATCH_TOKENS})

    dying = CountingEmbedder(embedder, die_after=math.ceil(0.9 * total))
    monkeypatch.setattr("corpusync.app.runtime.build_embedder", lambda s: dying)
    with pytest.raises(SimulatedKill):
        run(small, corpus)
    kept = cached(conn)
    assert kept == dying.embedded and 0.9 * total <= kept < total, (kept, total)
    assert conn.execute("SELECT published_generation FROM corpusync.index_state").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM corpusync.chunks").fetchone() == (0,)  # nothing loaded

    counting = CountingEmbedder(embedder)
    monkeypatch.setattr("corpusync.app.runtime.build_embedder", lambda s: counting)
    after = run(small, corpus)
    assert after["published"]
    assert after["chunks"]["embedded"] == counting.embedded == total - kept
    assert counting.embedded <= 0.15 * total, f"{counting.embedded} of {total} embedded again"
    print(f"\n(a) fault at {kept}/{total} embedded; next run embedded {counting.embedded}/{total}")
    assert_converged(conn, content, vectors)
    assert cached(conn) == 0, "prune drops cached vectors a published chunk holds"


def _kill_while_embedding(settings: Any, corpus: Path, api_url: str, kill_at: int) -> tuple[bool, int]:
    """Start a refresh in its own process group; SIGKILL the group once kill_at vectors are cached."""
    env = dict(os.environ, PREFECT_API_URL=api_url, CORPUSYNC_DATABASE_URL=settings.database_dsn(),
               CORPUSYNC_HOME=str(settings.home), CORPUSYNC_CHUNK_MAX_TOKENS=str(settings.chunk_max_tokens),
               CORPUSYNC_EMBED_BATCH_TOKENS=str(BATCH_TOKENS), PREFECT_LOGGING_LEVEL="WARNING")
    proc = subprocess.Popen([sys.executable, "-m", "flows.refresh", str(corpus), "--quiet"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    seen, killed = 0, False
    try:
        with db.connection(settings.database_dsn(), autocommit=True) as c:
            deadline = time.monotonic() + 300
            while proc.poll() is None and time.monotonic() < deadline:
                seen = cached(c)
                if seen >= kill_at:
                    os.killpg(proc.pid, signal.SIGKILL)
                    killed = True
                    break
                time.sleep(0.005)
    finally:
        if proc.poll() is None and not killed:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return killed, seen


@pytest.mark.slow
def test_sigkill_while_embedding_next_run_embeds_only_the_rest(  # type: ignore[no-untyped-def]
        prefect_harness, pg_server: str, settings, corpus: Path, conn, embedder, monkeypatch) -> None:
    from prefect.settings import PREFECT_API_URL

    total, content, vectors = reference(pg_server, settings, corpus)
    killed, seen = _kill_while_embedding(settings, corpus, PREFECT_API_URL.value(), math.ceil(0.9 * total))
    assert killed, "the refresh ended before 90% of its chunks were embedded"
    kept = cached(conn)  # the batch committed between the last poll and the kill counts too
    if kept >= total:
        pytest.skip(f"embedding finished ({kept}/{total}) between the poll and the kill")
    assert kept >= seen >= 0.9 * total
    assert conn.execute("SELECT status FROM corpusync.runs ORDER BY id DESC LIMIT 1").fetchone() == ("running",)

    counting = CountingEmbedder(embedder)
    monkeypatch.setattr("corpusync.app.runtime.build_embedder", lambda s: counting)
    after = run(settings, corpus)
    assert after["published"] and "recovered from an interrupted run" in after["message"]
    assert after["chunks"]["embedded"] == counting.embedded == total - kept
    assert counting.embedded <= 0.15 * total, f"{counting.embedded} of {total} embedded again"
    print(f"\n(b) SIGKILL at {kept}/{total} cached; next run embedded {counting.embedded}/{total}")
    assert_converged(conn, content, vectors)
    assert conn.execute("SELECT count(*) FROM corpusync.runs WHERE status = 'crashed'").fetchone() == (1,)


def _gold(corpus: Path, path: Path) -> Path:
    present = {p.relative_to(corpus).as_posix() for p in corpus.rglob("*") if p.is_file()}
    lines = [line for line in (REPO / "examples" / "goldset.jsonl").read_text().splitlines()
             if json.loads(line)["gold_document"] in present]
    path.write_text("\n".join(lines) + "\n")
    return path


def _known(conn: psycopg.Connection) -> set[str]:
    """Every text hash with a vector in the database (chunks of any version, and the cache)."""
    return {r[0] for r in conn.execute("SELECT text_sha256 FROM corpusync.chunks UNION "
                                       "SELECT text_sha256 FROM corpusync.vector_cache").fetchall()}


def test_gate_refusal_then_fix_embeds_only_what_changed(  # type: ignore[no-untyped-def]
        prefect_harness, settings, corpus: Path, conn, tmp_path: Path, monkeypatch) -> None:
    from corpusync.store.generations import prune

    gated = settings.model_copy(update={"goldsets": [str(_gold(corpus, tmp_path / "gold.jsonl"))],
                                        "parse_isolation": False})  # the fault is injected in this process
    assert run(gated, corpus)["generation"] == 1

    # a good new document, and a parser that breaks the others: the gate refuses the candidate
    new = "en/Amazon_rainforest.md"
    (corpus / new).write_bytes((SAMPLE / new).read_bytes())
    with monkeypatch.context() as m:
        scramble_parses(m, spare=new)
        with pytest.raises(EvalGateFailed) as refused:
            run(gated, corpus)
    summary = refused.value.summary  # type: ignore[attr-defined]
    assert summary["status"] == "refused"
    new_hashes = {r[0] for r in conn.execute(
        "SELECT c.text_sha256 FROM corpusync.chunks c JOIN corpusync.document_versions v ON v.id = c.version_id "
        "WHERE v.source_path = %s", (new,)).fetchall()}
    assert new_hashes and summary["chunks"]["embedded"] > len(new_hashes)

    # prune between refusal and fix (even with a zero TTL) keeps what only the refused candidate holds
    prune(conn, settings.retention_generations, vector_cache_ttl_h=0.0)
    cache = {r[0] for r in conn.execute("SELECT text_sha256 FROM corpusync.vector_cache").fetchall()}
    assert new_hashes <= cache

    # the cause is fixed (the parser is back) and one document is edited: only the edit needs the model
    edited = corpus / "zh/DEV_0.txt"
    edited.write_text(edited.read_text(encoding="utf-8") + "\n\n第九条 本办法由董事会负责解释。\n", encoding="utf-8")
    known = _known(conn)
    fixed = run(gated, corpus)
    assert fixed["published"] and fixed["generation"] == 3
    assert fixed["documents"]["new"] == 1 and fixed["documents"]["changed"] == 1
    live_hashes = {r[0] for r in conn.execute(
        "SELECT c.text_sha256 FROM corpusync.chunks c JOIN corpusync.live_chunks l ON l.chunk_id = c.id")}
    changed = live_hashes - known
    assert changed and not (changed & new_hashes)
    assert fixed["chunks"]["embedded"] == len(changed), "the refused run's good work was embedded again"
    print(f"\n(c) refused run embedded {summary['chunks']['embedded']} (new document: {len(new_hashes)}); "
          f"after the fix: {fixed['chunks']['embedded']} embedded of {len(live_hashes)} live texts")
    assert set(live(conn)) >= {new, "zh/DEV_0.txt"}


def test_prune_bounds_the_cache(prefect_harness, settings, corpus: Path, conn, embedder,  # type: ignore[no-untyped-def]
                                monkeypatch) -> None:
    from corpusync.store.generations import prune

    small = settings.model_copy(update={"embed_batch_tokens": BATCH_TOKENS})
    monkeypatch.setattr("corpusync.app.runtime.build_embedder", lambda s: CountingEmbedder(embedder, die_after=10))
    with pytest.raises(SimulatedKill):
        run(small, corpus)
    kept = cached(conn)
    assert kept >= 10
    assert prune(conn, 1)["cached_vectors"] == 0  # young and needed by the next run: kept
    conn.execute("UPDATE corpusync.vector_cache SET created_at = now() - interval '200 hours' "
                 "WHERE text_sha256 IN (SELECT text_sha256 FROM corpusync.vector_cache ORDER BY 1 LIMIT 4)")
    assert prune(conn, 1, vector_cache_ttl_h=168.0)["cached_vectors"] == 4  # stale: nothing holds them
    assert cached(conn) == kept - 4
    assert prune(conn, 1, vector_cache_ttl_h=1000.0)["cached_vectors"] == 0

    monkeypatch.setattr("corpusync.app.runtime.build_embedder", lambda s: embedder)
    done = run(small, corpus)
    assert done["published"] and done["chunks"]["reused"] >= kept - 4
    assert cached(conn) == 0, "the refresh's prune drops rows the published chunks hold"


def test_readers_cannot_read_the_cache(conn: psycopg.Connection, db_url: str) -> None:
    from corpusync.app import roles

    name, password = f"reader_{uuid.uuid4().hex[:10]}", uuid.uuid4().hex
    try:
        roles.grant_reader(conn, name, password, ["legal"])
        assert conn.execute("SELECT has_table_privilege('corpusync_reader', 'corpusync.vector_cache', 'SELECT')"
                            ).fetchone() == (False,)
        with psycopg.connect(db_url, user=name, password=password, autocommit=True) as rc:
            rc.execute("SELECT count(*) FROM corpusync.live_chunks").fetchone()  # a reader otherwise
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                rc.execute("SELECT * FROM corpusync.vector_cache")
    finally:
        conn.execute("DELETE FROM corpusync.access_groups WHERE role_name = %s", (name,))
        if conn.execute("SELECT to_regrole(%s)", (name,)).fetchone() != (None,):
            conn.execute(psycopg.sql.SQL("DROP OWNED BY {0}; DROP ROLE {0}").format(psycopg.sql.Identifier(name)))
