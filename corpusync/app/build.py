"""The candidate's build: parse -> chunk -> embed -> validate -> load, streamed in bounded batches.

The parse workers (separate processes) run ahead of the rest: a thread feeds their results, as they finish,
into a bounded queue, while this thread chunks each document and, once a batch holds `build_batch_documents`
documents or `build_batch_tokens` tokens, embeds, validates and loads it into the candidate generation. So
embedding one batch overlaps parsing the next, and what the run holds in memory is set by the batch (and
the queue), not by the corpus or the size of the change. Each loaded batch is durable in the candidate
(and each embedded one in the vector cache) as soon as it exists; the generation stays unpublished, so
readers still see the base generation until the one publish transaction.
"""

from __future__ import annotations

import contextvars
import logging
import queue
import threading
import time
from collections.abc import Generator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

import psycopg

from corpusync.app.fanout import BatchResult, EmbeddingCancelled, embed_batch
from corpusync.app.pipeline import _quarantine, chunk_config, pipeline_fingerprint, validation_fingerprint
from corpusync.app.runtime import RefreshContext
from corpusync.core import progress
from corpusync.core.errors import ParseError
from corpusync.store import generations, versions
from corpusync.store.db import open_database
from schemas.records import (
    ChunkedDocument,
    DiffPlan,
    EmbeddedDocument,
    LiveVersion,
    ParsedDocument,
    QuarantineRecord,
    SourceFile,
)
from tasks import chunk as chunk_stage
from tasks import parse as parse_stage
from tasks import validate_worker
from tasks.embed import EmbedStats
from tasks.parse_worker import ParsePool, default_workers
from tasks.validate import Thresholds, ValidationOutcome, validate_chunks

log = logging.getLogger("corpusync.refresh")

_DONE = object()
_Embedded = tuple[list[EmbeddedDocument], EmbedStats, float]  # a batch embedded, its counts, its seconds


@dataclass
class Validation:
    """The suite's results over every batch: per expectation, success only if every batch passed."""

    results: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    failures: dict[str, list[str]] = field(default_factory=dict)

    def add(self, outcome: ValidationOutcome) -> None:
        for r in outcome.results:
            seen = self.results.setdefault((r["expectation"], r["column"]), dict(r, unexpected_count=0))
            seen["success"] = seen["success"] and r["success"]
            seen["unexpected_count"] += r["unexpected_count"]
        self.failures.update(outcome.failures)

    def outcome(self) -> ValidationOutcome:
        return ValidationOutcome([], self.failures, list(self.results.values()))


def step_build(ctx: RefreshContext, plan: DiffPlan) -> int | None:
    """Build the candidate generation from the plan; returns its number (None when nothing would change).
    The validation report (Markdown) is left in ctx.validation_report."""
    s = ctx.settings
    replaces = {src.path: live for src, live in plan.changed}
    validation = Validation()
    batch: list[ChunkedDocument] = []
    tokens = 0
    with (progress.stage("build", len(plan.to_process)) as bar, closing(_parsed(ctx, plan.to_process)) as stream,
          EmbedAhead(ctx) as embedding):
        for parsed in stream:
            chunked = _chunk(ctx, parsed, replaces.get(parsed.source.path))
            bar.advance()
            if chunked is None:
                continue
            batch.append(chunked)
            tokens += sum(c.token_count for c in chunked.chunks)
            if len(batch) >= s.build_batch_documents or tokens >= s.build_batch_tokens:
                _load_embedded(ctx, embedding.submit(batch), validation)
                batch, tokens = [], 0
        if batch:
            _load_embedded(ctx, embedding.submit(batch), validation)
        _load_embedded(ctx, embedding.finish(), validation)
    return finish_build(ctx, plan, validation)


