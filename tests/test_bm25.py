"""The lexical channel is Okapi BM25 computed in PostgreSQL: on a fixed corpus its ranking and scores equal
the `bm25s` reference over the same token lists, per generation queried; the query syntax (-term,
"phrase") works the same from Python and SQL; postings follow their versions in and out."""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from corpusync.core.lexical import Analyzer
from query.search import Searcher
from tests.conftest import make_settings, new_database

pytestmark = [pytest.mark.flow, pytest.mark.db]

SAMPLE = Path(__file__).resolve().parent.parent / "examples" / "sample-corpus"
QUERIES = [
    "合同编号 HT2023-0876 的付款方式是什么？",
    "Which NFL team won Super Bowl 50?",
    "Normans Normandy Rollo",
    "付款 违约责任 合同",
    "臺灣銀行總行位於哪個城市？",
    "the",
    "Denver Broncos Carolina Panthers Levi's Stadium",
    "范廷颂 主教",
    "不存在的词语 xyzzy",
]


def index_sample(settings: Any, folder: Path, *leave_out: str) -> tuple[Any, Path]:
    """The sample corpus copied (but the `leave_out` patterns) and indexed."""
    from flows.refresh import refresh

    corpus = folder / "sample"
    shutil.copytree(SAMPLE, corpus, ignore=shutil.ignore_patterns(*leave_out))
    summary = refresh(str(corpus), settings=settings)
    assert summary["published"]
    return settings, corpus


@pytest.fixture(scope="module")
def shared_sample(prefect_harness, pg_server: str, template_db: str,  # type: ignore[no-untyped-def]
                  tmp_path_factory: pytest.TempPathFactory, embedder) -> Iterator[tuple[Any, Path]]:
    """The sample indexed once for the tests that only read it (its OCR and embedding are most of a test)."""
    folder = tmp_path_factory.mktemp("bm25-sample")
    with new_database(pg_server, template_db) as url:
        yield index_sample(make_settings(folder / "home", url), folder)


@pytest.fixture
def sample(shared_sample: tuple[Any, Path]) -> tuple[Any, Path]:
    return shared_sample


@pytest.fixture
def settings(shared_sample: tuple[Any, Path]) -> Any:
    """conftest's `conn` opens the shared index."""
    return shared_sample[0]


@pytest.fixture
def own_sample(prefect_harness, db_url: str, tmp_path: Path, embedder) -> tuple[Any, Path]:  # type: ignore[no-untyped-def]
    """The sample indexed for one test that changes it; its PDFs (a 14-page paper and an OCRed scan, most of
    the indexing time) are left out: that test's query and changes are about the text files."""
    return index_sample(make_settings(tmp_path / "home", db_url), tmp_path, "*.pdf")


def live_chunks(conn: Any, generation: int) -> list[tuple[int, str]]:
    return conn.execute("SELECT chunk_id, c.search_text FROM corpusync.chunks_at(%s) a "
                        "JOIN corpusync.chunks c ON c.id = a.chunk_id ORDER BY chunk_id", (generation,)).fetchall()


def reference(conn: Any, analyzer: Analyzer, generation: int, k1: float, b: float) -> tuple[list[int], Any]:
    """bm25s (Lucene variant, as ours) over the analyzer's tokens of every chunk of the generation."""
    import bm25s

    rows = live_chunks(conn, generation)
    tokens = [analyzer.tokens(text) for _, text in rows]
    vocab = {t: i for i, t in enumerate(sorted({t for doc in tokens for t in doc}))}
    retriever = bm25s.BM25(k1=k1, b=b, method="lucene")
    retriever.index(bm25s.tokenization.Tokenized(ids=[[vocab[t] for t in doc] for doc in tokens], vocab=vocab),
                    show_progress=False)
    return [cid for cid, _ in rows], (retriever, vocab)


def ref_scores(ref: Any, terms: list[str]) -> np.ndarray:
    retriever, vocab = ref
    known = [t for t in terms if t in vocab]
    if not known:
        return np.zeros(retriever.scores["num_docs"], np.float64)
    return np.asarray(retriever.get_scores([vocab[t] for t in known]), np.float64)


def assert_same_ranking(hits: list[Any], ids: list[int], scores: np.ndarray, k: int = 10) -> None:
    """Top-k equal to the reference's, ties aside: the same score at every rank, and every hit's score is
    the reference's score of that chunk."""
    order = sorted(range(len(ids)), key=lambda i: (-scores[i], ids[i]))
    expected = [scores[i] for i in order if scores[i] > 0][:k]
    got = {ids[i]: scores[i] for i in range(len(ids))}
    assert [h.lexical_score for h in hits] == pytest.approx(expected, rel=1e-5, abs=1e-7)
    for h in hits:
        assert h.lexical_score == pytest.approx(got[h.chunk_id], rel=1e-5, abs=1e-7)
    # where the score at the cut-off is not tied, the sets are identical
    if len(expected) == k and len(order) > k and scores[order[k]] < expected[-1] * (1 - 1e-5):
        assert {h.chunk_id for h in hits} == {ids[i] for i in order[:k]}


