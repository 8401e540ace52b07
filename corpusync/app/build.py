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

import logging
import queue
import threading
from collections.abc import Generator
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

from corpusync.app.fanout import BatchResult, embed_batch
from corpusync.app.pipeline import _quarantine, chunk_config, pipeline_fingerprint
from corpusync.app.runtime import RefreshContext
from corpusync.core import progress
from corpusync.core.errors import ParseError
from corpusync.store import generations, versions
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
from tasks.parse_worker import ParsePool, default_workers
from tasks.validate import Thresholds, ValidationOutcome, validate_chunks

log = logging.getLogger("corpusync.refresh")

_DONE = object()


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
    with progress.stage("build", len(plan.to_process)) as bar, closing(_parsed(ctx, plan.to_process)) as stream:
        for parsed in stream:
            chunked = _chunk(ctx, parsed, replaces.get(parsed.source.path))
            bar.advance()
            if chunked is None:
                continue
            batch.append(chunked)
            tokens += sum(c.token_count for c in chunked.chunks)
            if len(batch) >= s.build_batch_documents or tokens >= s.build_batch_tokens:
                _finish_batch(ctx, batch, validation)
                batch, tokens = [], 0
        if batch:
            _finish_batch(ctx, batch, validation)
    return finish_build(ctx, plan, validation)


def finish_build(ctx: RefreshContext, plan: DiffPlan, validation: Validation) -> int | None:
    """After the last batch: the validation summary and report, deleted documents out of the candidate."""
    if validation.results:
        outcome = validation.outcome()
        ctx.summary.validation = {"expectations": outcome.results, "quarantined": sorted(outcome.failures)}
        ctx.validation_report = outcome.markdown()
    return _retire(ctx, plan)


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


def _finish_batch(ctx: RefreshContext, batch: list[ChunkedDocument], validation: Validation) -> None:
    embedded = step_embed(ctx, batch)
    passed, outcome = step_validate(ctx, embedded)
    if outcome is not None:
        validation.add(outcome)
    step_load_batch(ctx, passed)


def step_embed(ctx: RefreshContext, chunked: list[ChunkedDocument]) -> list[EmbeddedDocument]:
    """Vectors for one batch (embed_batch), booked in the run's summary."""
    if not chunked:
        return []
    if ctx.settings.validate_chunks:  # started by now unless the model runs in a process of its own (warm_up)
        validate_worker.start()
    with ctx.timed("embed"):
        embedded, stats = embed_batch(ctx.settings, ctx.conn, ctx.embedder, _model(ctx), chunked,
                                      reembed=ctx.reembed)
    ctx.summary.chunks.embedded += stats.embedded
    ctx.summary.chunks.reused += stats.reused + stats.deduplicated
    return embedded


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
    _quarantine(ctx, failed, pipeline_fingerprint(ctx))
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
    return generation