class EmbedAhead:
    """Embeds one batch on a thread of its own (with its own connection, for the vector cache) while the
    build's thread validates and loads the batch before it and chunks the next, so the model does not wait
    for them. `submit(batch)` returns the previous batch, embedded (its vectors cached), before the new one
    starts: an error of the previous batch surfaces at once, and at most two batches are held beyond the one
    being chunked. The candidate is written by the build's thread only. When the build fails (or is
    interrupted) the batch in the model stops after its current model batch, whose vectors are kept."""

    def __init__(self, ctx: RefreshContext) -> None:
        self.ctx = ctx
        self._thread: ThreadPoolExecutor | None = None
        self._conn: psycopg.Connection | None = None
        self._pending: Future[_Embedded] | None = None
        self._cancel = threading.Event()

    def __enter__(self) -> EmbedAhead:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if exc_type is not None:
            self._cancel.set()
        try:
            if self._thread is not None:
                self._thread.shutdown(wait=True, cancel_futures=True)
            pending = self._pending
            failed = pending.exception() if pending is not None and not pending.cancelled() else None
            if failed is not None and not isinstance(failed, EmbeddingCancelled):  # else lost behind the first
                log.warning("the batch being embedded failed too: %s: %s", type(failed).__name__, failed)
        finally:
            if self._conn is not None:
                self._conn.close()

    def submit(self, batch: list[ChunkedDocument]) -> list[EmbeddedDocument]:
        """Start embedding `batch` once the previous one is done; returns that one ([] for the first)."""
        previous, self._pending = self._pending, None
        done = self._collect(previous)
        ctx = self.ctx
        model_id = _model(ctx)  # registered by the writer's connection, before the thread needs it
        if ctx.settings.validate_chunks:  # started by now unless the model runs in a process of its own
            validate_worker.start()
        if self._thread is None:
            self._conn = open_database(ctx.settings, migrate=False)
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="corpusync-embed")
        conn, cancel = self._conn, self._cancel
        assert conn is not None

        def embed() -> _Embedded:
            t0 = time.perf_counter()
            embedded, stats = step_embed(ctx, conn, model_id, batch, cancel)
            return embedded, stats, time.perf_counter() - t0

        # the flow run's context goes along: the thread's warnings reach the run's logs in Prefect
        self._pending = self._thread.submit(contextvars.copy_context().run, embed)
        return done

    def finish(self) -> list[EmbeddedDocument]:
        """The last batch submitted, embedded."""
        previous, self._pending = self._pending, None
        return self._collect(previous)

    def _collect(self, future: Future[_Embedded] | None) -> list[EmbeddedDocument]:
        if future is None:
            return []
        embedded, stats, seconds = future.result()
        ctx = self.ctx  # booked on the build's thread: the timings and summary have one writer
        ctx.timings["embed"] = round(ctx.timings.get("embed", 0.0) + seconds, 4)
        ctx.summary.chunks.embedded += stats.embedded
        ctx.summary.chunks.reused += stats.reused + stats.deduplicated
        return embedded


def finish_build(ctx: RefreshContext, plan: DiffPlan, validation: Validation) -> int | None:
    """After the last batch: the validation summary and report, deleted documents out of the candidate, and
    the model's HNSW indexes built if this was its first build (before anything searches the candidate)."""
    if validation.results:
        outcome = validation.outcome()
        ctx.summary.validation = {"expectations": outcome.results, "quarantined": sorted(outcome.failures)}
        ctx.validation_report = outcome.markdown()
    generation = _retire(ctx, plan)
    if ctx.model_id is not None:
        with ctx.timed("index"):
            versions.index_model(ctx.conn, ctx.model_id, ctx.embedder.identity,
                                 memory=ctx.settings.index_build_memory, workers=ctx.settings.index_workers())
    return generation


def register_model(ctx: RefreshContext) -> int:
    """The embedding model's id (registered on first need), for jobs that embed elsewhere."""
    return _model(ctx)


