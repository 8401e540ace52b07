"""The evaluation gate cannot be fooled (issue 15): a threshold naming no metric or no gold set is a
ConfigError (exit 2); the offline RAGAS context metrics are gated like retrieval metrics; the baseline is an
evaluation of the same question set (an ad-hoc `eval --limit` or an edited gold set is never one: the gate
evaluates a matching baseline on the spot); gold sets named alike in two folders keep apart baselines;
question embeddings are batched by the token budget and survive CUDA out-of-memory; reports are private.

Real components throughout (embedded PostgreSQL, Prefect flows, MiniLM); fakes only for fault injection
(a CUDA-out-of-memory embedder around the real model, a scrambling parser)."""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corpusync.cli import main
from corpusync.core.errors import ConfigError
from evaluation.gate import gate_checks
from schemas.settings import Settings
from tests.conftest import REPO, SAMPLE
from tests.faults import scramble_parses

DB = [pytest.mark.flow, pytest.mark.db]


def _gold_rows(corpus: Path) -> list[dict[str, Any]]:
    """The demo questions whose document is in the test corpus (20 of them)."""
    present = {p.relative_to(corpus).as_posix() for p in corpus.rglob("*") if p.is_file()}
    rows = [json.loads(line) for line in (REPO / "examples" / "goldset.jsonl").read_text().splitlines()]
    mine = [r for r in rows if r.get("gold_document") in present]
    assert len(mine) >= 10  # enough questions for the paired comparisons to mean something
    return mine


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


@pytest.fixture
def env(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The CLI builds its own Settings from the environment: point it at the test database."""
    monkeypatch.setenv("CORPUSYNC_HOME", str(settings.home))
    monkeypatch.setenv("CORPUSYNC_DATABASE_URL", settings.database_dsn())
    monkeypatch.setenv("CORPUSYNC_CHUNK_MAX_TOKENS", str(settings.chunk_max_tokens))
    monkeypatch.setenv("CORPUSYNC_PARSE_ISOLATION", "false")  # faults are injected in this process
    for name in ("CORPUSYNC_GATE_FLOORS", "CORPUSYNC_GATE_TOLERANCES", "CORPUSYNC_EVAL_MAX_QUESTIONS"):
        monkeypatch.delenv(name, raising=False)
    return settings


@pytest.fixture
def umask_022() -> Iterator[None]:
    """A usual umask, so files come out world-readable unless the code says otherwise."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def _json(capsys: pytest.CaptureFixture[str]) -> Any:
    return json.loads(capsys.readouterr().out)


# --- 1. thresholds naming no metric or no gold set -------------------------------------------------------


def test_unknown_threshold_metric_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"CORPUSYNC_GATE_FLOORS: unknown metric in key 'recall@50'.*"
                                          r"recall@5, .*mrr@10.*id_based_context_recall"):
        Settings(home=tmp_path, gate_floors={"recall@50": 0.5})
    with pytest.raises(ConfigError, match=r"CORPUSYNC_GATE_TOLERANCES: unknown metric in key 'gold:MRR@10'"):
        Settings(home=tmp_path, gate_tolerances={"gold:MRR@10": 0.02})
    monkeypatch.setenv("CORPUSYNC_GATE_TOLERANCES", json.dumps({"recall@5": 0.02, "faithfulness": 0.1}))
    with pytest.raises(ConfigError, match="'faithfulness'"):  # LLM-judged: not deterministic, not gated
        Settings(home=tmp_path)
    monkeypatch.delenv("CORPUSYNC_GATE_TOLERANCES")
    # a NaN floor never fails, a floor above 1 always does, a negative tolerance fails any non-gain
    for floors, tolerances in (({"recall@5": math.nan}, {}), ({"mrr@10": 1.5}, {}), ({}, {"recall@5": -0.1}),
                               ({":recall@5": 0.5}, {})):
        with pytest.raises(ConfigError):
            Settings(home=tmp_path, gate_floors=floors, gate_tolerances=tolerances)
    ok = Settings(home=tmp_path, gate_floors={"id_based_context_recall": 0.5, "g:latency_ms_p95": 500.0},
                  gate_tolerances={"g:non_llm_context_recall": 0.05, "recall@10": 0.02})
    assert ok.gate_floors["id_based_context_recall"] == 0.5
    # the pure gate refuses them too (a caller passing its own tables)
    with pytest.raises(ConfigError, match="recall@50"):
        gate_checks("g", "hybrid", {"q": {"recall@5": 1.0}}, None, tolerances={"recall@50": 0.1}, floors={})


