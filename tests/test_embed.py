"""Embedding with the real packaged MiniLM through FlagEmbedding; OOM back-off by fault injection."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from corpusync.adapters.embedding import EmbeddingOutput
from corpusync.core.errors import ModelMismatch
from corpusync.core.vectors import VectorTable
from tasks.embed import EmbedStats, embed_documents, encode_texts
from tasks.load import check_model

TEXTS = ["The seller ships within 14 days.", "Payment is due thirty days after the invoice.",
         "第十二条 付款方式", "Normans came from Normandy in France.", "short", "x " * 100]


def test_embeddings_are_deterministic_normalised_and_identified(embedder) -> None:  # type: ignore[no-untyped-def]
    a = encode_texts(embedder, TEXTS, token_budget=256)
    b = encode_texts(embedder, list(reversed(TEXTS)), token_budget=64)
    assert a.dense.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(np.linalg.norm(a.dense, axis=1), 1.0, atol=1e-4)
    np.testing.assert_allclose(a.dense, b.dense[::-1], atol=1e-4)  # batching/order does not change vectors
    assert a.sparse is None  # MiniLM has no trained sparse head: sparse is disabled, never faked
    ident = embedder.identity
    assert ident.dimension == 384 and ident.pooling == "mean" and not ident.sparse_trained
    assert len(ident.weights_sha256) == 64


class _OOMOnce:
    """Fault injection: the first batch raises CUDA-style out-of-memory, later ones go to the real model."""

    def __init__(self, inner) -> None:  # type: ignore[no-untyped-def]
        self.inner = inner
        self.identity = inner.identity
        self.sizes: list[int] = []

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return self.inner.count_tokens(texts)

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        return self.inner.token_offsets(text)

    def embed(self, texts: Sequence[str]) -> EmbeddingOutput:
        self.sizes.append(len(texts))
        if len(self.sizes) == 1:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.inner.embed(texts)


def test_oom_halves_batch_and_loses_nothing(embedder) -> None:  # type: ignore[no-untyped-def]
    flaky = _OOMOnce(embedder)
    stats = EmbedStats()
    out = encode_texts(flaky, TEXTS, token_budget=10_000, stats=stats)
    ref = encode_texts(embedder, TEXTS, token_budget=10_000)
    assert stats.oom_retries == 1
    assert flaky.sizes[0] == len(TEXTS) and flaky.sizes[1] == len(TEXTS) // 2
    np.testing.assert_allclose(out.dense, ref.dense, atol=1e-4)  # all chunks, in input order


def test_non_oom_errors_are_not_swallowed(embedder) -> None:  # type: ignore[no-untyped-def]
    class Broken(_OOMOnce):
        def embed(self, texts: Sequence[str]) -> EmbeddingOutput:
            raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        encode_texts(Broken(embedder), TEXTS, token_budget=1000)


def test_reuse_copies_vectors_instead_of_recomputing(embedder) -> None:  # type: ignore[no-untyped-def]
    from schemas.records import Block
    from tasks.chunk import ChunkConfig, chunk_document
    from tests.test_stages_unit import _doc

    doc = chunk_document(_doc([Block("text", t) for t in TEXTS[:4]]), embedder, ChunkConfig(32, 0.0))
    first, _ = embed_documents([doc], embedder, VectorTable.empty(384, False), 4096)
    stored = VectorTable({c.text_sha256: i for i, c in enumerate(doc.chunks)}, first[0].dense.copy(), None)
    calls = embedder.calls
    second, s2 = embed_documents([doc], embedder, stored, 4096)
    assert embedder.calls == calls, "no model call when every chunk text is already embedded"
    assert s2.embedded == 0 and s2.reused == len(doc.chunks)
    np.testing.assert_array_equal(second[0].dense, first[0].dense)


def test_model_mismatch_is_refused_unless_reembed() -> None:
    with pytest.raises(ModelMismatch, match="--reembed"):
        check_model(1, 2, "old-model (384-d)", "new-model (1024-d)", reembed=False)
    check_model(1, 2, "old", "new", reembed=True)
    check_model(None, 2, "", "new", reembed=False)


def test_sparse_top_k_matches_reference_loop() -> None:
    import torch

    from corpusync.core.vectors import sparse_top_k

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (5, 30), generator=g)
    ids[:, 0] = 0  # a special token
    w = torch.rand((5, 30), generator=g) - 0.2
    got = sparse_top_k(w, ids, [0], top_k=8, vocab_size=60)
    for r in range(5):
        ref: dict[int, float] = {}
        for t, x in zip(ids[r].tolist(), w[r].tolist(), strict=True):
            if t != 0 and x > 0:
                ref[t] = max(ref.get(t, 0.0), x)
        top = dict(sorted(sorted(ref.items(), key=lambda kv: -kv[1])[:8]))
        row = got.row(r)
        assert list(row) == sorted(top)  # ascending token ids, as sparsevec wants them
        assert all(abs(row[key] - top[key]) < 1e-6 for key in top)


class _OOMOncePipelined(_OOMOnce):
    """The same fault on the pipelined path (tokenise ahead on a thread, forward on the device)."""

    def __init__(self, inner) -> None:  # type: ignore[no-untyped-def]
        super().__init__(inner)
        self.prepared = 0

    def prepare(self, texts: Sequence[str]) -> object:
        self.prepared += 1
        return (len(texts), self.inner.prepare(texts))

    def forward(self, prepared: tuple[int, object]) -> EmbeddingOutput:
        self.sizes.append(prepared[0])
        if len(self.sizes) == 1:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.inner.forward(prepared[1])


def test_pipelined_tokenisation_matches_sequential_and_survives_oom(embedder) -> None:  # type: ignore[no-untyped-def]
    texts = TEXTS * 6
    seq = _OOMOnce(embedder)
    seq.sizes = [0]  # no fault: a plain sequential embedder (embed() only)
    ref = encode_texts(seq, texts, token_budget=400)
    piped = _OOMOncePipelined(embedder)
    stats = EmbedStats()
    out = encode_texts(piped, texts, token_budget=400, stats=stats)
    assert stats.oom_retries == 1 and stats.batches >= 3
    assert piped.prepared >= stats.batches  # every batch was tokenised through prepare()
    np.testing.assert_allclose(out.dense, ref.dense, atol=1e-4)  # same vectors, input order kept


class _TokenWeights(_OOMOnce):
    """No model with a trained sparse head is available offline, so this harness gives the real MiniLM one:
    weight 1/(1 + position) per token id, through the real sparse_top_k. It checks that sparse rows survive
    longest-first batching and OOM halving and come back in input order (first batch fails once)."""

    def __init__(self, inner) -> None:  # type: ignore[no-untyped-def]
        import dataclasses

        super().__init__(inner)
        self.identity = dataclasses.replace(inner.identity, sparse_trained=True, sparse_dim=30522)

    def embed(self, texts: Sequence[str]) -> EmbeddingOutput:
        import torch

        from corpusync.core.vectors import sparse_top_k

        out = super().embed(texts)
        enc = self.inner.tokenizer(list(texts), padding=True, return_tensors="pt")
        pos = torch.arange(enc["input_ids"].shape[1], dtype=torch.float32).expand_as(enc["input_ids"])
        w = (1.0 / (1.0 + pos)) * enc["attention_mask"]
        return EmbeddingOutput(out.dense, sparse_top_k(w, enc["input_ids"], [0, 100, 101, 102], 6, 30522))


def test_sparse_rows_come_back_in_input_order_through_batching_and_oom(embedder) -> None:  # type: ignore[no-untyped-def]
    texts = [f"clause {i} " + "payment terms " * (i % 7) for i in range(40)]
    harness = _TokenWeights(embedder)
    stats = EmbedStats()
    out = encode_texts(harness, texts, token_budget=120, stats=stats)
    assert stats.oom_retries == 1 and stats.batches > 3
    assert out.sparse is not None and len(out.sparse) == len(texts)
    one_by_one = [harness.embed([t]).sparse.row(0) for t in texts]  # type: ignore[union-attr]
    got = out.sparse.to_dicts()
    assert [list(r) for r in got] == [list(r) for r in one_by_one]
    for g, ref in zip(got, one_by_one, strict=True):
        assert all(abs(g[k] - ref[k]) < 1e-6 for k in ref)
    assert all(0 < len(r) <= 6 for r in got)


def test_one_worker_per_device_shares_the_queue_and_keeps_input_order(embedder, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two devices (two CPU workers here; GPUs on a multi-GPU machine), each with its own model replica; the
    second one runs out of memory once (fault injection). Every text comes out, in input order, equal to
    the single-worker result, and both workers ran batches."""
    import torch

    from corpusync.adapters.embedders import build_embedder
    from schemas.settings import Settings

    multi = build_embedder(Settings(chunk_max_tokens=128, home=tmp_path, device="cpu,cpu"))
    workers = multi.workers()
    assert [w.device for w in workers] == ["cpu", "cpu"] and workers[0] is multi
    assert workers[1].model is not workers[0].model and workers[1].tokenizer is not workers[0].tokenizer
    real_forward = workers[1].forward
    failures: list[int] = []

    def flaky_forward(prepared):  # type: ignore[no-untyped-def]
        if not failures:
            failures.append(1)
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        return real_forward(prepared)

    workers[1].forward = flaky_forward  # type: ignore[method-assign]
    texts = [f"Article {i}: " + "the buyer pays within thirty days " * (1 + i % 9) for i in range(120)]
    stats = EmbedStats()
    out = encode_texts(multi, texts, token_budget=400, stats=stats)
    ref = encode_texts(embedder, texts, token_budget=4096)
    np.testing.assert_allclose(out.dense, ref.dense, atol=1e-4)
    assert stats.oom_retries == 1 and failures == [1]
    assert workers[0].calls > 0 and workers[1].calls > 0
    assert workers[0].calls + workers[1].calls == stats.batches == len(stats.batch_sizes)
    assert sum(stats.batch_sizes) == len(texts)


