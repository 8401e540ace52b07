"""Markdown read directly (markdown-it-py, tasks/parsing/markdown.py) against `unstructured` (the earlier
path): quality and speed on every .md file of examples/sample-corpus, tests/data and ../shared/data/corpus,
plus the passages of SQuAD v1.1 dev and CMRC 2018 gold sets (exported as corpusync writes them, read as
Markdown).

Per file, with `unstructured` as the reference: text agreement (Levenshtein similarity of all block text,
whitespace collapsed), heading agreement (the (level, text) sequences equal; and F1 of the pairs), table
cells (F1 of the cell multisets, whitespace ignored: unstructured spaces code spans apart, "(file.pdf )"),
chunk breadcrumbs (the chunker's section paths equal, MiniLM budget), chunks equal (same texts and
breadcrumbs: the file retrieves exactly as before) and the parse time (median of --repeat runs). Prints a
summary per source and the least similar files.

Usage: python bench/markdown_parse.py [--goldset-limit 200] [--repeat 3] [--worst 12]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from corpusync.core.offline import apply_offline_defaults

apply_offline_defaults()
os.environ.setdefault("CORPUSYNC_EMBEDDER", "minilm")  # the benches measure the demo/test model unless told
os.environ.setdefault("UNSTRUCTURED_DISABLE_NOTICE", "1")

from rapidfuzz.distance import Levenshtein  # noqa: E402

from corpusync.adapters.embedding import Tokenizer  # noqa: E402
from corpusync.core.errors import ParseError  # noqa: E402
from schemas.records import Block, ParsedDocument, SourceFile  # noqa: E402
from tasks.chunk import ChunkConfig, chunk_document  # noqa: E402
from tasks.parsing.markdown import parse_markdown_direct  # noqa: E402
from tasks.parsing.markup import _parse_markup  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"sample-corpus": ROOT / "examples/sample-corpus", "tests/data": ROOT / "tests/data",
           "shared/corpus": ROOT.parent / "shared/data/corpus"}
GOLDSETS = {"squad": "squad-v1.1-dev", "cmrc": "cmrc2018/cmrc2018_dev.json"}


@dataclass
class Row:
    group: str
    name: str
    text_sim: float
    headings_equal: bool
    heading_f1: float
    cells_f1: float | None  # None: neither side has a table
    crumbs_equal: bool
    chunks_equal: bool
    ms_direct: float
    ms_unstructured: float
    note: str = ""


def _source(path: Path, name: str) -> SourceFile:
    data = path.read_bytes()
    return SourceFile(name, path, len(data), datetime.now(UTC), hashlib.sha256(data).hexdigest())


def _timed(fn: Callable[[], ParsedDocument], repeat: int) -> tuple[ParsedDocument | ParseError, float]:
    times: list[float] = []
    out: ParsedDocument | ParseError
    for _ in range(max(repeat, 1)):
        t0 = time.perf_counter()
        try:
            out = fn()
        except ParseError as exc:
            out = exc
        times.append((time.perf_counter() - t0) * 1000)
    return out, statistics.median(times)


def _f1(a: Counter, b: Counter) -> float:
    if not a and not b:
        return 1.0
    common = sum((a & b).values())
    return 2 * common / (sum(a.values()) + sum(b.values()))


def _cells(blocks: list[Block]) -> Counter:
    out: Counter = Counter()
    for b in blocks:
        if b.kind == "table":
            for line in b.text.split("\n")[:1] + b.text.split("\n")[2:]:
                out.update(re.sub(r"\s+", "", c) for c in re.split(r"(?<!\\)\|", line.strip().strip("|")))
    return out


def _text(blocks: list[Block]) -> str:
    return re.sub(r"\s+", " ", " ".join(b.text for b in blocks)).strip()


def compare(group: str, path: Path, name: str, repeat: int, tok: Tokenizer, config: ChunkConfig) -> Row:
    src = _source(path, name)
    data = path.read_bytes()
    direct, ms_d = _timed(lambda: parse_markdown_direct(src, data, 20_000_000), repeat)
    unst, ms_u = _timed(lambda: _parse_markup(src, data, "md"), repeat)
    if isinstance(direct, ParseError) or isinstance(unst, ParseError):
        same = type(direct) is type(unst)
        note = f"direct: {getattr(direct, 'reason', 'ok')}, unstructured: {getattr(unst, 'reason', 'ok')}"
        return Row(group, name, float(same), same, float(same), None, same, same, ms_d, ms_u, note)
    db, ub = direct.blocks, unst.blocks
    heads_d = [(b.level, b.text) for b in db if b.kind == "title"]
    heads_u = [(b.level, b.text) for b in ub if b.kind == "title"]
    cd, cu = _cells(db), _cells(ub)
    chunks = [[(c.section_path, c.context, c.text) for c in chunk_document(d, tok, config).chunks]
              if d.blocks else [] for d in (direct, unst)]
    crumbs = [[path for path, _, _ in cs] for cs in chunks]
    return Row(group, name, Levenshtein.normalized_similarity(_text(db), _text(ub)), heads_d == heads_u,
               _f1(Counter(heads_d), Counter(heads_u)), _f1(cd, cu) if cd or cu else None,
               crumbs[0] == crumbs[1], chunks[0] == chunks[1], ms_d, ms_u)


def files(goldset_limit: int, work: Path) -> list[tuple[str, Path, str]]:
    from evaluation.goldsets import export_corpus, load_goldset, sample_questions

    out = [(group, p, str(p.relative_to(folder))) for group, folder in FOLDERS.items()
           for p in sorted(folder.rglob("*")) if p.suffix.lower() in (".md", ".markdown") and p.is_file()]
    for group, spec in GOLDSETS.items():
        gs = load_goldset(ROOT.parent / "shared/data/goldsets" / spec)
        export_corpus(gs, work / group, only_gold_of=sample_questions(gs, goldset_limit))
        out += [(group, p, p.name) for p in sorted((work / group).iterdir())]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--goldset-limit", type=int, default=200, help="gold passages of this many questions per set")
    ap.add_argument("--repeat", type=int, default=3, help="parses per file and path (the median is timed)")
    ap.add_argument("--worst", type=int, default=12, help="list this many least similar files")
    args = ap.parse_args()
    from corpusync.adapters.embedders import build_embedder
    from schemas.settings import Settings

    with tempfile.TemporaryDirectory(prefix="mdbench-") as tmp:
        settings = Settings(home=Path(tmp) / "home")
        tok = build_embedder(settings)
        config = ChunkConfig(max_tokens=min(settings.chunk_max_tokens, tok.identity.max_tokens),
                             overlap=settings.chunk_overlap, min_tokens=settings.chunk_min_tokens)
        todo = files(args.goldset_limit, Path(tmp))
        warm = todo[0]
        compare(*warm, 1, tok, config)  # imports (unstructured ~3 s) off the clock
        rows = [compare(group, path, name, args.repeat, tok, config) for group, path, name in todo]

    print(f"\n## Markdown: direct (markdown-it-py) vs unstructured, {len(rows)} files "
          f"(median of {args.repeat} parses each)")
    print("| source | files | text sim (mean / min) | headings equal | heading F1 | table cells F1 (files) "
          "| breadcrumbs equal | chunks equal | ms/file direct | ms/file unstructured | speed-up |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for group in [*dict.fromkeys(r.group for r in rows), "all"]:
        rs = [r for r in rows if group in ("all", r.group)]
        tables = [r.cells_f1 for r in rs if r.cells_f1 is not None]
        md, mu = statistics.median(r.ms_direct for r in rs), statistics.median(r.ms_unstructured for r in rs)
        print(f"| {group} | {len(rs)} | {statistics.mean(r.text_sim for r in rs):.4f} / "
              f"{min(r.text_sim for r in rs):.3f} | {sum(r.headings_equal for r in rs)}/{len(rs)} | "
              f"{statistics.mean(r.heading_f1 for r in rs):.3f} | "
              f"{(f'{statistics.mean(tables):.3f} ({len(tables)})' if tables else '-')} | "
              f"{sum(r.crumbs_equal for r in rs)}/{len(rs)} | {sum(r.chunks_equal for r in rs)}/{len(rs)} | "
              f"{md:.2f} | {mu:.2f} | {mu / max(md, 1e-9):.0f}x |")
    total_d, total_u = sum(r.ms_direct for r in rows) / 1000, sum(r.ms_unstructured for r in rows) / 1000
    print(f"\nTotal parse time: direct {total_d:.2f} s, unstructured {total_u:.2f} s")
    print(f"\n## The {args.worst} least similar files (text similarity, then headings and tables)")
    print("| source | file | text sim | headings equal | heading F1 | cells F1 | breadcrumbs equal | note |")
    print("|---|---|---|---|---|---|---|---|")
    worst = sorted(rows, key=lambda r: (r.text_sim + r.heading_f1 + (1.0 if r.cells_f1 is None else r.cells_f1)
                                        + r.crumbs_equal))[:args.worst]
    for r in worst:
        cells = "-" if r.cells_f1 is None else f"{r.cells_f1:.3f}"
        print(f"| {r.group} | {r.name} | {r.text_sim:.3f} | {r.headings_equal} | {r.heading_f1:.3f} | {cells} "
              f"| {r.crumbs_equal} | {r.note} |")


if __name__ == "__main__":
    main()
