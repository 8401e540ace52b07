"""The budget side of chunking (internal to tasks.chunk): packing pieces into chunks, merging small ones, and
settling every chunk within the token and character budgets by exact counts. The cutting of single spans and
breadcrumbs it relies on lives in tasks.chunk_cut."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, replace

from corpusync.adapters.embedding import Tokenizer
from tasks.chunk_cut import Crumbs, split_long

FINE = 4  # an over-long sentence is cut into pieces of ~1/4 of the room, which packing then balances


@dataclass
class Piece:
    start: int
    end: int
    section: int
    path: tuple[str, ...]
    ctype: str
    unit: int  # pieces of one clause (or one table) share a unit; 0 = free text
    tokens: int = -1  # without the special tokens
    header: str = ""  # prepended when a chunk starts with this piece (a table's header row)
    rest_header: str = ""  # the same for the pieces this one is cut into, after the first
    heading: bool = False  # a heading (or table header) not yet glued to content
    protect: int = -1  # end of the headings glued in front: a cut inside the piece falls after it
    cut: bool = False  # made by cutting a longer piece


class Plan:
    """Pieces with their token counts, and the sizes of chunks made of consecutive pieces."""

    def __init__(self, text: str, pieces: list[Piece], tok: Tokenizer, crumbs: Crumbs, budget: int,
                 max_chars: int) -> None:
        self.text, self.tok, self.crumbs, self.budget, self.max_chars = text, tok, crumbs, budget, max_chars
        heads = {h: 0 for p in pieces for h in (p.header, p.rest_header) if h}
        for h, n in zip(heads, tok.count_tokens(list(heads)), strict=True):
            heads[h] = n - 2
        # a header too big to repeat is not repeated
        big = {h for h, n in heads.items() if n > budget // 3 or len(h) > max_chars // 3}
        if big:
            pieces = [replace(p, header="" if p.header in big else p.header,
                              rest_header="" if p.rest_header in big else p.rest_header) for p in pieces]
        self.heads = {**heads, "": 0}
        self.pieces = self._fit(pieces)
        self.has_content = not all(p.heading for p in self.pieces)
        self._sum()

    def _sum(self) -> None:
        self.sums = [0]
        for p in self.pieces:
            self.sums.append(self.sums[-1] + p.tokens)

    def _room(self, p: Piece) -> tuple[int, int]:
        """Tokens and characters a piece may hold: the budget less its breadcrumb and repeated header."""
        ctx, n = self.crumbs.get(p.path)
        return (self.budget - 2 - n - max(self.heads[p.header], self.heads[p.rest_header]),
                self.max_chars - len(ctx) - (1 if ctx else 0) - max(len(p.header), len(p.rest_header)))

    def _cut(self, p: Piece, fine: int = FINE) -> list[Piece]:
        """Cut a piece finely; glued headings stay with their content unless they take over half the room
        (then they are cut like text, between headings)."""
        troom, croom = self._room(p)
        protect = p.protect if p.protect < 0 or (2 * (p.protect - p.start) <= croom and 2 * (
            self.tok.count_tokens([self.text[p.start:p.protect]])[0] - 2) <= troom) else -1
        spans = split_long(self.text, p.start, p.end, self.tok, troom, croom, fine, protect)
        return [replace(p, start=a, end=b, tokens=-1, protect=-1, cut=True,
                        header=p.header if k == 0 else p.rest_header) for k, (a, b) in enumerate(spans)]

    def _fit(self, pieces: list[Piece], fine: int = 0) -> list[Piece]:
        """Token counts; a piece over its room (budget less breadcrumb and repeated header) is cut finely,
        one over the character room without tokenising it whole (`fine`: cut every piece so)."""
        staged = [q for p in pieces for q in (self._cut(p, fine or FINE) if fine or p.end - p.start >
                                              self._room(p)[1] else [p])]
        out: list[Piece] = []
        counts = self.tok.count_tokens([self.text[p.start:p.end] for p in staged])
        for p, n in zip(staged, counts, strict=True):
            if n - 2 <= self._room(p)[0]:
                p.tokens = n - 2
                out.append(p)
            else:
                out += self._cut(p)
        unknown = [p for p in out if p.tokens < 0]
        for p, n in zip(unknown, self.tok.count_tokens([self.text[p.start:p.end] for p in unknown]), strict=True):
            p.tokens = n - 2
        return out

    def size(self, i: int, j: int) -> int:
        """Estimated tokens of the text of pieces i..j (header and special tokens included)."""
        return self.heads[self.pieces[i].header] + self.sums[j + 1] - self.sums[i] + 2

    def fits(self, i: int, j: int) -> bool:
        p = self.pieces[i]
        ctx, n = self.crumbs.get(p.path)
        chars = len(p.header) + self.pieces[j].end - p.start + (len(ctx) + 1 if ctx else 0)
        return chars <= self.max_chars and self.size(i, j) + n <= self.budget

    def small(self, g: list[int], min_t: int) -> bool:
        """Under min_t tokens, or only headings (in a document that has more than headings)."""
        return self.size(*g) < min_t or (self.has_content and all(p.heading for p in self.pieces[g[0]:g[1] + 1]))

    # -- grouping -------------------------------------------------------------------------------------
    def pack(self, overlap: int, min_t: int) -> list[list[int]]:
        """Runs (consecutive pieces of one section, type and clause) whole when they fit, else packed
        greedily with overlap (not in tables), the last chunk of a run never a scrap; then neighbouring
        whole runs of a section and type (not tables) merge while they fit."""
        P = self.pieces
        groups: list[list[int]] = []
        whole: list[bool] = []
        r = 0
        while r < len(P):
            q = r
            while q + 1 < len(P) and (P[q + 1].section, P[q + 1].ctype, P[q + 1].unit, P[q + 1].heading) == (
                    P[r].section, P[r].ctype, P[r].unit, P[r].heading):
                q += 1
            if self.fits(r, q):
                run = [[r, q]]
            else:
                run, q = self._pack_run(r, q, 0 if P[r].ctype == "table" else overlap, min_t)
                P = self.pieces
            groups += run
            whole += [len(run) == 1] * len(run)
            r = q + 1
        merged: list[list[int]] = []
        merged_whole: list[bool] = []
        for g, w in zip(groups, whole, strict=True):
            if merged and w and merged_whole[-1]:
                a, b = P[merged[-1][0]], P[g[0]]
                if a.section == b.section and a.ctype == b.ctype != "table" and self.fits(merged[-1][0], g[1]):
                    merged[-1] = [merged[-1][0], g[1]]
                    continue
            merged.append(g)
            merged_whole.append(w)
        return merged

    def _next(self, i: int, j: int, overlap: int) -> int:
        """Where the chunk after pieces i..j starts: up to `overlap` tokens back, if the next piece fits."""
        back, carried = j + 1, 0
        while overlap and back - 1 > i and carried + self.pieces[back - 1].tokens <= overlap:
            back -= 1
            carried += self.pieces[back].tokens
        while back <= j and not self.fits(back, j + 1):
            back += 1
        return back

    def _pack_run(self, r: int, q: int, overlap: int, min_t: int) -> tuple[list[list[int]], int]:
        """Greedy packing of pieces r..q; where a chunk would stay under min_t because the piece after it
        (or the run's remainder) is too coarse to balance, that piece is cut finely first. Returns the
        groups and the run's new last index."""
        out: list[list[int]] = []
        i = r
        while True:
            j = i
            while j < q and self.fits(i, j + 1):
                j += 1
            if j < q and self.size(i, j) < min_t and (grown := self._refine_at(j + 1, min_t)):
                q += grown
                continue
            if j >= q:
                out.append([i, j])
                return out, q
            nxt = self._next(i, j, overlap)
            if self.fits(nxt, q) and self.size(nxt, q) < min_t:  # the run would end in a scrap: end earlier
                for j2 in range(j - 1, i - 1, -1):
                    n2 = self._next(i, j2, overlap)
                    if self.size(i, j2) < min_t or not self.fits(n2, q):
                        break
                    if self.size(n2, q) >= min_t:
                        j, nxt = j2, n2
                        break
                else:
                    if grown := self._refine_at(j, min_t):
                        q += grown
                        continue
            out.append([i, j])
            i = nxt

    def _refine_at(self, b: int, min_t: int, groups: list[list[int]] | None = None) -> int:
        """Cut text piece b finely (once, if it is bigger than min_t), so that a chunk can take part of it;
        group indices after it shift. Returns how many pieces were added."""
        p = self.pieces[b]
        if p.ctype == "table" or p.cut or p.tokens <= min_t:
            return 0
        parts = self._fit([p], fine=FINE)
        grown = len(parts) - 1
        self.pieces[b:b + 1] = parts
        self._sum()
        for g in groups or []:
            g[0] += grown * (g[0] > b)
            g[1] += grown * (g[1] >= b)
        return grown

    def merge_small(self, groups: list[list[int]], min_t: int) -> list[list[int]]:
        """Chunks under min_t tokens (and lone headings) merge with a neighbour, or take pieces from one
        that stays big enough: the next of their section first, then the previous, then across a section
        boundary."""
        k = 0
        while k < len(groups):
            if self.small(groups[k], min_t) and (self._absorb(groups, k, min_t) or (
                    self._refine(groups, k, min_t) and self._absorb(groups, k, min_t))):
                k = max(k - 1, 0)
            else:
                k += 1
        return groups

    def _refine(self, groups: list[list[int]], k: int, min_t: int) -> bool:
        """Cut a text piece of a neighbour that chunk k borders on finely (the one nearest the border that
        can be), so that the chunk can take part of it."""
        g = groups[k]
        near: list[int] = []
        if k + 1 < len(groups) and groups[k + 1][0] == g[1] + 1:
            near += range(groups[k + 1][0], groups[k + 1][1] + 1)
        if k and groups[k - 1][1] == g[0] - 1:
            near += range(groups[k - 1][1], groups[k - 1][0] - 1, -1)
        return any(self._refine_at(b, min_t, groups) for b in near)

    def _absorb(self, groups: list[list[int]], k: int, min_t: int) -> bool:
        P, g = self.pieces, groups[k]
        order: list[tuple[int, bool]] = []  # (neighbour index, same section)
        if k + 1 < len(groups):
            order.append((k + 1, P[groups[k + 1][0]].section == P[g[1]].section))
        if k:
            order.append((k - 1, P[groups[k - 1][1]].section == P[g[0]].section))
        order.sort(key=lambda o: not o[1])  # stable: next before previous within each class
        for nb, _ in order:
            i, j = (g[0], groups[nb][1]) if nb > k else (groups[nb][0], g[1])
            if self.fits(i, j):
                groups[min(k, nb)] = [i, j]
                del groups[max(k, nb)]
                return True
        for nb, _ in order:
            n = groups[nb]
            if nb > k and n[0] == g[1] + 1:
                for c in range(n[0], n[1]):  # take pieces n[0]..c
                    if not self.fits(g[0], c) or self.size(c + 1, n[1]) < min_t or not self.fits(c + 1, n[1]):
                        break
                    if not self.small([g[0], c], min_t):
                        g[1], n[0] = c, c + 1
                        return True
            if nb < k and n[1] == g[0] - 1:
                for c in range(n[1], n[0], -1):  # take pieces c..n[1]
                    if not self.fits(c, g[1]) or self.size(n[0], c - 1) < min_t:
                        break
                    if not self.small([c, g[1]], min_t):
                        g[0], n[1] = c, c - 1
                        return True
        return False


@dataclass
class Draft:
    """A chunk to be: text[start:end] after `prefix`, made of pieces first..last (-1: cut from one piece)."""

    start: int
    end: int
    prefix: str
    first: int
    last: int
    path: tuple[str, ...]
    ctype: str
    rest_header: str = ""


def _draft(plan: Plan, i: int, j: int) -> Draft:
    """Pieces i..j as a chunk: the first piece gives its header, path; its type is the one most of its
    tokens have."""
    tally: dict[str, int] = {}
    for p in plan.pieces[i:j + 1]:
        tally[p.ctype] = tally.get(p.ctype, 0) + p.tokens + 1
    first = plan.pieces[i]
    ctype = max(tally, key=lambda c: (tally[c], c == first.ctype))
    return Draft(first.start, plan.pieces[j].end, first.header, i, j, first.path, ctype, first.rest_header)


def settle(plan: Plan, groups: list[list[int]]) -> list[tuple[Draft, str, str, int]]:
    """Build each chunk's text, breadcrumb and model text and count the model text exactly (as is and
    NFKC-normalised, the larger count deciding); a chunk over the token or character budget is split in
    two between pieces, or its span halved, until every one fits. Returns (draft, text, context, tokens
    of the model text) in document order."""
    text, tok = plan.text, plan.tok
    todo = [_draft(plan, i, j) for i, j in groups]
    done: list[tuple[Draft, str, str, int]] = []
    while todo:
        built = []
        for d in todo:
            body = d.prefix + text[d.start:d.end]
            ctx, _ = plan.crumbs.context(d.path, body)
            built.append((d, body, ctx, f"{ctx}\n{body}" if ctx else body))
        counts = tok.count_tokens([m for *_, m in built])
        checks = list(counts)
        odd = [k for k, b in enumerate(built) if not unicodedata.is_normalized("NFKC", b[3])]
        for k, n in zip(odd, tok.count_tokens([unicodedata.normalize("NFKC", built[k][3]) for k in odd]),
                        strict=True):
            checks[k] = max(checks[k], n)
        todo = []
        for (d, body, ctx, model), n, check in zip(built, counts, checks, strict=True):
            if check <= plan.budget and len(model) <= plan.max_chars:
                done.append((d, body, ctx, n))
            elif d.last > d.first:
                m = min(range(d.first, d.last), key=lambda m: abs(plan.size(d.first, m) - plan.size(m + 1, d.last)))
                todo += [replace(_draft(plan, d.first, m), prefix=d.prefix), _draft(plan, m + 1, d.last)]
            else:
                troom = (check - 2) // 2 if check > plan.budget else plan.budget
                croom = len(body) // 2 if len(model) > plan.max_chars else plan.max_chars
                spans = split_long(text, d.start, d.end, tok, troom, croom)
                todo += [replace(d, start=a, end=b, prefix=d.prefix if k == 0 else d.rest_header, first=-1, last=-1)
                         for k, (a, b) in enumerate(spans)]
    done.sort(key=lambda x: (x[0].start, x[0].end))
    return done