def test_threshold_for_an_unknown_goldset_fails_before_any_work(tmp_path: Path) -> None:
    from corpusync.app.evaluating import evaluate_and_gate
    from evaluation.gate import check_threshold_goldsets
    from evaluation.goldsets import load_goldset

    gold = _write(tmp_path / "gold.jsonl", [{"id": "q1", "question": "Who won?", "document": "a.md"}])
    settings = Settings(home=tmp_path / "home", gate_floors={"nosuch:recall@5": 0.5})
    # conn and searcher are None: the check comes before the database is touched
    with pytest.raises(ConfigError, match=r"CORPUSYNC_GATE_FLOORS: key 'nosuch:recall@5' names gold set 'nosuch'.*"
                                          r"known gold set names and keys: gold, gold-[0-9a-f]{8}"):
        evaluate_and_gate(settings, None, None, 1, specs=[str(gold)])  # type: ignore[arg-type]
    key = load_goldset(gold).key
    for prefix in ("gold", key):  # by name or by key
        check_threshold_goldsets({f"{prefix}:recall@5": 0.1}, {}, [str(gold)])
    # a gold set configured for the refresh but not evaluated now is known too, even if it is not found here
    check_threshold_goldsets({}, {"other:mrr@10": 0.2}, [str(gold)], ["elsewhere/other.jsonl"])


def test_baseline_mismatch_reasons_and_uncomputed_metric() -> None:
    from evaluation.gate import baseline_mismatch

    rows = {"q1": {"recall@5": 1.0}, "q2": {"recall@5": 0.0}}
    stored = {"id": 7, "goldset_sha256": "ab" * 32, "n_questions": 2, "question_limit": None}
    assert baseline_mismatch(stored, "ab" * 32, ["q1", "q2"], lambda: rows, ["recall@5"]) is None
    assert "ad-hoc --limit" in str(baseline_mismatch(stored | {"question_limit": 2}, "ab" * 32, ["q1", "q2"],
                                                     lambda: rows, []))
    assert "other gold-set content" in str(baseline_mismatch(stored, "cd" * 32, ["q1", "q2"], lambda: rows, []))
    assert "1 of 3 in common" in str(baseline_mismatch(stored, "ab" * 32, ["q1", "q3", "q4"], lambda: rows, []))
    assert "no per-question id_based_context_recall" in str(
        baseline_mismatch(stored, "ab" * 32, ["q1", "q2"], lambda: rows, ["id_based_context_recall"]))
    # a gated metric the candidate has no score for fails: a gate that cannot judge does not pass
    (check,) = gate_checks("g", "hybrid", rows, rows, tolerances={"id_based_context_recall": 0.02}, floors={})
    assert not check.passed and "not computed" in check.reason


# --- 2 + 3. RAGAS gated; the baseline is the same question set -------------------------------------------


