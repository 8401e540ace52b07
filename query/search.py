"""Hybrid search (dense + lexical, RRF) over one generation; every hit carries its citation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import psycopg
from pgvector import HalfVector
from psycopg import sql

from corpusync import db, lexical
from corpusync.embedders import Embedder, build_embedder
from corpusync.errors import CorpusyncError, ModelMismatch
from schemas.settings import Settings

Mode = Literal["hybrid", "dense", "lexical"]
_WEIGHTS: dict[str, tuple[float, float]] = {"hybrid": (1.0, 1.0), "dense": (1.0, 0.0), "lexical": (0.0, 1.0)}


@dataclass
class Hit:
    rank: int
    score: float
    text: str
    source: str
    page_start: int | None
    page_end: int | None
    char_start: int
    char_end: int
    section_path: list[str]
    chunk_type: str
    chunk_id: int
    document_id: int
    version_id: int
    content_sha256: str
    parser: str
    run_id: int
    generation: int
    dense_rank: int | None
    dense_score: float | None
    lexical_rank: int | None
    lexical_score: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def citation(self) -> str:
        pages = ""
        if self.page_start is not None:
            pages = f" p.{self.page_start}" + (f"-{self.page_end}" if self.page_end != self.page_start else "")
        return f"{self.source}{pages} [{self.char_start}:{self.char_end}]"


class Searcher:
    """Holds a connection and the query embedder; checks the model matches the published index."""

    def __init__(self, settings: Settings, conn: psycopg.Connection, embedder: Embedder | None = None) -> None:
        self.settings = settings
        self.conn = conn
        self._embedder = embedder

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = build_embedder(self.settings)
        return self._embedder

    def published_generation(self) -> int:
        state = db.fetch_one(self.conn, "index_state")
        assert state is not None
        if not state["published_generation"]:
            raise CorpusyncError("the index is empty: run `corpusync refresh PATH` first")
        return int(state["published_generation"])

    def index_model_id(self, generation: int | None) -> int:
        """The embedding model that built `generation` (the published one when None)."""
        return int(self._index_model(generation)["model_id"])

    def _index_model(self, generation: int | None) -> dict[str, Any]:
        state = db.fetch_one(self.conn, "index_state")
        assert state is not None
        if generation is not None and generation != state["published_generation"]:
            row = self.conn.execute(
                "SELECT m.id, m.identity_hash, m.name, m.dimension FROM corpusync.generations g "
                "JOIN corpusync.embedding_models m ON m.id = g.model_id WHERE g.generation = %s", (generation,)
            ).fetchone()
            if row is None:
                raise CorpusyncError(f"generation {generation} does not exist")
            return {"model_id": row[0], "identity_hash": row[1], "model_name": row[2], "dimension": row[3],
                    "published_generation": generation}
        if state["model_id"] is None:
            raise CorpusyncError("the index is empty: run `corpusync refresh PATH` first")
        return state

    def search(self, text: str, k: int = 10, mode: Mode = "hybrid", generation: int | None = None,
               query_vector: Sequence[float] | None = None) -> list[Hit]:
        """Top-k hits of one generation. `query_vector`: the text's embedding when the caller already has
        it (evaluation embeds all questions in one batch)."""
        if mode not in _WEIGHTS:
            raise CorpusyncError(f"unknown mode {mode!r}: use one of {', '.join(_WEIGHTS)}")
        if k <= 0:
            return []
        state = self._index_model(generation)
        identity = self.embedder.identity
        if identity.identity_hash != state["identity_hash"]:
            raise ModelMismatch(
                f"the index was embedded with {state['model_name']} ({state['dimension']}-d) but queries are "
                f"configured with {identity.label}; configure the same model to query this index"
            )
        w_dense, w_lex = _WEIGHTS[mode]
        if w_dense <= 0:
            qvec: Any = [0.0] * identity.dimension
        else:
            qvec = query_vector if query_vector is not None else self.embedder.embed([text]).dense[0]
        params = {
            "generation": generation, "qvec": HalfVector(qvec), "qtext": " ".join(lexical.query_terms(text)),
            "w_dense": w_dense, "w_lex": w_lex, "rrf_k": float(self.settings.rrf_k),
            "pool": max(self.settings.candidate_pool, k), "k": k,
        }
        with self.conn.transaction():
            self.conn.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
            self.conn.execute(sql.SQL("SET LOCAL hnsw.ef_search = {}").format(
                sql.Literal(max(self.settings.hnsw_ef_search, k))))
            rows = db.fetch_all(self.conn, "search_hybrid", params, dim=sql.Literal(int(state["dimension"])),
                                model_id=sql.Literal(int(state["model_id"])))
        return [_hit(i, r) for i, r in enumerate(rows, start=1)]


def _hit(rank: int, r: dict[str, Any]) -> Hit:
    return Hit(
        rank=rank, score=float(r["score"]), text=r["text"], source=r["source"], page_start=r["page_start"],
        page_end=r["page_end"], char_start=r["char_start"], char_end=r["char_end"],
        section_path=list(r["section_path"] or []), chunk_type=r["chunk_type"], chunk_id=r["chunk_id"],
        document_id=r["document_id"], version_id=r["version_id"], content_sha256=r["content_sha256"],
        parser=r["parser"], run_id=r["run_id"], generation=r["generation"], dense_rank=r["dense_rank"],
        dense_score=_f(r["dense_score"]), lexical_rank=r["lexical_rank"], lexical_score=_f(r["lexical_score"]),
    )


def _f(v: Any) -> float | None:
    return None if v is None else float(v)


def search(settings: Settings, text: str, k: int = 10, mode: Mode = "hybrid",
           generation: int | None = None, conn: psycopg.Connection | None = None) -> Sequence[Hit]:
    """One-shot search (opens and closes its own connection unless one is given)."""
    if conn is not None:
        return Searcher(settings, conn).search(text, k, mode, generation)
    from corpusync.runtime import open_database

    with open_database(settings) as c:
        return Searcher(settings, c).search(text, k, mode, generation)
