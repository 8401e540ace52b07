"""The model server CLI commands share (corpusync/adapters/model_server.py): the same vectors as the model in
this process, one server per home and embedder that later commands reuse, gone after its linger time, a
killed server (fault injection: SIGKILL) costs nothing but a fallback, and only holders of the home's key
connect. Real model, real processes, real CLI commands."""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import subprocess
import sys
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from corpusync.adapters import model_server
from corpusync.adapters.embedders import FlagEmbedder
from tasks.embed import encode_texts
from tests.conftest import REPO, small_corpus

pytestmark = pytest.mark.skipif(not model_server.supported(), reason="abstract Unix sockets are Linux's")

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
    first = _shared(embedder, tmp_path, linger_s=3.0)
    try:
        out = encode_texts(first, TEXTS, token_budget=512)
        np.testing.assert_allclose(out.dense, ref.dense, atol=1e-5)
        assert "model" not in first.__dict__  # nothing loaded in this process
        host = first._host
        assert isinstance(host, model_server.SharedModel)
        pid = host.pid.result(timeout=60)
        second = _shared(embedder, tmp_path, linger_s=3.0)  # the next command
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
    time.sleep(1.5)
    assert _alive(pid)  # lingers for the next command
    assert _gone_within(pid, 20.0)  # then leaves
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
        assert model_server.stop_servers(tmp_path) == [new_pid]
    assert _gone_within(new_pid, 10.0)


def test_a_server_per_home_arguments_weights_and_code(embedder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec, ident = embedder.spec, embedder.identity.identity_hash
    key = model_server.server_key(tmp_path, spec, ident)
    assert model_server.server_key(tmp_path, dict(spec), ident) == key
    assert model_server.server_key(tmp_path / "other", spec, ident) != key
    assert model_server.server_key(tmp_path, {**spec, "device": "cuda:1"}, ident) != key
    assert model_server.server_key(tmp_path, {**spec, "max_tokens": 64}, ident) != key
    assert model_server.server_key(tmp_path, spec, "0" * 64) != key  # other weights


def test_only_the_homes_key_connects(embedder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    e = _shared(embedder, tmp_path, linger_s=60.0)
    try:
        host = e._host
        assert isinstance(host, model_server.SharedModel)
        pid = host.pid.result(timeout=60)
        with pytest.raises(AuthenticationError):
            Client(model_server._address(host.key), family="AF_UNIX", authkey=b"not the home's key")
        assert _alive(pid) and e.count_tokens(["still served"])
        assert encode_texts(e, TEXTS[:2], token_budget=512).dense.shape[0] == 2
    finally:
        e.close_host()
        model_server.stop_servers(tmp_path)


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "corpusync.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_cli_refresh_and_queries_reuse_the_server_and_model_stop_ends_it(  # type: ignore[no-untyped-def]
        settings, tmp_path: Path) -> None:
    corpus = small_corpus(tmp_path / "corpus")
    env = dict(os.environ, CORPUSYNC_DATABASE_URL=settings.database_dsn(), CORPUSYNC_HOME=str(settings.home),
               CORPUSYNC_CHUNK_MAX_TOKENS=str(settings.chunk_max_tokens), CORPUSYNC_MODEL_LINGER_S="120",
               PREFECT_LOGGING_LEVEL="WARNING")
    env.pop("PREFECT_API_URL", None)

    def servers() -> list[dict[str, Any]]:
        return list(json.loads(_cli(env, "model", "status", "--json").stdout))

    try:
        _cli(env, "refresh", str(corpus), "-q")
        (started,) = servers()  # the refresh's model stays for the next command
        query = ("query", "Which team won Super Bowl 50?", "--mode", "dense", "-k", "3", "--json")
        shared = [json.loads(_cli(env, *query).stdout) for _ in range(2)]
        assert servers() == [started]  # both queries used it
        own = json.loads(_cli(env | {"CORPUSYNC_MODEL_LINGER_S": "0"}, *query).stdout)
        assert shared[0] == shared[1] and [(h["chunk_id"], round(h["score"], 5)) for h in shared[0]] == [
            (h["chunk_id"], round(h["score"], 5)) for h in own]
        assert servers() == [started]
    finally:
        assert _cli(env, "model", "stop").stdout.strip() in {"stopped 1", "not running"}
    assert servers() == []
    assert _gone_within(started["pid"], 10.0)