def test_lexical_ranking_equals_bm25s(sample, conn, embedder) -> None:  # type: ignore[no-untyped-def]
    settings, _ = sample
    s = Searcher(settings, conn, embedder)
    analyzer = Analyzer.from_settings(settings)
    ids, ref = reference(conn, analyzer, s.published_generation(), settings.bm25_k1, settings.bm25_b)
    matched = 0
    for q in QUERIES:
        hits = s.search(q, k=10, mode="lexical")
        scores = ref_scores(ref, analyzer.query(q).terms)
        assert_same_ranking(hits, ids, scores)
        matched += bool(hits)
    assert matched >= len(QUERIES) - 2  # most queries match something: the comparison is not vacuous
    # other k1 / b reach SQL too
    tuned = settings.model_copy(update={"bm25_k1": 0.9, "bm25_b": 0.4})
    ids, ref = reference(conn, analyzer, s.published_generation(), 0.9, 0.4)
    q = QUERIES[0]
    assert_same_ranking(Searcher(tuned, conn, embedder).search(q, k=10, mode="lexical"), ids,
                        ref_scores(ref, analyzer.query(q).terms))


def test_postings_hold_the_analyzers_term_counts(sample, conn) -> None:  # type: ignore[no-untyped-def]
    settings, _ = sample
    analyzer = Analyzer.from_settings(settings)
    rows = conn.execute(
        "SELECT c.id, c.search_text, coalesce(array_agg(l.term ORDER BY l.term) FILTER (WHERE l.term IS NOT NULL), "
        "'{}'), coalesce(array_agg(p.tf ORDER BY l.term) FILTER (WHERE l.term IS NOT NULL), '{}'), max(p.dl) "
        "FROM corpusync.chunks c LEFT JOIN corpusync.postings p ON p.version_id = c.version_id "
        "AND p.ordinal = c.ordinal LEFT JOIN corpusync.lexicon l ON l.id = p.term_id GROUP BY c.id").fetchall()
    assert rows
    for _, text, terms, tfs, dl in rows:
        counts = Counter(analyzer.tokens(text))
        assert dict(zip(terms, tfs, strict=True)) == dict(counts)
        assert (dl or 0) == sum(counts.values())
    total = conn.execute("SELECT sum(lexical_tokens) FROM corpusync.document_versions").fetchone()[0]
    assert total == sum(sum(Counter(analyzer.tokens(t)).values()) for _, t, *_ in rows)


def test_statistics_come_from_the_generation_queried(own_sample, embedder) -> None:  # type: ignore[no-untyped-def]
    from corpusync.store.db import open_database
    from corpusync.store.generations import prune
    from flows.refresh import refresh

    settings, corpus = own_sample
    for f in sorted(corpus.rglob("*.md"))[:2]:
        f.unlink()
    (corpus / "new-note.md").write_text("# 付款说明\n\n付款方式为银行转账，付款期限为三十日。\n", encoding="utf-8")
    assert refresh(str(corpus), settings=settings, allow_mass_delete=True)["generation"] == 2
    with open_database(settings) as conn:
        s = Searcher(settings, conn, embedder)
        analyzer = Analyzer.from_settings(settings)
        q = "付款方式 付款期限 Normans"
        for gen in (1, 2):
            ids, ref = reference(conn, analyzer, gen, settings.bm25_k1, settings.bm25_b)
            assert_same_ranking(s.search(q, k=10, mode="lexical", generation=gen), ids,
                                ref_scores(ref, analyzer.query(q).terms))
        # prune removes the postings of versions no retained generation shows, with them
        prune(conn, 0)
        orphans = conn.execute("SELECT count(*) FROM corpusync.postings p WHERE NOT EXISTS "
                               "(SELECT 1 FROM corpusync.document_versions v WHERE v.id = p.version_id)").fetchone()[0]
        assert orphans == 0


def indexed_text(conn: Any, hit: Any) -> str:
    return conn.execute("SELECT search_text FROM corpusync.chunks WHERE id = %s", (hit.chunk_id,)).fetchone()[0]


