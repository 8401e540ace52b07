"""The refresh steps: each takes the shared RefreshContext, calls the pure stage function in tasks/,
and books counts and timings. Prefect task wrappers (flows/steps.py) call these; the flow wires
them (flows/refresh.py)."""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
from dataclasses import dataclass
from typing import Protocol

from corpusync import lexical, progress
from corpusync.embedders import Embedder
from corpusync.errors import EvalGateFailed, ParseError
from corpusync.runtime import RefreshContext
from corpusync.store import generations, vector_cache, versions
from corpusync.vectors import VectorTable
from schemas.records import (
    ChunkedDocument,
    DiffPlan,
    EmbeddedDocument,
    ParsedDocument,
    QuarantineRecord,
    SourceFile,
)
from schemas.settings import Settings
from tasks import chunk as chunk_stage
from tasks import discover as discover_stage
from tasks import embed as embed_stage
from tasks import load as load_stage
from tasks import parse as parse_stage
from tasks import publish as publish_stage
from tasks.diff import RetryPolicy, diff, with_state
from tasks.parse_worker import ParsePool, default_workers

log = logging.getLogger("corpusync.refresh")


class Configured(Protocol):
    """What the chunker config and the pipeline fingerprint depend on: settings and the embedding model."""

    @property
    def settings(self) -> Settings: ...
    @property
    def embedder(self) -> Embedder: ...


def chunk_config(ctx: Configured) -> chunk_stage.ChunkConfig:
    budget = min(ctx.settings.chunk_max_tokens, ctx.embedder.identity.max_tokens)
    return chunk_stage.ChunkConfig(max_tokens=budget, overlap=ctx.settings.chunk_overlap,
                                   strategy=ctx.settings.chunk_strategy, min_tokens=ctx.settings.chunk_min_tokens)


def pipeline_fingerprint(ctx: Configured) -> str:
    """What must match for a stored version to count as up to date: parser, chunker, lexical analyzer
    (rules, dictionaries, jieba version) and model."""
    raw = "|".join([parse_stage.parser_fingerprint(ctx.settings.parse_options()), chunk_config(ctx).fingerprint,
                    "lexical=" + lexical.Analyzer.from_settings(ctx.settings).fingerprint,
                    ctx.embedder.identity.identity_hash])
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


@dataclass
class Discovered:
    files: list[SourceFile]
    problems: list[QuarantineRecord]


def step_discover(ctx: RefreshContext) -> Discovered:
    s = ctx.settings
    with ctx.timed("discover"), progress.stage("discover") as bar:
        files, problems = discover_stage.discover(ctx.source_root, s.include_globs, s.exclude_globs, bar.advance)
    return Discovered(files, problems)


def step_diff(ctx: RefreshContext, found: Discovered) -> DiffPlan:
    s = ctx.settings
    if s.goldsets:  # a threshold naming a gold set that gates nothing is a configuration error: before any work
        from evaluation.gate import check_threshold_goldsets

        check_threshold_goldsets(s.gate_tolerances, s.gate_floors, s.goldsets, s.goldsets, s.goldset_dirs)
    with ctx.timed("diff"):
        identity = ctx.embedder.identity
        if ctx.published_model_id is not None:
            model_id = versions.find_model(ctx.conn, identity.identity_hash)
            load_stage.check_model(ctx.published_model_id, model_id if model_id is not None else -1,
                                   ctx.published_model_label, identity.label, ctx.reembed)
        fp = pipeline_fingerprint(ctx)
        live = versions.live_versions(ctx.conn, ctx.base_generation)
        quarantined = versions.latest_quarantine(ctx.conn)
        files = found.files
        unsupported = [f for f in files if not parse_stage.supported(f.path)]
        plan = diff(files, live, fp, quarantined, retry=RetryPolicy.from_settings(ctx.settings))
        if ctx.reembed:  # everything again, even with the model unchanged (the help's promise)
            by_path = {f.path: f for f in files}
            plan.changed += [(by_path[v.path], v) for v in plan.unchanged if v.path in by_path]
            plan.unchanged = [v for v in plan.unchanged if v.path not in by_path]
        # Unreadable files are not deletions: keep their live version (bad input never removes a document).
        unreadable = {p.path for p in found.problems}
        plan.deleted = [v for v in plan.deleted if v.path not in unreadable]
        d = ctx.summary.documents  # booked first: a refusal below reports what it refused
        d.new, d.changed, d.unchanged = len(plan.new), len(plan.changed), len(plan.unchanged)
        d.deleted, d.renamed = len(plan.deleted), len(plan.renamed)
        reference = generations.mass_delete_reference(ctx.conn, ctx.settings.mass_delete_window_h)
        publish_stage.check_mass_delete(plan, ctx.settings.max_delete_fraction, ctx.allow_mass_delete, reference)
        ctx.summary.renamed = [{"from": a.path, "to": b.path} for a, b in plan.renamed]
        _quarantine(ctx, found.problems, fp)
        _report_only(ctx, plan.still_quarantined)
        if plan.retrying:
            log.info("retrying %d file(s) quarantined for a cause that can pass: %s", len(plan.retrying),
                     ", ".join(f"{r.path} ({r.reason}, {r.attempts} failure(s))" for r in plan.retrying))
        log.info("%d files: %d new, %d changed, %d unchanged, %d deleted (%d unsupported)", len(files),
                 d.new, d.changed, d.unchanged, d.deleted, len(unsupported))
    return plan


