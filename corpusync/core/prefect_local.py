"""The local Prefect API server the CLI's flow runs report to when no PREFECT_API_URL is set.

Prefect would start a temporary API server per process; starting one costs seconds of imports and
migrations, the largest share of a small refresh from the CLI. So the CLI shares one (`SharedAPI`): the
first command spawns a small supervisor (`python -m corpusync.core.prefect_local`, stdlib only) that runs Prefect's
uvicorn command and stops it `local_api_linger_s` seconds after the last command that used it went. Each
command holds a lease (a file named by its pid, holding the pid of the supervisor it uses) while it runs; a
command killed with SIGKILL leaves a lease whose pid is gone, which the supervisor ignores, so nothing outlives
its linger time. The state (port, pid) lives under PREFECT_HOME, next to the SQLite database the server writes:
one server per database. A command of another install (another Python or Prefect) starts a server of its own
there; the one it supersedes stops as soon as none of its own commands runs, without lingering (until then,
two servers share the database).

With a linger of 0 the server is this process's child (`LocalAPI`), started from the main thread with the
kernel asked to terminate it when its parent dies (PR_SET_PDEATHSIG), and ended a second later if it has not
stopped by then (`lifetime.bounded_command`): it never outlives the command.

Either way `launch()` only spawns or finds the server and returns at once; the caller loads what the
refresh needs meanwhile and `serving()` waits for its health check, then points this process's Prefect
client at it for the flow run.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from corpusync.core.lifetime import bounded_command, die_with_parent, stop_process

_LOG_NAME = "server.log"
# After its parent went, the time the server has to stop by itself (it is sent SIGTERM) before it is ended:
# its graceful stop takes 0.15 s here; a CI run saw one still up 3 s after its refresh was SIGKILLed.
_ORPHAN_GRACE_S = 1.0


def _popen_dying_with_parent(*args: Any, **kwargs: Any) -> subprocess.Popen[Any]:
    if sys.platform.startswith("linux"):
        parent = os.getpid()
        kwargs.setdefault("preexec_fn", lambda: die_with_parent(parent))
    return subprocess.Popen(*args, **kwargs)


def uses_ephemeral_api() -> bool:
    from prefect.settings import PREFECT_API_URL

    return not PREFECT_API_URL.value()


class API(Protocol):
    """A local API server, maybe not answering yet."""

    @property
    def url(self) -> str: ...

    def wait_ready(self) -> str: ...


def _app_dir() -> str:
    import prefect

    return str(prefect.__module_path__.parent)


def _server_command(port: int, app_dir: str) -> list[str]:
    """The command Prefect's SubprocessASGIServer runs (prefect/server/api/server.py), spawned without
    importing the server package into this process, and ended soon after this process goes."""
    return bounded_command(os.getpid(), _ORPHAN_GRACE_S, "uvicorn", "--app-dir", app_dir, "--factory",
                           "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port),
                           "--log-level", "error", "--lifespan", "on")


def _server_env() -> dict[str, str]:
    """This process's environment less what the server has no use for: corpusync's settings (the database
    password among them) do not live on in a server that outlasts the command."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"PREFECT_API_URL", "DATABASE_URL"} and not k.startswith("CORPUSYNC_")}
    env.update(PREFECT_UI_ENABLED="0", PREFECT__SERVER_EPHEMERAL="1", PREFECT__SERVER_FINAL="1")
    return env


