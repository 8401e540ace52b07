"""Quarantine causes that can pass are retried with a bounded back-off, permanent ones wait for a change;
later runs say why a file is still quarantined; a file rejected the same way on every run keeps one row.

Real Prefect flow runs, the embedded PostgreSQL and the real model; the parse faults (a parser that hangs
or segfaults on *hang* / *crash* files) come from tests/faults.py, switched off again to show recovery."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from schemas.records import LiveVersion, QuarantineRecord, SourceFile
from tasks.diff import TEMPORARY_REASONS, QuarantineState, RetryPolicy, closed_quarantine, diff, with_state

HOUR = 3600.0


def run(settings: Any, corpus: Path, **kw: Any) -> dict[str, Any]:
    from flows.refresh import refresh

    return refresh(str(corpus), settings=settings, **kw)


def by_path(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {q["path"]: q for q in summary["quarantined"]}


def rows(conn: psycopg.Connection, path: str) -> int:
    row = conn.execute("SELECT count(*) FROM corpusync.quarantine WHERE path = %s", (path,)).fetchone()
    return int(row[0]) if row else 0


def age(conn: psycopg.Connection, minutes: int) -> None:
    """Let time pass for the back-off: every quarantine record becomes `minutes` older."""
    conn.execute("UPDATE corpusync.quarantine SET created_at = created_at - make_interval(mins => %s)", (minutes,))


def hours_until(iso: str) -> float:
    return (datetime.fromisoformat(iso) - datetime.now(UTC)).total_seconds() / HOUR


def live_paths(conn: psycopg.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT DISTINCT source_path FROM corpusync.live_chunks")}


@pytest.mark.flow
@pytest.mark.db
def test_temporary_causes_are_retried_after_back_off_and_permanent_ones_wait(
        prefect_harness: None, settings: Any, corpus: Path, conn: psycopg.Connection,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tasks import parse as parse_stage
    from tests.faults import crashing_parser

    # the hanging file costs its deadline twice (the clock starts when a warm worker takes it: the other small
    # files parse in milliseconds)
    s = settings.model_copy(update={"parse_timeout_s": 6.0, "quarantine_retry_base_s": HOUR,
                                    "quarantine_retry_max_s": 24 * HOUR})
    real_parse = parse_stage.parse_document
    monkeypatch.setattr(parse_stage, "parse_document", crashing_parser)
    (corpus / "notes").mkdir()
    (corpus / "notes/hang.txt").write_text("Harbour dues of Rouen\n\nThe harbour of Rouen charged dues on wine.")
    (corpus / "notes/crash.txt").write_text("Tolls of Caen\n\nThe bridge of Caen charged a toll on salt.")
    (corpus / "notes/empty.txt").write_bytes(b"")
    hang, crash, empty = "notes/hang.txt", "notes/crash.txt", "notes/empty.txt"

    first = by_path(run(s, corpus))
    assert (first[hang]["reason"], first[crash]["reason"], first[empty]["reason"]) == ("timeout", "crashed", "empty")
    assert 0.95 < hours_until(first[hang]["retry_at"]) <= 1.0 and first[empty]["retry_at"] is None

    # 1. within the back-off nothing is parsed again, and each entry says why it is still quarantined
    second = run(s, corpus)
    assert second["status"] == "no_changes" and second["documents"]["new"] == 0
    q = by_path(second)
    assert set(q) == {hang, crash, empty}
    assert (q[hang]["stage"], q[hang]["reason"], q[hang]["status"]) == ("parse", "timeout", "still quarantined")
    assert "longer than 6 s" in q[hang]["error"] and q[hang]["attempts"] == 1
    assert q[hang]["retry_at"] == first[hang]["retry_at"] and q[hang]["since"] == first[hang]["since"]
    assert (q[empty]["stage"], q[empty]["reason"], q[empty]["retry_at"]) == ("parse", "empty", None)
    assert "0 bytes" in q[empty]["error"] and "SIGSEGV" in q[crash]["error"]

    # 2. the back-off is over: the temporary ones are tried again (and fail again: the wait doubles)
    age(conn, 61)
    third = run(s, corpus)
    assert third["documents"]["new"] == 2
    q = by_path(third)
    assert (q[hang]["status"], q[hang]["reason"], q[hang]["attempts"]) == ("quarantined", "timeout", 2)
    assert 1.95 < hours_until(q[hang]["retry_at"]) <= 2.0
    assert q[crash]["attempts"] == 2 and q[empty]["status"] == "still quarantined"
    assert (rows(conn, hang), rows(conn, crash), rows(conn, empty)) == (2, 2, 1)
    assert run(s, corpus)["documents"]["new"] == 0  # the next wait is two hours

    # 3. the fault is gone (same files, same names): after the back-off they are indexed
    age(conn, 121)
    monkeypatch.setattr(parse_stage, "parse_document", real_parse)
    fifth = run(s, corpus)
    assert fifth["published"] and fifth["documents"]["new"] == 2
    assert set(by_path(fifth)) == {empty}
    assert {hang, crash} <= live_paths(conn)

    # 4. a permanent cause waits for a change however long ago it failed
    age(conn, 60 * 24 * 30)
    sixth = run(s, corpus)
    assert sixth["status"] == "no_changes" and by_path(sixth)[empty]["status"] == "still quarantined"
    assert rows(conn, empty) == 1
    (corpus / empty).write_text("Now it has text\n\nThe fair of Guibray was held in August.")
    assert run(s, corpus)["quarantined"] == [] and empty in live_paths(conn)


@pytest.mark.flow
@pytest.mark.db
def test_a_file_written_during_the_refresh_keeps_its_live_version_and_is_read_again_by_the_next(
        prefect_harness: None, settings: Any, corpus: Path, conn: psycopg.Connection,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tasks import parse as parse_stage
    from tests.faults import rewriting_parser

    path = "notes/rewritten.txt"
    (corpus / "notes").mkdir()
    (corpus / path).write_text("Harbour dues of Rouen\n\nThe harbour of Rouen charged dues on wine in 1150.\n")
    assert run(settings, corpus)["published"]

    def live() -> tuple[str, str]:
        row = conn.execute("SELECT string_agg(text, ' '), min(content_sha256) FROM corpusync.live_chunks "
                           "WHERE source_path = %s", (path,)).fetchone()
        assert row is not None
        return row[0] or "", row[1] or ""

    first_text, first_sha = live()
    assert "wine" in first_text
    saved = "Harbour dues of Rouen\n\nThe harbour of Rouen charged dues on salt in 1180.\n"
    (corpus / path).write_text(saved)
    real_parse = parse_stage.parse_document
    monkeypatch.setattr(parse_stage, "parse_document", rewriting_parser)  # saved again once discover hashed it
    second = run(settings, corpus)
    q = by_path(second)[path]
    assert (q["stage"], q["reason"], q["status"]) == ("parse", "changed-during-run", "quarantined")
    assert "changed after this refresh hashed it" in q["error"] and "bytes then" in q["error"], q["error"]
    assert hours_until(q["retry_at"]) <= 0  # due again at once: no back-off
    assert live() == (first_text, first_sha)  # neither the bytes hashed nor the bytes saved: the live version

    # the same bytes as discover hashed in that run (saved twice with one content): read by the next run anyway
    (corpus / path).write_text(saved)
    monkeypatch.setattr(parse_stage, "parse_document", real_parse)
    third = run(settings, corpus)
    assert third["published"] and path not in by_path(third), third["quarantined"]
    assert third["quarantine_closed"] == [{"path": path, "resolution": "indexed"}]  # closed in the publish
    text, sha = live()
    assert "salt" in text and "wine" not in text and sha == q_sha(conn, path)
    closed = conn.execute("SELECT resolution FROM corpusync.quarantine WHERE path = %s", (path,)).fetchall()
    assert closed == [("indexed",)]


def q_sha(conn: psycopg.Connection, path: str) -> str:
    """The content hash the quarantine recorded for the path (the bytes discover hashed)."""
    row = conn.execute("SELECT content_sha256 FROM corpusync.quarantine WHERE path = %s", (path,)).fetchone()
    assert row is not None
    return str(row[0])


@pytest.mark.flow
@pytest.mark.db
def test_file_rejected_at_discover_keeps_one_row_and_is_reported_every_run(
        prefect_harness: None, settings: Any, corpus: Path, conn: psycopg.Connection) -> None:
    (corpus / "environ.txt").symlink_to("/proc/self/environ")
    (corpus / "zh/DEV_1.txt.meta.json").write_text("[1, 2]")
    seen = []
    for _ in range(3):
        summary = run(settings, corpus)
        q = by_path(summary)
        assert q["environ.txt"]["reason"] == "outside-source" and q["environ.txt"]["stage"] == "discover"
        assert "/proc/self/environ" in q["environ.txt"]["error"]
        assert q["zh/DEV_1.txt"]["reason"] == "bad-metadata" and "JSON object" in q["zh/DEV_1.txt"]["error"]
        assert summary["documents"]["quarantined"] == 2
        seen.append(q)
    assert [q["environ.txt"]["status"] for q in seen] == ["quarantined", "still quarantined", "still quarantined"]
    assert len({q["environ.txt"]["since"] for q in seen}) == 1
    assert all(q[p]["retry_at"] is None for q in seen for p in q)  # discover looks at them on every run anyway
    assert (rows(conn, "environ.txt"), rows(conn, "zh/DEV_1.txt")) == (1, 1)
    # another failure of the same file is a new row, and a fixed file leaves quarantine
    (corpus / "zh/DEV_1.txt.meta.json").write_text('{"acl": 7}')
    q = by_path(run(settings, corpus))
    assert q["zh/DEV_1.txt"]["status"] == "quarantined" and '"acl"' in q["zh/DEV_1.txt"]["error"]
    assert rows(conn, "zh/DEV_1.txt") == 2
    (corpus / "zh/DEV_1.txt.meta.json").unlink()
    assert set(by_path(run(settings, corpus))) == {"environ.txt"}


# --- the back-off itself (pure) -----------------------------------------------------------------------

T0 = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)


def _src(path: str, sha: str = "s1") -> SourceFile:
    return SourceFile(path, Path("/nonexistent") / path, 1, T0, sha)


def _state(reason: str, attempts: int = 1, *, sha: str = "s1", fp: str = "fp", stage: str = "parse") -> QuarantineState:
    return QuarantineState(sha, fp, stage, reason, f"{reason} happened", attempts, T0 - timedelta(days=1), T0)


def test_back_off_doubles_up_to_the_cap_and_stops_after_max_attempts() -> None:
    policy = RetryPolicy(base_s=HOUR, max_s=24 * HOUR, max_attempts=8)
    waits = [(policy.retry_at(_state("timeout", n)) - T0).total_seconds() / HOUR  # type: ignore[operator]
             for n in range(1, 8)]
    assert waits == [1, 2, 4, 8, 16, 24, 24]
    assert policy.retry_at(_state("timeout", 8)) is None  # attempts used up: waits for a change
    assert RetryPolicy(max_attempts=0).retry_at(_state("crashed", 10_000)) is not None  # no limit, no overflow
    for permanent in ("corrupt", "encrypted", "empty", "too-large", "unsupported", "data-quality",
                      "outside-source", "bad-file-name", "path-too-long", "bad-metadata"):
        assert permanent not in TEMPORARY_REASONS and policy.retry_at(_state(permanent)) is None
    assert {"timeout", "crashed", "out-of-memory", "ocr-error", "database-error"} <= TEMPORARY_REASONS
    # a file written while it was read: due again at once, as long as attempts are left
    assert [policy.retry_at(_state("changed-during-run", n)) for n in (1, 7, 8)] == [T0, T0, None]
    assert policy.retry_at(_state("unreadable", stage="discover")) is None  # discover re-checks every run


def test_diff_retries_a_temporary_cause_once_due_and_reports_the_rest_with_their_reason() -> None:
    files = [_src("hang.txt"), _src("locked.pdf"), _src("changed.txt", sha="s2")]
    quarantined = {"hang.txt": _state("timeout"), "locked.pdf": _state("encrypted"),
                   "changed.txt": _state("corrupt")}
    policy = RetryPolicy(base_s=HOUR)
    early = diff(files, [], "fp", quarantined, retry=policy, now=T0 + timedelta(minutes=59))
    assert sorted(f.path for f in early.new) == ["changed.txt"]  # new content is always tried
    still = {r.path: r for r in early.still_quarantined}
    assert still["hang.txt"].reason == "timeout" and still["hang.txt"].retry_at == T0 + timedelta(hours=1)
    assert still["locked.pdf"].as_dict() | {"error": ""} == {
        "path": "locked.pdf", "stage": "parse", "reason": "encrypted", "error": "", "status": "still quarantined",
        "attempts": 1, "since": (T0 - timedelta(days=1)).isoformat(), "retry_at": None}
    due = diff(files, [], "fp", quarantined, retry=policy, now=T0 + timedelta(hours=1))
    assert sorted(f.path for f in due.new) == ["changed.txt", "hang.txt"]
    assert [r.path for r in due.retrying] == ["hang.txt"]
    assert [r.path for r in due.still_quarantined] == ["locked.pdf"]
    # another pipeline: everything is tried again; a bare (sha, fingerprint) pair is a permanent quarantine
    assert len(diff(files, [], "fp2", quarantined, retry=policy, now=T0).new) == 3
    legacy = diff([_src("old.txt")], [], "fp", {"old.txt": ("s1", "fp")}, now=T0 + timedelta(days=365))
    assert [r.path for r in legacy.still_quarantined] == ["old.txt"] and not legacy.new


def test_summary_entry_of_a_fresh_failure_carries_its_retry_time() -> None:
    record = QuarantineRecord("hang.txt", "parse", "timeout", "parsing took longer than 2 s", "s1")
    shown = with_state(record, _state("timeout", 3), RetryPolicy(base_s=HOUR)).as_dict()
    assert shown["status"] == "quarantined" and shown["attempts"] == 3
    assert shown["retry_at"] == (T0 + timedelta(hours=4)).isoformat()
    assert with_state(record, None, RetryPolicy()).as_dict()["retry_at"] is None


def test_a_quarantine_no_longer_describing_its_file_is_closed() -> None:
    live = [LiveVersion(1, 11, "restored.pdf", "good", "fp", 3), LiveVersion(2, 12, "still-bad.pdf", "good", "fp", 3),
            LiveVersion(3, 13, "fails-anew.pdf", "good", "old-fp", 3)]
    files = [_src("restored.pdf", sha="good"), _src("still-bad.pdf", sha="bad"), _src("never-live.txt", sha="bad"),
             _src("fails-anew.pdf", sha="good")]
    open_records = {path: _state("corrupt", sha="bad") for path in
                    ("restored.pdf", "still-bad.pdf", "never-live.txt", "deleted.txt", "unreadable.txt")}
    # the live content failed under a newer pipeline: still true of the file (closing it would retry it for ever)
    open_records["fails-anew.pdf"] = _state("timeout", sha="good", fp="fp")
    assert closed_quarantine(files, {"unreadable.txt"}, live, open_records) == {
        "restored.pdf": "live-content", "deleted.txt": "gone"}  # an unreadable file is still there
    assert closed_quarantine(files, set(), live, {}) == {}