def load_prepared(ctx: RefreshContext, result: BatchResult, replaces: dict[str, LiveVersion],
                  validation: Validation) -> None:
    """A batch a job prepared (corpusync/app/fanout.py), taken in by the writer: its failures quarantined, its
    counts and times booked, then validated and loaded into the candidate like a streamed batch."""
    _quarantine(ctx, result.failures, pipeline_fingerprint(ctx))
    for stage, seconds in result.timings.items():
        ctx.timings[stage] = round(ctx.timings.get(stage, 0.0) + seconds, 4)
    ctx.summary.chunks.embedded += result.stats.embedded
    ctx.summary.chunks.reused += result.stats.reused + result.stats.deduplicated
    ctx.add_message(result.memory_limit_problem)
    for ed in result.embedded:
        ed.doc.replaces = replaces.get(ed.doc.parsed.source.path)
    passed, outcome = step_validate(ctx, result.embedded)
    if outcome is not None:
        validation.add(outcome)
    step_load_batch(ctx, passed)


def _parsed(ctx: RefreshContext, todo: list[SourceFile]) -> Generator[ParsedDocument, None, None]:
    """Parsed documents as the workers finish them (failures quarantined on the way)."""
    s = ctx.settings
    options = s.parse_options()
    if not todo:
        return
    if not s.parse_isolation:
        for src in todo:
            with ctx.timed("parse"):
                try:
                    doc = parse_stage.parse_document(src, options)
                except ParseError as exc:
                    _parse_failed(ctx, src, exc)
                    continue
            yield doc
        return
    pool = ParsePool(options, workers=min(s.parse_workers or default_workers(), len(todo)),
                     timeout_s=s.parse_timeout_s, timeout_per_page_s=s.parse_timeout_per_page_s,
                     memory_mb=s.parse_memory_mb, parse=parse_stage.parse_document,
                     warm_for=[src.path for src in todo])
    results: queue.Queue[Any] = queue.Queue(maxsize=max(2 * s.build_batch_documents, 8))
    stop = threading.Event()

    def hand_on(item: object) -> bool:
        """Put `item` in the queue unless the consumer has stopped; False once it has."""
        while not stop.is_set():
            try:
                results.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def feed() -> None:
        """Runs the pool (this thread owns it and closes it), whatever the consumer does."""
        try:
            for item in pool.parse_many(todo, ordered=False):
                if not hand_on(item):
                    break  # the consumer failed: parse_many cancels what is in flight
        except BaseException as exc:  # handed to the consumer, raised there
            hand_on(exc)
        finally:
            pool.close()
            hand_on(_DONE)

    feeder = threading.Thread(target=feed, name="corpusync-parse-feed", daemon=True)
    feeder.start()
    try:
        while True:
            with ctx.timed("parse"):  # the time this thread waited for the workers
                item = results.get()
            if item is _DONE:
                break
            if isinstance(item, BaseException):
                raise item
            src, result = item
            if isinstance(result, ParseError):
                _parse_failed(ctx, src, result)
            else:
                yield result
    finally:
        stop.set()  # on an early exit the feeder stops at its next document (and closes the pool)
        if pool.memory_limit_problem:  # isolation weaker than configured: say so in the run
            ctx.add_message(pool.memory_limit_problem)


def _parse_failed(ctx: RefreshContext, src: SourceFile, exc: ParseError) -> None:
    _quarantine(ctx, [QuarantineRecord(src.path, "parse", exc.reason, exc.detail, src.sha256)],
                pipeline_fingerprint(ctx))


def _chunk(ctx: RefreshContext, doc: ParsedDocument, replaces: LiveVersion | None) -> ChunkedDocument | None:
    with ctx.timed("chunk"):
        cd = chunk_stage.chunk_document(doc, ctx.embedder, chunk_config(ctx))
    if not cd.chunks:
        _quarantine(ctx, [QuarantineRecord(doc.source.path, "chunk", "empty", "no chunk could be made",
                                           doc.source.sha256)], pipeline_fingerprint(ctx))
        return None
    cd.replaces = replaces
    return cd


def _load_embedded(ctx: RefreshContext, embedded: list[EmbeddedDocument], validation: Validation) -> None:
    passed, outcome = step_validate(ctx, embedded)
    if outcome is not None:
        validation.add(outcome)
    step_load_batch(ctx, passed)


