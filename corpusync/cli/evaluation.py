"""`corpusync eval`, `corpusync tune` and `corpusync goldset`: retrieval quality on gold sets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from corpusync.cli.base import app, load_settings
from corpusync.core.errors import CorpusyncError


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

    settings = load_settings()
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

    settings = load_settings()
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


goldset_app = typer.Typer(no_args_is_help=True, help="Gold sets: export the corpus a gold set brings.")
app.add_typer(goldset_app, name="goldset")


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

    settings = load_settings()
    gs = load_goldset(spec, settings.goldset_dirs)
    subset = sample_questions(gs, limit) if limit else None
    n = export_corpus(gs, folder, only_gold_of=subset, distractors=distractors)
    typer.echo(f"wrote {n} passages of {gs.name} ({len(gs.questions)} questions) to {folder}")
