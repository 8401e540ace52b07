"""Optional cross-encoder reranking (FlagEmbedding's FlagReranker, e.g. bge-reranker-v2-m3) from a local
directory; heavy imports deferred. No reranker configured -> None, and the caller says it skipped."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any, Protocol

from corpusync.core.errors import ConfigError
from schemas.settings import Settings


class Reranker(Protocol):
    def score(self, query: str, passages: Sequence[str]) -> list[float]: ...


class FlagCrossEncoder:
    def __init__(self, path: Path, use_fp16: bool) -> None:
        if not (path / "config.json").exists():
            raise ConfigError(f"reranker directory {path} has no config.json (a local bge-reranker model)")
        from FlagEmbedding import FlagReranker

        self._model: Any = FlagReranker(str(path), use_fp16=use_fp16)

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        scores = self._model.compute_score([[query, p] for p in passages], normalize=True)
        return [float(s) for s in (scores if isinstance(scores, list) else [scores])]


@cache
def _load(path: str, use_fp16: bool) -> FlagCrossEncoder:
    return FlagCrossEncoder(Path(path), use_fp16)


def build_reranker(settings: Settings) -> Reranker | None:
    if settings.reranker_path is None:
        return None
    import torch

    return _load(str(settings.reranker_path), settings.embed_fp16 and torch.cuda.is_available())
