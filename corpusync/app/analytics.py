"""Python analytics over the index: SQLAlchemy Core objects for the analyst views and SQL search functions
(so queries compose in Python), polars DataFrames, and Parquet exports of chunks and evaluation results.

    from sqlalchemy import select
    from corpusync.app.analytics import documents_current, engine, live_chunks, search_text, to_polars

    eng = engine(settings)
    h = search_text("付款 方式", 5)
    stmt = (select(h.c.source, h.c.score, documents_current.c.parser)
            .select_from(h.join(documents_current, documents_current.c.path == h.c.source)))
    df = to_polars(stmt, eng)

The objects mirror sql/views/*.sql (schema ``corpusync``); they are read-only descriptions, never created
by SQLAlchemy (the views are owned by the migrations, corpusync.store.migrations.migrate).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, DOUBLE_PRECISION, INTERVAL, JSONB
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import TableValuedAlias

if TYPE_CHECKING:
    import polars as pl
    import psycopg

    from schemas.eval import Evaluation
    from schemas.settings import Settings

__all__ = [
    "CHUNK_COLUMNS",
    "chunks_at",
    "documents_current",
    "engine",
    "eval_parquet",
    "eval_results",
    "export_parquet",
    "live_chunks",
    "metadata",
    "run_summary",
    "search_hybrid",
    "search_text",
    "sqlalchemy_url",
    "to_polars",
]

SCHEMA = "corpusync"
metadata = sa.MetaData(schema=SCHEMA)
TSTZ = sa.TIMESTAMP(timezone=True)

# (name, type) of corpusync.chunks_at(generation) / corpusync.live_chunks, in their order
CHUNK_COLUMNS: list[tuple[str, Any]] = [
    ("chunk_id", sa.BigInteger), ("document_id", sa.BigInteger), ("version_id", sa.BigInteger),
    ("ordinal", sa.Integer), ("chunk_key", sa.Text), ("text", sa.Text), ("token_count", sa.Integer),
    ("page_start", sa.Integer), ("page_end", sa.Integer), ("char_start", sa.Integer), ("char_end", sa.Integer),
    ("section_path", ARRAY(sa.Text)), ("chunk_type", sa.Text), ("source_path", sa.Text),
    ("content_sha256", sa.Text), ("media_type", sa.Text), ("parser", sa.Text), ("parser_version", sa.Text),
    ("ocr_engine", sa.Text), ("ocr_engine_version", sa.Text), ("chunk_config", JSONB),
    ("model_id", sa.Integer), ("model_name", sa.Text), ("model_revision", sa.Text), ("run_id", sa.BigInteger),
    ("gen_from", sa.Integer), ("gen_to", sa.Integer),
]


def _columns(spec: Iterable[tuple[str, Any]]) -> list[sa.Column[Any]]:
    return [sa.Column(name, type_) for name, type_ in spec]


live_chunks = sa.Table("live_chunks", metadata, *_columns(CHUNK_COLUMNS), comment="chunks of the published "
                       "generation with full lineage")

documents_current = sa.Table(
    "documents_current", metadata,
    *_columns([
        ("document_id", sa.BigInteger), ("path", sa.Text), ("version_id", sa.BigInteger),
        ("content_sha256", sa.Text), ("size_bytes", sa.BigInteger), ("mtime", TSTZ), ("media_type", sa.Text),
        ("parser", sa.Text), ("parser_version", sa.Text), ("ocr_engine", sa.Text), ("page_count", sa.Integer),
        ("char_count", sa.Integer), ("chunk_count", sa.Integer), ("live_since_generation", sa.Integer),
        ("indexed_by_run", sa.BigInteger), ("last_quarantine_reason", sa.Text),
        ("last_quarantine_error", sa.Text), ("last_quarantined_at", TSTZ), ("status", sa.Text),
        ("last_quarantine_resolved_at", TSTZ), ("last_quarantine_resolution", sa.Text),
    ]),
    comment="every known document, its live version and its latest quarantine record",
)

run_summary = sa.Table(
    "run_summary", metadata,
    *_columns([
        ("run_id", sa.BigInteger), ("kind", sa.Text), ("status", sa.Text), ("started_at", TSTZ),
        ("finished_at", TSTZ), ("duration", INTERVAL), ("generation", sa.Integer), ("published", sa.Boolean),
        ("source_root", sa.Text), ("docs_new", sa.Integer), ("docs_changed", sa.Integer),
        ("docs_unchanged", sa.Integer), ("docs_deleted", sa.Integer), ("docs_quarantined", sa.Integer),
        ("chunks_embedded", sa.Integer), ("chunks_reused", sa.Integer), ("chunks_retired", sa.Integer),
        ("model_name", sa.Text), ("config_hash", sa.Text), ("code_version", sa.Text), ("message", sa.Text),
    ]),
    comment="run history",
)

eval_results = sa.Table(
    "eval_results", metadata,
    *_columns([
        ("evaluation_id", sa.BigInteger), ("created_at", TSTZ), ("run_id", sa.BigInteger),
        ("generation", sa.Integer), ("generation_status", sa.Text), ("goldset", sa.Text),
        ("goldset_sha256", sa.Text), ("n_questions", sa.Integer), ("mode", sa.Text), ("metric", sa.Text),
        ("value", DOUBLE_PRECISION), ("passed", sa.Boolean), ("overridden", sa.Boolean), ("model_name", sa.Text),
    ]),
    comment="one row per (evaluation, retrieval mode, metric)",
)

SEARCH_TEXT_COLUMNS: list[tuple[str, Any]] = [
    ("chunk_id", sa.BigInteger), ("score", DOUBLE_PRECISION), ("text", sa.Text), ("source", sa.Text),
    ("page_start", sa.Integer), ("page_end", sa.Integer), ("section_path", ARRAY(sa.Text)),
    ("chunk_type", sa.Text), ("generation", sa.Integer),
]

SEARCH_HYBRID_COLUMNS: list[tuple[str, Any]] = [
    ("chunk_id", sa.BigInteger), ("score", DOUBLE_PRECISION), ("dense_rank", sa.BigInteger),
    ("dense_score", DOUBLE_PRECISION), ("lexical_rank", sa.BigInteger), ("lexical_score", DOUBLE_PRECISION),
    ("sparse_rank", sa.BigInteger), ("sparse_score", DOUBLE_PRECISION), ("text", sa.Text),
    ("document_id", sa.BigInteger), ("version_id", sa.BigInteger), ("source", sa.Text),
    ("page_start", sa.Integer), ("page_end", sa.Integer), ("char_start", sa.Integer), ("char_end", sa.Integer),
    ("section_path", ARRAY(sa.Text)), ("chunk_type", sa.Text), ("content_sha256", sa.Text),
    ("parser", sa.Text), ("parser_version", sa.Text), ("run_id", sa.BigInteger), ("model_id", sa.Integer),
    ("generation", sa.Integer),
]


def _table_columns(spec: Iterable[tuple[str, Any]]) -> list[sa.ColumnClause[Any]]:
    return [sa.column(name, type_) for name, type_ in spec]


def _typed(value: Any, type_: Any) -> ColumnElement[Any]:
    """A bound parameter cast to the function's parameter type (NULL stays a typed NULL)."""
    if isinstance(value, ColumnElement):
        return sa.cast(value, type_)
    return sa.cast(sa.literal(value), type_)


