"""Hybrid retrieval on the real embedded PostgreSQL + MiniLM: channels, filters (incl. sidecar metadata),
iterative index scans, RRF, generations, SQL functions vs the Python API, injection safety."""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pgvector import HalfVector

from corpusync.core.errors import CorpusyncError
from corpusync.core.lexical import Analyzer
from evaluation.fusion import Fusion
from query.search import Searcher, build_filter
from tests.conftest import make_settings, new_database, small_corpus

pytestmark = [pytest.mark.flow, pytest.mark.db]


def index_corpus(settings: Any, corpus: Path) -> Any:
    from flows.refresh import refresh

    (corpus / "docs/contract-terms.md.meta.json").write_text(json.dumps({"region": "East", "year": 2024}))
    summary = refresh(str(corpus), settings=settings)
    assert summary["published"] and summary["documents"]["new"] == 6  # the sidecar is not a document
    return settings


@pytest.fixture(scope="module")
def shared_index(prefect_harness, pg_server: str, template_db: str,  # type: ignore[no-untyped-def]
                 tmp_path_factory: pytest.TempPathFactory, embedder) -> Iterator[Any]:
    """The corpus indexed once for the tests that only query it."""
    folder = tmp_path_factory.mktemp("query-index")
    with new_database(pg_server, template_db) as url:
        yield index_corpus(make_settings(folder / "home", url), small_corpus(folder / "corpus"))


@pytest.fixture
def indexed(shared_index: Any) -> Any:
    return shared_index


@pytest.fixture
def settings(shared_index: Any) -> Any:
    """conftest's `conn` opens the shared index."""
    return shared_index


@pytest.fixture
def empty_conn(db_url: str, tmp_path: Path) -> Iterator[Any]:
    """A connection to an empty index of its own (for a test that writes rows directly)."""
    from corpusync.store.db import open_database

    with open_database(make_settings(tmp_path / "home", db_url)) as c:
        yield c


@pytest.fixture
def own_index(prefect_harness, db_url: str, tmp_path: Path, corpus: Path, embedder) -> Any:  # type: ignore[no-untyped-def]
    """The corpus indexed for one test that changes it."""
    return index_corpus(make_settings(tmp_path / "home", db_url), corpus)


def ids(hits: Any) -> list[int]:
    return [h.chunk_id for h in hits]


def test_identifier_and_chinese_term_found_by_lexical_and_hybrid(indexed, conn, embedder) -> None:  # type: ignore[no-untyped-def]
    s = Searcher(indexed, conn, embedder)
    for mode in ("lexical", "hybrid"):
        top = s.search("HT2023-0876", k=3, mode=mode)[0]
        assert top.source == "docs/contract-terms.md" and "HT2023-0876" in top.text, mode
        assert top.lexical_rank == 1
        zh = s.search("付款方式", k=3, mode=mode)
        assert any("付款方式" in h.text for h in zh), mode
    with pytest.raises(CorpusyncError, match="sparse retrieval needs"):
        s.search("x", mode="sparse")


def test_rrf_fusion_follows_the_formula(indexed, conn, embedder) -> None:  # type: ignore[no-untyped-def]
    s = Searcher(indexed, conn, embedder)
    hits = s.search("Which NFL team won Super Bowl 50?", k=10)
    rrf_k = 60  # no fusion tuned, none configured
    for h in hits:
        expected = sum(1.0 / (rrf_k + r) for r in (h.dense_rank, h.lexical_rank) if r is not None)
        assert h.score == pytest.approx(expected)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert any(h.dense_rank and h.lexical_rank for h in hits)  # fused from both channels
    dense = s.search("Which NFL team won Super Bowl 50?", k=10, mode="dense")
    assert [h.dense_rank for h in dense] == list(range(1, len(dense) + 1))
    # a channel weight of 0 leaves the other channel's order
    s.settings = indexed.model_copy(update={"rrf_weights": {"dense": 1.0, "lexical": 0.0}})
    assert ids(s.search("Which NFL team won Super Bowl 50?", k=10)) == ids(dense)


