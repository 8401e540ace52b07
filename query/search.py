"""Hybrid search (dense + lexical + sparse, weighted RRF, optional rerank) over one generation, with
filters applied inside every channel; every hit carries its citation and lineage."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import date
from functools import cached_property
from typing import Any

import psycopg
from pgvector import HalfVector, SparseVector
from psycopg.types.json import Jsonb

from corpusync.adapters.embedders import build_embedder
from corpusync.adapters.embedding import Embedder
from corpusync.core import lexical
from corpusync.core.errors import CorpusyncError, ModelMismatch
from corpusync.core.query_syntax import ParsedQuery
from corpusync.store import fusions, generations
from corpusync.store.search import search_rows
from evaluation.fusion import CHANNELS, Fusion
from schemas.eval import MODES, Mode
from schemas.settings import Settings

MAX_K = 10_000  # hnsw.ef_search and the channel pools are sized from k
log = logging.getLogger("corpusync.query")


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
    sparse_rank: int | None = None
    sparse_score: float | None = None
    model_id: int | None = None
    rerank_score: float | None = None
    fused_rank: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def citation(self) -> str:
        pages = ""
        if self.page_start is not None:
            pages = f" p.{self.page_start}" + (f"-{self.page_end}" if self.page_end != self.page_start else "")
        return f"{self.source}{pages} [{self.char_start}:{self.char_end}]"


@dataclass(frozen=True)
class Applied:
    """What a search ranked by, so a caller can say why without working it out again: the generation it read,
    the fusion in force (hybrid only, with the dense weight after scaling by `dense_coverage`; None in a
    one-channel mode, which ranks by that channel alone), the channels that ran and the share of the query's
    words the dense model reads (None where it was not asked: not hybrid, a fusion given as is, coverage
    weighting off, or a dense weight of 0)."""

    generation: int
    mode: str
    fusion: Fusion | None
    channels: tuple[str, ...]
    dense_coverage: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"generation": self.generation, "mode": self.mode,
                "fusion": self.fusion.as_dict() if self.fusion is not None else None,
                "channels": list(self.channels), "dense_coverage": self.dense_coverage}


@dataclass
class Result:
    """The hits of one search and what it applied."""

    hits: list[Hit]
    applied: Applied


# Generations a search may be pinned to: published ones still retained. Expired generations are partly
# pruned and discarded ones never passed validation or the gate; candidates only while being evaluated.
SERVABLE = frozenset({"published", "superseded", "rolled_back", "refused"})


class Searcher:
    """Holds a connection and the query embedder; checks the model matches the index it searches.

    `candidates`: also search unpublished candidate generations (the refresh's own evaluation and tuning)."""

    def __init__(self, settings: Settings, conn: psycopg.Connection, embedder: Embedder | None = None,
                 *, candidates: bool = False) -> None:
        self.settings = settings
        self.conn = conn
        self._embedder = embedder
        self.candidates = candidates
        self._fusions: dict[tuple[int, int], Fusion] = {}

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = build_embedder(self.settings)
        return self._embedder

    @cached_property
    def analyzer(self) -> lexical.Analyzer:
        return lexical.Analyzer.from_settings(self.settings)

    def dense_coverage(self, text: str | ParsedQuery) -> float:
        """How much of the query the dense model can read: the share of the query's words (lexical terms)
        its tokenizer has no unknown piece for (1.0 when the embedder cannot tell)."""
        coverage = getattr(self.embedder, "coverage", None)
        if not callable(coverage):
            return 1.0
        parsed = self.analyzer.query(text) if isinstance(text, str) else text
        return float(coverage(parsed.terms))

    def fusion(self, model_id: int, generation: int) -> Fusion:
        """The fusion in force for a generation: settings given explicitly, then the one tuned for this model
        (on this generation or an earlier one that was not refused), then RRF with weight 1 and k 60."""
        key = (model_id, generation)
        if key not in self._fusions:  # the stored row is read once per searcher
            row = fusions.latest_fusion(self.conn, model_id, generation)
            self._fusions[key] = Fusion.from_dict(row) if row else Fusion()
        stored = self._fusions[key]
        weights = {c: float(self.settings.rrf_weights.get(c, stored.weights.get(c, 1.0))) for c in CHANNELS}
        return Fusion(method="rrf", weights=weights, rrf_k=float(self.settings.rrf_k or stored.rrf_k))

    def forget_fusion(self) -> None:
        """Read the fusion again on the next search (after one was tuned and stored)."""
        self._fusions.clear()

    def published_generation(self) -> int:
        state = generations.index_state(self.conn)
        assert state is not None
        if not state["published_generation"]:
            raise CorpusyncError("the index is empty: run `corpusync refresh PATH` first")
        return int(state["published_generation"])

    def index_model_id(self, generation: int | None) -> int:
        """The embedding model that built `generation` (the published one when None)."""
        return int(self._index_model(generation)["model_id"])

    def _index_model(self, generation: int | None) -> dict[str, Any]:
        """Generation, status and model a search reads: read once, so the query is embedded with the model
        of the very generation it is answered from (a publish in between cannot mix models)."""
        state = generations.index_state(self.conn)
        assert state is not None
        if generation is None or generation == state["published_generation"]:
            if state["model_id"] is None:
                raise CorpusyncError("the index is empty: run `corpusync refresh PATH` first")
            return {**state, "status": "published"}
        row = generations.generation_model(self.conn, generation)
        if row is None:
            raise CorpusyncError(f"generation {generation} does not exist")
        status = row["status"]
        if status in SERVABLE or (status == "candidate" and self.candidates):
            if status == "refused":
                log.warning("generation %s was refused by the evaluation gate; it was never published", generation)
            return row
        why = {"expired": "it is outside the retention window and has been pruned (only part of it is left)",
               "discarded": "it was discarded: its refresh did not finish, so it never passed validation or "
                            "the gate",
               "candidate": "it is an unpublished candidate still being built or evaluated"}.get(status, status)
        raise CorpusyncError(f"generation {generation} cannot be searched: {why}. "
                             "`corpusync db status` lists the generations that can.")

    def search(self, text: str, k: int = 10, mode: Mode = "hybrid", generation: int | None = None,
               query_vector: Sequence[float] | None = None, filters: Mapping[str, Any] | None = None,
               rerank: bool = False, fusion: Fusion | None = None, pool: int | None = None) -> list[Hit]:
        """Top-k hits of one generation (the published one unless given), each channel filtered: `run`'s
        hits."""
        return self.run(text, k, mode, generation, query_vector, filters, rerank, fusion, pool).hits

    def run(self, text: str, k: int = 10, mode: Mode = "hybrid", generation: int | None = None,
            query_vector: Sequence[float] | None = None, filters: Mapping[str, Any] | None = None,
            rerank: bool = False, fusion: Fusion | None = None, pool: int | None = None) -> Result:
        """Top-k hits of one generation (the published one unless given), each channel filtered, and what the
        search applied (`Applied`).

        `query_vector`: the text's embedding when the caller already has it (evaluation embeds all
        questions in one batch). `filters`: see `build_filter`. `rerank`: re-order the fused top
        candidates with the configured cross-encoder (skipped, with a warning, when none is configured).
        `fusion`: hybrid fusion to use as given (no coverage scaling); default: `self.fusion()` with the
        dense weight scaled by `dense_coverage(text)`. `pool`: candidates per channel (default: the
        configured pool, at least k); k may exceed it (fusion tuning reads the whole union).
        """
        if mode not in MODES:
            raise CorpusyncError(f"unknown mode {mode!r}: use one of {', '.join(MODES)}")
        if k > MAX_K:
            raise CorpusyncError(f"k={k} is more than {MAX_K} hits: ask for fewer (or page with filters)")
        state = self._index_model(generation)
        identity = self.embedder.identity
        if identity.identity_hash != state["identity_hash"]:
            raise ModelMismatch(
                f"the index was embedded with {state['model_name']} ({state['dimension']}-d) but queries are "
                f"configured with {identity.label}; configure the same model to query this index"
            )
        if mode == "sparse" and not identity.sparse_trained:
            raise CorpusyncError(
                f"sparse retrieval needs a model with trained sparse weights (bge-m3); {identity.label} has none. "
                "Use --mode lexical for keyword search."
            )
        use = {"dense": mode in ("dense", "hybrid"), "lexical": mode in ("lexical", "hybrid"),
               "sparse": mode in ("sparse", "hybrid") and identity.sparse_trained}
        parsed = self.analyzer.query(text)  # segmented once: for the lexical channel and the dense coverage
        read = int(state["published_generation"])  # pinned: the generation the model was read for
        coverage = None
        if mode != "hybrid":
            fusion = Fusion()  # one channel: its own ranking
        elif fusion is None:
            fusion = self.fusion(int(state["model_id"]), read)
            if self.settings.dense_coverage_weighting and fusion.weights["dense"] > 0:
                coverage = self.dense_coverage(parsed)
                fusion = replace(fusion, weights={**fusion.weights, "dense": fusion.weights["dense"] * coverage})
        w = fusion.weights
        use = {c: on and w[c] > 0 for c, on in use.items()}
        applied = Applied(read, mode, fusion if mode == "hybrid" else None,
                          tuple(c for c in CHANNELS if use[c]), coverage)
        if k <= 0:
            return Result([], applied)
        qvec = qsparse = None
        out = self.embedder.embed([text]) if (use["dense"] and query_vector is None) or use["sparse"] else None
        if use["dense"]:
            qvec = HalfVector(list(query_vector) if query_vector is not None else out.dense[0])  # type: ignore[union-attr]
        if use["sparse"] and out is not None and out.sparse is not None and identity.sparse_dim:
            qsparse = SparseVector(out.sparse.row(0), identity.sparse_dim)
        pool = pool or max(self.settings.candidate_pool, k, self.settings.rerank_candidates if rerank else 0)
        params = {
            "qtext": parsed.sql_text(), "qvec": qvec, "qsparse": qsparse,
            "k": pool if rerank else k, "filter": Jsonb(build_filter(filters)),
            "generation": read,
            "w_dense": w.get("dense", 1.0) if use["dense"] else 0.0,
            "w_lex": w.get("lexical", 1.0) if use["lexical"] else 0.0,
            "w_sparse": w.get("sparse", 1.0) if use["sparse"] else 0.0,
            "rrf_k": fusion.rrf_k, "pool": pool, "k1": self.settings.bm25_k1, "b": self.settings.bm25_b,
        }
        try:
            rows = search_rows(self.conn, params, max(self.settings.hnsw_ef_search, pool))
        except psycopg.errors.RaiseException as exc:  # the SQL function's own, user-facing errors
            raise CorpusyncError(str(exc.diag.message_primary or exc)) from None
        except psycopg.errors.InvalidDatetimeFormat as exc:
            raise CorpusyncError(f"bad date in filter: {exc.diag.message_primary}") from None
        hits = [_hit(i, r) for i, r in enumerate(rows, start=1)]
        if rerank:
            hits = self._rerank(text, hits)[:k]
        return Result(hits, applied)

    def _rerank(self, text: str, hits: list[Hit]) -> list[Hit]:
        from corpusync.adapters.rerank import build_reranker

        reranker = build_reranker(self.settings)
        if reranker is None or not hits:
            if reranker is None:
                log.warning("rerank skipped: no reranker configured (set CORPUSYNC_RERANKER_PATH to a local "
                            "bge-reranker directory)")
            return hits
        scores = reranker.score(text, [h.text for h in hits])
        order = sorted(range(len(hits)), key=lambda i: (-scores[i], hits[i].rank))
        out = []
        for new_rank, i in enumerate(order, start=1):
            h = hits[i]
            h.rerank_score, h.fused_rank, h.rank = float(scores[i]), h.rank, new_rank
            out.append(h)
        return out


_FILTER_KEYS = {"path", "glob", "type", "chunk_type", "modified_after", "modified_before"}
_OPS = (">=", "<=", "!=", ">", "<")


def build_filter(filters: Mapping[str, Any] | None) -> dict[str, Any]:
    """User filters -> the jsonb filter of corpusync.search_hybrid.

    path (prefix), glob ("contracts/**/*.pdf"), type (extension or media type), chunk_type (text, table,
    ocr), modified_after / modified_before (ISO dates), valid_at (an ISO date or "today": only documents
    in force then, from their valid_from / valid_until); any other key matches the document's metadata
    (jsonb containment: sidecar `FILE.meta.json` fields, `lang`, ...; a "metadata." prefix is allowed).
    A key ending in an operator compares instead: {"year>=": 2023}, {"metadata.date<": "2024-06-01"}
    (numbers numerically, else as text). String values that are JSON numbers/booleans/lists are matched as
    such ("year=2024" matches {"year": 2024}).
    """
    out: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    ranges: list[dict[str, Any]] = []
    for key, value in (filters or {}).items():
        op = next((o for o in _OPS if key.endswith(o)), None)
        if op is not None:
            name = key[: -len(op)].strip().removeprefix("metadata.")
            if not name:
                raise CorpusyncError(f"filter {key!r}: a comparison needs a metadata key (e.g. year>=2023)")
            ranges.append({"key": name, "op": op, "value": _json_value(value)})
        elif key == "valid_at":
            out[key] = _valid_date(value)
        elif key in _FILTER_KEYS:
            out[key] = str(value).replace("**", "*") if key == "glob" else str(value)
        elif key == "metadata" and isinstance(value, Mapping):
            meta.update(value)
        else:
            meta[key.removeprefix("metadata.")] = _json_value(value)
    if meta:
        out["metadata"] = meta
    if ranges:
        out["metadata_cmp"] = ranges
    return out


def _valid_date(value: Any) -> str:
    text = str(value).strip().lower()
    if text == "today":
        return text
    try:
        return date.fromisoformat(text).isoformat()
    except ValueError:
        raise CorpusyncError(f"valid_at={value!r}: expected an ISO date (2024-06-01) or 'today'") from None


def _json_value(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return parsed if isinstance(parsed, int | float | bool | list) else value


def _hit(rank: int, r: dict[str, Any]) -> Hit:
    return Hit(
        rank=rank, score=float(r["score"]), text=r["text"], source=r["source"], page_start=r["page_start"],
        page_end=r["page_end"], char_start=r["char_start"], char_end=r["char_end"],
        section_path=list(r["section_path"] or []), chunk_type=r["chunk_type"], chunk_id=r["chunk_id"],
        document_id=r["document_id"], version_id=r["version_id"], content_sha256=r["content_sha256"],
        parser=r["parser"], run_id=r["run_id"], generation=r["generation"], dense_rank=r["dense_rank"],
        dense_score=_f(r["dense_score"]), lexical_rank=r["lexical_rank"], lexical_score=_f(r["lexical_score"]),
        sparse_rank=r["sparse_rank"], sparse_score=_f(r["sparse_score"]), model_id=r["model_id"],
    )


def _f(v: Any) -> float | None:
    return None if v is None else float(v)


def search(settings: Settings, text: str, k: int = 10, mode: Mode = "hybrid", generation: int | None = None,
           conn: psycopg.Connection | None = None, filters: Mapping[str, Any] | None = None,
           rerank: bool = False, embedder: Embedder | None = None) -> Sequence[Hit]:
    """One-shot search (opens and closes its own connection unless one is given; builds the query embedder
    from `settings` when needed unless one is given)."""
    return run(settings, text, k, mode, generation, conn, filters, rerank, embedder).hits


def run(settings: Settings, text: str, k: int = 10, mode: Mode = "hybrid", generation: int | None = None,
        conn: psycopg.Connection | None = None, filters: Mapping[str, Any] | None = None,
        rerank: bool = False, embedder: Embedder | None = None) -> Result:
    """`search`, with what the search applied (`Result.applied`)."""
    if conn is not None:
        return Searcher(settings, conn, embedder).run(text, k, mode, generation, filters=filters, rerank=rerank)
    from corpusync.store.db import open_database

    with open_database(settings) as c:
        return Searcher(settings, c, embedder).run(text, k, mode, generation, filters=filters, rerank=rerank)
