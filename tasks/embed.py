"""embed: vectors for new chunk text, reusing stored vectors of identical text from the same model.

Texts are de-duplicated, sorted by token length and cut into batches by a token budget (padded
tokens = batch size x longest text), so padding stays low. A CUDA out-of-memory error halves the batch
and retries; a batch of one that still fails is an error (no chunk is ever skipped silently).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from corpusync.adapters.embedding import Embedder, EmbeddingOutput
from corpusync.core.vectors import LexicalRows, SparseRows, VectorTable, embedding_batch

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
    device_batches: dict[str, int] = field(default_factory=dict)  # batches run per device


def is_oom(exc: BaseException) -> bool:
    name = type(exc).__name__
    return name == "OutOfMemoryError" or (isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def _free_cuda_cache() -> None:
    """Hand cached CUDA memory back, where this process runs a model (a model process clears its own)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


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
    on_vectors: Callable[[list[int], EmbeddingOutput], None] | None = None,
) -> EmbeddingOutput:
    """Embed texts in token-budgeted batches, halving a batch on out-of-memory. Output is in input order.

    When the embedder has several workers (one per visible GPU), each runs on its own thread and takes the
    next batch from one shared queue, longest first, so the devices finish together. `on_vectors` gets each
    finished batch (indices into texts, their vectors) at once, one call at a time, so a caller can make it
    durable before the next; an exception it raises fails the call like the model's own."""
    stats = stats or EmbedStats()
    n = len(texts)
    dense = np.zeros((n, embedder.identity.dimension), dtype=np.float32)
    sparse_trained = embedder.identity.sparse_trained
    if n == 0:
        return EmbeddingOutput(dense, SparseRows.empty(0) if sparse_trained else None)
    lengths = embedder.count_tokens(texts)
    over = [i for i, length in enumerate(lengths) if length > embedder.identity.max_tokens]
    if over:
        raise ValueError(
            f"{len(over)} text(s) exceed the model's {embedder.identity.max_tokens} tokens "
            f"(longest {max(lengths[i] for i in over)}); the chunker must prevent this"
        )
    get_workers = getattr(embedder, "workers", None)
    workers: list[Embedder] = get_workers() if callable(get_workers) else [embedder]
    run = _Run(texts, lengths, token_budget_batches(lengths, token_budget), dense, stats, on_batch, on_vectors)
    if len(workers) == 1:
        run.work(workers[0])
    else:
        log.info("embedding on %d devices: %s", len(workers),
                 ", ".join(str(getattr(w, "device", "?")) for w in workers))
        with ThreadPoolExecutor(max_workers=len(workers), thread_name_prefix="embed") as pool:
            for fut in [pool.submit(run.work, w) for w in workers]:
                fut.result()
    if run.error is not None:
        raise run.error
    return EmbeddingOutput(dense, _in_input_order(run.sparse_parts, n) if sparse_trained else None)


class _Run:
    """The batches of one encode_texts call, shared by its workers (one per device)."""

    def __init__(self, texts: Sequence[str], lengths: Sequence[int], batches: list[list[int]], dense: np.ndarray,
                 stats: EmbedStats, on_batch: Callable[[int], None] | None,
                 on_vectors: Callable[[list[int], EmbeddingOutput], None] | None = None) -> None:
        self.texts, self.lengths, self.pending, self.dense = texts, lengths, batches, dense
        self.stats, self.on_batch, self.on_vectors = stats, on_batch, on_vectors
        self.sparse_parts: list[tuple[list[int], SparseRows]] = []  # (text indices, their rows), as completed
        self.lock = threading.Lock()
        self.error: BaseException | None = None

    def take(self) -> list[int] | None:
        with self.lock:
            return self.pending.pop(0) if self.pending and self.error is None else None

    def work(self, embedder: Embedder) -> None:
        """Run batches on one device until the queue is empty. The next batch is tokenised on a CPU thread
        while the device runs the current one (the tokenizer and torch release the GIL), when the embedder
        exposes the two steps; otherwise one embed() call per batch."""
        prepare = getattr(embedder, "prepare", None)
        forward = getattr(embedder, "forward", None)
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize") if prepare and forward else None

        def submit(b: list[int]) -> Future[Any] | None:
            return pool.submit(prepare, [self.texts[i] for i in b]) if pool is not None and prepare else None

        batch = self.take()
        ahead = submit(batch) if batch is not None else None
        try:
            while batch is not None:
                nxt = self.take()
                nxt_ahead = submit(nxt) if nxt is not None else None
                try:
                    if forward is not None and ahead is not None:
                        out = forward(ahead.result())
                    else:
                        out = embedder.embed([self.texts[i] for i in batch])
                except Exception as exc:
                    with self.lock:
                        retry = _retry_smaller(exc, batch, self.pending, self.lengths, self.stats)
                    if not retry:
                        raise
                    # the halves go first in the shared queue; hand the batch taken ahead back behind them
                    if nxt is not None:
                        with self.lock:
                            self.pending.insert(2, nxt)
                    batch = self.take()
                    ahead = submit(batch) if batch is not None else None
                    continue
                self.done(batch, out, embedder)
                batch, ahead = nxt, nxt_ahead
        except BaseException as exc:
            with self.lock:
                self.error = self.error or exc
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)

    def done(self, batch: list[int], out: EmbeddingOutput, embedder: Embedder) -> None:
        self.dense[batch] = out.dense  # rows of different batches never overlap: no lock needed
        with self.lock:
            rows = None
            if embedder.identity.sparse_trained:
                rows = out.sparse if out.sparse is not None else SparseRows.empty(len(batch))
                self.sparse_parts.append((batch, rows))
            if self.on_vectors:  # under the lock: one write at a time, whatever the number of devices
                self.on_vectors(batch, EmbeddingOutput(np.asarray(out.dense, np.float32), rows))
            st = self.stats
            st.batches += 1
            st.batch_sizes.append(len(batch))
            st.real_tokens += sum(self.lengths[i] for i in batch)
            st.padded_tokens += len(batch) * max(self.lengths[i] for i in batch)
            device = str(getattr(embedder, "device", "default"))
            st.device_batches[device] = st.device_batches.get(device, 0) + 1
            if self.on_batch:
                self.on_batch(len(batch))


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