def test_filtered_dense_query_returns_k_rows_with_iterative_scan(indexed, conn, embedder) -> None:  # type: ignore[no-untyped-def]
    tight = indexed.model_copy(update={"hnsw_ef_search": 4, "candidate_pool": 4})
    conn.execute("SET enable_seqscan = off")  # make the planner use HNSW even on this small table
    s = Searcher(tight, conn, embedder)
    query, flt = "American football championship game", {"path": "zh/"}
    zh_chunks = conn.execute("SELECT count(*) FROM corpusync.live_chunks WHERE source_path LIKE 'zh/%'").fetchone()[0]
    assert zh_chunks >= 4
    hits = s.search(query, k=4, mode="dense", filters=flt)
    assert len(hits) == 4 and all(h.source.startswith("zh/") for h in hits)
    # the same filtered scan without iterative scanning comes back short: the filter is selective here
    state = conn.execute("SELECT model_id, dimension FROM corpusync.index_state JOIN corpusync.embedding_models m "
                         "ON m.id = model_id").fetchone()
    qvec = HalfVector(embedder.embed([query]).dense[0])
    with conn.transaction():
        conn.execute("SET LOCAL hnsw.iterative_scan = off")
        conn.execute("SET LOCAL hnsw.ef_search = 4")
        plain = conn.execute(
            f"SELECT c.id FROM corpusync.chunks c JOIN corpusync.documents d ON d.id = c.document_id "
            f"WHERE c.model_id = {int(state[0])} AND d.path LIKE 'zh/%%' "
            f"ORDER BY c.dense::halfvec({int(state[1])}) <=> %s::halfvec({int(state[1])}) LIMIT 4", (qvec,)
        ).fetchall()
    assert len(plain) < 4


def test_filters_metadata_type_chunk_type_and_dates(indexed, conn, embedder) -> None:  # type: ignore[no-untyped-def]
    s = Searcher(indexed, conn, embedder)
    east = s.search("合同", k=20, filters={"region": "East"})
    assert east and {h.source for h in east} == {"docs/contract-terms.md"}
    assert {h.source for h in s.search("合同", k=20, filters={"year": "2024"})} == {"docs/contract-terms.md"}
    assert s.search("合同", k=20, filters={"year": "2023"}) == []
    assert {h.source for h in s.search("Normans", k=20, filters={"type": "md", "lang": "latin"})} <= {
        "en/Normans.md", "en/Super_Bowl_50.md"}
    assert all(h.source.startswith("zh/") for h in s.search("游戏", k=20, filters={"lang": "zh", "glob": "zh/*.txt"}))
    assert s.search("Normans", k=5, filters={"modified_before": "2000-01-01"}) == []
    assert s.search("Normans", k=5, filters={"modified_after": "2000-01-01"})
    with pytest.raises(CorpusyncError, match="bad date"):
        s.search("Normans", filters={"modified_after": "yesterday-ish"})


def test_results_only_from_the_requested_generation(own_index, embedder, corpus: Path) -> None:  # type: ignore[no-untyped-def]
    from corpusync.store.db import open_database
    from flows.refresh import refresh

    (corpus / "zh/DEV_1.txt").write_text("全新的文档内容：量子计算机的纠错码。", encoding="utf-8")
    assert refresh(str(corpus), settings=own_index)["generation"] == 2
    with open_database(own_index) as conn:
        _generations_apart(Searcher(own_index, conn, embedder))


def _generations_apart(s: Searcher) -> None:
    new = s.search("量子计算机 纠错码", k=50, mode="lexical", generation=2)
    old = s.search("量子计算机 纠错码", k=50, mode="lexical", generation=1)
    assert any("量子计算机" in h.text for h in new) and not any("量子计算机" in h.text for h in old)
    both = [s.search("战国无双 量子计算机", k=50, mode=m, generation=g) for m in ("lexical", "hybrid") for g in (1, 2)]
    assert [{h.generation for h in hits} for hits in both] == [{1}, {2}, {1}, {2}]


def test_a_search_says_what_it_applied(indexed, conn, embedder) -> None:  # type: ignore[no-untyped-def]
    """The generation read, the fusion ranked by (the dense weight after coverage scaling), the channels that
    ran: what the CLI's note and the service's response report, from the search itself."""
    s = Searcher(indexed, conn, embedder)
    en = s.run("Which NFL team won Super Bowl?", k=5).applied
    assert (en.generation, en.mode, en.channels, en.dense_coverage) == (1, "hybrid", ("dense", "lexical"), 1.0)
    assert en.fusion is not None
    assert en.fusion.as_dict() == {"method": "rrf", "weights": {"dense": 1.0, "lexical": 1.0, "sparse": 1.0},
                                   "rrf_k": 60.0}
    mixed = s.run("合同 HT2023-0876 付款方式", k=5)  # the English model reads 2 of its 5 words (ht2023, 0876)
    assert mixed.applied.dense_coverage == pytest.approx(0.4)
    assert mixed.applied.fusion is not None and "dense" in mixed.applied.channels
    assert mixed.applied.fusion.weights["dense"] == pytest.approx(0.4)
    zh = s.run("付款方式是什么", k=5)  # none of it: ranked by the lexical channel alone
    assert zh.applied.dense_coverage == 0 and zh.applied.channels == ("lexical",)
    assert zh.hits and all(h.dense_rank is None for h in zh.hits)
    lexical = s.run("Normans", k=5, mode="lexical").applied
    assert lexical.channels == ("lexical",) and lexical.dense_coverage is None
    assert lexical.fusion is None  # one channel: its own ranking, nothing fused
    given = s.run("付款方式是什么", k=5, fusion=Fusion()).applied  # a fusion given is used as is
    assert given.dense_coverage is None and given.channels == ("dense", "lexical")
    none = s.run("Normans", k=0)
    assert none.hits == [] and none.applied.generation == 1