def warm_up(ctx: RefreshContext, plan: DiffPlan) -> threading.Thread | None:
    """Pay first-use costs (the tokenizer the chunker counts with, torch + FlagEmbedding, great_expectations)
    in a background thread while the parse workers run, and only when there is something to parse. The
    model's weights still load only when a chunk needs embedding."""
    if not plan.to_process:
        return None
    embedder, validate = ctx.embedder, ctx.settings.validate_chunks

    def warm() -> None:
        try:
            _ = embedder.tokenizer
            import FlagEmbedding  # noqa: F401  (torch, transformers' models)

            if validate:
                import great_expectations  # noqa: F401
        except Exception as exc:  # the stage that needs it reports the real error
            log.debug("warm-up failed: %s", exc)

    thread = threading.Thread(target=warm, name="corpusync-warm-up", daemon=True)
    thread.start()
    return thread


def _quarantine(ctx: RefreshContext, records: list[QuarantineRecord], fingerprint: str) -> None:
    """Record the failures (a repeat of a known one is not a new row) and report each with its history:
    how many identical failures in a row since when, and when a temporary cause is retried."""
    if not records:
        return
    written = versions.record_quarantine(ctx.conn, ctx.run_id, fingerprint, records)
    states = versions.latest_quarantine(ctx.conn, [r.path for r in records])
    policy = RetryPolicy.from_settings(ctx.settings)
    _report_only(ctx, [with_state(r, states.get(r.path), policy, repeated=r.path not in written) for r in records])


def _report_only(ctx: RefreshContext, records: list[QuarantineRecord]) -> None:
    for r in records:
        ctx.summary.quarantined.append(r.as_dict())
        retry = f" (retried after {r.retry_at:%Y-%m-%d %H:%M:%S %Z})" if r.retry_at else ""
        log.warning("%s %s at %s: %s: %s%s", r.status, r.path, r.stage, r.reason, r.error, retry)
    ctx.summary.documents.quarantined = len(ctx.summary.quarantined)


def step_parse(ctx: RefreshContext, plan: DiffPlan) -> list[ParsedDocument]:
    """Parse in the isolated worker pool (results in completion order for the progress bar, handed on in
    the plan's order, so a run is deterministic whatever the number of workers)."""
    todo = plan.to_process
    parsed: list[ParsedDocument] = []
    failed: list[QuarantineRecord] = []
    s = ctx.settings
    options = s.parse_options()
    results: dict[str, ParsedDocument | ParseError] = {}
    with ctx.timed("parse"), progress.stage("parse", len(todo)) as bar:
        if s.parse_isolation and todo:
            pool = ParsePool(options, workers=min(s.parse_workers or default_workers(), len(todo)),
                             timeout_s=s.parse_timeout_s, timeout_per_page_s=s.parse_timeout_per_page_s,
                             memory_mb=s.parse_memory_mb, parse=parse_stage.parse_document,
                             warm_for=[src.path for src in todo])
            try:
                for src, result in pool.parse_many(todo, ordered=False):
                    results[src.path] = result
                    bar.advance()
            finally:
                if pool.memory_limit_problem:  # isolation weaker than configured: say so in the run
                    ctx.summary.message = "; ".join(m for m in (ctx.summary.message, pool.memory_limit_problem) if m)
                pool.close()
        else:
            for src in todo:
                try:
                    results[src.path] = parse_stage.parse_document(src, options)
                except ParseError as exc:
                    results[src.path] = exc
                bar.advance()
    for src in todo:
        result = results[src.path]
        if isinstance(result, ParseError):
            failed.append(QuarantineRecord(src.path, "parse", result.reason, result.detail, src.sha256))
        else:
            parsed.append(result)
    _quarantine(ctx, failed, pipeline_fingerprint(ctx))
    return parsed


