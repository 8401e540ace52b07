"""A pool worker outlives a SIGKILLed refresh by a fraction of a second, even while it is busy.

The fault campaign found a parse worker still warming up (importing unstructured) seconds after its
refresh was killed: pebble's workers only notice a dead parent when they next read their channel, and a
PR_SET_PDEATHSIG follows the thread that started the worker, not the process. `watch_parent` polls.
And a signal only asks: a child that stalls on SIGTERM is ended a grace time later (`bounded_command`).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

PARENT = r"""
import multiprocessing as mp, sys, time
from concurrent.futures import ProcessPoolExecutor
import threading

def busy(parent):
    from corpusync.core.lifetime import watch_parent
    if sys.argv[1] == "watch":
        watch_parent(parent)
    print("busy", flush=True)
    while True:  # a long import or parse: never reads the pool's channel
        sum(range(10000))

def main():
    import os
    pool = ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"), initializer=busy, initargs=(os.getpid(),))
    # started from a short-lived thread, as a pool's manager thread or a warm-up thread may
    t = threading.Thread(target=lambda: pool.submit(int))
    t.start(); t.join()
    time.sleep(600)

if __name__ == "__main__":
    main()
"""


def _workers_after_kill(tmp_path: Path, mode: str, wait_s: float) -> list[int]:
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    proc = subprocess.Popen([sys.executable, str(script), mode], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "busy"
        workers = [p for p in psutil.Process(proc.pid).children(recursive=True)
                   if "resource_tracker" not in " ".join(p.cmdline())]
        assert workers
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + wait_s
        alive = workers
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        return [p.pid for p in alive]
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_busy_pool_worker_exits_when_its_parent_is_killed(tmp_path: Path) -> None:
    assert _workers_after_kill(tmp_path, "watch", wait_s=10) == []  # a liveness bound, not a timing


def test_without_the_watch_a_busy_worker_outlives_its_parent(tmp_path: Path) -> None:
    """The control: the same worker without `watch_parent` is still running (so the test above can fail)."""
    assert _workers_after_kill(tmp_path, "none", wait_s=2) != []


STALLING = r"""
import signal, time
signal.signal(signal.SIGTERM, lambda *a: print("asked to stop, still stopping", flush=True))
print("ready", flush=True)
while True:  # a server whose graceful stop waits on something that never comes
    time.sleep(0.05)
"""

SPAWNER = r"""
import os, subprocess, sys, time
from corpusync.core.lifetime import bounded_command, die_with_parent

parent = os.getpid()
command = bounded_command(parent, 1.0, "stalling") if sys.argv[1] == "bounded" else [sys.executable, "-m", "stalling"]
subprocess.Popen(command, preexec_fn=lambda: die_with_parent(parent), cwd=sys.argv[2])
time.sleep(600)
"""


def _stalling_child_after_kill(tmp_path: Path, mode: str, wait_s: float) -> list[int]:
    (tmp_path / "stalling.py").write_text(STALLING)
    (tmp_path / "spawner.py").write_text(SPAWNER)
    # the stalling child inherits the pipe: its "ready" says its SIGTERM handler is installed
    proc = subprocess.Popen([sys.executable, str(tmp_path / "spawner.py"), mode, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready and proc.stdout.readline().strip() == "ready", "the child did not start"
        children = [p for p in psutil.Process(proc.pid).children() if p.is_running()]
        assert children
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + wait_s
        alive = children
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        return [p.pid for p in alive]
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_child_that_stalls_on_sigterm_is_ended_after_its_grace(tmp_path: Path) -> None:
    """The local Prefect API server runs this way: a CI run saw one up 3 s after its refresh was SIGKILLed."""
    assert _stalling_child_after_kill(tmp_path, "bounded", wait_s=10) == []  # a liveness bound, not a timing


def test_without_the_bound_a_child_that_stalls_on_sigterm_outlives_its_parent(tmp_path: Path) -> None:
    """The control: PR_SET_PDEATHSIG alone only asks (so the test above can fail)."""
    assert _stalling_child_after_kill(tmp_path, "plain", wait_s=3) != []
