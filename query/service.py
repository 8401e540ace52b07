"""The query service: hybrid search over HTTP for applications (`corpusync serve`).

`create_app(settings)` returns a FastAPI app that, at startup, loads the embedding model once, migrates the
schema (corpusync.store.db.open_database) and keeps a small pool of connections, each with its own
`query.search.Searcher`: the modes, filters, lexical query syntax (`-term`, `"phrase"`) and stored fusion are
exactly the CLI's. Endpoints are plain (sync) functions, run by FastAPI in its threadpool; a request borrows
one connection for its whole search, so no two threads ever share a connection or its Searcher.

    GET  /health  -> {"status": "ok", "database": "ok", "published_generation": 3, "model": ..., ...}
    POST /search  {"query": "...", "k": 10, "mode": "hybrid", "filters": {...}, "generation": null,
                   "rerank": false}
                  -> {"query": ..., "mode": ..., "k": ..., "generation": the one read (also with no hits),
                      "took_ms": ..., "hits": [Hit.as_dict() + citation], "fusion": the weights and rrf_k
                      ranked by (the dense weight scaled by dense_coverage; null in a one-channel mode),
                      "channels": those that ran, "dense_coverage": the share of the query's words the dense
                      model reads, or null}

Errors: a corpusync error (bad mode, bad filter date, unknown generation, empty index, model mismatch) or a
malformed body is 400 {"error": message}; the database unreachable is 503; anything else is 500
{"error": "internal error"} (the traceback goes to the server log, never to the client).

With `serve_database_url` set (CORPUSYNC_SERVE_DATABASE_URL), searches run as that (reader) role — row-level
security then applies — while database_url (or the embedded server) only migrates the schema at startup.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from corpusync.adapters.embedders import build_embedder
from corpusync.adapters.embedding import Embedder, EmbeddingOutput, ModelIdentity
from corpusync.core.errors import CorpusyncError, DatabaseError
from corpusync.store import db, embedded, generations
from query.search import Hit, Searcher
from schemas.settings import Settings

log = logging.getLogger("corpusync.service")

# How long a pooled Searcher keeps the stored fusion before reading it again (a `corpusync tune` on the live
# generation is picked up within this time; a new generation is read at once).
FUSION_TTL_S = 30.0


class SearchRequest(BaseModel):
    query: str = Field(..., min_length=1, description="What to look for; lexical syntax: -term, \"phrase\".")
    k: int = Field(10, ge=0, le=1000, description="Number of hits.")
    mode: str = Field("hybrid", description="hybrid, dense, lexical or sparse (bge-m3).")
    filters: dict[str, Any] = Field(
        default_factory=dict, description="path, glob, type, chunk_type, modified_after, modified_before, or "
        "any metadata key (as `corpusync query --filter KEY=VALUE`).")
    generation: int | None = Field(None, description="Query this generation instead of the published one.")
    rerank: bool = Field(False, description="Re-order with the configured cross-encoder reranker.")


def hit_json(hit: Hit) -> dict[str, Any]:
    """A hit as the service returns it: every field of Hit plus its citation."""
    return hit.as_dict() | {"citation": hit.citation}


class _LockedEmbedder:
    """The one query embedder, shared by every pooled Searcher: calls are serialised (a fast tokenizer must
    not be used by two threads at once; torch already uses every core for one forward pass)."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.identity: ModelIdentity = inner.identity
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> EmbeddingOutput:
        with self._lock:
            return self.inner.embed(texts)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        with self._lock:
            return self.inner.count_tokens(texts)

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        with self._lock:
            return self.inner.token_offsets(text)

    def coverage(self, words: Sequence[str]) -> float:
        fn = getattr(self.inner, "coverage", None)
        if not callable(fn):
            return 1.0
        with self._lock:
            return float(fn(words))


@dataclass
class _Slot:
    conn: psycopg.Connection
    searcher: Searcher
    fusion_read_at: float = field(default_factory=time.monotonic)


class SearcherPool:
    """At most `size` connections, opened on demand; a borrower has its connection (and Searcher) alone."""

    def __init__(self, settings: Settings, url: str, embedder: Embedder, size: int,
                 first: psycopg.Connection | None = None, acquire_timeout_s: float = 30.0) -> None:
        if size < 1:
            raise CorpusyncError("the connection pool needs at least one connection")
        self.settings, self.url, self.embedder, self.size = settings, url, embedder, size
        self.acquire_timeout_s = acquire_timeout_s
        self._idle: list[_Slot] = []
        self._open = 0
        self._closed = False
        self._cond = threading.Condition()
        if first is not None:
            self._idle.append(self._slot(first))
            self._open = 1

    def _slot(self, conn: psycopg.Connection) -> _Slot:
        return _Slot(conn, Searcher(self.settings, conn, self.embedder))

    @contextmanager
    def searcher(self) -> Iterator[Searcher]:
        slot = self._acquire()
        try:
            if time.monotonic() - slot.fusion_read_at > FUSION_TTL_S:
                slot.searcher.forget_fusion()
                slot.fusion_read_at = time.monotonic()
            yield slot.searcher
        finally:
            self._release(slot)

    def _acquire(self) -> _Slot:
        deadline = time.monotonic() + self.acquire_timeout_s
        with self._cond:
            while True:
                if self._closed:
                    raise DatabaseError("the service is shutting down")
                if self._idle:
                    return self._idle.pop()
                if self._open < self.size:
                    self._open += 1
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DatabaseError(f"all {self.size} database connections stayed busy for "
                                        f"{self.acquire_timeout_s:g}s")
                self._cond.wait(left)
        try:  # connect outside the lock
            return self._slot(db.connect(self.url, autocommit=True, application_name="corpusync-serve"))
        except BaseException:
            with self._cond:
                self._open -= 1
                self._cond.notify()
            raise

    def _release(self, slot: _Slot) -> None:
        conn = slot.conn
        healthy = not (conn.closed or conn.broken)
        if healthy and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            try:
                conn.rollback()
            except psycopg.Error:
                healthy = False
        with self._cond:
            if healthy and not self._closed:
                self._idle.append(slot)
            else:
                self._open -= 1
                conn.close()
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            self._cond.notify_all()
        for slot in idle:
            slot.conn.close()


