"""`corpusync query` and `corpusync segment`: search the index from a terminal."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from corpusync.cli.base import app, load_settings
from corpusync.core.errors import CorpusyncError

if TYPE_CHECKING:
    from corpusync.core.query_syntax import ParsedQuery
    from query.search import Applied


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
    from query.search import run

    parsed = _parse_filters(filters or [])
    settings = load_settings()
    embedder = _query_embedder(settings) if mode != "lexical" else None
    try:
        result = run(settings, text, k=k, mode=mode, generation=generation,  # type: ignore[arg-type]
                     filters=parsed, rerank=rerank, embedder=embedder)
    finally:
        if embedder is not None and hasattr(embedder, "close_host"):
            embedder.close_host()
    hits = result.hits
    if as_json:
        typer.echo(json.dumps([h.as_dict() for h in hits], ensure_ascii=False, indent=2))
        return
    from corpusync.core.lexical import Analyzer

    q = Analyzer.from_settings(settings).query(text)
    if hits:
        _print_hits(q, hits)
    else:
        typer.echo("no hits")
    if len(hits) < k:
        typer.echo(fewer_hits_note(q, len(hits), k, mode, parsed), err=True)
    if note := _dense_note(embedder, result.applied):
        typer.echo(note, err=True)


def _dense_note(embedder: Any, applied: Applied) -> str | None:
    """What the dense channel's weight was scaled by for this query, when the model reads only part of it
    (a Chinese question to an English model is ranked by the lexical channel alone: say so). Not when the
    search did not scale it (not hybrid, coverage weighting off, a fusion whose dense weight is 0)."""
    share = applied.dense_coverage
    if share is None or share >= 1.0:
        return None
    from corpusync.adapters.model_dir import declared_languages

    languages = declared_languages(embedder.model_dir) if hasattr(embedder, "model_dir") else None
    card = f" (its card names {', '.join(sorted(languages))})" if languages else ""
    return (f"dense weight x{share:.2f}: {embedder.identity.name} reads {share:.0%} of the query's words{card}"
            + ("; ranked by the other channels" if share == 0 else ""))


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


def fewer_hits_note(q: ParsedQuery, found: int, k: int, mode: str, filters: dict[str, str]) -> str:
    """Why a query found fewer than the k hits asked for: each constraint the query put on every channel (a
    Chinese question's “quoted term” is a required phrase, which surprises), else what the mode can find."""
    why = []
    if q.phrases:
        why.append("each must contain " + ", ".join(f'"{p}"' for p in q.phrases)
                   + " (quotes, “” included, make a phrase required: drop them to rank by its words instead)")
    if q.excluded_terms or q.excluded_phrases:
        left_out = [*q.excluded_terms, *(f'"{p}"' for p in q.excluded_phrases)]
        why.append("chunks holding " + " or ".join(left_out) + " are left out")
    if filters:
        why.append("filtered by " + ", ".join(f"{key}{value}" if key[-1] in "<>=" else f"{key}={value}"
                                            for key, value in filters.items()))
    if mode == "lexical" and not q.phrases:
        why.append("lexical mode finds only chunks holding one of the query's words")
    if not why:
        why.append("the generation holds no more chunks that match")
    return f"{found} of {k} hits: " + "; ".join(why)


def _print_hits(q: ParsedQuery, hits: Any) -> None:
    """A table: rank, score, source:page, section, snippet with the query's terms highlighted."""
    import re

    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    terms = sorted({t for t in q.terms if len(t) > 1}, key=len, reverse=True)
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

    typer.echo(Analyzer.from_settings(load_settings()).query(text).sql_text())