def test_device_setting_resolves_to_workers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pydantic import ValidationError

    from corpusync.adapters.embedders import resolve_devices
    from schemas.settings import Settings

    assert resolve_devices("cuda:0,cuda:2") == ["cuda:0", "cuda:2"]
    assert resolve_devices("cpu") == ["cpu"]
    import torch

    expected = [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else ["cpu"]
    assert resolve_devices("auto") == expected
    with pytest.raises(ValidationError):
        Settings(home=tmp_path, device="gpu0")


def test_segmentation_overlaps_embedding_and_lands_in_the_record_batch(embedder) -> None:  # type: ignore[no-untyped-def]
    import threading
    from collections import Counter

    from corpusync.core.lexical import Analyzer
    from schemas.records import Block
    from tasks.chunk import ChunkConfig, chunk_document
    from tests.test_stages_unit import _doc

    doc = chunk_document(_doc([Block("text", t) for t in TEXTS]), embedder, ChunkConfig(32, 0.0))
    threads: list[str] = []
    analyzer = Analyzer()

    def segment(texts: Sequence[str]) -> list[tuple[str, list[str]]]:
        threads.append(threading.current_thread().name)
        return analyzer.index_texts(texts)

    out, _ = embed_documents([doc], embedder, VectorTable.empty(384, False), 4096, segment=segment)
    batch = out[0].vectors
    texts = [c.model_text for c in doc.chunks]
    assert batch.column("search_text").to_pylist() == [analyzer.normalize(t) for t in texts]
    got = [dict(zip(t, f, strict=True)) for t, f in zip(batch.column("terms").to_pylist(),
                                                          batch.column("term_freqs").to_pylist(), strict=True)]
    assert got == [dict(Counter(analyzer.tokens(t))) for t in texts]
    assert threads and threads[0].startswith("segment")  # not the embedding thread


def broken_vectors(embedder):  # type: ignore[no-untyped-def]
    """Three embedded documents: ok.md, nan.md (a NaN in a vector), long.md (an unnormalised vector)."""
    import dataclasses

    from corpusync.core.vectors import embedding_batch
    from schemas.records import Block, EmbeddedDocument
    from tasks.chunk import ChunkConfig, chunk_document
    from tests.test_stages_unit import _doc

    docs = []
    for name in ("ok.md", "nan.md", "long.md"):
        parsed = _doc([Block("text", t) for t in TEXTS[:3]])
        parsed = dataclasses.replace(parsed, source=dataclasses.replace(parsed.source, path=name))
        docs.append(chunk_document(parsed, embedder, ChunkConfig(64, 0.0)))
    embedded, _ = embed_documents(docs, embedder, VectorTable.empty(384, False), 4096)
    broken = []
    for ed in embedded:
        dense = ed.dense.copy()
        if ed.doc.parsed.source.path == "nan.md":
            dense[0, 5] = np.nan
        if ed.doc.parsed.source.path == "long.md":
            dense[-1] *= 3.0
        broken.append(EmbeddedDocument(ed.doc, embedding_batch(dense, None)))
    return broken


def test_validation_quarantines_documents_with_broken_vectors(embedder) -> None:  # type: ignore[no-untyped-def]
    """Fault injection into the record batches: a NaN vector and an unnormalised one fail the
    great-expectations suite for their documents only."""
    from tasks.validate import Thresholds, validate_chunks

    outcome = validate_chunks(broken_vectors(embedder), Thresholds(max_tokens=64, dimension=384, normalized=True))
    assert [ed.doc.parsed.source.path for ed in outcome.passed] == ["ok.md"]
    assert "expect_column_values_to_be_in_set(finite)" in outcome.failures["nan.md"]
    assert outcome.failures["long.md"] == ["expect_column_values_to_be_between(norm)"]


def test_a_page_indexed_from_its_kept_text_layer_passes_the_ocr_check(embedder, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """OCR read nothing on the page (confidence 0) and its few words of text layer are indexed: the chunk is
    not OCR text, so the OCR confidence check does not apply (a refresh quarantined pdf.js's scan-bad.pdf at
    validate when it did)."""
    import dataclasses

    from schemas.records import ParseOptions
    from tasks.chunk import ChunkConfig, chunk_document
    from tasks.parse import parse_document
    from tasks.validate import Thresholds, chunk_rows
    from tests.test_parse_corpus import kept_layer_pdf, source

    parsed = parse_document(source(kept_layer_pdf(tmp_path / "scan.pdf")), ParseOptions())
    assert parsed.metadata["ocr_pages"][0]["kept_text_layer"] and parsed.metadata["low_confidence_pages"] == [2]
    limits = Thresholds(max_tokens=64, dimension=384, normalized=True)

    def ocr_ok(doc):  # type: ignore[no-untyped-def]
        embedded, _ = embed_documents([chunk_document(doc, embedder, ChunkConfig(64, 0.0))], embedder,
                                      VectorTable.empty(384, False), 4096)
        return [r["ocr_ok"] for r in chunk_rows(embedded, limits)]

    assert ocr_ok(parsed) == [True]
    # the control: the same page read as OCR text of confidence 0, not flagged low, fails the check
    pages = [{**p, "kept_text_layer": False} for p in parsed.metadata["ocr_pages"]]
    assert ocr_ok(dataclasses.replace(parsed, metadata={**parsed.metadata, "ocr_pages": pages})) == [False]