def _model_label(state: dict[str, Any]) -> str | None:
    return f"{state['model_name']} ({state['dimension']}-d)" if state.get("model_id") else None


def create_app(settings: Settings, *, pool_size: int = 4, embedder: Embedder | None = None) -> FastAPI:
    """The query service over the index `settings` points at (see the module docstring).

    `pool_size`: at most this many concurrent searches (one connection each; more requests wait for one).
    `embedder`: an already loaded query embedder (default: built from the settings at startup).
    """
    from corpusync.core.lexical import Analyzer
    from corpusync.store.db import open_database

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        t0 = time.perf_counter()
        inner = embedder if embedder is not None else build_embedder(settings)
        inner.embed(["warm up"])  # load the weights now, not in the first request
        Analyzer.from_settings(settings).query("warm up 预热")  # jieba's dictionary too
        first = open_database(settings)  # starts the embedded server if needed; migrates
        serve_url = settings.serve_database_url.get_secret_value() if settings.serve_database_url else None
        if serve_url:
            first.close()  # the admin connection only migrates; searches run as the serving role
            first = db.connect(serve_url, autocommit=True, application_name="corpusync-serve")
            url = serve_url
        else:
            url = embedded.resolve_database(settings).url
        pool = SearcherPool(settings, url, _LockedEmbedder(inner), pool_size, first=first)
        app.state.pool = pool
        app.state.query_model = inner.identity.label
        app.state.database = db.redact(url)
        log.info("corpusync service ready in %.1fs: %s, model %s, pool %d", time.perf_counter() - t0,
                 app.state.database, app.state.query_model, pool_size)
        try:
            yield
        finally:
            pool.close()

    app = FastAPI(title="corpusync", summary="Hybrid search over a corpusync index, with citations.",
                  lifespan=lifespan)

    @app.exception_handler(CorpusyncError)
    async def _corpusync_error(request: Request, exc: CorpusyncError) -> JSONResponse:
        status = 503 if isinstance(exc, DatabaseError) else 400
        return JSONResponse({"error": str(exc)}, status_code=status)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for e in exc.errors():
            where = ".".join(str(p) for p in e.get("loc", ()) if p != "body")
            parts.append(f"{where}: {e.get('msg', 'invalid')}" if where else str(e.get("msg", "invalid")))
        return JSONResponse({"error": "bad request: " + "; ".join(parts)}, status_code=400)

    @app.exception_handler(psycopg.OperationalError)
    async def _db_down(request: Request, exc: psycopg.OperationalError) -> JSONResponse:
        log.error("database error: %s", exc)
        return JSONResponse({"error": "database unavailable"}, status_code=503)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
        return JSONResponse({"error": "internal error"}, status_code=500)

    @app.get("/health")
    def health(request: Request) -> JSONResponse:
        pool: SearcherPool = request.app.state.pool
        try:
            with pool.searcher() as s:
                state = generations.index_state(s.conn) or {}
        except (CorpusyncError, psycopg.Error) as exc:
            log.warning("health check failed: %s", exc)
            return JSONResponse({"status": "unavailable", "database": "unreachable",
                                 "error": str(exc) if isinstance(exc, CorpusyncError) else "database error"},
                                status_code=503)
        return JSONResponse({
            "status": "ok", "database": "ok", "published_generation": state.get("published_generation"),
            "model": _model_label(state), "query_model": request.app.state.query_model,
        })

    @app.post("/search")
    def search(body: SearchRequest, request: Request) -> dict[str, Any]:
        t0 = time.perf_counter()
        pool: SearcherPool = request.app.state.pool
        with pool.searcher() as s:
            result = s.run(body.query, k=body.k, mode=body.mode, generation=body.generation,  # type: ignore[arg-type]
                           filters=body.filters, rerank=body.rerank)
        return {"query": body.query, "k": body.k, **result.applied.as_dict(),
                "took_ms": round((time.perf_counter() - t0) * 1000, 2), "hits": [hit_json(h) for h in result.hits]}

    return app


def app_from_env() -> FastAPI:
    """The app over Settings() read from CORPUSYNC_* (uvicorn's factory for `corpusync serve`: every worker
    process builds its own)."""
    from corpusync.core.offline import apply_offline_defaults

    apply_offline_defaults()
    return create_app(Settings())
