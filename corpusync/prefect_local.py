"""Prefect's ephemeral API server, tied to the process that needs it, and started early.

When no PREFECT_API_URL is set, Prefect starts a temporary API server as a child process and stops it at
exit. A process killed with SIGKILL (the OOM killer) runs no exit handlers, so that server would live on,
orphaned, listening on 127.0.0.1. Here it is started from the main thread with the kernel asked to
terminate it when its parent dies (PR_SET_PDEATHSIG): the server never outlives the refresh.

Starting it costs seconds of the server's own imports and migrations, on another core. So `launch()` only
spawns it and returns at once; the caller loads what the refresh needs meanwhile and `serving()` waits for
its health check, then points this process's Prefect client at it for the flow run.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from corpusync.lifetime import die_with_parent, stop_process


def _popen_dying_with_parent(*args: Any, **kwargs: Any) -> subprocess.Popen[Any]:
    if sys.platform.startswith("linux"):
        parent = os.getpid()
        kwargs.setdefault("preexec_fn", lambda: die_with_parent(parent))
    return subprocess.Popen(*args, **kwargs)


def uses_ephemeral_api() -> bool:
    from prefect.settings import PREFECT_API_URL

    return not PREFECT_API_URL.value()


class LocalAPI:
    """An ephemeral API server this process spawned (maybe not answering yet)."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0
        self._spawn()
        atexit.register(self.stop)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def _spawn(self) -> None:
        """The command Prefect's SubprocessASGIServer runs (prefect/server/api/server.py), spawned without
        importing the server package into this process."""
        import prefect

        self.port = _free_port()
        env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
        env.update(PREFECT_UI_ENABLED="0", PREFECT__SERVER_EPHEMERAL="1", PREFECT__SERVER_FINAL="1")
        self.process = _popen_dying_with_parent(
            [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect.__module_path__.parent), "--factory",
             "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(self.port),
             "--log-level", "error", "--lifespan", "on"], env=env)

    def wait_ready(self) -> str:
        timeout_s = float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS") or 120)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            code = self.process.poll()
            if code == 3:  # the port was taken meanwhile: Prefect's own start does the same
                self._spawn()
            elif code is not None:
                raise RuntimeError(f"Prefect's ephemeral API server exited with code {code} while starting")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1) as response:
                    if response.status == 200:
                        return self.url
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"Prefect's ephemeral API server did not answer on {self.url} within {timeout_s:g} s")

    def stop(self) -> None:
        """SIGTERM, then give it a moment to finish its writes (its SQLite database) before SIGKILL."""
        proc, self.process = self.process, None
        if proc is not None:
            stop_process(proc, 5)


def _free_port() -> int:
    import random
    import socket

    for _ in range(20):
        port = random.randrange(8000, 9000)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 8000-8999 for Prefect's ephemeral API server")


def launch() -> LocalAPI | None:
    """Spawn the ephemeral API server now, without waiting for it (None when a Prefect API is configured).

    PR_SET_PDEATHSIG fires when the *thread* that forked exits, so this must run on the main thread."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("launch() must run on the main thread (the server must die with the process)")
    return LocalAPI() if uses_ephemeral_api() else None


@contextmanager
def serving(api: LocalAPI | None) -> Iterator[None]:
    """Flow runs inside this block use `api` (waited for here); without one, the configured Prefect API."""
    if api is None:
        yield
        return
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api.wait_ready()}):
        yield

