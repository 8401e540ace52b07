"""embed: vectors for new chunk text, reusing stored vectors of identical text from the same model.

Texts are de-duplicated, sorted by token length and cut into batches by a token budget (padded
tokens = batch size x longest text), so padding stays low. A CUDA out-of-memory error halves the batch
and retries; a batch of one that still fails is an error (no chunk is ever skipped silently).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from corpusync.embedders import Embedder, EmbeddingOutput

if TYPE_CHECKING:
    from schemas.records import ChunkedDocument, EmbeddedDocument

log = logging.getLogger("corpusync.embed")

Vectors = tuple[np.ndarray, dict[int, float] | None]


@dataclass
class EmbedStats:
    embedded: int = 0  # distinct texts sent to the model
    reused: int = 0  # chunks whose vectors came from the index
    deduplicated: int = 0  # chunks sharing text with another chunk of this run
    batches: int = 0
    oom_retries: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    batch_sizes: list[int] = field(default_factory=list)


def is_oom(exc: BaseException) -> bool:
    name = type(exc).__name__
    return name == "OutOfMemoryError" or (isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def _free_cuda_cache() -> None:
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


def token_budget_batches(lengths: Sequence[int], budget: int, max_batch: int = 1024) -> list[list[int]]:
    """Indices grouped into batches, longest first, so that len(batch) * max(length) <= budget.

    A single text longer than the budget still gets a batch of its own.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        n = lengths[i]
        new_longest = max(longest, n)
        if current and (new_longest * (len(current) + 1) > budget or len(current) >= max_batch):
            batches.append(current)
            current, new_longest = [], n
        current.append(i)
        longest = new_longest
    if current:
        batches.append(current)
    return batches


def encode_texts(
    embedder: Embedder,
    texts: Sequence[str],
    token_budget: int,
    stats: EmbedStats | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> EmbeddingOutput:
    """Embed texts in token-budgeted batches, halving a batch on out-of-memory. Output is in input order."""
    stats = stats or EmbedStats()
    n = len(texts)
    dim = embedder.identity.dimension
    dense = np.zeros((n, dim), dtype=np.float32)
    sparse: list[dict[int, float]] | None = [{} for _ in range(n)] if embedder.identity.sparse_trained else None
    if n == 0:
        return EmbeddingOutput(dense, sparse)
    lengths = embedder.count_tokens(texts)
    over = [i for i, length in enumerate(lengths) if length > embedder.identity.max_tokens]
    if over:
        raise ValueError(
            f"{len(over)} text(s) exceed the model's {embedder.identity.max_tokens} tokens "
            f"(longest {max(lengths[i] for i in over)}); the chunker must prevent this"
        )
    pending = token_budget_batches(lengths, token_budget)
    # Tokenise batch i+1 on a CPU thread while the model runs batch i (the tokenizer and torch release
    # the GIL), when the embedder exposes the two steps; otherwise one call per batch.
    prepare = getattr(embedder, "prepare", None)
    forward = getattr(embedder, "forward", None)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize") if prepare and forward else None
    ahead: dict[tuple[int, ...], Future[Any]] = {}  # batch (its text indices) -> tokenised batch

    def submit(b: list[int]) -> None:
        if pool is not None and prepare is not None and tuple(b) not in ahead:
            ahead[tuple(b)] = pool.submit(prepare, [texts[i] for i in b])

    try:
        while pending:
            batch = pending.pop(0)
            if pending:
                submit(pending[0])
            try:
                if pool is not None:
                    submit(batch)
                    out = forward(ahead.pop(tuple(batch)).result())  # type: ignore[misc]
                else:
                    out = embedder.embed([texts[i] for i in batch])
            except Exception as exc:
                if not _retry_smaller(exc, batch, pending, lengths, stats):
                    raise
                continue
            dense[batch] = out.dense
            if sparse is not None and out.sparse is not None:
                for i, w in zip(batch, out.sparse, strict=True):
                    sparse[i] = w
            stats.batches += 1
            stats.batch_sizes.append(len(batch))
            stats.real_tokens += sum(lengths[i] for i in batch)
            stats.padded_tokens += len(batch) * max(lengths[i] for i in batch)
            if on_batch:
                on_batch(len(batch))
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    return EmbeddingOutput(dense, sparse)


def _retry_smaller(exc: Exception, batch: list[int], pending: list[list[int]], lengths: Sequence[int],
                   stats: EmbedStats) -> bool:
    """On CUDA out-of-memory, put the batch back as two halves and return True; other errors: False."""
    if not is_oom(exc):
        return False
    stats.oom_retries += 1
    _free_cuda_cache()
    if len(batch) == 1:
        raise RuntimeError(
            f"out of memory embedding a single text of {lengths[batch[0]]} tokens; "
            "lower CORPUSYNC_CHUNK_MAX_TOKENS or use a larger device"
        ) from exc
    half = len(batch) // 2
    log.warning("out of memory on a batch of %d texts; retrying as %d + %d", len(batch), half, len(batch) - half)
    pending[:0] = [batch[:half], batch[half:]]
    return True


def embed_documents(
    docs: Sequence[ChunkedDocument],
    embedder: Embedder,
    stored: dict[str, Vectors],
    token_budget: int,
    on_batch: Callable[[int], None] | None = None,
) -> tuple[list[EmbeddedDocument], EmbedStats]:
    """Vectors for every chunk of docs. `stored` maps text_sha256 -> vectors already in the index for
    this model identity: those are copied, not recomputed."""
    stats = EmbedStats()
    todo: dict[str, str] = {}  # text hash -> text, first occurrence order
    total = 0
    for d in docs:
        for c in d.chunks:
            total += 1
            if c.text_sha256 in stored:
                stats.reused += 1
            elif c.text_sha256 in todo:
                stats.deduplicated += 1
            else:
                todo[c.text_sha256] = c.text
    hashes = list(todo)
    out = encode_texts(embedder, [todo[h] for h in hashes], token_budget, stats, on_batch)
    stats.embedded = len(hashes)
    fresh: dict[str, Vectors] = {
        h: (out.dense[i], out.sparse[i] if out.sparse is not None else None) for i, h in enumerate(hashes)
    }
    from schemas.records import EmbeddedDocument

    result: list[EmbeddedDocument] = []
    dim = embedder.identity.dimension
    for d in docs:
        dense = np.zeros((len(d.chunks), dim), dtype=np.float32)
        sparse: list[dict[int, float]] | None = [] if embedder.identity.sparse_trained else None
        for i, c in enumerate(d.chunks):
            vec, sp = fresh.get(c.text_sha256) or stored[c.text_sha256]
            dense[i] = vec
            if sparse is not None:
                sparse.append(sp or {})
        result.append(EmbeddedDocument(doc=d, dense=dense, sparse=sparse))
    return result, stats
