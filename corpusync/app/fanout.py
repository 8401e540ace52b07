"""The build's batches as self-contained jobs, for a task runner that may run them anywhere (a Dask worker on
another machine, a thread): a job parses, chunks and embeds its documents where it runs, with its own
database connection, and keeps what it embedded in the vector cache. It writes nothing else and holds no
lock, so a retry, or the same job run twice, is harmless. The flow, the one writer, validates and loads each
result into the candidate as it arrives (build.load_prepared) and publishes once: every generation guarantee
stays with the writer. Prefect's wiring is in flows/fanout.py.

What a job needs that is slow to make (the parse workers, the model) is kept per process, so a long-lived
Dask worker starts them once; jobs running in threads of one process take turns at each.
"""

from __future__ import annotations

import atexit
import functools
import os
import socket
import threading
from contextlib import closing
from dataclasses import dataclass, field

import psycopg

from corpusync.adapters.embedders import FlagEmbedder, build_embedder
from corpusync.app.runtime import timed
from corpusync.core import lexical
from corpusync.core.errors import ParseError
from corpusync.core.vectors import VectorTable
from corpusync.store import vector_cache
from corpusync.store.db import open_database
from schemas.records import ChunkedDocument, EmbeddedDocument, ParsedDocument, QuarantineRecord, SourceFile
from schemas.settings import Settings
from tasks import chunk as chunk_stage
from tasks import embed as embed_stage
from tasks import parse as parse_stage
from tasks.embed import EmbedStats
from tasks.parse_worker import ParsePool, default_workers


@dataclass
class BatchJob:
    """One batch of the plan: plain data (paths, hashes, settings), picklable to any worker. `model_id` is
    the model the writer registered; the vectors are cached under it."""

    number: int
    settings: Settings
    sources: list[SourceFile]
    model_id: int
    reembed: bool = False


@dataclass
class ChunkedBatch:
    """A batch parsed and chunked (where: host:pid), before embedding; the files set aside so far."""

    number: int
    chunked: list[ChunkedDocument]
    failures: list[QuarantineRecord]
    timings: dict[str, float] = field(default_factory=dict)
    parsed_on: str = ""
    memory_limit_problem: str | None = None


@dataclass
class BatchResult:
    """What a job made: the embedded documents (in the job's order), the files it set aside (parse errors,
    nothing to chunk) for the writer to quarantine, embedding counts, seconds per stage, and where it was
    parsed and embedded (host:pid)."""

    number: int
    embedded: list[EmbeddedDocument]
    failures: list[QuarantineRecord]
    stats: EmbedStats
    timings: dict[str, float] = field(default_factory=dict)
    parsed_on: str = ""
    embedded_on: str = ""
    memory_limit_problem: str | None = None


@dataclass
class _Configured:
    settings: Settings
    embedder: FlagEmbedder


_POOLS: dict[tuple[object, ...], tuple[ParsePool, threading.Lock]] = {}
_EMBED_LOCKS: dict[int, threading.Lock] = {}
_GUARD = threading.Lock()


def _pool(settings: Settings) -> tuple[ParsePool, threading.Lock]:
    """This process's parse workers for these settings, started on first use and stopped at exit."""
    options = settings.parse_options()
    key = (repr(options), settings.parse_workers, settings.parse_timeout_s, settings.parse_timeout_per_page_s,
           settings.parse_memory_mb)
    with _GUARD:
        if key not in _POOLS:
            if not _POOLS:
                atexit.register(close_pools)
            pool = ParsePool(options, workers=settings.parse_workers or default_workers(),
                             timeout_s=settings.parse_timeout_s, timeout_per_page_s=settings.parse_timeout_per_page_s,
                             memory_mb=settings.parse_memory_mb, parse=parse_stage.parse_document)
            _POOLS[key] = (pool, threading.Lock())
        return _POOLS[key]


def close_pools() -> None:
    """Stop the parse workers this process started for jobs."""
    with _GUARD:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool, _ in pools:
        pool.close()


def _embed_lock(embedder: FlagEmbedder) -> threading.Lock:
    with _GUARD:
        return _EMBED_LOCKS.setdefault(id(embedder), threading.Lock())


