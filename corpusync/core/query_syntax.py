"""The lexical query syntax: scored terms, "required phrases", -excluded terms and -"excluded phrases", parsed
into a ParsedQuery (the same syntax SQL's corpusync.lexical_parse reads back from ParsedQuery.sql_text()). Kept
apart from the analyzer because it is about the query language, not about tokens: the analyzer hands it a
tokenizer. STOPWORDS are part of corpusync.core.lexical's Analyzer.fingerprint."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

# Function and question words: they match nearly every chunk and only add noise to an OR query. Dropped from
# scored query terms only; documents keep them. Simplified and lower-case, as normalize() leaves text.
STOPWORDS = frozenset(
    (
        "的 了 着 过 和 与 及 或 并 而 且 但 是 在 于 为 对 由 以 之 其 等 也 就 都 又 还 这 那 此 该 有 中 上 下 "
        "将 被 把 从 向 到 给 个 么 吗 呢 吧 啊 呀 嘛 什么 什么样 哪 哪个 哪些 哪里 哪儿 哪种 谁 如何 怎么 怎样 "
        "怎么样 多少 多久 几 几个 为什么 为何 何时 是否 是不是 有没有 请问 请 关于 一个 这个 那个 这些 那些 "
        "我 你 您 他 她 它 我们 你们 他们 "
        "a an the of to in on at for and or but is are was were be been being am by with as from into about "
        "that this these those it its there their they them he she his her we our you your i me my "
        "what which who whom whose when where why how did does do can could would please"
    ).split()
)
_QUERY = re.compile(r'(?P<neg>(?<!\S)-)?"(?P<ph>[^"]*)"|(?<!\S)-(?P<ex>[^\s"]+)|(?P<plain>[^\s"]+|\s+|")')
_CURLY_QUOTES = {0x201C: '"', 0x201D: '"'}

# Tokens of normalized text; parts=False (the second argument) leaves out identifier parts (to count a word's
# tokens). The analyzer's tokenizer in the query mode asked for.
Tokenize = Callable[[str, bool], list[str]]


@dataclass(frozen=True)
class ParsedQuery:
    """A query split into what BM25 scores and what SQL filters on. Surfaces are normalize()d text."""

    terms: list[str]
    phrases: list[str]
    excluded_terms: list[str]
    excluded_phrases: list[str]

    def sql_text(self) -> str:
        """What the SQL functions parse: `tok "surface" -tok -"surface"`, single-space separated."""
        return " ".join([*self.terms, *(f'"{p}"' for p in self.phrases), *(f"-{t}" for t in self.excluded_terms),
                         *(f'-"{p}"' for p in self.excluded_phrases)])

    @property
    def empty(self) -> bool:
        """Nothing to look for (exclusions alone select nothing)."""
        return not self.terms and not self.phrases


def parse_query(text: str, tokenize: Tokenize) -> ParsedQuery:
    """Parse normalize()d query text: `-word` (exclude), `"phrase"` (must appear) and plain text (scored). An
    unpaired quote is text; `-` excludes only at the start of a word, so HT2023-0876 stays an identifier."""
    terms: dict[str, None] = {}
    phrases: dict[str, None] = {}
    ex_terms: dict[str, None] = {}
    ex_phrases: dict[str, None] = {}
    plain: list[str] = []

    def score(norm: str) -> None:
        for t in tokenize(norm, True):
            if t not in STOPWORDS:
                terms.setdefault(t, None)

    for m in _QUERY.finditer(text.translate(_CURLY_QUOTES)):
        if m.group("plain") is not None:
            plain.append(m.group("plain"))
            continue
        score("".join(plain))
        plain.clear()
        ph = m.group("ph")
        surface = " ".join((m.group("ex") if ph is None else ph).split())  # normalized once, like documents
        if ph is not None and m.group("neg") is None:
            if surface:
                phrases.setdefault(surface, None)
                score(surface)
            continue
        primary = tokenize(surface, False)
        if len(primary) == 1:
            ex_terms.setdefault(primary[0], None)
        elif primary:
            ex_phrases.setdefault(surface, None)
    score("".join(plain))
    return ParsedQuery(list(terms), list(phrases), list(ex_terms), list(ex_phrases))