def _in_input_order(parts: list[tuple[list[int], SparseRows]], n: int) -> SparseRows:
    """Batches' sparse rows, which arrive longest-first, put back in input order (one gather)."""
    done = np.concatenate([np.asarray(b, np.int64) for b, _ in parts])
    where = np.empty(n, np.int64)
    where[done] = np.arange(n)
    return SparseRows.concat([rows for _, rows in parts]).take(where)


def _by_hash(keys: list[str], on_vectors: Callable[[list[str], EmbeddingOutput], None],
             ) -> Callable[[list[int], EmbeddingOutput], None]:
    """A batch callback by text index turned into one by model-input hash."""
    def call(batch: list[int], vectors: EmbeddingOutput) -> None:
        on_vectors([keys[i] for i in batch], vectors)
    return call


def embed_documents(
    docs: Sequence[ChunkedDocument],
    embedder: Embedder,
    stored: VectorTable,
    token_budget: int,
    on_batch: Callable[[int], None] | None = None,
    segment: Callable[[Sequence[str]], Sequence[tuple[str, Sequence[str]]]] | None = None,
    on_vectors: Callable[[list[str], EmbeddingOutput], None] | None = None,
) -> tuple[list[EmbeddedDocument], EmbedStats]:
    """Vectors for every chunk of docs, one Arrow record batch per document. `stored` holds vectors already
    in the index for this model identity, keyed by the hash of the model input: those are copied, not
    recomputed. What is embedded is each chunk's `model_text` (its breadcrumb, then its text).

    `segment` (texts -> (normalised text, tokens) each, e.g. lexical.Analyzer.index_texts) runs on a thread
    while the model embeds, so the CPU-bound segmentation overlaps the device; its result becomes the
    lexical columns (search text, terms, term frequencies).

    `on_vectors` (model-input hashes, their vectors) is called as soon as each batch is embedded, so the
    caller can keep it (the vector cache) before the run goes on: work a crash would lose is one batch."""
    stats = EmbedStats()
    todo: dict[str, str] = {}  # model-input hash -> model input, first occurrence order
    distinct: dict[str, str] = {}  # every model input of this batch (for segmentation)
    for d in docs:
        for c in d.chunks:
            distinct.setdefault(c.text_sha256, c.model_text)
            if c.text_sha256 in stored.rows:
                stats.reused += 1
            elif c.text_sha256 in todo:
                stats.deduplicated += 1
            else:
                todo[c.text_sha256] = c.model_text
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="segment") as pool:
        segmented = pool.submit(segment, list(distinct.values())) if segment is not None else None
        out = encode_texts(embedder, list(todo.values()), token_budget, stats, on_batch,
                           _by_hash(list(todo), on_vectors) if on_vectors is not None else None)
        lexical = LexicalRows.from_tokens(segmented.result()) if segmented is not None else None
    stats.embedded = len(todo)
    fresh = VectorTable({h: i for i, h in enumerate(todo)}, out.dense, out.sparse)
    pool_table = VectorTable.concat([fresh, stored], sparse=embedder.identity.sparse_trained)
    lexical_row = {h: i for i, h in enumerate(distinct)}
    from schemas.records import EmbeddedDocument

    result: list[EmbeddedDocument] = []
    for d in docs:
        rows = np.fromiter((pool_table.rows[c.text_sha256] for c in d.chunks), np.int64, len(d.chunks))
        sparse = pool_table.sparse.take(rows) if pool_table.sparse is not None else None
        lex = lexical.take([lexical_row[c.text_sha256] for c in d.chunks]) if lexical is not None else None
        result.append(EmbeddedDocument(doc=d, vectors=embedding_batch(pool_table.dense[rows], sparse, lex)))
    return result, stats