def step_chunk(ctx: RefreshContext, parsed: list[ParsedDocument], plan: DiffPlan) -> list[ChunkedDocument]:
    replaces = {src.path: live for src, live in plan.changed}
    config = chunk_config(ctx)
    out: list[ChunkedDocument] = []
    failed: list[QuarantineRecord] = []
    with ctx.timed("chunk"), progress.stage("chunk", len(parsed)) as bar:
        for doc in parsed:
            cd = chunk_stage.chunk_document(doc, ctx.embedder, config)
            if not cd.chunks:
                failed.append(QuarantineRecord(doc.source.path, "chunk", "empty", "no chunk could be made",
                                               doc.source.sha256))
            else:
                cd.replaces = replaces.get(doc.source.path)
                out.append(cd)
            bar.advance()
    _quarantine(ctx, failed, pipeline_fingerprint(ctx))
    return out


def step_embed(ctx: RefreshContext, chunked: list[ChunkedDocument]) -> list[EmbeddedDocument]:
    if not chunked:
        return []
    with ctx.timed("embed"):
        ctx.model_id = model_id = versions.register_model(ctx.conn, ctx.embedder.identity)
        identity = ctx.embedder.identity
        stored = (VectorTable.empty(identity.dimension, identity.sparse_trained) if ctx.reembed else
                  vector_cache.stored_vectors(ctx.conn, model_id, (c.text_sha256 for d in chunked for c in d.chunks),
                                              dimension=identity.dimension, sparse=identity.sparse_trained))
        total = sum(len(d.chunks) for d in chunked)
        with progress.stage("embed", total - sum(1 for d in chunked for c in d.chunks
                                                 if c.text_sha256 in stored.rows)) as bar:
            processes = ctx.settings.segment_processes or lexical.default_processes()
            sparse_dim = identity.sparse_dim if identity.sparse_trained else None

            def keep(hashes: list[str], out: embed_stage.EmbeddingOutput) -> None:  # durable per batch
                vector_cache.cache_vectors(ctx.conn, model_id, hashes, out.dense, out.sparse, sparse_dim)

            embedded, stats = embed_stage.embed_documents(
                chunked, ctx.embedder, stored, ctx.settings.embed_batch_tokens, bar.advance,
                segment=functools.partial(lexical.Analyzer.from_settings(ctx.settings).index_texts,
                                          processes=processes), on_vectors=keep)
    ctx.summary.chunks.embedded = stats.embedded
    ctx.summary.chunks.reused = stats.reused + stats.deduplicated
    return embedded


def step_validate(ctx: RefreshContext, embedded: list[EmbeddedDocument]) -> tuple[list[EmbeddedDocument], str]:
    """great-expectations suite over the batch; a document with a failing chunk is quarantined, the rest
    load. Returns the documents to load and the suite's Markdown report."""
    if not embedded or not ctx.settings.validate_chunks:
        return embedded, ""
    from tasks.validate import Thresholds, validate_chunks

    identity = ctx.embedder.identity
    with ctx.timed("validate"):
        outcome = validate_chunks(embedded, Thresholds(
            max_tokens=chunk_config(ctx).max_tokens, dimension=identity.dimension, normalized=identity.normalized,
            norm_tolerance=ctx.settings.validate_norm_tolerance, min_ocr_confidence=ctx.settings.ocr_min_confidence,
        ))
    failed = [QuarantineRecord(ed.doc.parsed.source.path, "validate", "data-quality",
                               "failed expectations: " + ", ".join(outcome.failures[ed.doc.parsed.source.path]),
                               ed.doc.parsed.source.sha256)
              for ed in embedded if ed.doc.parsed.source.path in outcome.failures]
    _quarantine(ctx, failed, pipeline_fingerprint(ctx))
    ctx.summary.validation = {"expectations": outcome.results, "quarantined": sorted(outcome.failures)}
    return outcome.passed, outcome.markdown()


