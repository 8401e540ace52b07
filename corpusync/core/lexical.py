"""The tokenizer behind the Okapi BM25 lexical channel. The same token lists are written at index time, parsed
from queries and fed to a bm25s reference in tests, so every rule here is deterministic and versioned: any
change to the rules (these, and the script classes and normalize() of corpusync.core.unicode_text) bumps
TOKENIZER_VERSION, and dictionary contents go into `Analyzer.fingerprint`. The query syntax Analyzer.query
parses lives in corpusync.core.query_syntax."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from functools import cache, lru_cache
from itertools import pairwise
from pathlib import Path
from typing import Any, Literal

from corpusync.core.errors import ConfigError
from corpusync.core.query_syntax import STOPWORDS, ParsedQuery, parse_query
from corpusync.core.unicode_text import BIGRAM, CJK, MARKS, normalize

TOKENIZER_VERSION = "3"
MAX_TOKEN_CHARS = 64
QueryMode = Literal["cut", "search"]  # jieba cut (precise) or cut_for_search (also sub-words), as at index time

# Token patterns over the script classes of corpusync.core.unicode_text.
_X = f"[^\\W_{CJK}{BIGRAM}]"  # a letter or digit of a spaced script
_W = f"{_X}++(?:[{MARKS}]++{_X}*+)*+"  # unrolled and possessive: linear on a 5 MB word, no backtracking
_SEP = "-_./:"
_WORD = f"{_W}(?:[{re.escape(_SEP)}]{_W})*+"  # identifiers such as HT2023-0876, ISO-9001:2015, v1.2.3
_SCAN = re.compile(f"(?P<h>[{CJK}]+)|(?P<b>[{BIGRAM}]+)|(?P<w>{_WORD})")
_WORD_FULL = re.compile(_WORD)
_X_ONE = re.compile(_X)
_HAS_SEP = re.compile(f"[{re.escape(_SEP)}]").search
_SPLIT_SEP = re.compile(f"[{re.escape(_SEP)}]+").split
_HAS_MARK = re.compile(f"[{MARKS}]").search
_CLUSTER = re.compile(f"[^{MARKS}][{MARKS}]*|[{MARKS}]+")
_ALL_HAN = re.compile(f"[{CJK}]+")


@cache
def _jieba_base() -> Any:
    """A private, never modified jieba.Tokenizer; Analyzers with words of their own get a copy of its dict."""
    import jieba

    jieba.setLogLevel(logging.WARNING)
    tk = jieba.Tokenizer()
    tk.initialize()
    return tk


def _read(path: Path | None, what: str) -> bytes:
    if path is None:
        return b""
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the {what} file: {e}") from e


def _lines(path: Path | None, data: bytes, what: str) -> Iterable[tuple[int, str, str]]:
    """(line number, stripped line, location for messages) of non-blank, non-comment lines."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        at = data[: e.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{at}: {what} file is not UTF-8") from e
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line and not line.startswith("#"):
            yield n, line, f"{path}:{n}"


def _literal(word: str) -> str:
    """A user word jieba never sees (not all Han, e.g. c++ or t恤) as a pattern that will not match mid-word."""
    pat = re.escape(word)
    if _X_ONE.match(word[0]):
        pat = f"(?<!{_X}){pat}"
    if _X_ONE.match(word[-1]):
        pat = f"{pat}(?!{_X})"
    return pat


