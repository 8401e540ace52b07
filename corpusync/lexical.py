"""Text for Postgres full-text search without a Chinese extension: jieba segments CJK runs into words
separated by spaces, so the built-in 'simple' configuration indexes them as lexemes. The same function
runs at index time and at query time."""

from __future__ import annotations

import logging
import re
import unicodedata
from collections.abc import Sequence
from functools import cache
from typing import Any

_CJK_RUN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
# Identifiers like HT2023-0876 or ISO-9001:2015 stay one token (and their parts are added too).
_WORD = re.compile(r"[0-9A-Za-z\u00c0-\u024f]+(?:[-_./:][0-9A-Za-z\u00c0-\u024f]+)*")

# Function words that match nearly every chunk and so only add noise to an OR query.
STOPWORDS = frozenset(
    (
        "的 了 和 是 在 与 及 或 等 之 其 为 对 由 于 以 而 也 就 都 这 那 有 中 上 下 "
        "将 被 把 从 向 到 个 么 吗 呢 吧 "
        "a an the of to in on at for and or is are was were be been by with as from that this it its "
        "what which who whom when where why how did does do"
    ).split()
)


@cache
def _jieba() -> Any:
    import jieba

    jieba.setLogLevel(logging.WARNING)
    jieba.initialize()
    return jieba


def tokens(text: str, *, for_query: bool = False) -> list[str]:
    """Lower-cased search tokens: jieba words for CJK, whole identifiers plus their parts otherwise."""
    text = unicodedata.normalize("NFKC", text).lower()
    out: list[str] = []
    pos = 0
    for m in _CJK_RUN.finditer(text):
        out.extend(_latin_tokens(text[pos : m.start()]))
        jb = _jieba()
        words = jb.cut(m.group(0)) if for_query else jb.cut_for_search(m.group(0))
        out.extend(w for w in words if w.strip())
        pos = m.end()
    out.extend(_latin_tokens(text[pos:]))
    if for_query:
        out = [t for t in out if t not in STOPWORDS]
    return out


def _latin_tokens(text: str) -> list[str]:
    out: list[str] = []
    for m in _WORD.finditer(text):
        word = m.group(0)
        out.append(word)
        if any(ch in word for ch in "-_./:"):
            out.extend(p for p in re.split(r"[-_./:]", word) if p)
    return out


def index_text(text: str) -> str:
    """What goes into chunks.search_text (to_tsvector('simple', ...) makes the lexemes)."""
    return " ".join(tokens(text))


def index_texts(texts: Sequence[str], processes: int = 1, *, min_per_process: int = 1000) -> list[str]:
    """index_text for many texts. jieba is pure Python (about 2,000 chunks/s on one core), as slow as a GPU
    embeds; with processes > 1 and enough texts it runs in a pool of spawned processes, in order."""
    processes = min(processes, len(texts) // min_per_process)
    if processes <= 1:
        return [index_text(t) for t in texts]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")  # never fork a process that runs torch and Prefect threads
    with ProcessPoolExecutor(max_workers=processes, mp_context=ctx, initializer=_jieba) as pool:
        return list(pool.map(index_text, texts, chunksize=max(1, min(256, len(texts) // (4 * processes)))))


def default_processes() -> int:
    """Segmentation processes when not configured: the cores beyond the first, at most 8."""
    import os

    return max(1, min(8, (os.cpu_count() or 1) - 1))


def query_terms(text: str) -> list[str]:
    """Distinct query lexemes, in order."""
    seen: dict[str, None] = {}
    for t in tokens(text, for_query=True):
        seen.setdefault(t, None)
    return list(seen)
