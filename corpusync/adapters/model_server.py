"""The embedding model kept loaded between commands, as the local Prefect API server is (`model_linger_s`).

Each CLI command is a fresh process, and loading the model libraries and weights is most of a small command:
about 7 s of CPU for torch, transformers and FlagEmbedding on 2 cores, against well under a second to embed a
query or a 1% change. So the CLI's refreshes and queries share one model process per model and home: the first
command starts it (`python -m corpusync.adapters.model_serving`, in a session of its own so that it outlives
the command), later ones connect to it, and it exits `model_linger_s` seconds after the last connection
closed. A command killed with SIGKILL closes its connection with it (the kernel closes the socket), so
nothing outlives its linger time. `corpusync model stop` stops it at once.

A server serves one key: a hash of the home, the embedder's arguments, its model identity (the weights'
sha256 among it), the visible GPUs and this code's files, so new weights or a new corpusync never talk to an
old server (which is stopped when its successor starts). It listens on a Unix socket in <home>/model-server,
a folder only its owner may enter; both ends check the other is the same user (SO_PEERCRED) and prove they
hold the home's key (mode 0600) before anything is unpickled. A batch crosses as its texts and comes back as
its vectors.

The client is a `ModelProcess`, as the per-command model process is: a server that cannot be reached, goes
away or could not build its embedder raises BrokenProcessPool, and the embedder then runs the model in its
own process (where a real configuration error is then raised as itself) and says why.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import secrets
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corpusync.adapters.embedders import FlagEmbedder
    from corpusync.adapters.embedding import EmbeddingOutput

STATE_DIR = "model-server"
START_TIMEOUT_S = 30.0  # for a server just started to listen (it listens before it imports anything)
HANDSHAKE_TIMEOUT_S = 10.0  # a peer that connects and says nothing does not hold the other end
WARM_CHECK_S = 2.0  # how long `warm` waits for the server's first answer
_GPU_VARIABLES = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
_MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes


def supported() -> bool:
    """Unix sockets with SO_PEERCRED are Linux's; elsewhere each command has a model process of its own."""
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
    identity hash holds their sha256), same visible GPUs, same code."""
    package = Path(__file__).resolve().parents[1]  # all of corpusync: the server runs its core modules too
    code = sorted((p.relative_to(package).as_posix(), p.stat().st_mtime_ns, p.stat().st_size)
                  for p in package.rglob("*.py"))
    blob = json.dumps({"home": str(home.resolve()), "spec": {k: str(v) for k, v in spec.items()},
                       "identity": identity_hash, "code": code, "python": sys.executable,
                       "gpus": [os.environ.get(v) for v in _GPU_VARIABLES]}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _private_dir(path: Path) -> Path:
    """`path` created mode 0700; refused unless this user owns it and nobody else may enter it."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(f"{path} must belong to this user with mode 0700 (it holds the model server's key)")
    return path


def socket_path(state: Path, key: str) -> Path:
    """The server's socket: in the home's private folder, or a private folder under the temporary directory
    when that path would be too long for a Unix socket."""
    path = state.resolve() / f"{key}.sock"
    if len(os.fsencode(path)) <= _MAX_SOCKET_PATH:
        return path
    return _private_dir(Path(tempfile.gettempdir()) / f"corpusync-{os.getuid()}") / f"{key}.sock"


def authkey(state: Path) -> bytes:
    """The home's connection key, created once (written whole, then linked into place: a command that loses
    the race reads the winner's complete key)."""
    path = _private_dir(state) / "authkey"
    if not path.exists():
        fd, tmp = tempfile.mkstemp(dir=state, prefix=".authkey-")  # mode 0600
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(32))
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(f"{path} must belong to this user with mode 0600")
    return path.read_bytes()


def _peer_is_me(sock: socket.socket) -> bool:
    _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize("3i")))
    return bool(uid == os.getuid())


def _receive_timeout(fd: int, seconds: float) -> None:
    """SO_RCVTIMEO on the socket behind `fd` (0: none): a read past it fails instead of waiting forever."""
    with socket.socket(fileno=os.dup(fd)) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", int(seconds), 0))


