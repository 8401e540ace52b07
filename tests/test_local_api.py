"""The local Prefect API server CLI commands share (corpusync/core/prefect_local.py): the next command reuses it,
`corpusync api stop` stops it, and it stops by itself once no command has used it for its linger time, also
when the command that used it was SIGKILLed (a released lease and a dead one count the same: not in use).
Real refreshes in fresh processes, a real Prefect server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from test_edges import _alive, _env, _wait_for_child

from tests.servers import PREFECT_DB, seed_prefect_db

REPO = Path(__file__).resolve().parent.parent


def _cli_env(settings: Any, prefect_home: Path, linger_s: float, prefect_db: Path) -> dict[str, str]:
    """The CLI's environment on a fresh PREFECT_HOME whose database is migrated ahead (tests/servers.py)."""
    seed_prefect_db(prefect_db, prefect_home / PREFECT_DB)
    return _env(settings) | {"PREFECT_HOME": str(prefect_home), "CORPUSYNC_LOCAL_API_LINGER_S": str(linger_s)}


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "corpusync.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _status(env: dict[str, str]) -> dict[str, Any] | None:
    info: dict[str, Any] | None = json.loads(_cli(env, "api", "status", "--json").stdout)
    return info


def _flow_runs(url: str) -> list[dict[str, Any]]:
    request = urllib.request.Request(f"{url}/flow_runs/filter", data=b"{}", method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        runs: list[dict[str, Any]] = json.loads(response.read())
    return runs


def _healthy(folder: Path) -> bool:
    port = json.loads((folder / "state.json").read_text())["port"]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _gone_within(pids: list[int], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.2)
    return False


def _server_pids(supervisor: int) -> list[int]:
    uvicorn = _wait_for_child(supervisor, "uvicorn", timeout_s=30)
    assert uvicorn is not None, "the supervisor runs Prefect's uvicorn command"
    return [supervisor, uvicorn]


def test_the_next_command_reuses_the_server_and_api_stop_stops_it(  # type: ignore[no-untyped-def]
        lingering_model, settings, corpus: Path, prefect_db: Path, tmp_path: Path) -> None:
    # the model lingers too (lingering_model), as by default: the second refresh reuses it
    env = _cli_env(settings, tmp_path / "prefect", 600, prefect_db)
    assert _status(env) is None
    _cli(env, "refresh", str(corpus), "-q")
    first = _status(env)
    assert first is not None and first["healthy"] and first["commands"] == 0, first  # its lease is released
    pids = _server_pids(first["pid"])
    try:
        for pid in pids:  # the server outlives the command: not with its settings (the database password)
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            assert not [v for v in environ if v.startswith((b"CORPUSYNC_", b"DATABASE_URL="))], pid
        edited = sorted(p for p in corpus.rglob("*.md"))[0]
        edited.write_text(edited.read_text(encoding="utf-8") + "\n\nOne more sentence.\n", encoding="utf-8")
        _cli(env, "refresh", str(corpus), "-q")  # a flow run again: on the same server
        second = _status(env)
        assert second is not None and second["pid"] == first["pid"] and second["url"] == first["url"]
        runs = _flow_runs(first["url"])
        assert sorted(r["state_type"] for r in runs) == ["COMPLETED", "COMPLETED"], runs

        assert _cli(env, "api", "stop").stdout.strip() == "stopped"
        assert _gone_within(pids, 15), "api stop left the server running"
        assert _status(env) is None and _cli(env, "api", "stop").stdout.strip() == "not running"
        assert not (tmp_path / "prefect" / "corpusync-local-api" / "state.json").exists()
    finally:
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_sigkilled_command_does_not_keep_the_server_beyond_its_linger(  # type: ignore[no-untyped-def]
        settings, corpus: Path, prefect_db: Path, tmp_path: Path) -> None:
    env = _cli_env(settings, tmp_path / "prefect", 2, prefect_db)
    proc = subprocess.Popen([sys.executable, "-m", "corpusync.cli", "refresh", str(corpus), "-q"], cwd=REPO,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    folder = tmp_path / "prefect" / "corpusync-local-api"
    try:
        deadline = time.monotonic() + 120
        while not (folder / "state.json").exists() or not _healthy(folder):
            assert time.monotonic() < deadline and proc.poll() is None, "the refresh should start the server"
            time.sleep(0.1)
        assert (folder / "leases" / str(proc.pid)).exists(), "the running refresh holds a lease"
        pids = _server_pids(json.loads((folder / "state.json").read_text())["pid"])
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert _gone_within(pids, 2 + 15), "the server outlived the SIGKILLed command's linger time"
    assert not (folder / "state.json").exists() and not (folder / "leases" / str(proc.pid)).exists()


_INSTALL_A = """
import sys
from corpusync.core import prefect_local as pl
identity = pl._identity()
pl._identity = lambda: identity | {"python": "/another/install/bin/python"}
api = pl.SharedAPI(600)
api.wait_ready()
print(api.pid, flush=True)
sys.stdin.readline()
"""


def test_a_server_another_install_superseded_stops_once_its_own_commands_are_done(  # type: ignore[no-untyped-def]
        prefect_db: Path, tmp_path: Path, monkeypatch) -> None:
    """Two installs (another Python or Prefect) on one PREFECT_HOME: a command of the second starts a server of
    its own, and the first install's server stops once none of its own commands runs, at once, not kept alive
    by the other install's commands (it was, for as long as they kept coming within its linger time)."""
    from corpusync.core import prefect_local as pl

    home = tmp_path / "prefect"
    seed_prefect_db(prefect_db, home / PREFECT_DB)
    monkeypatch.setenv("PREFECT_HOME", str(home))  # the servers' database, and install A's state folder
    folder = home / "corpusync-local-api"
    monkeypatch.setattr(pl, "state_dir", lambda: folder)
    install_a = subprocess.Popen([sys.executable, "-c", _INSTALL_A], cwd=REPO, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        assert install_a.stdout is not None and install_a.stdin is not None
        old = _server_pids(int(install_a.stdout.readline()))
        pids += old
        api = pl.SharedAPI(600)  # this install's command: another identity, so a server of its own
        url = api.wait_ready()
        assert api.pid != old[0]
        pids += _server_pids(api.pid)
        time.sleep(2)  # four of the supervisor's checks
        assert all(_alive(p) for p in old), "a superseded server stopped while its own command still used it"
        install_a.stdin.write("\n")
        install_a.stdin.flush()
        assert install_a.wait(timeout=30) == 0
        assert _gone_within(old, 15), "a superseded server lived on, kept by another install's command"
        assert pl._healthy(url) and json.loads((folder / "state.json").read_text())["pid"] == api.pid
        api.release()
        assert pl.stop_shared() and _gone_within(pids, 15)
    finally:
        install_a.kill()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
