"""Prefect's ephemeral API server, tied to the process that needs it.

When no PREFECT_API_URL is set, Prefect starts a temporary API server as a child process and stops it at
exit. A process killed with SIGKILL (the OOM killer) runs no exit handlers, so that server would live on,
orphaned, listening on 127.0.0.1. Here it is started from the main thread with the kernel asked to
terminate it when its parent dies (PR_SET_PDEATHSIG): the server never outlives the refresh.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
from types import SimpleNamespace
from typing import Any

_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """Runs in the child between fork and exec: ask for SIGTERM when the parent goes."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _popen_dying_with_parent(*args: Any, **kwargs: Any) -> subprocess.Popen[Any]:
    if sys.platform.startswith("linux"):
        parent = os.getpid()
        kwargs.setdefault("preexec_fn", lambda: _die_with_parent(parent))
    return subprocess.Popen(*args, **kwargs)


def uses_ephemeral_api() -> bool:
    from prefect.settings import PREFECT_API_URL

    return not PREFECT_API_URL.value()


def start_ephemeral_api() -> str | None:
    """Start Prefect's ephemeral API server now, tied to this process; returns its URL (None when a real
    Prefect API is configured). Prefect's engine reuses this server (one instance per process).

    PR_SET_PDEATHSIG fires when the *thread* that forked exits, so this must run on the main thread."""
    if not uses_ephemeral_api():
        return None
    from prefect.server.api import server

    # The server module's `subprocess` name only (not the global module): its Popen gains the hook.
    if threading.current_thread() is threading.main_thread() and not isinstance(server.subprocess, SimpleNamespace):
        names = {k: getattr(subprocess, k) for k in dir(subprocess) if not k.startswith("__")}
        server.subprocess = SimpleNamespace(**names | {"Popen": _popen_dying_with_parent})  # type: ignore[assignment]
    instance = server.SubprocessASGIServer()
    instance.start()
    return instance.api_url