def _filter(value: Mapping[str, Any] | None) -> ColumnElement[Any]:
    # bound as JSON text and cast: values are parameters, never spliced into SQL
    return sa.cast(sa.literal(json.dumps(dict(value or {}), ensure_ascii=False), sa.Text), JSONB)


def _vector_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if hasattr(value, "to_text"):  # pgvector Vector / HalfVector / SparseVector
        return str(value.to_text())
    if hasattr(value, "tolist"):
        value = value.tolist()
    return "[" + ",".join(repr(float(x)) for x in value) + "]"


def _vector(value: Any, type_name: str) -> ColumnElement[Any]:
    if isinstance(value, ColumnElement):
        return value
    from pgvector.sqlalchemy import HALFVEC, SPARSEVEC

    type_ = HALFVEC() if type_name == "halfvec" else SPARSEVEC()
    return sa.cast(sa.literal(_vector_text(value), sa.Text), type_)


def chunks_at(generation: int | ColumnElement[Any], *, name: str = "chunks_at") -> TableValuedAlias:
    """``corpusync.chunks_at(generation)``: every chunk of that generation with its lineage."""
    fn = sa.func.corpusync.chunks_at(_typed(generation, sa.Integer))
    return fn.table_valued(*_table_columns(CHUNK_COLUMNS), name=name)


