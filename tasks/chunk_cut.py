"""Cutting text to fit token and character caps, at token boundaries (internal to tasks.chunk and
tasks.chunk_pack): an over-long span split into balanced spans (split_long), and a section path's breadcrumb
shortened to its share of the budget (Crumbs). It works on plain strings and offsets and knows nothing of
pieces or chunks, which is why it stands apart from the packing in tasks.chunk_pack."""

from __future__ import annotations

import bisect
import itertools
import math

from corpusync.adapters.embedding import Tokenizer

CRUMB_SHARE = 4  # the breadcrumb takes at most 1/4 of the token and character budgets


def strip_spans(text: str, cuts: list[int]) -> list[tuple[int, int]]:
    """The spans between consecutive cut positions, whitespace at their edges left out, empty ones dropped."""
    spans = []
    for s, e in itertools.pairwise(cuts):
        while s < e and text[s].isspace():
            s += 1
        while e > s and text[e - 1].isspace():
            e -= 1
        if e > s:
            spans.append((s, e))
    return spans


def cell_border(text: str, pos: int) -> bool:
    """A Markdown cell border: a pipe not escaped by an odd run of backslashes."""
    if text[pos] != "|":
        return False
    k = pos
    while k > 0 and text[k - 1] == "\\":
        k -= 1
    return (pos - k) % 2 == 0


def windows(text: str, s: int, e: int, limit: int) -> list[int]:
    """Cut positions splitting text[s:e] into windows of at most `limit` characters, at a space in the
    window's second half when there is one."""
    cuts = [s]
    while e - cuts[-1] > limit:
        a = cuts[-1]
        ws = max(text.rfind(" ", a + limit // 2, a + limit), text.rfind("\n", a + limit // 2, a + limit))
        cuts.append(ws if ws > a else a + limit)
    return [*cuts, e]


def split_long(text: str, s: int, e: int, tok: Tokenizer, room: int, croom: int, fine: int = 1,
                protect: int = -1) -> list[tuple[int, int]]:
    """Cut text[s:e] into balanced spans of at most `room` tokens (about room/fine each) and `croom`
    characters, at token boundaries, preferring a line break, a cell border, then a space; a token longer than
    `croom` (a run without spaces is one [UNK]) is cut by characters. The first cut falls after `protect` (a
    glued heading stays with its content) when it can. A huge span is tokenised window by window."""
    room, croom = max(room, 1), max(croom, 1)
    target = max(room // fine, 1)
    cuts: list[int] = []
    bounds = windows(text, s, e, croom * 4)
    for ws, we in itertools.pairwise(bounds):
        offs = [(ws + a, ws + b) for a, b in tok.token_offsets(text[ws:we]) if b > a]
        if not offs:
            cuts += windows(text, ws, we, croom)[:-1]
            continue
        ends = [b for _, b in offs]
        cur, i, n = ws, 0, len(offs)
        cuts.append(ws)
        floor = bisect.bisect_left([a for a, _ in offs], protect) + 1 if protect >= 0 else 1
        protect = -1
        while i < n:
            hard = min(i + room, bisect.bisect_right(ends, cur + croom, lo=i), n)
            if hard == i:  # token i does not fit after what the piece holds (a giant token's tail) ...
                if offs[i][1] - offs[i][0] <= croom:
                    cur = offs[i][0]
                    cuts.append(cur)
                    continue
                while offs[i][1] - cur > croom:  # ... or is itself longer than the character cap
                    cur += croom
                    cuts.append(cur)
                i += 1
                continue
            left = n - i
            j = min(i + math.ceil(left / math.ceil(left / target)), hard)
            lo = i + max((j - i) // 2, 1)
            if floor <= hard:  # the glued headings fit: cut after them
                j, lo = max(j, floor), max(lo, floor)
            if j < n:
                j = next((k for good in (lambda p: text[p - 1] == "\n", lambda p: cell_border(text, p),
                                         lambda p: text[p - 1].isspace())
                          for k in range(j, lo - 1, -1) if good(offs[k][0])), j)
                cur = offs[j][0]
                cuts.append(cur)
            i, floor = j, 1
    return strip_spans(text, [*sorted(set(cuts)), e])


class Crumbs:
    """Breadcrumbs: a section path joined by " > ", within a quarter of the token and character budgets
    (oldest levels dropped first, then the one left cut short). Sizes count the line break after it."""

    def __init__(self, tok: Tokenizer, budget: int, max_chars: int) -> None:
        self.tok, self.cap, self.char_cap = tok, budget // CRUMB_SHARE, max_chars // CRUMB_SHARE
        self.memo: dict[tuple[tuple[str, ...], int, int], tuple[str, int]] = {}

    def get(self, path: tuple[str, ...], cap: int | None = None, char_cap: int | None = None) -> tuple[str, int]:
        """(breadcrumb, its tokens + 1) of `path`, within `cap` tokens and `char_cap` characters."""
        key = (path, self.cap if cap is None else cap, self.char_cap if char_cap is None else char_cap)
        if key not in self.memo:
            self.memo[key] = self._build(list(path), key[1], key[2])
        return self.memo[key]

    def _build(self, levels: list[str], cap: int, char_cap: int) -> tuple[str, int]:
        while levels:
            s = " > ".join(levels)
            if len(s) < char_cap and (n := self.tok.count_tokens([s])[0] - 2) < cap:
                return s, n + 1
            if len(levels) > 1:
                levels.pop(0)
                continue
            offs = self.tok.token_offsets(s[: max(char_cap - 1, 0)])[: max(cap - 1, 0)]
            while offs:
                s = s[: offs[-1][1]]
                if (n := self.tok.count_tokens([s])[0] - 2) < cap:
                    return s, n + 1
                offs.pop()
            break
        return "", 0

    def context(self, path: tuple[str, ...], body: str) -> tuple[str, int]:
        """The breadcrumb of a chunk: its path less the levels its first lines start with, within the room
        that the full path's breadcrumb was given."""
        lines = [t for line in body.split("\n", 2 * len(path) + 2)[: 2 * len(path) + 2] if (t := line.strip())]
        rest = [level for level in path if not any(t.startswith(level) for t in lines[: len(path) + 1])]
        full, n = self.get(path)
        return self.get(tuple(rest), n, len(full) + 1) if rest else ("", 0)