def test_exclusion_and_phrase_syntax_in_python_and_sql(sample, conn, embedder) -> None:  # type: ignore[no-untyped-def]
    settings, _ = sample
    s = Searcher(settings, conn, embedder)
    base = s.search("Super Bowl Broncos", k=20, mode="lexical")
    assert any("Panthers" in h.text for h in base)
    without = s.search("Super Bowl Broncos -Panthers", k=20, mode="lexical")
    assert without and not any("panthers" in h.text.lower() for h in without)
    # a phrase must appear in what the index holds: the chunk's breadcrumb and text, normalised
    phrase = s.search('"Levi\'s Stadium" Super Bowl', k=20, mode="lexical")
    assert phrase and all("levi's stadium" in indexed_text(conn, h) for h in phrase)
    assert len(phrase) < len(base) or len(base) < 20
    zh = s.search('"付款方式" 合同', k=20, mode="lexical")
    assert zh and all("付款方式" in indexed_text(conn, h) for h in zh)
    # the same syntax in SQL (segmented, as `corpusync segment` prints it)
    sql_text = Analyzer.from_settings(settings).query("Super Bowl Broncos -Panthers").sql_text()
    rows = conn.execute("SELECT chunk_id FROM corpusync.search_text(%s, 20)", (sql_text,)).fetchall()
    assert [r[0] for r in rows] == [h.chunk_id for h in without]
    rows = conn.execute("""SELECT c.search_text FROM corpusync.search_text('bowl "super bowl 50" -"carolina panthers"',
                           20) h JOIN corpusync.chunks c ON c.id = h.chunk_id""").fetchall()
    assert rows and all("super bowl 50" in t and "carolina panthers" not in t for (t,) in rows)
    # a query of phrases only, typed in SQL: the phrases' words find the candidates
    rows = conn.execute("""SELECT c.search_text FROM corpusync.search_text('"super bowl 50"', 20) h
                           JOIN corpusync.chunks c ON c.id = h.chunk_id""").fetchall()
    assert rows and all("super bowl 50" in t for (t,) in rows)
    # the syntax holds in every channel of a hybrid query, the dense one too
    for mode in ("hybrid", "dense"):
        hits = s.search("Super Bowl Broncos -Panthers", k=10, mode=mode)
        assert hits and not any("panthers" in indexed_text(conn, h) for h in hits), mode
        hits = s.search('"Levi\'s Stadium" Super Bowl', k=10, mode=mode)
        assert hits and all("levi's stadium" in indexed_text(conn, h) for h in hits), mode


def test_query_syntax_and_segment_on_the_cli(sample, conn, capsys, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    import json

    from corpusync.cli import main

    settings, _ = sample
    monkeypatch.setenv("CORPUSYNC_HOME", str(settings.home))
    monkeypatch.setenv("CORPUSYNC_DATABASE_URL", settings.database_dsn() or "")
    monkeypatch.setenv("CORPUSYNC_CHUNK_MAX_TOKENS", str(settings.chunk_max_tokens))
    assert main(["query", "Super Bowl Broncos", "--mode", "lexical", "-k", "20", "--json"]) == 0
    base = json.loads(capsys.readouterr().out)
    assert any("panthers" in h["text"].lower() for h in base)
    assert main(["query", "Super Bowl Broncos -Panthers", "--mode", "lexical", "-k", "20", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)
    assert hits and not any("panthers" in h["text"].lower() for h in hits)
    assert main(["query", '"付款方式" 合同', "--mode", "lexical", "-k", "20", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)
    assert hits and all("付款方式" in indexed_text(conn, SimpleNamespace(chunk_id=h["chunk_id"])) for h in hits)
    # fewer hits than asked: the table says why (a Chinese question's “” make a required phrase)
    assert main(["query", "“付款方式”是什么", "-k", "20"]) == 0
    out, err = capsys.readouterr()
    assert "付款方式" in out and f"{len(hits)} of 20 hits: each must contain \"付款方式\"" in err
    # and that the English test model does not vote on a Chinese question (its card names English)
    assert ("dense weight x0.00: sentence-transformers/all-MiniLM-L6-v2 reads 0% of the query's words (its card "
            "names en); ranked by the other channels") in err
    assert main(["query", "Super Bowl -Panthers", "-k", "5", "-f", "year>=2999"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "no hits"
    assert "0 of 5 hits: chunks holding panthers are left out; filtered by year>=2999" in err
    assert main(["query", "Super Bowl", "-k", "3"]) == 0
    assert capsys.readouterr().err == ""  # as many as asked: no note
    # a query the model reads in part: the note says by how much, unless the fusion gives dense no weight
    assert main(["query", "合同 HT2023-0876 付款方式", "-k", "3"]) == 0
    assert "dense weight x0.40: sentence-transformers/all-MiniLM-L6-v2 reads 40% of" in capsys.readouterr().err
    monkeypatch.setenv("CORPUSYNC_RRF_WEIGHTS", '{"dense": 0}')
    assert main(["query", "合同 HT2023-0876 付款方式", "-k", "3"]) == 0
    assert capsys.readouterr().err == ""
    monkeypatch.delenv("CORPUSYNC_RRF_WEIGHTS")
    # an absurd k is a clear error (exit 2), not an unhandled hnsw.ef_search failure
    assert main(["query", "Super Bowl", "-k", "99999999999"]) == 2
    assert "more than 10000 hits" in capsys.readouterr().err
    # segment prints what SQL takes: Traditional folded, syntax kept
    assert main(["segment", '臺灣銀行 "不可抗力" -草案']) == 0
    out = capsys.readouterr().out.strip()
    assert '"不可抗力"' in out and "-草案" in out and "台湾" in out