def search_text(q: str | ColumnElement[Any], k: int = 10, filter: Mapping[str, Any] | None = None,
                *, name: str = "hits") -> TableValuedAlias:
    """``corpusync.search_text(q, k, filter)``: Okapi BM25 over the published generation (segment CJK
    queries first: ``corpusync segment``). Use as a FROM item: ``select(h.c.source).select_from(h)``."""
    fn = sa.func.corpusync.search_text(_typed(q, sa.Text), _typed(k, sa.Integer), _filter(filter))
    return fn.table_valued(*_table_columns(SEARCH_TEXT_COLUMNS), name=name)


def search_hybrid(
    q_text: str | ColumnElement[Any],
    q_dense: Any,
    q_sparse: Any = None,
    k: int = 10,
    filter: Mapping[str, Any] | None = None,
    at_generation: int | None = None,
    w_dense: float | None = None,
    w_lexical: float | None = None,
    w_sparse: float | None = None,
    rrf_k: float | None = None,
    pool: int | None = None,
    bm25_k1: float = 1.2,
    bm25_b: float = 0.75,
    *,
    name: str = "hits",
) -> TableValuedAlias:
    """``corpusync.search_hybrid(...)``: RRF over dense, lexical and sparse channels (the same function the
    Python API calls). ``q_dense``/``q_sparse``: a sequence of floats, a pgvector value, its text form, a
    SQL expression (e.g. a scalar subquery on ``chunks.dense``), or None. Weights left None come from the
    tuned fusion, else 1 (the CLI's scaling of w_dense by the readable share of the query is not applied)."""
    fn = sa.func.corpusync.search_hybrid(
        _typed(q_text, sa.Text), _vector(q_dense, "halfvec"), _vector(q_sparse, "sparsevec"),
        _typed(k, sa.Integer), _filter(filter), _typed(at_generation, sa.Integer),
        _typed(w_dense, DOUBLE_PRECISION), _typed(w_lexical, DOUBLE_PRECISION), _typed(w_sparse, DOUBLE_PRECISION),
        _typed(rrf_k, DOUBLE_PRECISION), _typed(pool, sa.Integer), _typed(bm25_k1, DOUBLE_PRECISION),
        _typed(bm25_b, DOUBLE_PRECISION),
    )
    return fn.table_valued(*_table_columns(SEARCH_HYBRID_COLUMNS), name=name)


# ---------------------------------------------------------------------------------------------------
# engines and DataFrames


