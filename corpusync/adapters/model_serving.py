"""The shared model server's own process (`python -m corpusync.adapters.model_serving`, started by
corpusync.adapters.model_server, which documents the design): listens first, then imports and builds the
embedder while the command that started it connects; serves each connection on a thread of its own, the
model one batch at a time; leaves once no connection has been open for its linger time."""

from __future__ import annotations

import argparse
import errno
import json
import os
import socket
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corpusync.adapters.model_server import START_TIMEOUT_S, authkey, handshake

if TYPE_CHECKING:
    from corpusync.adapters.embedders import FlagEmbedder


class Server:
    def __init__(self, key: str, state: Path, listener: socket.socket, path: Path, linger_s: float) -> None:
        self.key, self.state, self.listener, self.path, self.linger_s = key, state, listener, path, linger_s
        self.authkey = authkey(state)
        self.connections = 0
        self.counting = threading.Lock()  # connections, idle_since and the decision to leave
        self.idle_since = time.monotonic() + START_TIMEOUT_S  # the command that started it connects first
        self.model_lock = threading.Lock()  # the model runs one batch at a time
        self.ready = threading.Event()
        self.embedder: FlagEmbedder | None = None
        self.error: BaseException | None = None
        self.socket_inode = 0  # set once bound: the socket file this server may remove

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
        except BaseException as exc:  # each command builds it itself and meets the error there
            self.error, self.linger_s = exc, 0.0
            print(f"model server {self.key}: cannot build the embedder: {exc!r}", file=sys.stderr, flush=True)
        self.ready.set()

    def answer(self, op: str, args: tuple[Any, ...]) -> tuple[str, Any]:
        from corpusync.adapters.model_host import embed_in_host

        if op == "hello":
            return "ok", (os.getpid(), self.ready.is_set() and self.embedder is not None)
        self.ready.wait()
        if self.embedder is None:
            return "broken", repr(self.error)
        with self.model_lock:
            if op == "load":
                self.embedder.load_model()
                return "ok", None
            if op == "devices":
                return "ok", list(self.embedder.devices)
            if op == "embed":
                return "ok", embed_in_host(self.embedder, args[0])
        raise ValueError(f"unknown request {op!r}")

    def serve(self, sock: socket.socket) -> None:
        """One command's connection (counted by the accept loop), until it closes: the command ended, or was
        killed, or failed the handshake."""
        try:
            conn = handshake(sock, self.authkey, server=True)
        except Exception as exc:
            print(f"model server {self.key}: refused a connection: {exc!r}", file=sys.stderr, flush=True)
            self._release()
            return
        try:
            self._requests(conn)
        finally:
            conn.close()
            self._release()

    def _requests(self, conn: Connection) -> None:
        while True:
            try:
                op, args = conn.recv()
            except (EOFError, OSError):
                return
            try:
                reply = self.answer(op, args)
            except Exception as exc:  # a model error (embed_in_host made it a builtin one), or a bad request
                reply = ("error", exc if type(exc).__module__ == "builtins" else RuntimeError(str(exc)))
            try:
                conn.send(reply)
            except (OSError, ValueError):
                return
            except Exception as exc:  # an error whose arguments do not pickle
                try:
                    conn.send(("error", RuntimeError(f"{type(reply[1]).__name__}: {reply[1]} ({exc!r})")))
                except Exception:
                    return

    def _release(self) -> None:
        with self.counting:
            self.connections -= 1
            self.idle_since = time.monotonic()

    def accept_forever(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:  # closed: the server leaves
                return
            with self.counting:
                self.connections += 1
            threading.Thread(target=self.serve, args=(sock,), daemon=True).start()

    def linger(self) -> None:
        """Leave once idle for the linger time: stop listening first (under the lock the accept loop counts
        under, so a connection is either counted or refused; a refused command starts a new server)."""
        while True:
            time.sleep(0.2)
            with self.counting:
                if self.connections == 0 and time.monotonic() - self.idle_since >= self.linger_s:
                    self.listener.close()
                    self._remove_own_files()
                    os._exit(0)

    def _remove_own_files(self) -> None:
        """The socket and pid file, if still this server's: its home may have been deleted and recreated, and a
        successor (same key, same paths) started there."""
        try:
            if os.stat(self.path).st_ino == self.socket_inode:
                self.path.unlink()
        except OSError:
            pass
        pid_file = self.state / f"{self.key}.pid"
        try:
            if pid_file.read_text().strip() == str(os.getpid()):
                pid_file.unlink()
        except OSError:
            pass


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="corpusync's shared model server (started by the CLI)")
    ap.add_argument("--key", required=True)
    ap.add_argument("--state", type=Path, required=True)
    ap.add_argument("--socket", type=Path, required=True)
    ap.add_argument("--linger", type=float, required=True)
    args = ap.parse_args(argv)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(os.fspath(args.socket))
    except OSError as exc:
        print(f"model server {args.key}: cannot listen on {args.socket}: {exc}", file=sys.stderr, flush=True)
        sys.exit(0 if exc.errno == errno.EADDRINUSE else 1)  # in use: another server took it first, and serves
    listener.listen(64)
    server = Server(args.key, args.state, listener, args.socket, args.linger)
    server.socket_inode = os.stat(args.socket).st_ino
    (args.state / f"{args.key}.pid").write_text(str(os.getpid()))
    threading.Thread(target=server.build, name="build", daemon=True).start()
    threading.Thread(target=server.linger, name="linger", daemon=True).start()
    server.accept_forever()
    os._exit(0)


if __name__ == "__main__":
    main()
