"""The embedding model kept loaded between commands, as the local Prefect API server is (`model_linger_s`).

Each CLI command is a fresh process, and loading the model libraries and weights is most of a small command:
about 7 s of CPU for torch, transformers and FlagEmbedding on 2 cores, against well under a second to embed a
query or a 1% change. So the CLI's refreshes and queries share one model process per model and home: the first
command starts it (`python -m corpusync.adapters.model_server`, in a session of its own so that it outlives
the command), later ones connect to it, and it exits `model_linger_s` seconds after the last connection
closed. A command killed with SIGKILL closes its connection with it (the kernel closes the socket), so
nothing outlives its linger time. `corpusync model stop` stops it at once.

The server is found by an abstract Unix socket (Linux; no file to go stale when it is killed) named by a hash
of the home, the embedder's arguments, its model identity (the weights' sha256 among it) and this code's
files: new weights or a new corpusync never talk to an old server. Connections authenticate with a key kept
in <home>/model-server (mode 0600), so another user on the machine cannot use it. Requests and answers are
pickled (multiprocessing.connection): a batch crosses as its texts and comes back as its vectors.

The client is a `ModelProcess`, as the per-command model process is: a server that goes away raises
BrokenProcessPool, and the embedder then runs the model in its own process and says why.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corpusync.adapters.embedders import EmbeddingOutput, FlagEmbedder

STATE_DIR = "model-server"
CONNECT_TIMEOUT_S = 30.0  # for a server just started to listen (it listens before it imports anything)


def supported() -> bool:
    """Abstract Unix sockets are Linux's; elsewhere each command has a model process of its own."""
    return sys.platform.startswith("linux")


def share_model(embedder: FlagEmbedder, home: Path, linger_s: float) -> bool:
    """Run `embedder`'s model in the home's shared model server from now on (started if none answers); False
    when it cannot (linger 0, not Linux, its model already loaded here, a fault injected into it)."""
    if linger_s <= 0 or not supported() or not embedder.can_host:
        return False
    embedder.attach_host(SharedModel(home, embedder.spec, embedder.identity.identity_hash, linger_s))
    return True


def server_key(home: Path, spec: dict[str, Any], identity_hash: str) -> str:
    """Which server may serve an embedder built from `spec` for `home`: same arguments, same weights (the
    identity hash holds their sha256), same code."""
    code = sorted((p.name, p.stat().st_mtime_ns, p.stat().st_size)
                  for p in Path(__file__).parent.glob("*.py"))
    blob = json.dumps({"home": str(home.resolve()), "spec": {k: str(v) for k, v in spec.items()},
                       "identity": identity_hash, "code": code, "python": sys.executable},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _address(key: str) -> str:
    return f"\0corpusync-model-{key}"


def _authkey(state: Path) -> bytes:
    """The home's connection key, created on first use (mode 0600 in a 0700 folder)."""
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = state / "authkey"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_bytes()
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(32))
    return path.read_bytes()


