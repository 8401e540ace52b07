"""The refresh steps: each takes the shared RefreshContext, calls the pure stage function in tasks/,
and books counts and timings. Prefect task wrappers (flows/steps.py) call these; the flow wires
them (flows/refresh.py)."""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from corpusync.adapters.embedders import FlagEmbedder, preload_libraries
from corpusync.adapters.embedding import Embedder
from corpusync.app import pruning
from corpusync.app.runtime import RefreshContext
from corpusync.core import lexical, progress
from corpusync.core.errors import EvalGateFailed
from corpusync.store import generations, versions
from schemas.records import (
    DiffPlan,
    QuarantineRecord,
    SourceFile,
)
from schemas.settings import Settings
from tasks import chunk as chunk_stage
from tasks import discover as discover_stage
from tasks import load as load_stage
from tasks import parse as parse_stage
from tasks import publish as publish_stage
from tasks import validate_worker
from tasks.diff import RetryPolicy, closed_quarantine, diff, with_state
from tasks.validate import VALIDATE_LOGIC_VERSION

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


def validation_fingerprint(ctx: Configured) -> str:
    """What a validate-stage quarantine was decided by besides the pipeline: the suite's logic version and its
    settings (the other thresholds come from the chunker, the model and the parse options)."""
    s = ctx.settings
    suite = f"v{VALIDATE_LOGIC_VERSION};tol={s.validate_norm_tolerance}" if s.validate_chunks else "off"
    raw = pipeline_fingerprint(ctx) + "|validate=" + suite
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


def stage_fingerprints(ctx: Configured) -> dict[str, str]:
    """The fingerprints quarantine records of stages that depend on more than the pipeline are written with."""
    return {"validate": validation_fingerprint(ctx)}


@dataclass
class Discovered:
    files: list[SourceFile]
    problems: list[QuarantineRecord]


_offered: tuple[tuple[Any, ...], Discovered] | None = None


def _discovery_key(settings: Settings, source: Path) -> tuple[Any, ...]:
    return source.resolve(), tuple(settings.include_globs), tuple(settings.exclude_globs)


@contextmanager
def discovered(settings: Settings, source: Path, found: Discovered) -> Iterator[None]:
    """Inside this block the next discover of `source` with the same include/exclude globs takes `found`
    instead of walking and hashing the folder again: the CLI's check for changes just did that. A snapshot
    a second older is as valid as a new one (a file that changes now is the next run's work); the diff
    still runs under the writer lock, against what is published then."""
    global _offered
    _offered = (_discovery_key(settings, source), found)
    try:
        yield
    finally:
        _offered = None


def step_discover(ctx: RefreshContext) -> Discovered:
    global _offered
    s = ctx.settings
    offered, _offered = _offered, None  # one run takes it, once
    with ctx.timed("discover"), progress.stage("discover") as bar:
        if offered is not None and offered[0] == _discovery_key(s, Path(ctx.source_root)):
            bar.advance(len(offered[1].files))
            return offered[1]
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
        # unreadable files are not deletions: their live version stays (bad input never removes a document)
        unreadable = {p.path for p in found.problems}
        plan = diff(files, live, fp, quarantined, retry=RetryPolicy.from_settings(ctx.settings),
                    stage_fingerprints=stage_fingerprints(ctx), unreadable=unreadable)
        if ctx.reembed:  # everything again, even with the model unchanged (the help's promise)
            by_path = {f.path: f for f in files}
            plan.changed += [(by_path[v.path], v) for v in plan.unchanged if v.path in by_path]
            plan.unchanged = [v for v in plan.unchanged if v.path not in by_path]
        d = ctx.summary.documents  # booked first: a refusal below reports what it refused
        # a rename is counted once, as renamed (it is processed as a delete plus a new document)
        d.new, d.changed, d.unchanged = len(plan.added), len(plan.changed), len(plan.unchanged)
        d.deleted, d.renamed = len(plan.removed), len(plan.renamed)
        reference = generations.mass_delete_reference(ctx.conn, ctx.settings.mass_delete_window_h)
        publish_stage.check_mass_delete(plan, ctx.settings.max_delete_fraction, ctx.allow_mass_delete, reference)
        ctx.summary.renamed = [{"from": a.path, "to": b.path} for a, b in plan.renamed]
        _close_quarantine(ctx, closed_quarantine(files, unreadable, live, quarantined))
        _quarantine(ctx, found.problems, fp)
        _report_only(ctx, plan.still_quarantined)
        if plan.retrying:
            log.info("retrying %d file(s) quarantined for a cause that can pass: %s", len(plan.retrying),
                     ", ".join(f"{r.path} ({r.reason}, {r.attempts} failure(s))" for r in plan.retrying))
        log.info("%d files: %d new, %d changed, %d unchanged, %d deleted, %d renamed (%d unsupported)", len(files),
                 d.new, d.changed, d.unchanged, d.deleted, d.renamed, len(unsupported))
    return plan