def sqlalchemy_url(url: str) -> str:
    """corpusync's libpq URL (``postgresql://...``, possibly ``?host=/socket/dir``) for the psycopg 3
    dialect."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    raise ValueError(f"not a PostgreSQL URL: {url.split('@')[-1]}")


def engine(settings: Settings | None = None, **kwargs: Any) -> Engine:
    """A SQLAlchemy engine on this index's database (DATABASE_URL, else the embedded server, started on
    demand). Extra keyword arguments go to ``sqlalchemy.create_engine``."""
    from corpusync.store import embedded
    from schemas.settings import Settings

    location = embedded.resolve_database(settings if settings is not None else Settings())
    connect_args = {"application_name": "corpusync-analytics", **kwargs.pop("connect_args", {})}
    eng = sa.create_engine(sqlalchemy_url(location.url), connect_args=connect_args, **kwargs)

    @sa.event.listens_for(eng, "connect")
    def _register_vector(dbapi_conn: Any, _record: Any) -> None:  # chunks.dense etc. come back as pgvector
        from pgvector.psycopg import register_vector

        try:
            register_vector(dbapi_conn)
        except Exception:  # no vector extension yet: vectors come back as text then
            dbapi_conn.rollback()

    return eng


def to_polars(stmt: sa.Executable | str, bind: Engine | Connection, **kwargs: Any) -> pl.DataFrame:
    """Run a statement and return a polars DataFrame (column names and order as selected). jsonb values
    come back as JSON text, arrays as lists; ``kwargs`` go to ``polars.read_database``."""
    import polars as pl

    query = sa.text(stmt) if isinstance(stmt, str) else stmt
    if isinstance(bind, Engine):
        with bind.connect() as conn:
            return to_polars(query, conn, **kwargs)
    kwargs.setdefault("infer_schema_length", None)
    result = bind.execute(query)
    names = list(result.keys())
    rows = [tuple(json.dumps(v, ensure_ascii=False, default=str) if isinstance(v, dict) else v for v in row)
            for row in result]
    if not rows:
        return pl.DataFrame(schema=dict.fromkeys(names, pl.Null))
    return pl.DataFrame(rows, schema=names, orient="row", infer_schema_length=kwargs["infer_schema_length"])


# ---------------------------------------------------------------------------------------------------
# Parquet


def _chunk_schema(vectors: bool, dimension: int | None) -> Any:
    import pyarrow as pa

    arrow = {sa.BigInteger: pa.int64(), sa.Integer: pa.int32(), sa.Text: pa.string()}
    fields = []
    for name, type_ in CHUNK_COLUMNS:
        if isinstance(type_, ARRAY):
            t = pa.list_(pa.string())
        elif type_ is JSONB:
            t = pa.string()  # JSON text
        else:
            t = arrow[type_]
        fields.append(pa.field(name, t))
    if vectors:
        fields.append(pa.field("dense", pa.list_(pa.float32()),
                               metadata={"dimension": str(dimension or "")}))
    return pa.schema(fields)


def export_parquet(
    conn: psycopg.Connection,
    path: str | Path,
    *,
    generation: int | None = None,
    vectors: bool = False,
    batch_size: int = 10_000,
) -> dict[str, Any]:
    """Write the chunks of the published generation (or of ``generation``, via corpusync.chunks_at) with
    their lineage columns (those of live_chunks; chunk_config as JSON text) to a Parquet file, streamed
    through a server-side cursor ``batch_size`` rows at a time (memory stays bounded). ``vectors`` adds the
    dense embedding as ``dense: list<float32>``. Returns {"path", "rows", "generation", "dimension"}."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from corpusync.core.errors import CorpusyncError
    from corpusync.store import exports, generations

    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    published = generations.published_generation(conn)
    gen = generation if generation is not None else (published if published is not None else 0)
    known = generations.generation_model(conn, gen)
    if known is None:
        raise CorpusyncError(f"generation {gen} does not exist (is the index empty?)")
    dimension = int(known["dimension"])
    schema = _chunk_schema(vectors, dimension).with_metadata(
        {"corpusync.generation": str(gen), "corpusync.model": str(known["model_name"]),
         "corpusync.dimension": str(dimension)})
    names = schema.names
    json_col = names.index("chunk_config")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    rows = 0
    try:
        with pq.ParquetWriter(tmp, schema) as writer, exports.chunk_batches(
                conn, gen, [name for name, _ in CHUNK_COLUMNS], vectors=vectors, batch_size=batch_size) as batches:
            for batch in batches:
                columns: list[list[Any]] = [list(c) for c in zip(*batch, strict=True)]
                columns[json_col] = [None if v is None else json.dumps(v, ensure_ascii=False, sort_keys=True)
                                     for v in columns[json_col]]
                writer.write_table(pa.Table.from_arrays(
                    [pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)], schema=schema))
                rows += len(batch)
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return {"path": str(out), "rows": rows, "generation": gen, "dimension": dimension}


def eval_rows(evaluations: Sequence[Evaluation]) -> list[dict[str, Any]]:
    """One dict per (gold set, mode, question) of these evaluations (GateOutcome.evaluations)."""
    metrics = sorted({m for e in evaluations for q in e.questions for m in q.scores})
    out: list[dict[str, Any]] = []
    for e in evaluations:
        for q in e.questions:
            out.append({
                "goldset": e.goldset, "generation": e.generation, "evaluation_id": e.id, "mode": q.mode,
                "question_id": q.question_id, "relevant_count": q.relevant_count, "first_rank": q.first_rank,
                **{m: q.scores.get(m) for m in metrics},
                "retrieved": list(q.retrieved), "retrieved_sources": list(q.retrieved_sources),
            })
    return out


def eval_parquet(evaluations: Sequence[Evaluation], path: str | Path) -> int:
    """Write the per-question results of evaluations (GateOutcome.evaluations) as a Parquet table: goldset,
    generation, evaluation_id, mode, question_id, relevant_count, first_rank, one float64 column per score
    (recall@k, mrr@10, ndcg@10, ...), retrieved chunk ids and sources. Returns the number of rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    metrics = sorted({m for e in evaluations for q in e.questions for m in q.scores})
    schema = pa.schema(
        [pa.field("goldset", pa.string()), pa.field("generation", pa.int32()),
         pa.field("evaluation_id", pa.int64()), pa.field("mode", pa.string()),
         pa.field("question_id", pa.string()), pa.field("relevant_count", pa.int32()),
         pa.field("first_rank", pa.int32())]
        + [pa.field(m, pa.float64()) for m in metrics]
        + [pa.field("retrieved", pa.list_(pa.int64())), pa.field("retrieved_sources", pa.list_(pa.string()))]
    )
    rows = eval_rows(evaluations)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), out)
    return len(rows)