def _healthy(url: str, timeout_s: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _wait_healthy(api: API, gone: Callable[[], None]) -> str:
    """Poll the health check until it answers; `gone()` raises (or restarts the server) when it died."""
    timeout_s = float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS") or 120)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        gone()
        if _healthy(api.url):
            return api.url
        time.sleep(0.05)
    raise RuntimeError(f"Prefect's local API server did not answer on {api.url} within {timeout_s:g} s")


class LocalAPI:
    """An API server this process spawned as its child, stopped when it exits (maybe not answering yet)."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0
        self._spawn()
        atexit.register(self.stop)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def _spawn(self) -> None:
        self.port = _free_port()
        self.process = _popen_dying_with_parent(_server_command(self.port, _app_dir()), env=_server_env())

    def wait_ready(self) -> str:
        def gone() -> None:
            assert self.process is not None
            code = self.process.poll()
            if code == 3:  # the port was taken meanwhile: Prefect's own start does the same
                self._spawn()
            elif code is not None:
                raise RuntimeError(f"Prefect's ephemeral API server exited with code {code} while starting")

        return _wait_healthy(self, gone)

    def stop(self) -> None:
        """SIGTERM, then give it a moment to finish its writes (its SQLite database) before SIGKILL."""
        proc, self.process = self.process, None
        if proc is not None:
            stop_process(proc, 5)


def _free_port() -> int:
    import random
    import socket

    pick = random.SystemRandom()  # not the global generator: an application's (or Hypothesis's) seeded state
    for _ in range(20):
        port = pick.randrange(8000, 9000)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 8000-8999 for Prefect's ephemeral API server")


def launch(linger_s: float = 0.0) -> API | None:
    """Find or spawn the local API server now, without waiting for it (None when a Prefect API is configured).

    With `linger_s` > 0 the server is shared between commands (`SharedAPI`), else a child of this process.
    PR_SET_PDEATHSIG fires when the *thread* that forked exits, so this must run on the main thread."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("launch() must run on the main thread (the server must die with the process)")
    if not uses_ephemeral_api():
        return None
    return SharedAPI(linger_s) if linger_s > 0 else LocalAPI()


@contextmanager
def serving(api: API | None) -> Iterator[None]:
    """Flow runs inside this block use `api` (waited for here); without one, the configured Prefect API.

    On a local API the flow run sends no heartbeats: they exist for a server's automations to notice a
    crashed run, which a local API does not run, and the engine's heartbeat thread, asleep in one-second
    steps, held up the end of every flow run by half a second on average."""
    if api is None:
        yield
        return
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api.wait_ready(), PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield


# --- the shared server -----------------------------------------------------------------------------------


def state_dir() -> Path:
    """Where the shared server's state lives: beside the database it writes (PREFECT_HOME)."""
    from prefect.settings import PREFECT_HOME

    return Path(PREFECT_HOME.value()).expanduser() / "corpusync-local-api"


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """One process at a time decides whether the server lives (a command attaching, the supervisor leaving)."""
    (folder / "leases").mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not: it exited and waits for its parent to reap it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _read_state(folder: Path) -> dict[str, Any] | None:
    try:
        state = json.loads((folder / "state.json").read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def _identity() -> dict[str, str]:
    """A server is reused only by commands of the same Python and Prefect (an upgrade starts a new one)."""
    import prefect

    return {"python": sys.executable, "prefect": prefect.__version__}


def _forget(folder: Path, pid: int) -> None:
    state = _read_state(folder)
    if state is not None and state.get("pid") == pid:
        (folder / "state.json").unlink(missing_ok=True)


def _lease_server(lease: Path) -> int | None:
    """The supervisor pid a lease names (None: it names none, as an older corpusync's empty lease)."""
    try:
        text = lease.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _live_leases(folder: Path, server: int) -> int:
    """Leases of commands still running that use `server` (a supervisor pid; a lease that names none counts
    for any); those of commands that died without releasing are removed. A server superseded by another
    install's is not kept alive by that install's commands."""
    live = 0
    for lease in (folder / "leases").iterdir():
        if not (lease.name.isdigit() and _alive(int(lease.name))):
            lease.unlink(missing_ok=True)
        elif _lease_server(lease) in (None, server):
            live += 1
    return live


def _superseded(folder: Path, pid: int) -> bool:
    """Whether the state no longer names supervisor `pid` (another server took over, or `api stop` ran)."""
    state = _read_state(folder)
    return state is None or state.get("pid") != pid


_SPAWNED: list[subprocess.Popen[bytes]] = []


class SharedAPI:
    """The API server shared by this home's commands: found running, or started to linger after them."""

    def __init__(self, linger_s: float) -> None:
        self.folder = state_dir()
        self.linger_s = linger_s
        self.pid = self.port = 0
        self._lease = self.folder / "leases" / str(os.getpid())
        self._attach(restart=False)
        atexit.register(self.release)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def _attach(self, *, restart: bool) -> None:
        with _locked(self.folder):
            state = _read_state(self.folder)
            if (not restart and state is not None and {k: state.get(k) for k in _identity()} == _identity()
                    and isinstance(state.get("pid"), int) and _alive(state["pid"])):
                self.pid, self.port = state["pid"], int(state["port"])
            else:
                self.port = _free_port()
                with open(self.folder / _LOG_NAME, "wb") as log:
                    proc = subprocess.Popen(
                        [sys.executable, "-m", "corpusync.core.prefect_local", str(self.folder), str(self.port),
                         str(self.linger_s), _app_dir()], env=_server_env(), stdin=subprocess.DEVNULL, stdout=log,
                        stderr=subprocess.STDOUT, start_new_session=True)
                _SPAWNED.append(proc)  # kept: reaped by the interpreter, no "still running" warning
                self.pid = proc.pid
                state = {"pid": proc.pid, "port": self.port, "started": time.time(), **_identity()}
                tmp = self.folder / "state.json.tmp"
                tmp.write_text(json.dumps(state))
                tmp.replace(self.folder / "state.json")
            self._lease.write_text(str(self.pid))  # under the lock: the supervisor reads it whole

    def wait_ready(self) -> str:
        restarts = 0

        def gone() -> None:
            nonlocal restarts
            if not _alive(self.pid):
                restarts += 1
                if restarts > 3:
                    log = (self.folder / _LOG_NAME).read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"Prefect's local API server keeps exiting while starting:\n{log}")
                self._attach(restart=True)

        return _wait_healthy(self, gone)

    def release(self) -> None:
        self._lease.unlink(missing_ok=True)


def stop_shared() -> bool:
    """Stop the shared server of this PREFECT_HOME now. Returns whether one ran."""
    folder = state_dir()
    if not folder.exists():
        return False
    with _locked(folder):
        state = _read_state(folder)
        (folder / "state.json").unlink(missing_ok=True)
    pid = state.get("pid") if state else None
    if not isinstance(pid, int) or not _alive(pid):
        return False
    os.kill(pid, signal.SIGTERM)  # the supervisor stops the server (5 s for its writes), then exits
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _alive(pid):  # stuck: its server dies with it (PR_SET_PDEATHSIG)
        os.kill(pid, signal.SIGKILL)
    return True


def shared_status() -> dict[str, Any] | None:
    """The shared server of this PREFECT_HOME (url, pid, commands using it), or None when none runs."""
    folder = state_dir()
    state = _read_state(folder) if folder.exists() else None
    if state is None or not isinstance(state.get("pid"), int) or not _alive(state["pid"]):
        return None
    url = f"http://127.0.0.1:{state['port']}/api"
    with _locked(folder):
        leases = _live_leases(folder, state["pid"])
    return {"url": url, "pid": state["pid"], "healthy": _healthy(url), "commands": leases,
            "prefect": state.get("prefect")}


def supervise(folder: Path, port: int, linger_s: float, app_dir: str) -> int:
    """The supervisor's loop: run the server until none of its commands has held a lease for `linger_s`
    seconds, or, once another server took its place in the state, until none holds one."""
    stopping = False

    def on_term(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    server = _popen_dying_with_parent(_server_command(port, app_dir), env=_server_env())
    idle_since = time.monotonic()
    try:
        while not stopping and server.poll() is None:
            time.sleep(0.5)
            with _locked(folder):
                if _live_leases(folder, os.getpid()):
                    idle_since = time.monotonic()
                elif _superseded(folder, os.getpid()) or time.monotonic() - idle_since >= linger_s:
                    _forget(folder, os.getpid())  # under the lock: a command attaching now starts a new one
                    break
    finally:
        with _locked(folder):
            _forget(folder, os.getpid())
        stop_process(server, 5)
    return server.returncode or 0


if __name__ == "__main__":
    sys.exit(supervise(Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]))