@pytest.mark.flow
@pytest.mark.db
def test_ragas_gated_and_baseline_is_the_same_question_set(
        prefect_harness: None, lingering_model: None, env: Any, corpus: Path, conn: Any,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    rows = _gold_rows(corpus)
    gold = _write(corpus.parent / "gold" / "gold.jsonl", rows)
    monkeypatch.setenv("CORPUSYNC_GOLDSETS", json.dumps([str(gold)]))
    monkeypatch.setenv("CORPUSYNC_GATE_TOLERANCES", json.dumps(
        {"recall@5": 0.02, "mrr@10": 0.03, "id_based_context_recall": 0.02}))
    monkeypatch.setenv("CORPUSYNC_GATE_FLOORS", json.dumps({"id_based_context_recall": 0.5}))

    # generation 1: the RAGAS floor is judged on the RAGAS score (not on a missing per-question value = 0)
    assert main(["refresh", str(corpus), "--json"]) == 0
    (ev1,) = _json(capsys)["evaluation"]
    floor = next(c for c in ev1["checks"] if c["metric"] == "id_based_context_recall")
    assert ev1["passed"] and floor["floor"] == 0.5
    assert floor["candidate"] == pytest.approx(ev1["ragas"]["id_based_context_recall"]) and floor["candidate"] > 0.5

    # an ad-hoc --limit run on generation 1: recorded as such, never a baseline
    assert main(["eval", "--limit", "5", "--json"]) == 0
    (adhoc,) = _json(capsys)
    assert adhoc["n_questions"] == 5 and adhoc["question_limit"] == 5
    assert conn.execute("SELECT question_limit FROM corpusync.evaluations WHERE id = %s",
                        (adhoc["evaluation_id"],)).fetchone()[0] == 5

    # generation 2: the baseline is generation 1's full evaluation, not the newer --limit one
    shutil.copy(SAMPLE / "en" / "Amazon_rainforest.md", corpus / "en" / "Amazon_rainforest.md")
    assert main(["refresh", str(corpus), "--json"]) == 0
    (ev2,) = _json(capsys)["evaluation"]
    assert ev2["passed"] and ev2["baseline_id"] == ev1["evaluation_id"] and not ev2["baseline_computed"]
    assert {c["metric"] for c in ev2["checks"]} == {"recall@5", "mrr@10", "id_based_context_recall"}
    assert all(c["n_paired"] == len(rows) and c["baseline"] is not None for c in ev2["checks"])

    # the gold set is edited (one question reworded, one dropped): no stored evaluation of generation 1 scored
    # these questions, so the standalone gate evaluates generation 1 now, says so, and pairs all of them
    edited = [dict(rows[0], question=rows[0]["question"] + " Answer briefly."), *rows[1:-1]]
    _write(gold, edited)
    assert main(["eval", "--gate", "--json"]) == 0
    (ev3,) = _json(capsys)
    assert ev3["generation"] == 2 and ev3["baseline_generation"] == 1 and ev3["baseline_computed"]
    assert ev3["baseline_id"] not in (ev1["evaluation_id"], adhoc["evaluation_id"])
    assert ev3["baseline_note"].startswith("evaluated now: evaluation ") and "ad-hoc --limit" in ev3["baseline_note"]
    assert all(c["n_paired"] == len(edited) for c in ev3["checks"])
    assert "evaluated now" in Path(ev3["report"]).read_text()
    assert conn.execute("SELECT generation, n_questions, question_limit FROM corpusync.evaluations WHERE id = %s",
                        (ev3["baseline_id"],)).fetchone() == (1, len(edited), None)

    # generation 3, a scrambling parser, gated on a RAGAS tolerance alone: refused for that drop, against the
    # stored evaluation of the edited gold set on generation 2
    monkeypatch.setenv("CORPUSYNC_GATE_TOLERANCES", json.dumps({"id_based_context_recall": 0.02}))
    monkeypatch.setenv("CORPUSYNC_GATE_FLOORS", "{}")
    scramble_parses(monkeypatch)
    assert main(["refresh", str(corpus), "--json"]) == 1
    run = conn.execute("SELECT status, counts FROM corpusync.runs ORDER BY id DESC LIMIT 1").fetchone()
    assert run[0] == "refused"
    (ev4,) = run[1]["evaluation"]
    assert ev4["baseline_id"] == ev3["evaluation_id"] and not ev4["baseline_computed"]
    (check,) = ev4["checks"]
    assert check["metric"] == "id_based_context_recall" and not check["passed"] and check["ci_high"] < 0
    capsys.readouterr()

    # a threshold naming no metric, or no configured gold set: exit 2 with the valid names, before any work
    monkeypatch.setenv("CORPUSYNC_GATE_TOLERANCES", json.dumps({"recall@50": 0.02}))
    assert main(["eval", "--gate"]) == 2
    err = capsys.readouterr().err
    assert "recall@50" in err and "recall@5, " in err and "non_llm_context_recall" in err
    monkeypatch.setenv("CORPUSYNC_GATE_TOLERANCES", "{}")
    monkeypatch.setenv("CORPUSYNC_GATE_FLOORS", json.dumps({"nosuch:recall@5": 0.5}))
    n_before = conn.execute("SELECT count(*) FROM corpusync.evaluations").fetchone()[0]
    assert main(["eval"]) == 2
    assert "'nosuch'" in capsys.readouterr().err
    assert conn.execute("SELECT count(*) FROM corpusync.evaluations").fetchone()[0] == n_before


# --- 4 + 6. same file name in two folders; private reports -----------------------------------------------


@pytest.mark.flow
@pytest.mark.db
def test_same_name_in_two_folders_keeps_apart_and_reports_are_private(
        prefect_harness: None, lingering_model: None, env: Any, corpus: Path, conn: Any,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], umask_022: None) -> None:
    rows = _gold_rows(corpus)
    half = len(rows) // 2
    a = _write(corpus.parent / "a" / "gold.jsonl", rows[:half])
    b = _write(corpus.parent / "b" / "gold.jsonl", rows[half:])
    monkeypatch.setenv("CORPUSYNC_GOLDSETS", json.dumps([str(a), str(b)]))
    reports = Path(env.home) / "reports"  # left world-readable by an earlier version
    reports.mkdir(mode=0o755)
    os.chmod(reports, 0o755)
    stale = reports / "eval-g0-gold-e0.md"
    stale.write_text("# an old report\n")
    os.chmod(stale, 0o644)

    assert main(["refresh", str(corpus), "--json"]) == 0
    first = _json(capsys)["evaluation"]  # in the order of CORPUSYNC_GOLDSETS: a, b
    assert [e["goldset"] for e in first] == ["gold", "gold"]  # the readable name is kept

    shutil.copy(SAMPLE / "en" / "Amazon_rainforest.md", corpus / "en" / "Amazon_rainforest.md")
    assert main(["refresh", str(corpus), "--json"]) == 0
    second = _json(capsys)["evaluation"]
    for before, ev, n in zip(first, second, (half, len(rows) - half), strict=True):  # each vs its own generation 1
        baseline_id = conn.execute("SELECT baseline_id FROM corpusync.evaluations WHERE id = %s",
                                   (ev["evaluation_id"],)).fetchone()[0]
        assert baseline_id == before["evaluation_id"]
        assert ev["baseline_id"] == baseline_id
        assert ev["checks"] and all(c["n_paired"] == n for c in ev["checks"])
        assert not ev["baseline_computed"]
    assert [e["goldset_source"] for e in second] == [str(a), str(b)]
    key_a, key_b = (e["goldset_key"] for e in first)
    assert key_a != key_b and key_a.startswith("gold-") and key_b.startswith("gold-")
    keys = conn.execute("SELECT goldset_key, count(*) FROM corpusync.evaluations GROUP BY 1").fetchall()
    assert sorted(keys) == sorted([(key_a, 2), (key_b, 2)])
    assert len(list(reports.glob("history-gold-*.svg"))) == 2  # one history per gold set, not one shared

    assert stat.S_IMODE(reports.stat().st_mode) == 0o700
    files = list(reports.iterdir())
    assert len(files) >= 7 and {stat.S_IMODE(f.stat().st_mode) for f in files} == {0o600}


