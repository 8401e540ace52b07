"""Child processes that never outlive the refresh that started them.

A refresh killed with SIGKILL (the OOM killer, a CI timeout) runs no exit handlers, so a helper process it
started (Prefect's ephemeral API server, the validation worker) would live on, orphaned, holding ports and
its parent's stdout. On Linux the kernel can signal a child when its parent goes (PR_SET_PDEATHSIG).
The signal fires when the *thread* that created the child exits, so children are started from the main
thread, or from a thread that lives as long as they must. Pool workers, which a pool's own threads start
and restart, watch their parent's pid instead (`watch_parent`).

A signal only asks: a server that takes its time to stop (Prefect's API server, stopping gracefully while a
write waits on its SQLite database) would still outlive the command. `python -m corpusync.core.lifetime PARENT
GRACE_S MODULE ARGS...` runs MODULE as `python -m MODULE ARGS...` would, and ends it GRACE_S seconds after
PARENT went, however its own shutdown fares.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
from typing import Any

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """Run in the child (between fork and exec, or first thing in a spawned worker): SIGTERM when `parent`
    goes. Exits at once if it is already gone."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def watch_parent(parent: int, interval_s: float = 0.25, grace_s: float = 0.0) -> None:
    """Run first thing in a pool worker: exit within `interval_s` (plus `grace_s`) of `parent` going. A daemon
    thread polls the parent pid, so it works whichever thread of the parent started the worker (the pool's
    manager thread restarts workers; a PR_SET_PDEATHSIG tied to a short-lived thread would kill them early) and
    while the worker is busy importing or parsing (the thread gets the interpreter lock every few ms)."""
    if os.getppid() != parent:
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent:  # re-parented: the refresh is gone, and nobody will read our result
                time.sleep(grace_s)  # the time a process asked to stop (PR_SET_PDEATHSIG) has to do so itself
                os._exit(1)

    threading.Thread(target=watch, name="corpusync-watch-parent", daemon=True).start()


def stop_process(proc: subprocess.Popen[Any], grace_s: float) -> None:
    """SIGTERM, `grace_s` seconds to finish its writes, then SIGKILL; reaped either way."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def bounded_command(parent: int, grace_s: float, module: str, *args: str) -> list[str]:
    """The command that runs `python -m module args` ended `grace_s` seconds after `parent` goes."""
    return [sys.executable, "-m", "corpusync.core.lifetime", str(parent), f"{grace_s:g}", module, *args]


def _run_bounded(argv: list[str]) -> None:
    parent, grace_s, module, *args = argv
    watch_parent(int(parent), interval_s=0.1, grace_s=float(grace_s))
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _run_bounded(sys.argv[1:])