class _State:
    """What an Analyzer's files compile to: built once per fingerprint and process (jieba's dict is ~15 MB)."""

    def __init__(self, lex_path: Path | None, lex: bytes, syn_path: Path | None, syn: bytes) -> None:
        words: list[tuple[str, int | None, str | None]] = []
        patterns: list[str] = []
        for _n, line, where in _lines(lex_path, lex, "lexicon"):
            if line.startswith("re:"):
                try:
                    if re.compile(line[3:], re.IGNORECASE).fullmatch(""):
                        raise ConfigError(f"{where}: pattern {line[3:]!r} matches the empty string")
                except re.error as e:
                    raise ConfigError(f"{where}: bad pattern {line[3:]!r}: {e}") from e
                patterns.append(line[3:])
                continue
            parts = line.split()
            freq = int(parts.pop(1)) if len(parts) > 1 and parts[1].isdigit() else None
            if len(parts) > 2 or freq == 0:
                raise ConfigError(f"{where}: expected 'word [freq>0] [tag]', got {line!r}")
            words.append((normalize(parts[0]), freq, parts[1] if len(parts) > 1 else None))
        self.synonyms: dict[str, str] = {}
        first_line: dict[str, int] = {}
        for n, line, where in _lines(syn_path, syn, "synonyms"):
            group = [t for t in (normalize(e) for e in re.split("[,，]", line)) if t]
            for term in group:
                if len(term) > MAX_TOKEN_CHARS or term.startswith("-") or any(c.isspace() or c == '"' for c in term):
                    raise ConfigError(f"{where}: {term!r} cannot be one token (space, quote, leading '-' or long)")
                if self.synonyms.get(term, group[0]) != group[0]:
                    raise ConfigError(f"{where}: {term!r} is already in the group of line {first_line[term]}")
                self.synonyms[term] = group[0]
                first_line.setdefault(term, n)
                words.append((term, None, None))
        for word, _freq, _tag in words:
            if not _ALL_HAN.fullmatch(word) and not _WORD_FULL.fullmatch(word):
                patterns.append(_literal(word))
        self._han = [w for w in words if _ALL_HAN.fullmatch(w[0]) and len(w[0]) > 1]
        self._jieba: Any = None
        self._jieba_lock = threading.Lock()
        self.user_re: re.Pattern[str] | None = None
        if patterns:
            try:
                self.user_re = re.compile("|".join(f"(?:{p})" for p in patterns), re.IGNORECASE)
            except re.error as e:
                raise ConfigError(f"{lex_path}: the re: patterns cannot be combined (use (?i:...) flags): {e}") from e


    @property
    def jieba(self) -> Any:
        """jieba with the lexicon's Chinese words, loaded at the first Chinese text (its dictionary costs about a
        second of CPU, which text without Han characters, or a check that only needs the fingerprint, never pays)."""
        if self._jieba is None:
            with self._jieba_lock:
                if self._jieba is None:
                    self._jieba = self._load_jieba()
        return self._jieba

    def _load_jieba(self) -> Any:
        base = _jieba_base()
        if not self._han:
            return base
        import jieba

        tk = jieba.Tokenizer()
        tk.FREQ, tk.total, tk.initialized = dict(base.FREQ), base.total, True
        for word, freq, tag in self._han:
            tk.add_word(word, freq, tag)
        return tk


_STATES: OrderedDict[str, _State] = OrderedDict()
_STATES_LOCK = threading.Lock()


