"""The query service (query/service.py) on the real embedded PostgreSQL + MiniLM after a real refresh:
health, search in every mode with citations, filters, the lexical syntax, errors as JSON, concurrent requests
over the connection pool, the serving role's URL."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from corpusync.core.errors import DatabaseError
from query.service import create_app

pytestmark = [pytest.mark.flow, pytest.mark.db]


@pytest.fixture
def indexed(prefect_harness, settings, corpus: Path, embedder) -> Any:
    from flows.refresh import refresh

    (corpus / "docs/contract-terms.md.meta.json").write_text(json.dumps({"region": "East", "year": 2024}))
    summary = refresh(str(corpus), settings=settings)
    assert summary["published"] and summary["documents"]["new"] == 6
    return settings


def search(client: TestClient, **body: Any) -> Any:
    return client.post("/search", json=body)


def test_health_search_modes_filters_syntax_and_errors(indexed, embedder) -> None:
    with TestClient(create_app(indexed, pool_size=2, embedder=embedder)) as client:
        health = client.get("/health")
        assert health.status_code == 200
        h = health.json()
        assert h["status"] == "ok" and h["database"] == "ok" and h["published_generation"] == 1
        assert h["model"] and "384-d" in h["model"] and h["query_model"] == embedder.identity.label

        r = search(client, query="HT2023-0876", k=3, mode="lexical")
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["mode"] == "lexical" and body["generation"] == 1 and body["took_ms"] >= 0
        assert body["channels"] == ["lexical"] and body["dense_coverage"] is None
        top = body["hits"][0]
        assert top["source"] == "docs/contract-terms.md" and "HT2023-0876" in top["text"]
        assert top["rank"] == 1 and top["lexical_rank"] == 1
        assert top["citation"].startswith("docs/contract-terms.md [") and top["citation"].endswith("]")
        assert f"[{top['char_start']}:{top['char_end']}]" in top["citation"]

        hybrid = search(client, query="Which NFL team won Super Bowl 50?", k=5).json()["hits"]  # default mode
        assert len(hybrid) == 5 and any(x["dense_rank"] and x["lexical_rank"] for x in hybrid)
        assert hybrid[0]["source"] == "en/Super_Bowl_50.md" and all(x["citation"] for x in hybrid)
        dense = search(client, query="Which NFL team won Super Bowl 50?", k=5, mode="dense").json()["hits"]
        assert [x["dense_rank"] for x in dense] == [1, 2, 3, 4, 5]

        east = search(client, query="合同", k=20, filters={"region": "East"}).json()["hits"]
        assert east and {x["source"] for x in east} == {"docs/contract-terms.md"}
        nothing = search(client, query="合同", k=20, filters={"year": 2023}).json()
        assert nothing["hits"] == [] and nothing["generation"] == 1  # the generation read, hits or none
        # what the hybrid ranking applied: the English test model reads none of a Chinese query
        assert nothing["dense_coverage"] == 0 and nothing["channels"] == ["lexical"]
        assert nothing["fusion"] == {"method": "rrf", "weights": {"dense": 0.0, "lexical": 1.0, "sparse": 1.0},
                                     "rrf_k": 60.0}
        one = search(client, query="游戏", k=20, mode="lexical", filters={"path": "zh/"}).json()
        assert one["fusion"] is None and one["channels"] == ["lexical"]  # one channel: nothing fused
        zh = one["hits"]
        assert zh and all(x["source"].startswith("zh/") for x in zh)

        base = search(client, query="Super Bowl", k=20, mode="lexical").json()["hits"]
        assert any("panthers" in x["text"].lower() for x in base)
        for mode in ("lexical", "hybrid"):
            without = search(client, query="Super Bowl -Panthers", k=20, mode=mode).json()["hits"]
            assert without and not any("panthers" in x["text"].lower() for x in without), mode

        bad = search(client, query="x", mode="fuzzy")
        assert bad.status_code == 400 and "unknown mode 'fuzzy'" in bad.json()["error"]
        assert "sparse retrieval needs" in search(client, query="x", mode="sparse").json()["error"]
        date = search(client, query="Normans", filters={"modified_after": "yesterday-ish"})
        assert date.status_code == 400 and "bad date" in date.json()["error"]
        gen = search(client, query="Normans", generation=99)
        assert gen.status_code == 400 and "generation 99 does not exist" in gen.json()["error"]
        malformed = client.post("/search", json={"query": "Normans", "k": "many"})
        assert malformed.status_code == 400 and malformed.json()["error"].startswith("bad request: k:")
        assert client.post("/search", json={"k": 3}).status_code == 400  # no query

        # more concurrent requests than connections: each borrows one, the others wait; same answers
        questions = ["HT2023-0876", "Super Bowl -Panthers", "付款方式", "Normans"] * 3
        expected = {q: [x["chunk_id"] for x in search(client, query=q, k=5).json()["hits"]] for q in set(questions)}
        with ThreadPoolExecutor(4) as ex:
            got = list(ex.map(lambda q: search(client, query=q, k=5), questions))
        assert all(r.status_code == 200 for r in got)
        assert [[x["chunk_id"] for x in r.json()["hits"]] for r in got] == [expected[q] for q in questions]
        assert client.app.state.pool._open <= 2  # type: ignore[attr-defined]


def test_empty_index_internal_errors_and_serving_role(settings, monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import SecretStr

    from query.search import Searcher

    # the embedder is loaded at startup from the settings; searches use serve_database_url when set
    serving = settings.model_copy(update={"serve_database_url": SecretStr(settings.database_dsn())})
    with TestClient(create_app(serving), raise_server_exceptions=False) as client:
        h = client.get("/health").json()
        assert h["status"] == "ok" and not h["published_generation"] and h["model"] is None
        assert "all-MiniLM-L6-v2" in h["query_model"]
        empty = search(client, query="Normans")
        assert empty.status_code == 400 and "the index is empty" in empty.json()["error"]

        def boom(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("secret internals")

        monkeypatch.setattr(Searcher, "run", boom)
        r = search(client, query="Normans")
        assert r.status_code == 500 and r.json() == {"error": "internal error"} and "secret" not in r.text
        assert client.get("/health").status_code == 200  # the connection went back to the pool

    unreachable = settings.model_copy(update={"serve_database_url": SecretStr("postgresql://nobody@127.0.0.1:1/x")})
    with pytest.raises(DatabaseError, match="cannot connect"), TestClient(create_app(unreachable)):
        pass
