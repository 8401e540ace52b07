"""Real servers the tests start (Prefect's API): wait until one answers its health check."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import httpx


def wait_for_health(server: subprocess.Popen[Any], url: str, log: Path, timeout_s: float) -> None:
    """Poll `url` until it answers 200; fail with the server's log when it exits or takes too long."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert server.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"{url} did not answer in {timeout_s:.0f} s"
        time.sleep(0.5)
