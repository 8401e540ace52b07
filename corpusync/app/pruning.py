"""Pruning as every caller runs it (a refresh, `corpusync prune`, the prune flow): the database's retention
window and vector cache (corpusync.store.generations.prune), then the OCR readings on disk not used for
CORPUSYNC_VECTOR_CACHE_TTL_H hours."""

from __future__ import annotations

import psycopg

from corpusync.adapters.ocr_cache import prune_ocr_cache
from corpusync.store import generations
from schemas.settings import Settings

REFRESH_OCR_PRUNE_EVERY_S = 3600.0  # a refresh walks the OCR cache at most this often (corpusync prune: always)


def prune(conn: psycopg.Connection, settings: Settings, *, ocr_every_s: float = 0.0) -> dict[str, int]:
    """The numbers of versions, chunks, documents, cached vectors and OCR readings deleted, and the oldest
    generation retained. `ocr_every_s`: leave the OCR cache alone if it was pruned more recently than that."""
    result = generations.prune(conn, settings.retention_generations, settings.vector_cache_ttl_h)
    result["ocr_readings"] = prune_ocr_cache(settings.ocr_cache_dir, settings.vector_cache_ttl_h,
                                             every_s=ocr_every_s)
    return result
