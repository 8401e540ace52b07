"""The model in a process of its own (corpusync/adapters/model_host.py) and token counts from tokenizer.json
(corpusync/core/fast_tokenizer.py): the same counts, offsets and vectors as transformers and the in-process model,
a host killed mid-run (fault injection: SIGKILL) falls back to the in-process model and loses nothing, and a
CLI refresh never imports torch in its own process."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from corpusync.adapters import model_host
from corpusync.adapters.embedders import FlagEmbedder
from corpusync.core.fast_tokenizer import FastTokenizer
from tasks.embed import EmbedStats, encode_texts, is_oom
from tests.conftest import REPO, SAMPLE

TEXTS = ["The seller ships within 14 days.", "第十二条 付款方式：买方应在收到发票后三十日内付款。",
         "Ｆｕｌｌｗｉｄｔｈ ＡＢＣ, ﬁ ligatures, café naïve", "emoji 😀 and a zero\u200bwidth space", "",
         "Normans came from Normandy in France. " * 30]


def _sample_texts() -> list[str]:
    texts = list(TEXTS)
    for p in sorted(SAMPLE.rglob("*")):
        if p.suffix in {".md", ".txt"} and p.name != "SOURCE.md":
            text = p.read_text(encoding="utf-8")
            texts += [text, text[:400], text.upper()[:400]]
    return texts


def test_tokenizer_json_counts_and_offsets_equal_transformers(embedder) -> None:  # type: ignore[no-untyped-def]
    """The chunker's counts come from tokenizer.json; the model's input from transformers' tokenizer."""
    assert isinstance(embedder.counter, FastTokenizer)
    hf = embedder.tokenizer
    texts = _sample_texts()
    assert len(texts) > 40
    expected = [len(ids) for ids in hf(texts, add_special_tokens=True, truncation=False)["input_ids"]]
    assert embedder.count_tokens(texts) == expected
    assert max(expected) > 512  # the file's own truncation (128 for MiniLM) is off, as with transformers
    for text in texts:
        enc = hf(text, add_special_tokens=False, return_offsets_mapping=True, truncation=False)
        assert embedder.token_offsets(text) == [tuple(o) for o in enc["offset_mapping"]]
    assert embedder.counter.unk_token_id == hf.unk_token_id
    words = ["合同", "payment", "café", "𠀀", "HT2023-0876"]
    assert embedder.counter.ids(words) == hf(words, add_special_tokens=False, truncation=False)["input_ids"]


def test_a_model_folder_without_tokenizer_json_keeps_transformers(tmp_path: Path, embedder) -> None:  # type: ignore[no-untyped-def]
    assert FastTokenizer.load(tmp_path) is None


def _host_pid(e: FlagEmbedder) -> int:
    host = e._host
    assert isinstance(host, model_host.ModelHost)
    host.started.result(timeout=300)
    (pid,) = host.pool._processes  # type: ignore[attr-defined]
    return int(pid)


def test_hosted_model_gives_the_same_vectors_and_survives_a_killed_host(  # type: ignore[no-untyped-def]
        embedder, caplog: pytest.LogCaptureFixture) -> None:
    texts = [f"Article {i}: the buyer pays within thirty days. " * (1 + i % 7) for i in range(40)] + TEXTS[:-2]
    ref = encode_texts(embedder, texts, token_budget=512)
    hosted = FlagEmbedder(**embedder.spec)
    assert model_host.host_model(hosted) and not model_host.host_model(hosted)  # one host
    try:
        assert hosted.hosted and hosted.devices == embedder.devices
        hosted.load_model()  # in the host: returns at once
        stats = EmbedStats()
        out = encode_texts(hosted, texts, token_budget=512, stats=stats)
        np.testing.assert_allclose(out.dense, ref.dense, atol=1e-5)
        assert hosted.calls == stats.batches > 1
        assert "model" not in hosted.__dict__ and "tokenizer" not in hosted.__dict__  # nothing loaded here
        # the same vectors without scikit-learn (installed, training-only): none of its libraries mapped there
        maps = Path(f"/proc/{_host_pid(hosted)}/maps")
        if maps.exists():
            assert "torch" in maps.read_text() and "sklearn" not in maps.read_text()

        os.kill(_host_pid(hosted), signal.SIGKILL)  # fault injection: the model process dies
        with caplog.at_level(logging.WARNING, logger="corpusync.embed"):
            again = encode_texts(hosted, texts, token_budget=512)
        np.testing.assert_allclose(again.dense, ref.dense, atol=1e-5)
        assert not hosted.hosted and "model" in hosted.__dict__
        assert any("model process failed" in r.getMessage() for r in caplog.records)
    finally:
        hosted.close_host()