_warm_up: threading.Thread | None = None
_want_model = threading.Event()


def warm_up(embedder: Embedder, *, validate: bool, model: bool = False, host: bool = False,
            shared: tuple[Path, float] | None = None) -> None:
    """Pay first-use costs once per process, while other work runs: torch + FlagEmbedding and the tokenizer
    the chunker counts with in a background thread; with `model`, then the model's weights (a flow asks once
    its plan has documents to build: their new text needs them); with `validate`, great_expectations in the
    validation worker's own process. The CLI starts the thread as soon as it knows there is work (the worker
    later: it would compete with Prefect's API server for the other core). With `host` (a fresh process that
    refreshes once: the CLI) torch and the model go to a process of their own instead
    (corpusync/adapters/model_host.py) and only the tokenizer loads here; with `shared` (home, linger in
    seconds; the CLI's settings.model_linger_s) to the home's model server, which outlives the command
    (corpusync/adapters/model_server.py)."""
    global _warm_up
    if host and isinstance(embedder, FlagEmbedder):
        from corpusync.adapters.model_host import host_model
        from corpusync.adapters.model_server import share_model

        if not (shared and share_model(embedder, *shared)):
            host_model(embedder)
    if isinstance(embedder, FlagEmbedder) and embedder.hosted:
        # the validation worker waits for the first batch to go to the model (build.EmbedAhead): until then this
        # process plans, parses and chunks on one core and the model process imports on the other; unless that
        # process is a shared server that has imported already, when great_expectations is the longest wait
        if validate and embedder.host_warm:
            validate_worker.start()
        if model:
            embedder.load_model()  # in the model process: returns at once
        embedder.count_tokens(["warm-up"])  # tokenizer.json: milliseconds
        return
    if validate:
        validate_worker.start()
    if model:
        _want_model.set()
    if _warm_up is not None and (_warm_up.is_alive() or not model):
        return  # running (it loads the model if asked before it ends), or done and nothing more wanted

    def warm() -> None:
        try:
            preload_libraries()  # torch, transformers, FlagEmbedding
            embedder.count_tokens(["warm-up"])  # loads the tokenizer
            if _want_model.is_set() and isinstance(embedder, FlagEmbedder):
                embedder.load_model()
        except Exception as exc:  # the stage that needs it reports the real error
            log.debug("warm-up failed: %s", exc)

    _warm_up = threading.Thread(target=warm, name="corpusync-warm-up", daemon=True)
    _warm_up.start()


def stop_workers() -> None:
    """Stop what warm_up started in other processes now: for a process that refreshes once (the CLI)."""
    validate_worker.stop()


def release_workers() -> None:
    """Let go of what warm_up started in other processes: the validation worker stays a minute for this
    process's next refresh (tasks/validate_worker.py), then exits; the CLI stops it as its command ends."""
    validate_worker.release()


def _close_quarantine(ctx: RefreshContext, closed: dict[str, str]) -> None:
    """Close the quarantine records that no longer describe their file (tasks/diff.py closed_quarantine), so
    documents_current stops reporting them and the diff no longer skips the path for them."""
    if versions.close_quarantine(ctx.conn, ctx.run_id, closed):
        ctx.summary.quarantine_closed = [{"path": p, "resolution": why} for p, why in sorted(closed.items())]
        log.info("quarantine closed for %d file(s): %s", len(closed),
                 ", ".join(f"{q['path']} ({q['resolution']})" for q in ctx.summary.quarantine_closed))


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


def step_evaluate(ctx: RefreshContext, generation: int | None) -> str | None:
    """Evaluate the candidate on the configured gold sets before it goes live; refuse it on regression.

    Returns the Markdown report (None when there is nothing to evaluate)."""
    if generation is None or not ctx.settings.goldsets:
        return None
    from corpusync.app.evaluating import evaluate_and_gate
    from query.search import Searcher

    searcher = Searcher(ctx.settings, ctx.conn, ctx.embedder, candidates=True)
    with ctx.timed("tune"):
        from corpusync.app.tuning import auto_tune

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
        indexed = generations.publish(ctx.conn, generation, ctx.base_generation, ctx.model_id)
    if indexed:  # after the diff's closures (gone, live-content): a path's failure closed by its new version
        ctx.summary.quarantine_closed = sorted(
            [*ctx.summary.quarantine_closed, *({"path": p, "resolution": "indexed"} for p in indexed)],
            key=lambda q: q["path"])
    ctx.summary.status = "published"
    ctx.summary.published = True
    ctx.summary.generation = generation


def step_prune(ctx: RefreshContext) -> None:
    with ctx.timed("prune"):
        result = pruning.prune(ctx.conn, ctx.settings, ocr_every_s=pruning.REFRESH_OCR_PRUNE_EVERY_S)
    ctx.summary.chunks.pruned = result["chunks"]