def step_embed(ctx: RefreshContext, conn: psycopg.Connection, model_id: int, chunked: list[ChunkedDocument],
               cancel: threading.Event | None = None) -> tuple[list[EmbeddedDocument], EmbedStats]:
    """Vectors for one batch (embed_batch) on `conn`. It runs on the embedding thread (EmbedAhead), so it
    books nothing in ctx: the caller does."""
    return embed_batch(ctx.settings, conn, ctx.embedder, model_id, chunked, reembed=ctx.reembed, cancel=cancel)


def step_validate(ctx: RefreshContext, embedded: list[EmbeddedDocument]
                  ) -> tuple[list[EmbeddedDocument], ValidationOutcome | None]:
    """great-expectations suite over one batch; a document with a failing chunk is quarantined, the rest
    load. Returns the documents to load and the batch's outcome (None when the suite is off)."""
    if not embedded or not ctx.settings.validate_chunks:
        return embedded, None
    validate_worker.start()  # started by now, except in a mapped build whose model runs in a process of its own
    identity = ctx.embedder.identity
    with ctx.timed("validate"):
        outcome = validate_chunks(embedded, Thresholds(
            max_tokens=chunk_config(ctx).max_tokens, dimension=identity.dimension, normalized=identity.normalized,
            norm_tolerance=ctx.settings.validate_norm_tolerance, min_ocr_confidence=ctx.settings.ocr_min_confidence,
        ), suite=validate_worker.suite())
    failed = [QuarantineRecord(ed.doc.parsed.source.path, "validate", "data-quality",
                               "failed expectations: " + ", ".join(outcome.failures[ed.doc.parsed.source.path]),
                               ed.doc.parsed.source.sha256)
              for ed in embedded if ed.doc.parsed.source.path in outcome.failures]
    _quarantine(ctx, failed, validation_fingerprint(ctx))  # tried again when validation changes
    return outcome.passed, outcome


def _model(ctx: RefreshContext) -> int:
    """The embedding model's id, registered on first need."""
    if ctx.model_id is None:
        ctx.model_id = versions.register_model(ctx.conn, ctx.embedder.identity)
    return ctx.model_id


def _candidate(ctx: RefreshContext) -> int:
    """The candidate generation, created on first need."""
    if ctx.generation is None:
        ctx.generation = generations.create_candidate(ctx.conn, ctx.run_id, _model(ctx))
    return ctx.generation


def step_load_batch(ctx: RefreshContext, embedded: list[EmbeddedDocument]) -> None:
    """One batch into the candidate (new versions, the versions they replace retired)."""
    if not embedded:
        return
    with ctx.timed("load"):
        generation = _candidate(ctx)
        identity = ctx.embedder.identity
        inserted, retired = versions.load_documents(
            ctx.conn, embedded, run_id=ctx.run_id, generation=generation, model_id=_model(ctx),
            fingerprint=pipeline_fingerprint(ctx), chunk_config=chunk_config(ctx).as_dict(),
            sparse_dim=identity.sparse_dim if identity.sparse_trained else None,
        )
        ctx.loaded_paths.update(e.doc.parsed.source.path for e in embedded)
    ctx.summary.chunks.inserted += inserted
    ctx.summary.chunks.retired += retired


def _retire(ctx: RefreshContext, plan: DiffPlan) -> int | None:
    """Deleted documents (and, on a model switch, every live document not re-embedded) leave the candidate.
    A changed document that failed to parse keeps its live version: it is not retired."""
    deleted = [v.version_id for v in plan.deleted]
    if ctx.generation is None and not deleted:
        return None
    with ctx.timed("load"):
        generation = _candidate(ctx)
        if ctx.reembed and ctx.published_model_id not in (None, ctx.model_id):
            stale = [v.version_id for v in versions.live_versions(ctx.conn, ctx.base_generation)
                     if v.path not in ctx.loaded_paths]
            deleted = sorted(set(deleted) | set(stale))
        ctx.summary.chunks.retired += versions.retire(ctx.conn, deleted, generation)
        # a rename whose new path failed to parse left nothing to follow: the document is only gone
        versions.record_renames(ctx.conn, generation, ctx.run_id, [(old.path, new.path) for old, new in plan.renamed
                                                                    if new.path in ctx.loaded_paths])
    return generation