class OutOfMemoryError(RuntimeError):
    """Named as torch's is (a class the other process may not be able to unpickle)."""


class _Failing:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def embed(self, texts: list[str]) -> None:
        raise self.exc


def test_model_errors_cross_as_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    """In the host: an out-of-memory error of the model comes back as one the caller halves batches for; a
    builtin error as itself; an embedder that could not be built as an error naming the cause."""
    monkeypatch.setattr(model_host, "_empty_cuda_cache", lambda: None)
    monkeypatch.setattr(model_host, "_embedder", _Failing(OutOfMemoryError("CUDA out of memory. Tried 2 GiB")))
    with pytest.raises(RuntimeError) as oom:
        model_host._embed(["x"])
    assert type(oom.value) is RuntimeError and is_oom(oom.value) and "OutOfMemoryError" in str(oom.value)
    monkeypatch.setattr(model_host, "_embedder", _Failing(ValueError("bad input")))
    with pytest.raises(ValueError, match="bad input"):
        model_host._embed(["x"])
    monkeypatch.setattr(model_host, "_embedder", None)
    monkeypatch.setattr(model_host, "_init_error", ImportError("no module named torch"))
    with pytest.raises(RuntimeError, match=r"could not start its embedder.*no module named torch"):
        model_host._embed(["x"])


@pytest.mark.db
@pytest.mark.flow
def test_a_cli_refresh_never_imports_torch_in_its_own_process(prefect_harness, settings,  # type: ignore[no-untyped-def]
                                                              corpus: Path) -> None:
    from prefect.settings import PREFECT_API_URL

    # and its validation worker is stopped as the command ends (the exit would wait out the worker's linger)
    code = ("import sys, json\n"
            "from corpusync import cli\n"
            "from tasks import validate_worker\n"
            "rc = cli.main(sys.argv[1:])\n"
            "print(json.dumps({'rc': rc, 'torch': 'torch' in sys.modules,"
            " 'transformers': 'transformers' in sys.modules, 'validation': validate_worker._worker is not None}))\n")
    env = {**os.environ, "CORPUSYNC_DATABASE_URL": settings.database_dsn(),
           "CORPUSYNC_CHUNK_MAX_TOKENS": str(settings.chunk_max_tokens),
           "PREFECT_API_URL": str(PREFECT_API_URL.value())}  # the session's API, not one of its own
    proc = subprocess.run([sys.executable, "-c", code, "--home", str(settings.home), "refresh", str(corpus), "--json",
                           "-q"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary_text, _, last = proc.stdout.rstrip().rpartition("\n")
    summary, after = json.loads(summary_text), json.loads(last)
    assert summary["status"] == "published" and summary["chunks"]["embedded"] > 0
    assert after == {"rc": 0, "torch": False, "transformers": False, "validation": False}, proc.stderr[-3000:]


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def test_closing_stops_hosts_at_once_replicas_included_and_a_dead_host_is_not_an_error(embedder) -> None:  # type: ignore[no-untyped-def]
    """close() does not wait for what the host was doing (this process joins the pool's thread before it
    exits); an embedder's replicas for other devices are closed with it; a host that died before the weights
    were asked for leaves the load to this process instead of failing the refresh."""
    import threading

    busy = model_host.ModelHost(embedder.spec)  # still importing torch
    (pid,) = busy.pool._processes  # type: ignore[attr-defined]
    manager = busy.pool._executor_manager_thread  # type: ignore[attr-defined]
    assert isinstance(manager, threading.Thread) and manager.is_alive()
    busy.close()
    assert _gone(pid, 5.0)
    # only this host's thread: other pools (a validation worker an earlier test released) may linger
    manager.join(timeout=5.0)
    assert not manager.is_alive()

    multi = FlagEmbedder(**{**embedder.spec, "device": "cpu,cpu"})
    assert model_host.host_model(multi)
    workers = multi.workers()
    assert len(workers) == 2 and all(w.hosted for w in workers)
    pids = [_host_pid(w) for w in workers]
    assert len(set(pids)) == 2
    multi.close_host()
    assert not any(w.hosted for w in workers) and all(_gone(p, 5.0) for p in pids)

    lost = FlagEmbedder(**embedder.spec)
    assert model_host.host_model(lost)
    host = lost._host
    assert isinstance(host, model_host.ModelHost)
    os.kill(_host_pid(lost), signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not host.pool._broken and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.05)  # the pool's thread notices the death
    lost.load_model()  # the pool is broken now: no error, the model loads here at first use
    assert not lost.hosted and "model" not in lost.__dict__