# --- 5. question embeddings: token-budgeted batches, out-of-memory halved ---------------------------------


class OutOfMemoryEmbedder:
    """Fault injection: the real MiniLM, but a batch of more than `max_batch` texts raises CUDA OOM."""

    def __init__(self, inner: Any, max_batch: int) -> None:
        self.inner, self.identity, self.max_batch = inner, inner.identity, max_batch
        self.batches: list[list[str]] = []
        self.ooms = 0

    def count_tokens(self, texts: Any) -> list[int]:
        return list(self.inner.count_tokens(texts))

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        return list(self.inner.token_offsets(text))

    def coverage(self, words: Any) -> float:
        return float(self.inner.coverage(words))

    def embed(self, texts: Any) -> Any:
        if len(texts) > self.max_batch:
            self.ooms += 1
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        self.batches.append(list(texts))
        return self.inner.embed(texts)


@pytest.mark.flow
@pytest.mark.db
def test_question_embeddings_are_batched_and_survive_out_of_memory(
        prefect_harness: None, settings: Any, corpus: Path, conn: Any, embedder: Any) -> None:
    from corpusync.app.evaluating import evaluate_generation
    from evaluation.goldsets import load_goldset
    from flows.refresh import refresh
    from query.search import Searcher

    assert refresh(str(corpus), settings=settings)["generation"] == 1
    gs = load_goldset(_write(corpus.parent / "gold.jsonl", _gold_rows(corpus)))
    plain = evaluate_generation(settings, conn, Searcher(settings, conn, embedder), gs, 1)

    budget = 64
    small = settings.model_copy(update={"embed_batch_tokens": budget})
    faulty = OutOfMemoryEmbedder(embedder, max_batch=3)
    ev = evaluate_generation(small, conn, Searcher(small, conn, faulty), gs, 1)

    assert faulty.ooms > 0  # batches over 3 hit out-of-memory and were halved
    assert sorted(t for b in faulty.batches for t in b) == sorted(q.question for q in gs.questions)
    for batch in faulty.batches:  # each within the token budget (padded: size x longest)
        assert len(batch) <= 3 and (len(batch) == 1 or len(batch) * max(embedder.count_tokens(batch)) <= budget)
    for mode in plain.modes:
        quality = {k: v for k, v in plain.metrics[mode].items() if not k.startswith("latency")}
        assert {k: ev.metrics[mode][k] for k in quality} == pytest.approx(quality)
    assert [(q.mode, q.question_id, q.retrieved) for q in ev.questions] == \
        [(q.mode, q.question_id, q.retrieved) for q in plain.questions]
    assert ev.ragas["metrics"] == pytest.approx(plain.ragas["metrics"])
