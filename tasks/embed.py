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
from corpusync.vectors import SparseRows, VectorTable, embedding_batch

if TYPE_CHECKING:
    from schemas.records import ChunkedDocument, EmbeddedDocument

log = logging.getLogger("corpusync.embed")


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
    sparse_trained = embedder.identity.sparse_trained
    sparse_parts: list[tuple[list[int], SparseRows]] = []  # (text indices, their rows), in completion order
    if n == 0:
        return EmbeddingOutput(dense, SparseRows.empty(0) if sparse_trained else None)
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
            if sparse_trained:
                sparse_parts.append((batch, out.sparse if out.sparse is not None else SparseRows.empty(len(batch))))
            stats.batches += 1
            stats.batch_sizes.append(len(batch))
            stats.real_tokens += sum(lengths[i] for i in batch)
            stats.padded_tokens += len(batch) * max(lengths[i] for i in batch)
            if on_batch:
                on_batch(len(batch))
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    return EmbeddingOutput(dense, _in_input_order(sparse_parts, n) if sparse_trained else None)


def _in_input_order(parts: list[tuple[list[int], SparseRows]], n: int) -> SparseRows:
    """Batches' sparse rows, which arrive longest-first, put back in input order (one gather)."""
    done = np.concatenate([np.asarray(b, np.int64) for b, _ in parts])
    where = np.empty(n, np.int64)
    where[done] = np.arange(n)
    return SparseRows.concat([rows for _, rows in parts]).take(where)


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
    stored: VectorTable,
    token_budget: int,
    on_batch: Callable[[int], None] | None = None,
) -> tuple[list[EmbeddedDocument], EmbedStats]:
    """Vectors for every chunk of docs, one Arrow record batch per document. `stored` holds vectors already
    in the index for this model identity, keyed by text hash: those are copied, not recomputed."""
    stats = EmbedStats()
    todo: dict[str, str] = {}  # text hash -> text, first occurrence order
    for d in docs:
        for c in d.chunks:
            if c.text_sha256 in stored.rows:
                stats.reused += 1
            elif c.text_sha256 in todo:
                stats.deduplicated += 1
            else:
                todo[c.text_sha256] = c.text
    out = encode_texts(embedder, list(todo.values()), token_budget, stats, on_batch)
    stats.embedded = len(todo)
    fresh = VectorTable({h: i for i, h in enumerate(todo)}, out.dense, out.sparse)
    pool = VectorTable.concat([fresh, stored], sparse=embedder.identity.sparse_trained)
    from schemas.records import EmbeddedDocument

    result: list[EmbeddedDocument] = []
    for d in docs:
        rows = np.fromiter((pool.rows[c.text_sha256] for c in d.chunks), np.int64, len(d.chunks))
        sparse = pool.sparse.take(rows) if pool.sparse is not None else None
        result.append(EmbeddedDocument(doc=d, vectors=embedding_batch(pool.dense[rows], sparse)))
    return result, stats
