"""The evaluation gate end to end (real Prefect flows, embedded PostgreSQL, MiniLM): a harmless change
passes, a scrambled-text parser is refused before publishing (previous generation stays live, exit code 1),
the override publishes and is recorded, and `corpusync eval --gate` catches the regression too."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from corpusync.cli import main
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

    # generation 2: an unrelated document added; the gate compares with generation 1 and passes
    shutil.copy(SAMPLE / "en" / "Amazon_rainforest.md", corpus / "en" / "Amazon_rainforest.md")
    assert main(["refresh", str(corpus), "--json"]) == 0
    second = json.loads(capsys.readouterr().out)
    (ev2,) = second["evaluation"]
    assert second["published"] and ev2["passed"] is True and ev2["baseline_generation"] == 1
    assert all(c["n_paired"] == 20 for c in ev2["checks"])

    hits_before = main(["query", "Which NFL team won Super Bowl 50?", "--json"])
    assert hits_before == 0
    before = json.loads(capsys.readouterr().out)

    # generation 3: a scrambling parser re-parses everything -> refused, exit 1, generation 2 stays live
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

    # the override publishes and is recorded
    assert main(["refresh", str(corpus), "--skip-gate", "--json"]) == 0
    forced = json.loads(capsys.readouterr().out)
    assert forced["published"] and forced["generation"] == 4 and "overridden" in forced["message"]
    row = conn.execute("SELECT passed, overridden FROM corpusync.evaluations WHERE generation = 4").fetchone()
    assert row == (False, True)

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


def test_a_renamed_gold_document_is_followed(  # type: ignore[no-untyped-def]
        prefect_harness, lingering_model, env, corpus: Path, conn, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Renaming or moving a gold document is not a miss: evaluation follows the renames of the generation's
    lineage. (It scored as an empty unit: recall fell, and the gate could refuse a refresh that changed no
    content.) A refused candidate's renames are no later generation's history."""
    from corpusync.store.evaluations import lineage_renames

    assert main(["refresh", str(corpus), "--json"]) == 0
    (ev1,) = json.loads(capsys.readouterr().out)["evaluation"]
    assert ev1["missing_questions"] == 0

    # generation 2: two gold documents renamed, neither findable by its old name (nor by its trailing segments)
    (corpus / "archive").mkdir()
    (corpus / "en" / "Normans.md").rename(corpus / "archive" / "normans-2016.md")
    (corpus / "zh" / "DEV_0.txt").rename(corpus / "archive" / "cmrc-0.txt")
    assert main(["refresh", str(corpus), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (ev2,) = out["evaluation"]
    assert out["published"] and out["documents"]["renamed"] == 2 and ev2["passed"]
    assert ev2["missing_questions"] == 0
    for metric in ("recall@5", "mrr@10"):
        assert ev2["metrics"]["hybrid"][metric] == pytest.approx(ev1["metrics"]["hybrid"][metric])
    (note,) = [n for n in ev2["notes"] if "renamed or moved" in n]
    assert note.startswith("2 gold document reference(s)") and "en/Normans.md -> archive/normans-2016.md" in note
    assert "renamed or moved" in Path(ev2["report"]).read_text()

    # generation 3: moved on again, followed through generation 2's rename and its own
    (corpus / "old").mkdir()
    (corpus / "archive" / "normans-2016.md").rename(corpus / "old" / "n.md")
    assert main(["refresh", str(corpus), "--json"]) == 0
    (ev3,) = json.loads(capsys.readouterr().out)["evaluation"]
    assert ev3["passed"] and ev3["missing_questions"] == 0
    assert conn.execute("SELECT generation, from_path, to_path FROM corpusync.document_renames "
                        "ORDER BY generation, from_path").fetchall() == [
        (2, "en/Normans.md", "archive/normans-2016.md"), (2, "zh/DEV_0.txt", "archive/cmrc-0.txt"),
        (3, "archive/normans-2016.md", "old/n.md")]

    # generation 4 moves it once more and is refused (a scrambling parser): the next candidate's lineage has
    # generations 2 and 3's renames, not generation 4's
    (corpus / "old" / "n.md").rename(corpus / "n.md")
    scramble_parses(monkeypatch)
    assert main(["refresh", str(corpus)]) == 1
    capsys.readouterr()
    assert conn.execute("SELECT status FROM corpusync.generations WHERE generation = 4").fetchone()[0] == "refused"
    assert (4, "old/n.md", "n.md") in conn.execute("SELECT generation, from_path, to_path "
                                                    "FROM corpusync.document_renames").fetchall()
    assert lineage_renames(conn, 5) == [("en/Normans.md", "archive/normans-2016.md"),
                                        ("zh/DEV_0.txt", "archive/cmrc-0.txt"),
                                        ("archive/normans-2016.md", "old/n.md")]
