"""The model server CLI commands share (corpusync/adapters/model_server.py): the same vectors as the model in
this process, one server per home and embedder that later commands reuse, gone after its linger time, a
killed server (fault injection: SIGKILL) costs nothing but a fallback, and only holders of the home's key
connect. Real model, real processes, real CLI commands."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from multiprocessing import AuthenticationError
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from corpusync.adapters import model_server
from corpusync.adapters.embedders import FlagEmbedder
from tasks.embed import encode_texts
from tests.conftest import REPO, small_corpus

pytestmark = pytest.mark.skipif(not model_server.supported(), reason="SO_PEERCRED and the model server are Linux's")

TEXTS = [f"Article {i}: the buyer pays within thirty days. " * (1 + i % 5) for i in range(24)] + [
    "第十二条 付款方式：买方应在收到发票后三十日内付款。", "", "Normans came from Normandy in France."]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat")
    return not (state.exists() and state.read_text().split(") ", 1)[1].startswith("Z"))


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.2)
    return False


def _shared(embedder: FlagEmbedder, home: Path, linger_s: float) -> FlagEmbedder:
    e = FlagEmbedder(**embedder.spec)
    assert model_server.share_model(e, home, linger_s)
    return e


def test_commands_share_one_server_with_the_same_vectors_until_it_lingers_out(  # type: ignore[no-untyped-def]
        embedder, tmp_path: Path) -> None:
    ref = encode_texts(embedder, TEXTS, token_budget=512)
    first = _shared(embedder, tmp_path, linger_s=10.0)
    try:
        out = encode_texts(first, TEXTS, token_budget=512)
        np.testing.assert_allclose(out.dense, ref.dense, atol=1e-5)
        assert "model" not in first.__dict__  # nothing loaded in this process
        host = first._host
        assert isinstance(host, model_server.SharedModel)
        pid = host.pid.result(timeout=60)
        second = _shared(embedder, tmp_path, linger_s=10.0)  # the next command
        try:
            assert second.host_warm and second._host.pid.result(timeout=60) == pid  # type: ignore[union-attr]
            np.testing.assert_allclose(encode_texts(second, TEXTS[:5], token_budget=512).dense, ref.dense[:5],
                                       atol=1e-5)
        finally:
            second.close_host()
        assert [s["pid"] for s in model_server.server_status(tmp_path)] == [pid]
        state = tmp_path / model_server.STATE_DIR
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
        assert stat.S_IMODE((state / "authkey").stat().st_mode) == 0o600
    finally:
        first.close_host()
    time.sleep(1.0)
    assert _alive(pid)  # lingers for the next command
    assert _gone_within(pid, 40.0)  # then leaves
    assert not model_server.socket_path(tmp_path / model_server.STATE_DIR, host.key).exists()
    assert model_server.server_status(tmp_path) == []


def test_a_killed_server_falls_back_and_the_next_command_starts_another(  # type: ignore[no-untyped-def]
        embedder, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ref = encode_texts(embedder, TEXTS, token_budget=512)
    e = _shared(embedder, tmp_path, linger_s=60.0)
    try:
        e.load_model()
        pid = e._host.pid.result(timeout=60)  # type: ignore[union-attr]
        os.kill(pid, signal.SIGKILL)  # fault injection: the server dies
        assert _gone_within(pid, 10.0)
        with caplog.at_level(logging.WARNING, logger="corpusync.embed"):
            out = encode_texts(e, TEXTS, token_budget=512)
        np.testing.assert_allclose(out.dense, ref.dense, atol=1e-5)
        assert not e.hosted and "model" in e.__dict__  # this process runs the model now
        assert any("model process failed" in r.getMessage() for r in caplog.records)
    finally:
        e.close_host()
    again = _shared(embedder, tmp_path, linger_s=60.0)
    try:
        new_pid = again._host.pid.result(timeout=60)  # type: ignore[union-attr]
        assert new_pid != pid and not again.host_warm  # a new server, still importing
        np.testing.assert_allclose(encode_texts(again, TEXTS[:3], token_budget=512).dense, ref.dense[:3],
                                   atol=1e-5)
    finally:
        again.close_host()
        stopped = model_server.stop_servers(tmp_path)
    assert stopped == [new_pid] and _gone_within(new_pid, 10.0)


def test_a_server_per_home_arguments_weights_and_gpus(  # type: ignore[no-untyped-def]
        embedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, ident = embedder.spec, embedder.identity.identity_hash
    key = model_server.server_key(tmp_path, spec, ident)
    assert model_server.server_key(tmp_path, dict(spec), ident) == key
    assert model_server.server_key(tmp_path / "other", spec, ident) != key
    assert model_server.server_key(tmp_path, {**spec, "device": "cuda:1"}, ident) != key
    assert model_server.server_key(tmp_path, {**spec, "max_tokens": 64}, ident) != key
    assert model_server.server_key(tmp_path, spec, "0" * 64) != key  # other weights
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert model_server.server_key(tmp_path, spec, ident) != key  # other GPUs in sight


def test_only_the_homes_key_connects_and_a_refused_command_runs_the_model_itself(  # type: ignore[no-untyped-def]
        embedder, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    e = _shared(embedder, tmp_path, linger_s=60.0)
    try:
        host = e._host
        assert isinstance(host, model_server.SharedModel)
        pid = host.pid.result(timeout=60)
        path = model_server.socket_path(host.state, host.key)
        assert stat.S_ISSOCK(path.stat().st_mode) and path.parent.stat().st_uid == os.getuid()
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700  # the home's folder, or /tmp/corpusync-UID
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(path))
        with pytest.raises(AuthenticationError):
            model_server.handshake(sock, b"not the home's key", server=False)
        assert _alive(pid) and encode_texts(e, TEXTS[:2], token_budget=512).dense.shape[0] == 2  # still served

        (host.state / "authkey").unlink()  # a new key (the folder was recreated): the old server refuses it
        with caplog.at_level(logging.WARNING, logger="corpusync.embed"):
            refused = _shared(embedder, tmp_path, linger_s=60.0)
            try:
                out = encode_texts(refused, TEXTS[:3], token_budget=512)
                assert not refused.hosted and "model" in refused.__dict__  # ran here, and said why
            finally:
                refused.close_host()
        np.testing.assert_allclose(out.dense, encode_texts(embedder, TEXTS[:3], token_budget=512).dense, atol=1e-5)
        assert any("model process failed" in r.getMessage() for r in caplog.records)
    finally:
        e.close_host()
        model_server.stop_servers(tmp_path)


def test_commands_started_together_start_one_server_and_new_weights_replace_it(  # type: ignore[no-untyped-def]
        embedder, tmp_path: Path) -> None:
    old = [model_server.SharedModel(tmp_path, embedder.spec, "0" * 64, 60.0) for _ in range(3)]  # "old weights"
    try:
        (pid,) = {m.pid.result(timeout=60) for m in old}
    except BaseException:
        model_server.stop_servers(tmp_path)
        raise
    finally:
        for m in old:
            m.close()
    state = tmp_path / model_server.STATE_DIR
    hour_ago = time.time() - 3600
    for name in (f"{old[0].key}.json", f"{old[0].key}.log"):
        os.utime(state / name, (hour_ago, hour_ago))
    (state / ("f" * 24 + ".json")).write_text("{}")  # another GPU's server, starting now: kept
    new = model_server.SharedModel(tmp_path, embedder.spec, embedder.identity.identity_hash, 60.0)
    try:
        new_pid = new.pid.result(timeout=60)
        assert new_pid != pid and _gone_within(pid, 10.0)  # the old weights' server does not linger beside it
        assert [s["pid"] for s in model_server.server_status(tmp_path)] == [new_pid]
        files = {p.name for p in state.iterdir()}
        assert f"{old[0].key}.json" not in files and f"{old[0].key}.log" not in files  # nothing piles up per key
        assert f"{new.key}.json" in files and "f" * 24 + ".json" in files
    finally:
        new.close()
        model_server.stop_servers(tmp_path)


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "corpusync.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_cli_refresh_and_queries_reuse_the_server_and_model_stop_ends_it(  # type: ignore[no-untyped-def]
        prefect_harness, settings, tmp_path: Path) -> None:
    from prefect.settings import PREFECT_API_URL

    corpus = small_corpus(tmp_path / "corpus")
    env = dict(os.environ, CORPUSYNC_DATABASE_URL=settings.database_dsn(), CORPUSYNC_HOME=str(settings.home),
               CORPUSYNC_CHUNK_MAX_TOKENS=str(settings.chunk_max_tokens), CORPUSYNC_MODEL_LINGER_S="120",
               PREFECT_LOGGING_LEVEL="WARNING", PREFECT_API_URL=str(PREFECT_API_URL.value()))  # the session's API

    def servers() -> list[dict[str, Any]]:
        return list(json.loads(_cli(env, "model", "status", "--json").stdout))

    try:
        _cli(env, "refresh", str(corpus), "-q")
        (started,) = servers()  # the refresh's model stays for the next command
        query = ("query", "Which team won Super Bowl 50?", "--mode", "dense", "-k", "3", "--json")
        runs = [_cli(env, *query) for _ in range(2)]
        assert not any("model process failed" in r.stderr for r in runs)  # served, not loaded by the command
        shared = [json.loads(r.stdout) for r in runs]
        assert servers() == [started]  # both queries used it
        own = json.loads(_cli(env | {"CORPUSYNC_MODEL_LINGER_S": "0"}, *query).stdout)
        assert shared[0] == shared[1] and [(h["chunk_id"], round(h["score"], 5)) for h in shared[0]] == [
            (h["chunk_id"], round(h["score"], 5)) for h in own]
        assert servers() == [started]
    finally:
        stopped = _cli(env, "model", "stop").stdout.strip()
    assert stopped == "stopped 1" and servers() == []
    assert _gone_within(started["pid"], 10.0)
