"""The embedding interface the stages, the store and the query layer depend on: what identifies a model
(ModelIdentity), what it returns (EmbeddingOutput) and the protocols of a tokenizer, an embedder and a model
running in a process of its own. The FlagEmbedding implementation is corpusync.adapters.embedders."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from corpusync.core.vectors import SparseRows


@dataclass(frozen=True)
class ModelIdentity:
    """What makes two vectors comparable. Recorded per model in embedding_models; queries and
    refreshes refuse to mix identities."""

    name: str
    revision: str | None
    weights_sha256: str | None
    dimension: int
    pooling: str
    normalized: bool
    sparse_trained: bool
    sparse_dim: int | None
    max_tokens: int

    @property
    def identity_hash(self) -> str:
        d = asdict(self)
        d.pop("max_tokens")  # a serving limit, not part of what a vector means
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()

    @property
    def label(self) -> str:
        rev = (self.revision or self.weights_sha256 or "?")[:12]
        return f"{self.name}@{rev} ({self.dimension}-d, {self.pooling})"


@dataclass
class EmbeddingOutput:
    dense: np.ndarray  # (n, d) float32
    sparse: SparseRows | None  # CSR token weights, one row per text, or None (no trained sparse head)


@runtime_checkable
class Tokenizer(Protocol):
    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Token counts including the model's special tokens."""
        ...

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        """Character (start, end) of each token, special tokens excluded."""
        ...


class ModelProcess(Protocol):
    """The model in a process of its own (corpusync/adapters/model_host.py). A call raises BrokenProcessPool when
    that process died."""

    @property
    def warm(self) -> bool: ...  # its model libraries imported already (a shared server's, from an earlier command)
    def load(self) -> None: ...
    def devices(self) -> list[str]: ...
    def embed(self, texts: Sequence[str]) -> EmbeddingOutput: ...
    def for_device(self, device: str) -> ModelProcess: ...
    def close(self) -> None: ...


@runtime_checkable
class Embedder(Tokenizer, Protocol):
    identity: ModelIdentity

    def embed(self, texts: Sequence[str]) -> EmbeddingOutput:
        """Vectors for one batch of texts (the caller batches; this may raise CUDA OOM)."""
        ...
