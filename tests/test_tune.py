"""`corpusync tune`: fusion fitted on a gold set by cross-validation is stored with the index, reported, and
then applied by the Python API and by search_hybrid in SQL (NULL weights) alike; the simulation it fits on
predicts exactly what SQL returns."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pgvector import HalfVector

from evaluation.fusion import Fusion, fuse
from evaluation.goldsets import load_goldset
from query.search import Searcher
from tests.conftest import make_settings, new_database

pytestmark = [pytest.mark.flow, pytest.mark.db]

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def sample(prefect_harness, pg_server: str, template_db: str,  # type: ignore[no-untyped-def]
           tmp_path_factory: pytest.TempPathFactory, embedder) -> Iterator[Any]:
    """The sample indexed once for the module (its OCR and embedding are most of a test): each test adds only
    fusions and a refused generation, which the other test does not read."""
    from flows.refresh import refresh

    folder = tmp_path_factory.mktemp("tune-sample")
    corpus = folder / "sample"
    shutil.copytree(REPO / "examples" / "sample-corpus", corpus)
    with new_database(pg_server, template_db) as url:
        settings = make_settings(folder / "home", url)
        assert refresh(str(corpus), settings=settings)["published"]
        yield settings


@pytest.fixture
def settings(sample: Any) -> Any:
    """conftest's `conn` opens the module's index."""
    return sample


def test_tune_stores_reports_and_applies_the_fusion(sample, conn, embedder) -> None:  # type: ignore[no-untyped-def]
    from corpusync.app.tuning import collect, tune_fusion
    from tasks.tune import describe

    settings = sample
    gs = load_goldset(REPO / "examples" / "goldset.jsonl")
    searcher = Searcher(settings, conn, embedder)
    gen = searcher.published_generation()
    # the candidates it fits on reproduce SQL's ranking for any fusion (here: a lexical-heavy one)
    questions = collect(settings, conn, searcher, gs, gen)
    probe = Fusion(weights={"dense": 0.5, "lexical": 2.0, "sparse": 0.0}, rrf_k=10)
    vectors = embedder.embed([q.question for q in gs.questions]).dense
    pinned = Searcher(settings.model_copy(update={"rrf_weights": probe.weights, "rrf_k": probe.rrf_k}), conn,
                      embedder)
    for i, (q, gq) in enumerate(list(zip(questions, gs.questions, strict=True))[:8]):
        hits = pinned.search(gq.question, k=10, query_vector=vectors[i])
        assert [h.chunk_id for h in hits] == fuse(q.candidates, probe, 10, q.scale)

    outcome = tune_fusion(settings, conn, searcher, [gs], gen, folds=3)
    text = describe(outcome)
    assert "held-out" in text and gs.name in text and f"fusion {outcome.stored_id}" in text
    row = conn.execute("SELECT model_id, method, weights, rrf_k, goldset, goldset_sha256, generation, folds, report "
                       "FROM corpusync.fusions WHERE id = %s", (outcome.stored_id,)).fetchone()
    best = outcome.result.best
    assert row[0] == searcher.index_model_id(gen) and row[1] == "rrf" and row[2] == best.weights
    assert row[3] == best.rrf_k and row[4] == gs.name and row[5] == gs.sha256 and (row[6], row[7]) == (gen, 3)
    assert row[8]["held_out"] == outcome.result.held_out and row[8]["per_goldset"][gs.name]["best"]
    # a stored fusion that differs from the default is what queries use from now on
    stored = Fusion("rrf", {"dense": 0.25, "lexical": 1.0, "sparse": 0.0}, 7.0)
    conn.execute("INSERT INTO corpusync.fusions (model_id, method, weights, rrf_k) VALUES (%s, 'rrf', %s, 7)",
                 (row[0], json.dumps(stored.weights)))
    conn.commit()
    q = "Which NFL team won Super Bowl 50?"
    fresh = Searcher(settings, conn, embedder)
    assert fresh.fusion(row[0], gen) == stored
    hits = fresh.search(q, k=10)
    cov = fresh.dense_coverage(q)
    for h in hits:
        expected = sum(w / (7 + r) for w, r in ((0.25 * cov, h.dense_rank), (1.0, h.lexical_rank)) if r is not None)
        assert h.score == pytest.approx(expected)
    # SQL with NULL weights reads the same stored fusion (the dense weight as the caller gives it)
    qvec = HalfVector(embedder.embed([q]).dense[0])
    rows = conn.execute("SELECT chunk_id, score FROM corpusync.search_hybrid(%s, %s, NULL, 10, '{}', NULL, %s)",
                        (fresh.analyzer.query(q).sql_text(), qvec, 0.25 * cov)).fetchall()
    assert [r[0] for r in rows] == [h.chunk_id for h in hits]
    # a fusion tuned on a candidate that the gate refused never comes into force
    run = conn.execute("SELECT max(id) FROM corpusync.runs").fetchone()[0]
    conn.execute("INSERT INTO corpusync.generations (generation, run_id, model_id, status) "
                 "VALUES (%s, %s, %s, 'refused')", (gen + 1, run, row[0]))
    conn.execute("INSERT INTO corpusync.fusions (model_id, method, weights, rrf_k, generation) "
                 "VALUES (%s, 'rrf', '{\"dense\": 3}', 9, %s)", (row[0], gen + 1))
    conn.commit()
    assert Searcher(settings, conn, embedder).fusion(row[0], gen) == stored
    assert Searcher(settings, conn, embedder).fusion(row[0], gen + 1) == stored
    assert [r[0] for r in conn.execute(
        "SELECT chunk_id FROM corpusync.search_hybrid(%s, %s, NULL, 10, '{}', NULL, %s)",
        (fresh.analyzer.query(q).sql_text(), qvec, 0.25 * cov)).fetchall()] == [h.chunk_id for h in hits]
    # explicit settings win over the stored fusion
    override = settings.model_copy(update={"rrf_weights": {"dense": 0.0}})
    assert all(h.dense_rank is None for h in Searcher(override, conn, embedder).search(q, k=10))


def test_tune_refuses_too_few_questions(sample, conn, embedder) -> None:  # type: ignore[no-untyped-def]
    from corpusync.app.tuning import tune_fusion
    from schemas.eval import GoldSet

    gs = load_goldset(REPO / "examples" / "goldset.jsonl")
    tiny = GoldSet(name=gs.name, source=gs.source, sha256=gs.sha256, questions=gs.questions[:2])
    s = Searcher(sample, conn, embedder)
    before = conn.execute("SELECT count(*) FROM corpusync.fusions").fetchone()[0]
    with pytest.raises(ValueError, match="at least 5 questions"):
        tune_fusion(sample, conn, s, [tiny], s.published_generation(), folds=5)
    assert conn.execute("SELECT count(*) FROM corpusync.fusions").fetchone()[0] == before  # nothing stored
