"""The evaluation gate end to end (real Prefect flows, embedded PostgreSQL, MiniLM): a harmless change
passes (gold documents renamed included: their references follow the renames), a scrambled-text parser is
refused before publishing (previous generation stays live, exit code 1), the override publishes and is
recorded, and `corpusync eval --gate` catches the regression too."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from corpusync.cli import main
from corpusync.store.evaluations import lineage_renames
from tests.conftest import SAMPLE, goldset_for
from tests.faults import scramble_parses

pytestmark = [pytest.mark.flow, pytest.mark.db]


@pytest.fixture
def goldset(corpus: Path, tmp_path: Path) -> Path:
    """The demo gold set restricted to the documents of the test corpus (20 questions)."""
    return goldset_for(corpus, tmp_path / "gold.jsonl")


@pytest.fixture
def env(settings: Any, goldset: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Point the CLI at the test database and gold set (the CLI builds its own Settings from the env)."""
    monkeypatch.setenv("CORPUSYNC_HOME", str(settings.home))
    monkeypatch.setenv("CORPUSYNC_DATABASE_URL", settings.database_dsn())
    monkeypatch.setenv("CORPUSYNC_CHUNK_MAX_TOKENS", str(settings.chunk_max_tokens))
    monkeypatch.setenv("CORPUSYNC_GOLDSETS", json.dumps([str(goldset)]))
    monkeypatch.setenv("CORPUSYNC_PARSE_ISOLATION", "false")  # the fault is injected in this process
    return settings


def _state(conn: Any) -> tuple[int, list[tuple[int, str]]]:
    pub = conn.execute("SELECT published_generation FROM corpusync.index_state").fetchone()[0]
    gens = conn.execute("SELECT generation, status FROM corpusync.generations ORDER BY generation").fetchall()
    return pub, gens


def test_gate_passes_harmless_change_and_refuses_broken_candidate(
        prefect_harness, lingering_model, env, corpus: Path, conn, monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # type: ignore[no-untyped-def]
    # generation 1: no baseline yet -> evaluated (floors only) and published
    assert main(["refresh", str(corpus), "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    (ev1,) = first["evaluation"]
    assert ev1["passed"] is True and ev1["baseline_generation"] is None
    assert ev1["metrics"]["hybrid"]["recall@10"] >= 0.9  # the index answers its gold set
    assert ev1["ragas"]["id_based_context_recall"] > 0.5  # RAGAS non-LLM metrics ran offline

    # generation 2: an unrelated document added, and two gold documents renamed (neither findable by its old
    # name or its trailing segments): the gate compares with generation 1 and passes. Their references follow
    # the renames; before, both were misses and the gate refused this refresh (exit 1)
    shutil.copy(SAMPLE / "en" / "Amazon_rainforest.md", corpus / "en" / "Amazon_rainforest.md")
    (corpus / "archive").mkdir()
    (corpus / "en" / "Normans.md").rename(corpus / "archive" / "normans-2016.md")
    (corpus / "zh" / "DEV_0.txt").rename(corpus / "archive" / "cmrc-0.txt")
    assert main(["refresh", str(corpus), "--json"]) == 0
    second = json.loads(capsys.readouterr().out)
    (ev2,) = second["evaluation"]
    assert second["published"] and ev2["passed"] is True and ev2["baseline_generation"] == 1
    assert second["documents"]["renamed"] == 2 and ev2["missing_questions"] == 0
    assert all(c["n_paired"] == 20 for c in ev2["checks"])
    (note,) = [n for n in ev2["notes"] if "renamed or moved" in n]
    assert note.startswith("2 gold document reference(s)") and "en/Normans.md -> archive/normans-2016.md" in note
    assert "renamed or moved" in Path(ev2["report"]).read_text()

    hits_before = main(["query", "Which NFL team won Super Bowl 50?", "--json"])
    assert hits_before == 0
    before = json.loads(capsys.readouterr().out)

    # generation 3: a scrambling parser re-parses everything -> refused, exit 1, generation 2 stays live (it
    # also moves a renamed gold document on: a refused candidate's renames are no later generation's history)
    (corpus / "old").mkdir()
    (corpus / "archive" / "normans-2016.md").rename(corpus / "old" / "n.md")
    scramble_parses(monkeypatch)
    assert main(["refresh", str(corpus)]) == 1
    err = capsys.readouterr().err
    assert "not published: retrieval regressed" in err and "Generation 2 stays live" in err
    pub, gens = _state(conn)
    assert pub == 2 and gens[-1] == (3, "refused")
    run = conn.execute("SELECT status, counts FROM corpusync.runs ORDER BY id DESC LIMIT 1").fetchone()
    assert run[0] == "refused" and run[1]["evaluation"][0]["passed"] is False
    failed = [c for c in run[1]["evaluation"][0]["checks"] if not c["passed"]]
    assert failed and all(c["ci_high"] < 0 for c in failed)
    assert main(["query", "Which NFL team won Super Bowl 50?", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == before  # readers still see generation 2, unchanged
    report = Path(run[1]["evaluation"][0]["report"]).read_text()
    assert "FAIL" in report and "Worst-regressed questions" in report
    assert lineage_renames(conn, 4) == [("en/Normans.md", "archive/normans-2016.md"),
                                        ("zh/DEV_0.txt", "archive/cmrc-0.txt")]

    # the override publishes and is recorded
    assert main(["refresh", str(corpus), "--skip-gate", "--json"]) == 0
    forced = json.loads(capsys.readouterr().out)
    assert forced["published"] and forced["generation"] == 4 and "overridden" in forced["message"]
    row = conn.execute("SELECT passed, overridden FROM corpusync.evaluations WHERE generation = 4").fetchone()
    assert row == (False, True)
    # the move found again and published: Normans.md's references follow generation 2's rename and then 4's
    assert forced["evaluation"][0]["missing_questions"] == 0
    assert conn.execute("SELECT generation, from_path, to_path FROM corpusync.document_renames "
                        "ORDER BY generation, from_path").fetchall() == [
        (2, "en/Normans.md", "archive/normans-2016.md"), (2, "zh/DEV_0.txt", "archive/cmrc-0.txt"),
        (3, "archive/normans-2016.md", "old/n.md"), (4, "archive/normans-2016.md", "old/n.md")]

    # standalone: `corpusync eval --gate` on the (broken) live generation vs the last published baseline
    assert main(["eval", "--gate", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out[0]["generation"] == 4 and out[0]["baseline_generation"] == 2 and out[0]["passed"] is False
    # the history is queryable by analysts
    n = conn.execute("SELECT count(DISTINCT generation) FROM corpusync.eval_results "
                     "WHERE metric = 'recall@5' AND mode = 'hybrid'").fetchone()[0]
    assert n == 4
    assert (Path(env.home) / "reports").glob("history-*.svg")


def test_eval_errors_exit_2(prefect_harness, env, corpus: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["eval"]) == 2  # empty index
    assert "empty" in capsys.readouterr().err
    assert main(["refresh", str(corpus), "-q"]) == 0
    assert main(["eval", "--goldset", "no/such/goldset.jsonl"]) == 2
    assert "not found" in capsys.readouterr().err
    monkeypatch.setenv("CORPUSYNC_GOLDSETS", "[]")
    assert main(["eval"]) == 2
    assert "no gold set" in capsys.readouterr().err

