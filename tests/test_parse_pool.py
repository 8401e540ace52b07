"""The parse worker pool (tasks/parse_worker.py, issue 13): crash, hang and memory isolation per document in a
pool of two next to good documents, deadlines scaled by page count, a clock that starts after the worker's
warm-up, results in input order, a memory limit that cannot be set still reported, a pool that broke between
documents replaced. The parse functions below are module level: they travel to the spawned workers."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pickle
import signal
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pymupdf
import pytest

from corpusync.core.errors import ParseError
from schemas.records import ParsedDocument, SourceFile
from tasks import parse_in_worker
from tasks.parse import ParseOptions, parse_document
from tasks.parse_worker import MAX_SCALED_PAGES, PARSE_AT_ONCE_PAGES, ParsePool, parse_deadline_s
from tests.faults import SetrlimitRefused, crashing_parser

TXT = ["any.txt"]  # warm only the text parser: these pools start fast


def source(path: Path) -> SourceFile:
    data = path.read_bytes()
    return SourceFile(path.name, path, len(data), datetime.now(UTC), hashlib.sha256(data).hexdigest())


def text_file(path: Path, text: str) -> SourceFile:
    path.write_text(text)
    return source(path)


def slow_by_pages(src: SourceFile, options: ParseOptions) -> ParsedDocument:
    """Takes 0.05 s per PDF page before parsing: a stand-in for OCR, whose time grows with the pages."""
    with pymupdf.open(src.abs_path) as doc:
        time.sleep(0.05 * doc.page_count)
    return parse_document(src, options)


def hangs(src: SourceFile, options: ParseOptions) -> ParsedDocument:
    time.sleep(60)
    return parse_document(src, options)


def slow_when_named_slow(src: SourceFile, options: ParseOptions) -> ParsedDocument:
    """'slow-*' finishes after 'e.txt' was parsed in the other worker (and a second more, for its result to be
    sent): on busy cores, not a fixed sleep that the other worker may not beat."""
    marker = src.abs_path.with_name("e.parsed")
    if "slow" in src.path:
        deadline = time.monotonic() + 30
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        marker.unlink(missing_ok=True)
        time.sleep(1.0)
    elif src.path == "e.txt":
        marker.touch()
    return parse_document(src, options)


def dies_after_returning(src: SourceFile, options: ParseOptions) -> ParsedDocument:
    """Parses, then kills its worker a moment later, while the worker is idle (the pool breaks)."""
    if "die" in src.path:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
    return parse_document(src, options)


def many_page_pdf(path: Path, pages: int) -> SourceFile:
    doc = pymupdf.open()
    for n in range(pages):
        doc.new_page().insert_text((72, 72), f"Page {n + 1} of a long report about parsing.")
    doc.save(path)
    return source(path)


def outcome(result: ParsedDocument | ParseError) -> str:
    return result.reason if isinstance(result, ParseError) else "ok"


def test_crash_hang_and_hog_in_a_pool_of_two_cost_only_themselves(tmp_path: Path) -> None:
    names = ["good0", "crash", "good1", "hang", "good2", "hog", "good3", "good4"]
    sources = [text_file(tmp_path / f"{n}.txt", f"Document {n}.\n\nSecond paragraph.") for n in names]
    with ParsePool(ParseOptions(), workers=2, timeout_s=8, memory_mb=2048, parse=crashing_parser,
                   warm_for=TXT) as pool:
        results = list(pool.parse_many(sources))
        restarts = pool.restarts
    assert [src.path for src, _ in results] == [s.path for s in sources]  # input order
    by_name = {src.path.removesuffix(".txt"): result for src, result in results}
    assert {n: outcome(r) for n, r in by_name.items()} == {
        "good0": "ok", "crash": "crashed", "good1": "ok", "hang": "timeout", "good2": "ok",
        "hog": "out-of-memory", "good3": "ok", "good4": "ok"}
    for n in ("good0", "good1", "good2", "good3", "good4"):
        doc = by_name[n]
        assert isinstance(doc, ParsedDocument) and doc.blocks[0].text == f"Document {n}."
    crash, hang, hog = by_name["crash"], by_name["hang"], by_name["hog"]
    assert isinstance(crash, ParseError) and "SIGSEGV" in crash.detail and crash.path == "crash.txt"
    assert isinstance(hang, ParseError) and "8 s" in hang.detail
    assert isinstance(hog, ParseError) and "2048 MiB" in hog.detail
    assert restarts == 2  # the crashed and the hung worker were replaced; MemoryError leaves the worker usable


def test_deadline_is_the_base_plus_a_time_per_page() -> None:
    assert parse_deadline_s(None, 600, 5) == 600  # not a paged file
    assert parse_deadline_s(0, 600, 5) == 600
    assert parse_deadline_s(300, 600, 5) == 2100  # a 300-page scan gets 35 minutes, not 10
    assert parse_deadline_s(300, 600, 0) == 600
    assert parse_deadline_s(10**7, 1, 1) == 1 + MAX_SCALED_PAGES  # a hostile page count buys no days
    assert parse_deadline_s(-4, 10, 1) == 10


def test_a_long_pdf_gets_a_longer_deadline(tmp_path: Path) -> None:
    """60 pages take 3 s: over a 1 s base, within 1 s + 60 x 0.1 s; the 2-page one is within the base."""
    long, short = many_page_pdf(tmp_path / "long.pdf", 60), many_page_pdf(tmp_path / "short.pdf", 2)
    with ParsePool(ParseOptions(), workers=2, timeout_s=1.0, timeout_per_page_s=0.1, memory_mb=4096,
                   parse=slow_by_pages, warm_for=["x.pdf"]) as pool:
        results = dict((s.path, r) for s, r in pool.parse_many([long, short]))
    assert {p: outcome(r) for p, r in results.items()} == {"long.pdf": "ok", "short.pdf": "ok"}
    doc = results["long.pdf"]
    assert isinstance(doc, ParsedDocument) and "Page 60 of a long report" in " ".join(b.text for b in doc.blocks)

    with ParsePool(ParseOptions(), workers=1, timeout_s=1.0, timeout_per_page_s=0.0, memory_mb=4096,
                   parse=slow_by_pages, warm_for=["x.pdf"]) as pool:
        (_, fixed), = pool.parse_many([long])
    assert isinstance(fixed, ParseError) and fixed.reason == "timeout", fixed  # the base alone is too short
    with ParsePool(ParseOptions(), workers=1, timeout_s=1.0, timeout_per_page_s=0.01, memory_mb=4096,
                   parse=slow_by_pages, warm_for=["x.pdf"]) as pool:
        (_, scaled), = pool.parse_many([long])
    assert isinstance(scaled, ParseError) and scaled.reason == "timeout"
    assert "1.6 s (1 s + 60 pages x 0.01 s)" in scaled.detail  # the deadline says how it was made


def test_a_short_pdf_is_counted_and_parsed_in_one_task_under_the_allowance_of_short_documents(
        tmp_path: Path) -> None:
    """Up to PARSE_AT_ONCE_PAGES pages, the page count and the parse are one task (no round trip to count
    first): its deadline is that of a document of that many pages, and a timeout says so."""
    assert PARSE_AT_ONCE_PAGES == 16
    short = many_page_pdf(tmp_path / "short.pdf", 2)
    with ParsePool(ParseOptions(), workers=1, timeout_s=0.5, timeout_per_page_s=0.1, memory_mb=4096,
                   parse=hangs, warm_for=["x.pdf"]) as pool:
        (_, hung), = pool.parse_many([short])
    assert isinstance(hung, ParseError) and hung.reason == "timeout", hung
    assert "2.1 s (0.5 s + 16 pages x 0.1 s, the allowance of a document of at most 16 pages)" in hung.detail


def test_the_clock_starts_after_the_worker_warmed_up(tmp_path: Path) -> None:
    """A fresh worker imports unstructured (~3 s) before its first Markdown file: not on that file's clock.
    Before the pool, a 2 s timeout failed this innocent note in a fresh worker."""
    note = text_file(tmp_path / "note.md", "# Note\n\nA short note.\n")
    with ParsePool(ParseOptions(), workers=1, timeout_s=2.0, memory_mb=4096, warm_for=[note.path]) as pool:
        assert [b.text for b in pool.parse(note).blocks] == ["Note", "A short note."]


def test_results_in_input_order_or_as_they_finish(tmp_path: Path) -> None:
    """Unordered, results come in the order they came back, also when several came back while the caller
    was busy (one wait() returns them together, as a set)."""
    sources = [text_file(tmp_path / f"{name}.txt", f"Text of {name}.")
               for name in ("slow-a", "b", "c", "d", "e")]
    with ParsePool(ParseOptions(), workers=2, timeout_s=60, memory_mb=2048, parse=slow_when_named_slow,
                   warm_for=TXT) as pool:
        ordered = [src.path for src, _ in pool.parse_many(sources)]
        finished: list[str] = []
        for src, _ in pool.parse_many(sources, ordered=False):
            finished.append(src.path)
            if len(finished) == 1:
                time.sleep(3)  # the others come back meanwhile
    assert ordered == ["slow-a.txt", "b.txt", "c.txt", "d.txt", "e.txt"]
    assert finished == ["b.txt", "c.txt", "d.txt", "e.txt", "slow-a.txt"]  # the other worker did b..e meanwhile


def test_a_memory_limit_that_cannot_be_set_is_reported_once_per_pool(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tasks.parse_worker")
    sources = [text_file(tmp_path / f"{name}.txt", "Plain text.") for name in ("a", "crash", "b", "c", "d")]
    with ParsePool(ParseOptions(), workers=2, timeout_s=60, memory_mb=1024, parse=SetrlimitRefused(),
                   warm_for=TXT) as pool:
        assert [outcome(r) for _, r in pool.parse_many(sources)] == ["ok", "crashed", "ok", "ok", "ok"]
        problem = pool.memory_limit_problem
    assert problem and "1024 MiB" in problem and "not allowed to raise maximum limit" in problem
    warnings = [r for r in caplog.records if "1024 MiB" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]  # three workers, one warning


def test_a_pool_that_broke_between_documents_is_replaced(tmp_path: Path) -> None:
    die = text_file(tmp_path / "die.txt", "Parsed, then the worker dies.")
    good = text_file(tmp_path / "ok.txt", "Fine.")
    with ParsePool(ParseOptions(), workers=1, timeout_s=30, memory_mb=2048, parse=dies_after_returning,
                   warm_for=TXT) as pool:
        assert pool.parse(die).blocks
        time.sleep(1.5)  # the idle worker is killed: pebble declares its pool broken
        assert [outcome(r) for _, r in pool.parse_many([good, good])] == ["ok", "ok"]


def test_a_crash_pebble_blames_on_the_wrong_document_costs_only_the_crasher(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pebble's message thread, stalled here after each start (as a busy machine stalls it), reads that the one
    worker finished 'a.txt' and took the next only after its manager thread saw it die on 'crash.txt': pebble blames
    'a.txt' and leaves 'crash.txt' running on the dead worker until its deadline. Seen in CI: a good document
    quarantined as 'crashed', the crasher as 'timeout' 600 s later. Each suspect is parsed alone instead."""
    from pebble.pool import process

    blamed: list[str] = []
    task_start = process.TaskManager.task_start
    expire = process.PoolManager.handle_worker_expiration

    def slow_after_start(self: process.TaskManager, task_id: int, worker_id: int | None) -> None:
        task_start(self, task_id, worker_id)
        time.sleep(1.0)  # the message thread, busy: the worker finishes this one and takes the next meanwhile

    def noting_blame(self: process.PoolManager, expiration: tuple[int, int]) -> None:
        with contextlib.suppress(LookupError):  # what pebble is about to blame
            blamed.append(next(iter(self.find_expired_task(expiration[0]).payload.args)).path)
        expire(self, expiration)

    monkeypatch.setattr(process.TaskManager, "task_start", slow_after_start)
    monkeypatch.setattr(process.PoolManager, "handle_worker_expiration", noting_blame)
    sources = [text_file(tmp_path / f"{name}.txt", f"Text of {name}.") for name in ("a", "b", "crash", "c")]
    with ParsePool(ParseOptions(), workers=1, timeout_s=120, memory_mb=2048, parse=crashing_parser,
                   warm_for=TXT) as pool:
        results = {src.path: result for src, result in pool.parse_many(sources, largest_first=False)}
        restarts = pool.restarts
    assert {path: outcome(r) for path, r in results.items()} == {
        "a.txt": "ok", "b.txt": "ok", "crash.txt": "crashed", "c.txt": "ok"}
    assert restarts == 1  # one worker died, whatever pebble blamed it on
    crash = results["crash.txt"]
    assert isinstance(crash, ParseError) and "SIGSEGV" in crash.detail
    assert blamed[0] == "a.txt"  # the race did happen: pebble blamed an innocent document