def handshake(sock: socket.socket, authkey: bytes, server: bool) -> Connection:
    """Same user, then the key proved both ways (as multiprocessing's Listener and Client do), in bounded time."""
    if not _peer_is_me(sock):
        sock.close()
        raise PermissionError("the peer on the model server's socket is another user")
    conn = Connection(sock.detach())
    try:
        _receive_timeout(conn.fileno(), HANDSHAKE_TIMEOUT_S)
        if server:
            deliver_challenge(conn, authkey)
            answer_challenge(conn, authkey)
        else:
            answer_challenge(conn, authkey)
            deliver_challenge(conn, authkey)
        _receive_timeout(conn.fileno(), 0)
    except BaseException:
        conn.close()
        raise
    return conn


class SharedModel:
    """A connection to the home's model server for one embedder's arguments, starting the server when none
    answers. Calls run one at a time on a daemon thread of their own (a command never waits at exit for a call
    in flight), `load` without waiting for its answer."""

    def __init__(self, home: Path, spec: dict[str, Any], identity_hash: str, linger_s: float) -> None:
        spec = {k: v.resolve() if isinstance(v, Path) else v for k, v in spec.items()}  # the server's cwd differs
        self.home, self.spec, self.identity_hash, self.linger_s = home, spec, identity_hash, linger_s
        self.state = home.resolve() / STATE_DIR
        self.key = server_key(home, spec, identity_hash)
        self._conn: Connection | None = None
        self._queue: list[tuple[Future[Any], str, tuple[Any, ...]]] = []
        self._cv = threading.Condition()
        self._closed = False
        self._warm = False
        self._lost: str | None = None
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
        """Whether the server had its model libraries imported when this command connected. A running server
        answers within milliseconds; one still starting is not warm, so this waits WARM_CHECK_S at most."""
        try:
            self.pid.result(timeout=WARM_CHECK_S)
        except Exception:
            return False
        return self._warm

    def for_device(self, device: str) -> SharedModel:
        return SharedModel(self.home, {**self.spec, "device": device}, self.identity_hash, self.linger_s)

    def close(self) -> None:
        """Close this command's connection (the server lingers for the next command); calls not yet answered
        fail as a lost server does. A call waiting for its answer is woken by shutting the socket down."""
        with self._cv:
            self._closed = True
            pending, self._queue = self._queue, []
            self._cv.notify_all()
            conn = self._conn
        for fut, _, _ in pending:
            if fut.set_running_or_notify_cancel():
                fut.set_exception(BrokenProcessPool("the shared model connection was closed"))
        if conn is not None:
            try:
                with socket.socket(fileno=os.dup(conn.fileno())) as s:
                    s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # -- calls ------------------------------------------------------------------------------------------
    def _submit(self, op: str, *args: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        with self._cv:
            if self._closed:
                fut.set_exception(BrokenProcessPool("the shared model connection was closed"))
                return fut
            self._queue.append((fut, op, args))
            self._cv.notify()
        return fut

    def _serve_calls(self) -> None:
        try:
            while True:
                with self._cv:
                    while not self._queue and not self._closed:
                        self._cv.wait()
                    if self._closed:
                        return
                    fut, op, args = self._queue.pop(0)
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(self._call(op, args))
                    except BaseException as exc:
                        fut.set_exception(exc)
        finally:
            if self._conn is not None:
                self._conn.close()
            if not self.pid.done():
                self.pid.set_exception(BrokenProcessPool("closed before the server answered"))

    def _call(self, op: str, args: tuple[Any, ...]) -> Any:
        if self._lost is not None:  # once lost, lost: the embedder runs the model itself (no server loop)
            raise BrokenProcessPool(self._lost)
        for attempt in (1, 2):
            try:
                if self._conn is None:
                    self._conn = self._connect()
                self._conn.send((op, args))
                status, value = self._conn.recv()
                break
            except Exception as exc:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
                # a server leaving at the end of its linger as this command connected: start a new one
                if op == "hello" and attempt == 1 and not self._closed:
                    continue
                self._lost = f"the shared model server cannot be used: {type(exc).__name__}: {exc}"
                if not self.pid.done():
                    self.pid.set_exception(BrokenProcessPool(self._lost))
                raise BrokenProcessPool(self._lost) from None
        if status == "broken":  # it could not build the embedder: this process builds it and says why
            raise BrokenProcessPool(f"the shared model server could not build its embedder: {value}")
        if status == "error":
            raise value
        if op == "hello" and not self.pid.done():
            self.pid.set_result(int(value[0]))
            self._warm = bool(value[1])
        return value

    def _dial(self, path: Path, authkey: bytes) -> Connection:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(os.fspath(path))
        except BaseException:
            sock.close()
            raise
        return handshake(sock, authkey, server=False)

    def _connect(self) -> Connection:
        """Connect, or start the server and connect: under a lock, so that commands started together start one."""
        key, path = authkey(self.state), socket_path(self.state, self.key)
        try:
            return self._dial(path, key)
        except (ConnectionRefusedError, FileNotFoundError):
            pass
        with (self.state / f"{self.key}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                return self._dial(path, key)
            except (ConnectionRefusedError, FileNotFoundError):
                path.unlink(missing_ok=True)  # left by a server killed with SIGKILL
            proc = self._start_server(path)
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:
                try:
                    conn = self._dial(path, key)
                    break
                except (ConnectionRefusedError, FileNotFoundError):
                    if proc.poll() is not None or time.monotonic() > deadline:
                        proc.kill()  # too slow to listen: not left to linger beside the one the retry starts
                        raise BrokenProcessPool(f"the model server did not start (exit code {proc.poll()}); see "
                                                f"{self.state / (self.key + '.log')}") from None
                    time.sleep(0.05)
        if self._closed:
            conn.close()
            raise BrokenProcessPool("the shared model connection was closed")
        return conn

    def _start_server(self, path: Path) -> subprocess.Popen[bytes]:
        """Start this key's server (its code: the package this process imported, never the working folder's),
        after stopping the home's servers for the same model and device under another key (older code or
        weights: their memory, GPU memory included, would otherwise linger beside the new one's), and removing
        the arguments and logs of keys no server runs for."""
        running = {info["key"]: info for info in server_status(self.home)}
        for key, info in list(running.items()):
            if key != self.key and info["name"] == self.spec.get("name") and info["device"] == self.spec.get("device"):
                stop_servers(self.home, keys={key})
                del running[key]
        for stale in [*self.state.glob("*.json"), *self.state.glob("*.log")]:  # of keys no server runs for
            try:  # (a server starting now, another GPU's, has no pid file yet but a new .json)
                old = time.time() - stale.stat().st_mtime > 10 * START_TIMEOUT_S
            except OSError:
                continue
            if old and stale.stem not in running and stale.stem != self.key:
                stale.unlink(missing_ok=True)
        (self.state / f"{self.key}.json").write_text(
            json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in self.spec.items()}))
        log_path = self.state / f"{self.key}.log"
        mode = "ab" if log_path.exists() and log_path.stat().st_size < 1_000_000 else "wb"
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        with log_path.open(mode) as log:
            return subprocess.Popen(
                [sys.executable, "-P", "-m", "corpusync.adapters.model_serving", f"--key={self.key}",
                 f"--state={self.state}", f"--socket={path}", f"--linger={self.linger_s}"],
                cwd=self.state, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True, close_fds=True)


def _running(home: Path) -> list[tuple[Path, int]]:
    """The home's servers that run: (pid file, pid). A server killed with SIGKILL left its pid file, and its
    pid may be another process's by now: a pid counts only when its command line names the server's key."""
    found = []
    for pid_file in sorted((home.resolve() / STATE_DIR).glob("*.pid")):
        try:
            pid = int(pid_file.read_text())
            if f"--key={pid_file.stem}".encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
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


def stop_servers(home: Path, keys: set[str] | None = None) -> list[int]:
    """Stop the home's servers (those of `keys`, else all) now (`corpusync model stop`); their pids."""
    stopped = []
    for pid_file, pid in _running(home):
        if keys is not None and pid_file.stem not in keys:
            continue
        try:
            os.kill(pid, signal.SIGTERM)
            stopped.append(pid)
        except ProcessLookupError:
            pass
        pid_file.unlink(missing_ok=True)
    return stopped