class SharedModel:
    """A connection to the home's model server for one embedder's arguments, starting the server when none
    answers. Calls run one at a time on a daemon thread of their own (so that a command never waits at exit
    for a call in flight), `load` without waiting for its answer."""

    def __init__(self, home: Path, spec: dict[str, Any], identity_hash: str, linger_s: float) -> None:
        self.home, self.spec, self.identity_hash, self.linger_s = home, spec, identity_hash, linger_s
        self.state = home / STATE_DIR
        self.key = server_key(home, spec, identity_hash)
        self._conn: Connection | None = None
        self._queue: list[tuple[Future[Any], str, tuple[Any, ...]]] = []
        self._cv = threading.Condition()
        self._closed = False
        self._warm = False
        self.pid: Future[int] = Future()  # the server's, once connected
        threading.Thread(target=self._serve_calls, name="corpusync-shared-model", daemon=True).start()
        self._submit("hello")  # connects (and starts the server if needed) at once

    # -- the ModelProcess protocol ----------------------------------------------------------------------
    def load(self) -> None:
        self._submit("load")

    def devices(self) -> list[str]:
        return list(self._submit("devices").result())

    def embed(self, texts: Sequence[str]) -> EmbeddingOutput:
        return self._submit("embed", list(texts)).result()

    @property
    def warm(self) -> bool:
        """Whether the server had its model libraries imported when this command connected (a second or so
        after the command started, at most: the answer comes before any import)."""
        try:
            self.pid.result(timeout=CONNECT_TIMEOUT_S)
        except Exception:
            return False
        return self._warm

    def for_device(self, device: str) -> SharedModel:
        return SharedModel(self.home, {**self.spec, "device": device}, self.identity_hash, self.linger_s)

    def close(self) -> None:
        """Close this command's connection: the server lingers for the next command."""
        with self._cv:
            self._closed = True
            pending, self._queue = self._queue, []
            self._cv.notify_all()
        for fut, _, _ in pending:
            fut.cancel()
        if self._conn is not None:
            self._conn.close()

    # -- calls ------------------------------------------------------------------------------------------
    def _submit(self, op: str, *args: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        with self._cv:
            if self._closed:
                fut.set_exception(BrokenProcessPool("the shared model connection is closed"))
                return fut
            self._queue.append((fut, op, args))
            self._cv.notify()
        return fut

    def _serve_calls(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                fut, op, args = self._queue.pop(0)
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(self._call(op, args))
            except BaseException as exc:
                fut.set_exception(exc)

    def _call(self, op: str, args: tuple[Any, ...]) -> Any:
        try:
            if self._conn is None:
                self._conn = self._connect()
            self._conn.send((op, args))
            status, value = self._conn.recv()
        except (EOFError, OSError) as exc:
            if not self.pid.done():
                self.pid.set_exception(BrokenProcessPool(str(exc)))
            raise BrokenProcessPool(f"the shared model process went away: {type(exc).__name__}: {exc}") from None
        if status == "error":
            raise value
        if op == "hello" and not self.pid.done():
            self.pid.set_result(int(value[0]))
            self._warm = bool(value[1])
        return value

    def _connect(self) -> Connection:
        """Connect, or start the server and connect: under a lock, so that commands started together start one."""
        key = _authkey(self.state)
        try:
            return Client(_address(self.key), family="AF_UNIX", authkey=key)
        except (ConnectionRefusedError, FileNotFoundError):
            pass
        with (self.state / f"{self.key}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                return Client(_address(self.key), family="AF_UNIX", authkey=key)
            except (ConnectionRefusedError, FileNotFoundError):
                pass
            proc = self._start_server()
            deadline = time.monotonic() + CONNECT_TIMEOUT_S
            while True:
                try:
                    return Client(_address(self.key), family="AF_UNIX", authkey=key)
                except (ConnectionRefusedError, FileNotFoundError):
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise BrokenProcessPool(f"the model server did not start (exit code {proc.poll()}); see "
                                                f"{self.state / (self.key + '.log')}") from None
                    time.sleep(0.05)

    def _start_server(self) -> subprocess.Popen[bytes]:
        spec_file = self.state / f"{self.key}.json"
        spec_file.write_text(json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in self.spec.items()}))
        log = (self.state / f"{self.key}.log").open("ab")
        with log:
            return subprocess.Popen(
                [sys.executable, "-m", "corpusync.adapters.model_server", "--key", self.key, "--state",
                 str(self.state), "--linger", str(self.linger_s)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True)


def _running(home: Path) -> list[tuple[Path, int]]:
    """The home's servers that run: (pid file, pid). A server killed with SIGKILL left its pid file, and its
    pid may be another process's by now: a pid counts only when its command line names the server's key."""
    found = []
    for pid_file in sorted((home / STATE_DIR).glob("*.pid")):
        try:
            pid = int(pid_file.read_text())
            if pid_file.stem.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append((pid_file, pid))
                continue
        except (ValueError, OSError):
            pass
        pid_file.unlink(missing_ok=True)
    return found


def server_status(home: Path) -> list[dict[str, Any]]:
    """The home's running servers (`corpusync model status`): pid and the embedder arguments they serve."""
    out = []
    for pid_file, pid in _running(home):
        try:
            spec = json.loads(pid_file.with_suffix(".json").read_text())
        except (OSError, ValueError):
            spec = {}
        out.append({"pid": pid, "key": pid_file.stem, "name": spec.get("name"), "device": spec.get("device"),
                    "model_dir": spec.get("model_dir")})
    return out


def stop_servers(home: Path) -> list[int]:
    """Stop the home's servers now (`corpusync model stop`); their pids."""
    import signal

    stopped = []
    for pid_file, pid in _running(home):
        try:
            os.kill(pid, signal.SIGTERM)
            stopped.append(pid)
        except ProcessLookupError:
            pass
        pid_file.unlink(missing_ok=True)
    return stopped


# -- the server -----------------------------------------------------------------------------------------------
class _Server:
    def __init__(self, key: str, state: Path, linger_s: float) -> None:
        self.key, self.state, self.linger_s = key, state, linger_s
        self.connections = 0
        self.counting = threading.Lock()
        self.idle_since = time.monotonic() + CONNECT_TIMEOUT_S  # the command that started it connects first
        self.lock = threading.Lock()  # the model runs one batch at a time
        self.ready = threading.Event()
        self.embedder: FlagEmbedder | None = None
        self.error: BaseException | None = None

    def build(self) -> None:
        """Import and build the embedder (the weights load at the first 'load' or batch)."""
        from corpusync.adapters.embedders import FlagEmbedder, preload_libraries, skip_training_imports

        try:
            skip_training_imports()
            preload_libraries()
            spec = json.loads((self.state / f"{self.key}.json").read_text())
            for k in ("model_dir", "cache_dir"):
                spec[k] = Path(spec[k]) if spec.get(k) not in (None, "None") else None
            self.embedder = FlagEmbedder(**spec)
        except BaseException as exc:  # answered to every request; the server leaves when they have gone
            self.error, self.linger_s = exc, 0.0
        self.ready.set()

    def answer(self, op: str, args: tuple[Any, ...]) -> Any:
        from corpusync.adapters.model_host import embed_in_host

        if op == "hello":
            return os.getpid(), self.ready.is_set() and self.embedder is not None
        self.ready.wait()
        if self.embedder is None:
            raise RuntimeError(f"the model server could not build its embedder: {self.error!r}")
        with self.lock:
            if op == "load":
                return self.embedder.load_model()
            if op == "devices":
                return list(self.embedder.devices)
            if op == "embed":
                return embed_in_host(self.embedder, args[0])
        raise ValueError(f"unknown request {op!r}")

    def serve(self, conn: Connection) -> None:
        """One command's connection, until it closes (the command ended, or was killed)."""
        with self.counting:
            self.connections += 1
        try:
            while True:
                try:
                    op, args = conn.recv()
                except (EOFError, OSError):
                    return
                try:
                    reply: tuple[str, Any] = ("ok", self.answer(op, args))
                except Exception as exc:
                    reply = ("error", exc if type(exc).__module__ == "builtins" else RuntimeError(str(exc)))
                try:
                    conn.send(reply)
                except (OSError, ValueError):
                    return
        finally:
            conn.close()
            with self.counting:
                self.connections -= 1
                self.idle_since = time.monotonic()

    def watch(self, exit_: Callable[[int], Any] = os._exit) -> None:
        while True:
            time.sleep(0.2)
            with self.counting:
                idle = self.connections == 0 and time.monotonic() - self.idle_since >= self.linger_s
            if idle:
                (self.state / f"{self.key}.pid").unlink(missing_ok=True)
                exit_(0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="corpusync's shared model server (started by the CLI)")
    ap.add_argument("--key", required=True)
    ap.add_argument("--state", type=Path, required=True)
    ap.add_argument("--linger", type=float, required=True)
    args = ap.parse_args(argv)
    try:
        listener = Listener(_address(args.key), family="AF_UNIX", authkey=_authkey(args.state))
    except OSError as exc:  # another server took the address first: it serves
        print(f"model server {args.key}: {exc}", file=sys.stderr)
        return
    server = _Server(args.key, args.state, args.linger)
    (args.state / f"{args.key}.pid").write_text(str(os.getpid()))
    threading.Thread(target=server.build, name="build", daemon=True).start()
    threading.Thread(target=server.watch, name="linger", daemon=True).start()
    while True:
        try:
            conn = listener.accept()
        except Exception as exc:  # a client that failed the key exchange, or went away during it
            print(f"model server {args.key}: refused a connection: {exc}", file=sys.stderr)
            continue
        threading.Thread(target=server.serve, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    main()