def _parse(settings: Settings, sources: list[SourceFile], timings: dict[str, float]
           ) -> tuple[list[tuple[SourceFile, ParsedDocument | ParseError]], str | None]:
    if not settings.parse_isolation:
        out: list[tuple[SourceFile, ParsedDocument | ParseError]] = []
        options = settings.parse_options()
        for src in sources:
            with timed(timings, "parse"):
                try:
                    out.append((src, parse_stage.parse_document(src, options)))
                except ParseError as exc:
                    out.append((src, exc))
        return out, None
    pool, lock = _pool(settings)
    with lock, timed(timings, "parse"):
        return list(pool.parse_many(sources, ordered=True)), pool.memory_limit_problem


class EmbeddingCancelled(Exception):
    """The run failed elsewhere while this batch was embedding: it stopped after a model batch (kept)."""


def embed_batch(settings: Settings, conn: psycopg.Connection, embedder: FlagEmbedder, model_id: int,
                chunked: list[ChunkedDocument], *, reembed: bool = False, cancel: threading.Event | None = None
                ) -> tuple[list[EmbeddedDocument], embed_stage.EmbedStats]:
    """Vectors for one batch: stored ones (the index, the vector cache) copied, the rest embedded and kept in
    the vector cache batch by batch (committed at once: durable whatever happens to the run). Once `cancel`
    is set, it stops after the model batch at hand, which is kept, raising EmbeddingCancelled."""
    identity = embedder.identity
    stored = (VectorTable.empty(identity.dimension, identity.sparse_trained) if reembed else
              vector_cache.stored_vectors(conn, model_id, (c.text_sha256 for d in chunked for c in d.chunks),
                                          dimension=identity.dimension, sparse=identity.sparse_trained))
    processes = settings.segment_processes or lexical.default_processes()
    sparse_dim = identity.sparse_dim if identity.sparse_trained else None

    def keep(hashes: list[str], out: embed_stage.EmbeddingOutput) -> None:
        vector_cache.cache_vectors(conn, model_id, hashes, out.dense, out.sparse, sparse_dim)
        if cancel is not None and cancel.is_set():
            raise EmbeddingCancelled("the build failed while this batch was embedding; what it embedded is kept")

    return embed_stage.embed_documents(
        chunked, embedder, stored, settings.embed_batch_tokens,
        segment=functools.partial(lexical.Analyzer.from_settings(settings).index_texts, processes=processes),
        on_vectors=keep)


def _here() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def parse_batch(job: BatchJob) -> ChunkedBatch:
    """Parse and chunk one batch (the parse workers and the model's tokenizer; no model weights)."""
    from corpusync.app.pipeline import chunk_config
    from corpusync.core.offline import apply_offline_defaults

    apply_offline_defaults()
    s = job.settings
    timings: dict[str, float] = {}
    failures: list[QuarantineRecord] = []
    parsed, problem = _parse(s, job.sources, timings)
    embedder = build_embedder(s)
    config = chunk_config(_Configured(s, embedder))
    chunked: list[ChunkedDocument] = []
    with _embed_lock(embedder):  # a tokenizer serves one thread at a time
        for src, result in parsed:
            if isinstance(result, ParseError):
                failures.append(QuarantineRecord(src.path, "parse", result.reason, result.detail, src.sha256))
                continue
            with timed(timings, "chunk"):
                cd = chunk_stage.chunk_document(result, embedder, config)
            if cd.chunks:
                chunked.append(cd)
            else:
                failures.append(QuarantineRecord(src.path, "chunk", "empty", "no chunk could be made", src.sha256))
    return ChunkedBatch(job.number, chunked, failures, timings, _here(), problem)


def embed_chunked(job: BatchJob, part: ChunkedBatch) -> BatchResult:
    """Embed a parsed batch (vectors kept in the vector cache as each model batch finishes)."""
    from corpusync.core.offline import apply_offline_defaults

    apply_offline_defaults()
    s = job.settings
    timings = dict(part.timings)
    embedded: list[EmbeddedDocument] = []
    stats = EmbedStats()
    if part.chunked:
        embedder = build_embedder(s)
        with _embed_lock(embedder), timed(timings, "embed"), closing(open_database(s, migrate=False)) as conn:
            embedded, stats = embed_batch(s, conn, embedder, job.model_id, part.chunked, reembed=job.reembed)
    return BatchResult(job.number, embedded, part.failures, stats, timings, part.parsed_on, _here(),
                       part.memory_limit_problem)


def prepare_batch(job: BatchJob) -> BatchResult:
    """Parse, chunk and embed one batch where it runs."""
    return embed_chunked(job, parse_batch(job))