class Analyzer:
    """Normalization and tokens for one lexicon + synonyms pair. Picklable: a spawned worker rebuilds jieba."""

    def __init__(self, lexicon: Path | None = None, synonyms: Path | None = None, *,
                 query_mode: QueryMode = "cut") -> None:
        if query_mode not in ("cut", "search"):
            raise ValueError(f"query_mode must be 'cut' or 'search', not {query_mode!r}")
        self.lexicon, self.synonyms, self.query_mode = lexicon, synonyms, query_mode
        self._lex, self._syn = _read(lexicon, "lexicon"), _read(synonyms, "synonyms")
        self._fingerprint = self._compute_fingerprint()
        self._state = self._build()

    @classmethod
    def from_settings(cls, settings: Any) -> Analyzer:
        """One Analyzer per (file, content) pair: cheap to call per query or per batch."""
        lex, syn = settings.lexicon, settings.synonyms
        lex_sha, syn_sha = (hashlib.sha256(_read(p, "dictionary")).hexdigest() for p in (lex, syn))
        return _cached_analyzer(lex, lex_sha, syn, syn_sha)

    def _compute_fingerprint(self) -> str:
        import jieba
        import opencc

        h = hashlib.sha256()
        for part in (TOKENIZER_VERSION, jieba.__version__, getattr(opencc, "__version__", "?"),
                     unicodedata.unidata_version, " ".join(sorted(STOPWORDS))):
            h.update(f"{len(part.encode())}:{part}".encode())
        for data in (self._lex, self._syn):
            h.update(f"{len(data)}:".encode() + data)
        return h.hexdigest()[:16]

    def _build(self) -> _State:
        with _STATES_LOCK:
            state = _STATES.get(self._fingerprint)
            if state is None:
                state = _State(self.lexicon, self._lex, self.synonyms, self._syn)
                _STATES[self._fingerprint] = state
                while len(_STATES) > 4:  # a long-lived process seldom sees more configurations
                    _STATES.popitem(last=False)
            return state

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_state"}

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.__dict__.update(d)
        self._state = self._build()

    @property
    def fingerprint(self) -> str:
        """Changes whenever the tokens of some text could: rules, library versions, dictionary contents."""
        return self._fingerprint

    def normalize(self, text: str) -> str:
        """NFKC, case-folded, Traditional->Simplified, single spaces: the stored search text and phrase surface."""
        return normalize(text)

    def tokens(self, text: str) -> list[str]:
        """Index tokens of raw text, repeated and in order (BM25 term frequencies)."""
        return self._analyze(text)[1]

    def _analyze(self, text: str) -> tuple[str, list[str]]:
        norm = normalize(text)
        return norm, self._tokens(norm, "search")

    def _tokens(self, norm: str, mode: QueryMode, parts: bool = True) -> list[str]:
        """Tokens of normalized text; parts=False leaves out identifier parts (to count a word's tokens)."""
        st = self._state
        if st.user_re is None:
            out = self._scan(norm, mode, parts)
        else:
            out, pos = [], 0
            for m in st.user_re.finditer(norm):
                if m.end() == m.start():
                    continue
                out += self._scan(norm[pos : m.start()], mode, parts)
                whole = "".join(m.group().split()).replace('"', "").lstrip("-")
                inner = self._scan(m.group(), mode, parts)
                if whole and len(whole) <= MAX_TOKEN_CHARS:
                    out.append(whole)
                    inner = [t for t in inner if t != whole] if parts else []
                out += inner
                pos = m.end()
            out += self._scan(norm[pos:], mode, parts)
        if st.synonyms:
            out = [st.synonyms.get(t, t) for t in out]
        return out

    def _scan(self, text: str, mode: QueryMode, parts: bool) -> list[str]:
        out: list[str] = []
        for m in _SCAN.finditer(text):
            s, kind = m.group(), m.lastgroup
            if kind == "w":
                if len(s) <= MAX_TOKEN_CHARS:
                    out.append(s)
                if (parts or len(s) > MAX_TOKEN_CHARS) and _HAS_SEP(s):
                    out.extend(p for p in _SPLIT_SEP(s) if len(p) <= MAX_TOKEN_CHARS)
            elif kind == "h":  # jieba yields Han it does not know (Ext A, B, ...) one character at a time
                jieba = self._state.jieba
                cut = jieba.cut_for_search if mode == "search" else jieba.cut
                out.extend(w for w in cut(s) if len(w) <= MAX_TOKEN_CHARS)
            else:
                units: Sequence[str] = _CLUSTER.findall(s) if _HAS_MARK(s) else s
                if len(units) == 1:
                    out.append(units[0])
                else:
                    out.extend(g for g in map("".join, pairwise(units)) if len(g) <= MAX_TOKEN_CHARS)
        return out

    def query(self, text: str, *, mode: QueryMode | None = None) -> ParsedQuery:
        """Parse `-word` (exclude), `"phrase"` (must appear) and plain text (scored). An unpaired quote is text;
        `-` excludes only at the start of a word, so HT2023-0876 stays an identifier."""
        how: QueryMode = mode or self.query_mode
        return parse_query(normalize(text), lambda norm, parts: self._tokens(norm, how, parts))

    def index_texts(self, texts: Sequence[str], processes: int = 1, *,
                    min_per_process: int = 1000) -> list[tuple[str, list[str]]]:
        """(normalize(t), tokens(t)) per text, in order. jieba is pure Python (~2,000 chunks/s a core), as slow
        as a GPU embeds; with processes > 1 and enough texts it runs in spawned processes."""
        processes = min(processes, len(texts) // max(1, min_per_process))
        if processes <= 1:
            return [self._analyze(t) for t in texts]
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        ctx = multiprocessing.get_context("spawn")  # never fork a process that runs torch and Prefect threads
        chunksize = max(1, min(256, len(texts) // (4 * processes)))
        with ProcessPoolExecutor(processes, mp_context=ctx, initializer=_warm,
                                 initargs=(self, os.getpid())) as pool:
            return list(pool.map(self._analyze, texts, chunksize=chunksize))


@lru_cache(maxsize=8)
def _cached_analyzer(lex: Path | None, _lex_sha: str, syn: Path | None, _syn_sha: str) -> Analyzer:
    return Analyzer(lex, syn)


def _warm(analyzer: Analyzer, parent: int) -> None:
    """Pool initializer: gone within a fraction of a second of a SIGKILLed refresh; unpickling built the
    worker's jieba; one call loads the HMM model too."""
    from corpusync.core.lifetime import watch_parent

    watch_parent(parent)
    analyzer.tokens("预热")


def default_processes() -> int:
    """Segmentation processes when not configured: the cores beyond the first, at most 8."""
    import os

    return max(1, min(8, (os.cpu_count() or 1) - 1))