def test_sql_functions_match_the_python_api(indexed, conn, embedder) -> None:  # type: ignore[no-untyped-def]
    s = Searcher(indexed, conn, embedder)
    question = "合同编号 HT2023-0876 的付款方式是什么？"
    result = s.run(question, k=5)
    py = result.hits
    segmented = Analyzer.from_settings(indexed).query(question).sql_text()
    qvec = HalfVector(embedder.embed([question]).dense[0])
    # the Python API scales the dense weight by how much of the query the model reads; SQL takes it as given
    assert result.applied.fusion is not None
    w_dense = result.applied.fusion.weights["dense"]
    assert w_dense == pytest.approx(s.dense_coverage(question)) and 0 < w_dense < 1
    rows = conn.execute("SELECT chunk_id, source FROM corpusync.search_hybrid(%s, %s, NULL, 5, '{}', NULL, %s)",
                        (segmented, qvec, w_dense)).fetchall()
    assert [r[0] for r in rows] == ids(py)
    text_rows = conn.execute("SELECT chunk_id FROM corpusync.search_text(%s, 5, %s)",
                             (segmented, json.dumps({"type": "md"}))).fetchall()
    assert [r[0] for r in text_rows] == ids(s.search(question, k=5, mode="lexical", filters={"type": "md"}))


def test_injection_attempts_in_filters_are_harmless(indexed, conn, embedder) -> None:  # type: ignore[no-untyped-def]
    s = Searcher(indexed, conn, embedder)
    before = conn.execute("SELECT count(*) FROM corpusync.chunks").fetchone()[0]
    evil = {"path": "'; DROP TABLE corpusync.chunks; --", "glob": "%' OR 1=1 --",
            "x') OR true; --": "1", "type": "md' OR '1'='1"}
    assert s.search("Normans", k=5, filters=evil) == []
    assert conn.execute("SELECT count(*) FROM corpusync.chunks").fetchone()[0] == before
    assert build_filter({"glob": "a/**/*.pdf", "year": "2024", "ok": "true", "name": "x"}) == {
        "glob": "a/*/*.pdf", "metadata": {"year": 2024, "ok": True, "name": "x"}}
    with pytest.raises(psycopg.errors.RaiseException, match="unknown filter key"), conn.transaction():
        conn.execute("""SELECT * FROM corpusync.search_text('x', 5, '{"pth": "a"}')""")


def test_rerank_without_a_reranker_is_skipped_with_a_warning(indexed, conn, embedder, caplog) -> None:  # type: ignore[no-untyped-def]
    s = Searcher(indexed, conn, embedder)
    with caplog.at_level(logging.WARNING, logger="corpusync.query"), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        hits = s.search("Normans", k=3, rerank=True)
    assert "rerank skipped" in caplog.text and len(hits) == 3 and hits[0].rerank_score is None
    # outside a flow run the record goes to the console only: no Prefect warning that it could not reach the API
    assert not [w for w in seen if "flow run id" in str(w.message)], [str(w.message) for w in seen]


@pytest.mark.db
def test_an_index_build_out_of_shared_memory_is_done_again_serially(empty_conn: Any, monkeypatch: Any,
                                                                      caplog: Any) -> None:
    """A parallel HNSW build whose shared-memory segment does not fit (a container's 64 MB /dev/shm: PostgreSQL
    raises 'could not resize shared memory segment', SQLSTATE 53100) is built again with no parallel workers
    (fault injected: the first build attempt fails as the server would)."""
    import psycopg

    from corpusync.adapters.embedding import ModelIdentity
    from corpusync.store import versions

    identity = ModelIdentity("m", "r1", None, 4, "cls", True, False, None, 512)
    mid = versions.register_model(empty_conn, identity)
    tried: list[int | None] = []
    build = versions._build_index

    def out_of_shm(conn: Any, *args: Any, workers: int | None, **kwargs: Any) -> None:
        tried.append(workers)
        if workers != 0:
            raise psycopg.errors.DiskFull('could not resize shared memory segment "/PostgreSQL.1" to 1073741824 '
                                          "bytes: No space left on device")
        build(conn, *args, workers=workers, **kwargs)

    monkeypatch.setattr(versions, "_build_index", out_of_shm)
    assert versions.index_model(empty_conn, mid, identity, memory="64MB", workers=3) == [f"chunks_dense_m{mid}"]
    assert tried == [3, 0]
    assert empty_conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"corpusync.chunks_dense_m{mid}",)).fetchone()[0]
    assert "building it serially" in caplog.text


