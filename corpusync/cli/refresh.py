"""`corpusync refresh`: the command, its progress bar and its summary."""

from __future__ import annotations

import json
import os
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, Any

import typer

from corpusync.cli.base import app, load_settings
from corpusync.core.errors import CorpusyncError


class _Bar:
    """rich progress bar fed by corpusync.core.progress."""

    def __init__(self, enabled: bool) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("{task.description:<9}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), transient=False, disable=not enabled,
                                 console=None)
        self.task: Any = None

    def start(self, stage: str, total: int | None) -> None:
        self.task = self.progress.add_task(stage, total=total)

    def advance(self, n: int = 1) -> None:
        if self.task is not None:
            self.progress.advance(self.task, n)

    def finish(self) -> None:
        if self.task is not None:
            t = self.progress.tasks[-1]
            if t.total is None:
                self.progress.update(self.task, total=t.completed)
            self.task = None


@app.command()
def refresh(
    source: Annotated[Path, typer.Argument(help="Folder of documents to index.")],
    allow_mass_delete: Annotated[bool, typer.Option(help="Publish even if many documents disappeared.")] = False,
    reembed: Annotated[bool, typer.Option(help="Re-embed everything with the configured model.")] = False,
    skip_gate: Annotated[bool, typer.Option(
        help="Publish even if the evaluation gate fails (recorded in the run and the evaluation).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the run summary as JSON.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Bring the index in step with SOURCE and publish a new generation if anything changed."""
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    from corpusync.app import pipeline
    from corpusync.app.fastpath import refresh_if_unchanged
    from corpusync.core import progress

    settings = load_settings()
    try:
        # nothing changed (most scheduled runs): recorded without a flow run, in well under a second of work
        summary, found = (None, None) if reembed else refresh_if_unchanged(
            settings, source, allow_mass_delete=allow_mass_delete, skip_gate=skip_gate)
        if summary is None:
            from corpusync.adapters.embedders import build_embedder
            from corpusync.core import prefect_local

            # torch, FlagEmbedding and the model load from now on (the longest wait of a small refresh), in a
            # process of their own (settings.model_process) while the flow machinery loads here and Prefect's local
            # API server is found, or started on another core (great_expectations loads later, in the validation
            # worker, once the flow has a plan: earlier it would slow the server's start).
            embedder = build_embedder(settings)
            try:  # from here on the model process is stopped however the command ends
                pipeline.warm_up(embedder, validate=False,
                                 host=settings.model_process and settings.task_runner != "dask",  # Dask workers embed
                                 shared=(settings.home, settings.model_linger_s))
                if settings.validate_chunks and getattr(embedder, "host_warm", False):
                    # a warm shared model (an earlier command loaded it): great_expectations is now the longest wait
                    pipeline.warm_up(embedder, validate=True)
                api = prefect_local.launch(settings.local_api_linger_s)
                from flows.refresh import refresh as refresh_flow

                _quiet_expected_failures()
                bar = _Bar(enabled=not (quiet or as_json) and sys.stderr.isatty())
                handed_on = pipeline.discovered(settings, source, found) if found is not None else nullcontext()
                with prefect_local.serving(api), bar.progress, progress.use(bar), handed_on:
                    summary = refresh_flow(str(source), allow_mass_delete=allow_mass_delete, reembed=reembed,
                                           skip_gate=skip_gate, settings=settings)
            finally:
                embedder.close_host()
    finally:  # this process ends here: the validation worker has no next refresh to wait for (and the
        pipeline.stop_workers()  # exit, which joins threads, would wait out its linger)
    code = 1 if summary["status"] == "refused" else 0
    if as_json:
        reason = summary.get("message") or ("nothing changed" if summary["status"] == "no_changes" else "")
        typer.echo(json.dumps({**summary, "reason": reason, "exit_code": code}, ensure_ascii=False, indent=2))
    else:
        _print_summary(summary)
    if code:
        raise typer.Exit(code)


class _ExpectedFailureFilter:
    """Drop Prefect's ERROR records (with tracebacks) for a refusal the CLI reports itself in one line
    (gate failed, mass delete, model mismatch, ...); unexpected exceptions keep their tracebacks."""

    def filter(self, record: Any) -> bool:
        from corpusync.core.errors import as_user_error

        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and as_user_error(exc) is not None:  # also a lost database: one line, by main()
            return False
        return not any(f"{name}(" in str(record.getMessage()) or f"{name}:" in str(record.getMessage())
                       for name in _corpusync_error_names())


def _corpusync_error_names() -> list[str]:
    from corpusync.core import errors

    return [n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, CorpusyncError)]


def _quiet_expected_failures() -> None:
    import logging

    for name in ("prefect.task_runs", "prefect.flow_runs"):
        logging.getLogger(name).addFilter(_ExpectedFailureFilter())


def _print_summary(s: dict[str, Any]) -> None:
    d, c = s["documents"], s["chunks"]
    verdict = (f"published generation {s['generation']}" if s["published"]
               else f"nothing to publish; generation {s['generation']} stays live")
    typer.echo(f"run {s['run_id']}: {s['status']} — {verdict}")
    typer.echo(f"  documents: {d['new']} new, {d['changed']} changed, {d['unchanged']} unchanged, "
               f"{d['deleted']} deleted, {d['renamed']} renamed, {d['quarantined']} quarantined")
    typer.echo(f"  chunks:    {c['embedded']} embedded, {c['reused']} reused, {c['inserted']} inserted, "
               f"{c['retired']} retired, {c['pruned']} pruned")
    for q in s["quarantined"]:
        typer.secho(f"  quarantined {q['path']} ({q['stage']}: {q['reason']}): {q['error']}",
                    fg=typer.colors.YELLOW)
    for q in s.get("quarantine_closed", []):
        why = {"gone": "the file left the source", "live-content": "the file is back to its live content",
               "indexed": "a version of it went live"}
        typer.echo(f"  quarantine closed for {q['path']}: {why.get(q['resolution'], q['resolution'])}")
    if f := s.get("fusion"):
        best = f["best"]
        weights = ", ".join(f"{k} {v:g}" for k, v in best["weights"].items())
        typer.echo(f"  fusion tuned on {', '.join(f['goldsets'])}: rrf_k {best['rrf_k']:g}, {weights} "
                   f"(held-out objective {f['held_out']['objective']:.3f}, default "
                   f"{f['default_scores']['objective']:.3f})")
    for e in s.get("evaluation", []):
        gate = {True: "gate passed", False: "gate FAILED", None: "not gated"}[e["passed"]]
        gated_mode = next(iter(c["mode"] for c in e["checks"]), "hybrid")
        figures = ", ".join(f"{k} {v:.3f}" for k, v in e["metrics"].get(gated_mode, {}).items()
                            if k in ("recall@5", "mrr@10"))
        typer.echo(f"  eval {e['goldset']}: {gate}" + (" (overridden)" if e["overridden"] else "")
                   + (f"; {gated_mode} {figures}" if figures else "")
                   + (f"; report {e['report']}" if e["report"] else ""))
    if s.get("message"):
        typer.echo(f"  {s['message']}")
    stages = ", ".join(f"{k} {v:.2f}s" for k, v in s["timings"].items())
    typer.echo(f"  time: {s.get('elapsed_s', 0.0):.2f}s" + (f" (by stage, overlapping: {stages})" if stages else ""))