def step_load(ctx: RefreshContext, embedded: list[EmbeddedDocument], plan: DiffPlan) -> int | None:
    """Write the candidate generation. Returns its number, or None when nothing would change."""
    loaded_paths = {e.doc.parsed.source.path for e in embedded}
    # A changed document that failed to parse keeps its live version: it is not retired.
    deleted = [v.version_id for v in plan.deleted]
    if not embedded and not deleted:
        return None
    with ctx.timed("load"), progress.stage("load", len(embedded)) as bar:
        if ctx.model_id is None:
            ctx.model_id = versions.register_model(ctx.conn, ctx.embedder.identity)
        ctx.generation = generations.create_candidate(ctx.conn, ctx.run_id, ctx.model_id)
        identity = ctx.embedder.identity
        inserted, retired = versions.load_documents(
            ctx.conn, embedded, run_id=ctx.run_id, generation=ctx.generation, model_id=ctx.model_id,
            fingerprint=pipeline_fingerprint(ctx), chunk_config=chunk_config(ctx).as_dict(),
            sparse_dim=identity.sparse_dim if identity.sparse_trained else None, on_document=bar.advance,
        )
        if ctx.reembed and ctx.published_model_id not in (None, ctx.model_id):
            # A model switch: every live document not re-embedded above leaves this generation.
            stale = [v.version_id for v in versions.live_versions(ctx.conn, ctx.base_generation)
                     if v.path not in loaded_paths]
            deleted = sorted(set(deleted) | set(stale))
        retired += versions.retire(ctx.conn, deleted, ctx.generation)
    ctx.summary.chunks.inserted = inserted
    ctx.summary.chunks.retired = retired
    return ctx.generation


def step_evaluate(ctx: RefreshContext, generation: int | None) -> str | None:
    """Evaluate the candidate on the configured gold sets before it goes live; refuse it on regression.

    Returns the Markdown report (None when there is nothing to evaluate)."""
    if generation is None or not ctx.settings.goldsets:
        return None
    from corpusync.evaluating import evaluate_and_gate
    from query.search import Searcher

    searcher = Searcher(ctx.settings, ctx.conn, ctx.embedder, candidates=True)
    with ctx.timed("tune"):
        from corpusync.tuning import auto_tune

        tuned = auto_tune(ctx.settings, ctx.conn, searcher, generation)
    if tuned is not None:
        ctx.summary.fusion = tuned.as_dict()
    with ctx.timed("evaluate"):
        outcome = evaluate_and_gate(
            ctx.settings, ctx.conn, searcher, generation,
            specs=ctx.settings.goldsets, run_id=ctx.run_id, baseline_generation=ctx.base_generation or None,
            override=ctx.skip_gate,
        )
    ctx.summary.evaluation = outcome.summary()
    ctx.evaluation_report = outcome.report  # also when refused below: Prefect shows it (flows/artifacts.py)
    if not outcome.passed:
        failures = "; ".join(outcome.failures())
        if not ctx.skip_gate:
            raise EvalGateFailed(
                f"generation {generation} was not published: retrieval regressed ({failures}). Generation "
                f"{ctx.base_generation} stays live. Report: {outcome.report_path}. To publish anyway, rerun "
                "with --skip-gate (recorded)."
            )
        ctx.summary.message = f"evaluation gate failed but was overridden with --skip-gate: {failures}"
        log.warning(ctx.summary.message)
    return outcome.report


def step_publish(ctx: RefreshContext, generation: int | None) -> None:
    if generation is None:
        ctx.summary.status = "no_changes"
        ctx.summary.generation = ctx.base_generation
        return
    assert ctx.model_id is not None
    with ctx.timed("publish"):
        generations.publish(ctx.conn, generation, ctx.base_generation, ctx.model_id)
    ctx.summary.status = "published"
    ctx.summary.published = True
    ctx.summary.generation = generation


def step_prune(ctx: RefreshContext) -> None:
    with ctx.timed("prune"):
        result = generations.prune(ctx.conn, ctx.settings.retention_generations, ctx.settings.vector_cache_ttl_h)
    ctx.summary.chunks.pruned = result["chunks"]