def slow_or_crashing(src: SourceFile, options: ParseOptions) -> ParsedDocument:
    """'slow-*' takes 4 s (a document running on the other worker meanwhile), noting each start; else
    crashing_parser."""
    if "slow" in src.path:
        with src.abs_path.with_suffix(".starts").open("a") as starts:
            starts.write("started\n")
        time.sleep(4)
    return crashing_parser(src, options)


def test_a_death_pebble_blames_on_no_document_costs_only_the_crasher(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the message thread further behind (stalled after each result here), pebble has already read that
    the dying worker finished 'a.txt' but not that it took 'crash.txt': it finds no document on the dead
    worker, says nothing, and 'crash.txt' waits out its deadline on a worker that is gone. The pool finds
    the document left running on the dead worker (WatchedPool.orphans) and parses it alone; the other worker's
    document goes on."""
    from pebble.pool import process

    silent: list[int] = []
    task_done = process.TaskManager.task_done
    find = process.PoolManager.find_expired_task

    def slow_after_result(self: process.TaskManager, task_id: int, result: object) -> None:
        task_done(self, task_id, result)
        time.sleep(1.0)

    def noting_silence(self: process.PoolManager, worker_id: int) -> object:
        try:
            return find(self, worker_id)
        except LookupError:
            silent.append(worker_id)
            raise

    monkeypatch.setattr(process.TaskManager, "task_done", slow_after_result)
    monkeypatch.setattr(process.PoolManager, "find_expired_task", noting_silence)
    sources = [text_file(tmp_path / f"{name}.txt", f"Text of {name}.") for name in ("slow", "a", "crash", "b")]
    with ParsePool(ParseOptions(), workers=2, timeout_s=120, memory_mb=2048, parse=slow_or_crashing,
                   warm_for=TXT) as pool:
        assert pool._running_pool().watched
        results = {src.path: result for src, result in pool.parse_many(sources, largest_first=False)}
        restarts = pool.restarts
    assert {path: outcome(r) for path, r in results.items()} == {
        "slow.txt": "ok", "a.txt": "ok", "crash.txt": "crashed", "b.txt": "ok"}
    crash = results["crash.txt"]
    assert isinstance(crash, ParseError) and "SIGSEGV" in crash.detail
    assert silent  # the race did happen: a death pebble blamed on no document
    assert (tmp_path / "slow.starts").read_text() == "started\n"  # the other worker went on: parsed once
    assert restarts == 1  # one worker replaced


def crash_or_raise(src: SourceFile, options: ParseOptions) -> ParsedDocument:
    """Raises on 'bad-*' (a parser's bug, not a crash); else crashing_parser."""
    if "bad" in src.path:
        raise ValueError("the parser cannot handle this")
    return crashing_parser(src, options)


def _after(delay_s: float, fn: object) -> object:
    time.sleep(delay_s)
    return fn


class SlowToStart:
    """A parse function that takes `delay_s` to unpickle in the process it is sent to, before that process
    can say it is ready: its start-up on a busy machine, where spawn, imports and warm-up take seconds."""

    def __init__(self, delay_s: float, fn: object) -> None:
        self.delay_s, self.fn = delay_s, fn

    def __reduce__(self) -> tuple[object, tuple[float, object]]:
        return _after, (self.delay_s, self.fn)


def test_a_document_parsed_alone_gets_a_certain_verdict(tmp_path: Path) -> None:
    """The process of its own (tasks/parse_deaths.py): the crash with its signal, the hang stopped at its
    deadline, the parser's exception handed back, and the clock started once the process is ready, the way a
    pool worker's is: a Markdown file within a 2 s deadline, from a process 3 s slow to start (CI failed
    that: the start-up counted against the deadline)."""
    from pebble import ProcessExpired

    from tasks.parse_deaths import AloneRuns

    runs = AloneRuns()
    initargs = (ParseOptions(), 2048, crash_or_raise, ("md",), os.getpid(), str(tmp_path / "warm"))
    note = text_file(tmp_path / "note.md", "# Note\n\nA short note.\n")
    slow_start = (initargs[0], initargs[1], SlowToStart(3.0, crash_or_raise), *initargs[3:])
    problem, (status, doc) = runs.parse(note, None, 2.0, slow_start)
    assert problem is None and status == "ok"
    assert [b.text for b in pickle.loads(doc).blocks] == ["Note", "A short note."]
    with pytest.raises(ProcessExpired) as crashed:
        runs.parse(text_file(tmp_path / "crash.txt", "x"), None, 30.0, initargs)
    assert crashed.value.exitcode == -signal.SIGSEGV
    with pytest.raises(TimeoutError):
        runs.parse(text_file(tmp_path / "hang.txt", "x"), None, 2.0, initargs)
    with pytest.raises(ValueError, match="cannot handle"):  # as a pool worker hands it back: not a crash
        runs.submit(text_file(tmp_path / "bad.txt", "x"), None, 30.0, initargs).result()
    runs.close()
    with pytest.raises(RuntimeError, match="closed"):
        runs.parse(note, None, 2.0, initargs)


def test_a_pool_removes_the_warm_up_folders_of_refreshes_that_were_killed(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A refresh SIGKILLed with its pool running leaves its warm-up folder (no clean-up runs); the next pool
    removes it, and leaves the folders of pools that are still running."""
    import subprocess
    import sys
    import tempfile

    repo = Path(__file__).resolve().parent.parent
    note = text_file(tmp_path / "note.txt", "A short note.")
    code = ("import sys, time\nfrom pathlib import Path\nfrom tasks.parse import ParseOptions\n"
            "from tasks.parse_worker import ParsePool\nfrom tests.test_parse_pool import TXT, source\n"
            "pool = ParsePool(ParseOptions(), workers=1, timeout_s=60, memory_mb=2048, warm_for=TXT)\n"
            "pool.parse(source(Path(sys.argv[1])))\nprint('parsed', flush=True)\ntime.sleep(120)\n")
    temp = tmp_path / "tmp"
    temp.mkdir()
    killed = subprocess.Popen([sys.executable, "-c", code, str(note.abs_path)], cwd=repo, text=True,
                              stdout=subprocess.PIPE, env={**os.environ, "TMPDIR": str(temp)})
    try:
        assert killed.stdout is not None and killed.stdout.readline() == "parsed\n"
    finally:
        killed.kill()
        killed.wait()
    orphans = list(temp.glob(f"corpusync-warm-{killed.pid}-*"))
    assert len(orphans) == 1 and orphans[0].is_dir()  # what a SIGKILL leaves
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    with ParsePool(ParseOptions(), workers=1, timeout_s=60, memory_mb=2048, warm_for=TXT) as pool:
        assert pool.parse(note).blocks
        running = list(temp.glob(f"corpusync-warm-{os.getpid()}-*"))
        with ParsePool(ParseOptions(), workers=1, timeout_s=60, memory_mb=2048, warm_for=TXT) as other:
            assert other.parse(note).blocks
            assert all(p.is_dir() for p in running) and len(running) == 1  # a running pool's folder stays
        assert not orphans[0].exists()
    assert not list(temp.glob("corpusync-warm-*"))


def test_a_worker_hands_freed_memory_back_once_it_has_grown(monkeypatch: pytest.MonkeyPatch) -> None:
    """malloc_trim after a document only above TRIM_ABOVE_MIB and once the worker has grown by
    TRIM_GROWTH_MIB since it last trimmed (trimming after every document made the next one fault its heap
    in again); above KEEP_ENGINES_BELOW_MIB always, with the OCR engines dropped. Resident sizes injected."""
    from corpusync.adapters import ocr

    resident = iter([100, 300, 200, 230, 280, 300, 1100, 250])  # after each document, then after each trim
    trims: list[int] = []
    monkeypatch.setattr(parse_in_worker, "_WORKER", {})
    monkeypatch.setattr(parse_in_worker, "_resident_mib", lambda: next(resident))
    monkeypatch.setattr(parse_in_worker, "_malloc_trim", lambda: trims.append)
    cleared: list[bool] = []
    monkeypatch.setattr(ocr.build_ocr_engine, "cache_clear", lambda: cleared.append(True))
    decisions = []
    for _ in range(5):
        before = len(trims)
        parse_in_worker._release_freed_memory()
        decisions.append(len(trims) > before)
    # 100: small; 300: above the floor, grown from 0 (trimmed to 200); 230: +30 since; 280: +80, trimmed
    # (to 300); 1100: engines dropped and trimmed (to 250)
    assert decisions == [False, True, False, True, True]
    assert cleared == [True]
    assert parse_in_worker._WORKER["trimmed_at_mib"] == 250