@pytest.mark.db
def test_sparse_channel_in_sql(empty_conn: Any) -> None:
    """The sparse channel of corpusync.search_hybrid (BGE-M3 weights are not available offline here, so the
    rows are written directly: a 4-d dense + 16-d sparse model, three chunks with known inner products)."""
    conn = empty_conn
    from pgvector import SparseVector

    from corpusync.adapters.embedding import ModelIdentity
    from corpusync.store.versions import index_model, register_model

    identity = ModelIdentity("bge-m3-shaped", "r1", None, 4, "cls", True, True, 16, 512)
    mid = register_model(conn, identity)
    names = [f"chunks_dense_m{mid}", f"chunks_sparse_m{mid}"]

    def indexes() -> list[str]:
        return sorted(r[0] for r in conn.execute(
            "SELECT indexname FROM pg_indexes WHERE indexname = ANY(%s)", (names,)).fetchall())

    assert indexes() == []  # built once the model's first build is loaded, not when it is registered
    memory = conn.execute("SHOW maintenance_work_mem").fetchone()[0]
    assert index_model(conn, mid, identity, memory="96MB", workers=1) == names
    assert indexes() == names
    assert conn.execute("SHOW maintenance_work_mem").fetchone()[0] == memory  # set for the build only
    assert index_model(conn, mid, identity, memory="96MB", workers=None) == []  # there: nothing to do
    run = conn.execute("INSERT INTO corpusync.runs (kind) VALUES ('refresh') RETURNING id").fetchone()[0]
    conn.execute("INSERT INTO corpusync.generations (generation, run_id, model_id, status) VALUES (1, %s, %s, "
                 "'published')", (run, mid))
    conn.execute("UPDATE corpusync.index_state SET published_generation = 1, model_id = %s", (mid,))
    weights = {"a.md": {1: 0.9, 5: 0.1}, "b.md": {1: 0.3, 7: 0.8}, "c.md": {9: 1.0}}
    for path, sparse in weights.items():
        doc = conn.execute("INSERT INTO corpusync.documents (path) VALUES (%s) RETURNING id", (path,)).fetchone()[0]
        ver = conn.execute(
            "INSERT INTO corpusync.document_versions (document_id, content_sha256, size_bytes, source_path, "
            "parser, pipeline_fingerprint, model_id, run_id, gen_from) VALUES (%s, %s, 1, %s, 'text', 'fp', %s, %s, 1) "
            "RETURNING id", (doc, path, path, mid, run)).fetchone()[0]
        conn.execute(
            "INSERT INTO corpusync.chunks (version_id, document_id, ordinal, chunk_key, text, text_sha256, "
            "token_count, char_start, char_end, model_id, dense, sparse, search_text, run_id, gen_from) VALUES "
            "(%s, %s, 0, %s, %s, %s, 3, 0, 3, %s, %s, %s, %s, %s, 1)",
            (ver, doc, path, f"text of {path}", path, mid, HalfVector([1, 0, 0, 0]), SparseVector(sparse, 16),
             "text", run))
    q = SparseVector({1: 1.0, 7: 0.5}, 16)  # inner products: a 0.9, b 0.7, c 0
    rows = conn.execute("SELECT source, sparse_rank, round(sparse_score::numeric, 3), dense_rank FROM "
                        "corpusync.search_hybrid('', NULL, %s, 3, '{}', NULL, 0, 0, 1)", (q,)).fetchall()
    assert [(r[0], r[1], float(r[2])) for r in rows[:2]] == [("a.md", 1, 0.9), ("b.md", 2, 0.7)]
    assert all(r[3] is None for r in rows)  # dense channel off
    filtered = conn.execute("SELECT source FROM corpusync.search_hybrid('', NULL, %s, 3, %s::jsonb, NULL, 0, 0, 1)",
                            (q, '{"path": "b"}')).fetchall()
    assert filtered == [("b.md",)]
