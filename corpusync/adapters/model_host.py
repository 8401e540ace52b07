"""The embedding model in a process of its own, for a refresh that starts in a fresh process (the CLI).

A small refresh started from the CLI is short of interpreter time, not of cores: torch, transformers and
FlagEmbedding cost about 7 s of imports, which ran under one interpreter lock with Prefect's flow machinery,
the parse feed and the chunker. In a process of its own the model imports and loads on the other core while
the refresh finds its plan, parses and chunks, and the refresh process never imports torch at all (the
chunker counts with corpusync.core.fast_tokenizer). A batch crosses as its texts and comes back as its vectors
(a few kB a chunk). The host builds the same FlagEmbedder from the same arguments, so vectors are the ones
the refresh process would have computed.

The host only ever runs the model over our own chunk texts, so a dead host is not a bad-input matter: the
embedder goes back to running the model in the refresh process and says why. Errors of the model itself
(CUDA out of memory above all, which the caller answers with smaller batches) come back as errors.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from corpusync.adapters.embedders import FlagEmbedder, preload_libraries, skip_training_imports
from corpusync.adapters.embedding import EmbeddingOutput
from corpusync.core.lifetime import watch_parent

_hosts: set[ModelHost] = set()
_hosts_lock = threading.Lock()


def host_model(embedder: FlagEmbedder) -> bool:
    """Give `embedder` a model process of its own, started now (see the module's docstring); False when it
    cannot have one (its model is already loaded here, or a fault was injected into it)."""
    if not embedder.can_host:
        return False
    embedder.attach_host(ModelHost(embedder.spec))
    return True


class ModelHost:
    """One model process: imports at once, loads the weights when asked (or at the first batch). A call
    raises BrokenProcessPool when the process died (the embedder then runs the model itself)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.pool = ProcessPoolExecutor(max_workers=1, initializer=_init, initargs=(os.getpid(), spec),
                                        mp_context=mp.get_context("spawn"))  # never fork a process with threads
        self.started: Future[None] = self.pool.submit(_noop)  # the process starts (and imports) now
        self.loaded: Future[None] | None = None
        with _hosts_lock:
            if not _hosts:
                atexit.register(close_all)
            _hosts.add(self)

    def load(self) -> None:
        """Load the weights now, in the host (returns at once)."""
        if self.loaded is None:
            self.loaded = self.pool.submit(_load)

    @property
    def warm(self) -> bool:
        """A new process: it imports torch and the model libraries first."""
        return False

    def devices(self) -> list[str]:
        """The devices the host's embedder would use (it imports torch to count GPUs: we do not)."""
        return self.pool.submit(_devices).result()

    def embed(self, texts: Sequence[str]) -> EmbeddingOutput:
        return self.pool.submit(_embed, list(texts)).result()

    def for_device(self, device: str) -> ModelHost:
        """Another process with the same model, on `device` (one per GPU, as in-process replicas are)."""
        return ModelHost({**self.spec, "device": device})

    def close(self) -> None:
        """Stop the host now. Its process is killed rather than asked to finish what it was handed (an import
        of seconds, a weight load): the pool's manager thread, which this process joins before it exits, would
        wait for that. The host holds nothing to save: results already came back. Also when it is already gone."""
        with _hosts_lock:
            _hosts.discard(self)
        running = getattr(self.pool, "_processes", None)  # pid -> Process; the pool offers no kill before 3.14
        processes = list(running.values()) if isinstance(running, dict) else []
        self.pool.shutdown(wait=False, cancel_futures=True)
        for proc in processes:
            if proc.is_alive():
                proc.kill()


def close_all() -> None:
    """Close every host of this process (before it exits: the pools' threads are joined then)."""
    with _hosts_lock:
        hosts = list(_hosts)
    for host in hosts:
        host.close()


# -- in the host process ---------------------------------------------------------------------------------
_embedder: FlagEmbedder | None = None
_init_error: BaseException | None = None


def _init(parent: int, spec: dict[str, Any]) -> None:
    """The host's initializer: tied to its refresh's life, then the embedder and its imports. Never raises
    (that would break the pool); a failure is raised by the first call instead."""
    global _embedder, _init_error
    watch_parent(parent)
    # leave without the interpreter's teardown of torch's modules (seconds, which the refresh would wait for
    # as it joins the pool): this runs once the pool has told the process to exit, after the last result
    atexit.register(os._exit, 0)
    skip_training_imports()
    try:
        preload_libraries()
        _embedder = FlagEmbedder(**spec)
    except BaseException as exc:  # re-raised by the first call
        _init_error = exc


def _ready() -> FlagEmbedder:
    if _embedder is None:
        raise RuntimeError(f"the model process could not start its embedder: {_init_error!r}") from _init_error
    return _embedder


def _noop() -> None:
    return None


def _load() -> None:
    _ready().load_model()


def _devices() -> list[str]:
    return list(_ready().devices)


def _embed(texts: list[str]) -> EmbeddingOutput:
    return embed_in_host(_ready(), texts)


def embed_in_host(embedder: FlagEmbedder, texts: list[str]) -> EmbeddingOutput:
    """One batch in a model process (this one's, or the shared server's): an error of the model crosses
    back as a RuntimeError naming its type."""
    try:
        return embedder.embed(texts)
    except Exception as exc:
        if type(exc).__module__ == "builtins":
            raise
        # a torch error would need torch to be unpickled on the other side: its type and text cross as a
        # RuntimeError, which is how tasks.embed.is_oom recognises an out-of-memory error
        if "out of memory" in str(exc).lower() or type(exc).__name__ == "OutOfMemoryError":
            _empty_cuda_cache()
        raise RuntimeError(f"{type(exc).__name__}: {exc}") from None


def _empty_cuda_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
