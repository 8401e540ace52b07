"""Evaluation reports: Markdown (per gold set: metrics and search latency per mode, the gate with deltas and
intervals, the worst-regressed questions with what they retrieved) and a small SVG plot of metric history.

Reports quote gold questions and chunk text, so they are private: the folder is 0700 and every file 0600
(`private_dir`, `write_private`), tightened when they already exist."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from evaluation.metrics import LATENCY_METRICS, METRICS
from schemas.eval import Evaluation, GoldQuestion, GoldSet

Lookup = Callable[[Sequence[int]], Mapping[int, tuple[str, str]]]


def _f(v: float | None, signed: bool = False) -> str:
    if v is None:
        return "–"
    return f"{v:+.3f}" if signed else f"{v:.3f}"


def _snip(text: str, n: int = 90) -> str:
    t = " ".join(text.split()).replace("|", "\\|")
    return t[:n] + ("…" if len(t) > n else "")


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.1f}"


def private_dir(path: Path, tighten: Sequence[str] = ()) -> Path:
    """Create `path` (and parents) and make it 0700, also when it already existed with a looser mode; files
    in it matching a `tighten` glob (reports written before they were private) are made 0600."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    for pattern in tighten:
        for f in path.glob(pattern):
            if f.is_file() and not f.is_symlink():
                os.chmod(f, 0o600)
    return path


def write_private(path: Path, text: str) -> None:
    """Write a UTF-8 file readable by its owner only: created 0600 (never readable by others, not even
    briefly), and an existing file is tightened to 0600 before it is rewritten."""
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as f:
        os.fchmod(f.fileno(), 0o600)  # the mode given to open() applies only to a file it creates
        f.write(text)


def _baseline(ev: Evaluation) -> str:
    if not ev.baseline_id:
        return ev.baseline_note or "none"
    how = f"; {ev.baseline_note}" if ev.baseline_note else ""
    return f"generation {ev.baseline_generation} (evaluation {ev.baseline_id}{how})"


def describe_gold(q: GoldQuestion) -> str:
    """The gold units of a question: `a.md`, `law-2020.pdf` p.12 | `law-2023.pdf` p.14 (alternatives)."""
    def ref(d: str, pages: list[int]) -> str:
        return f"`{d}`" + (" p." + ",".join(map(str, pages)) if pages else "")

    return ", ".join(" | ".join(ref(r.document, r.pages) for r in unit) for unit in q.units)


def worst_regressions(ev: Evaluation, baseline: Mapping[str, Mapping[str, float]] | None, mode: str,
                      metric: str = "mrr@10", n: int = 5) -> list[tuple[str, float]]:
    """Question ids with the largest drop of `metric` vs the baseline (or the lowest scores without one)."""
    mine = {q.question_id: q.scores.get(metric, 0.0) for q in ev.questions if q.mode == mode}
    if baseline:
        deltas = [(qid, v - baseline[qid].get(metric, 0.0)) for qid, v in mine.items() if qid in baseline]
        return [d for d in sorted(deltas, key=lambda d: (d[1], d[0])) if d[1] < 0][:n]
    return [d for d in sorted(mine.items(), key=lambda d: (d[1], d[0])) if d[1] == 0][:n]


def markdown(ev: Evaluation, goldset: GoldSet, mode: str, *, baseline_questions: Mapping[str, Any] | None = None,
             lookup: Lookup | None = None) -> str:
    """The report of one evaluation. `baseline_questions`: question id -> {'scores', 'retrieved'} rows."""
    verdict = {None: "not gated", True: "PASS", False: "FAIL"}[ev.passed]
    if ev.overridden:
        verdict += " (overridden: published anyway)"
    lines = [
        f"## Gold set `{ev.goldset}` on generation {ev.generation}: {verdict}",
        "",
        f"{ev.n_questions} questions"
        + (f" (ad-hoc --limit {ev.question_limit}: never a gate baseline)" if ev.question_limit else "")
        + f", gold set `{ev.goldset_key or ev.goldset}` sha256 `{ev.goldset_sha256[:16]}`; baseline: {_baseline(ev)}"
        + f". Questions with no relevant chunk in this generation: {ev.missing_questions}; "
        f"relevance by fallback (whole document, or gold pages without page numbers): {ev.fallback_questions}.",
        "",
        "| mode | " + " | ".join(METRICS) + " | search p50 ms | p95 ms |",
        "|---|" + "---|" * (len(METRICS) + len(LATENCY_METRICS)),
    ]
    for m in ev.modes:
        lines.append(f"| {m} | " + " | ".join(_f(ev.metrics[m].get(k)) for k in METRICS) + " | "
                     + " | ".join(_ms(ev.metrics[m].get(k)) for k in LATENCY_METRICS) + " |")
    if ev.notes:
        lines += [""] + [f"- note: {n}" for n in ev.notes]
    if ev.checks:
        lines += ["", f"### Gate ({mode})", "",
                  "| metric | baseline | candidate | delta | 95% CI | paired | tolerance | floor | verdict |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for c in ev.checks:
            ci = f"{c.ci_low:+.3f}..{c.ci_high:+.3f}" if c.ci_low is not None and c.ci_high is not None else "–"
            lines.append(
                f"| {c.metric} | {_f(c.baseline)} | {_f(c.candidate)} | {_f(c.delta, True)} | {ci} | {c.n_paired} "
                f"| {_f(c.tolerance)} | {_f(c.floor)} | {'pass' if c.passed else '**FAIL**'}"
                + (f": {c.reason}" if c.reason else "") + " |")
    rg = ev.ragas or {}
    if rg.get("metrics") or rg.get("skipped"):
        lines += ["", f"### RAGAS ({mode}, top 5 contexts, {rg.get('n', 0)} questions)", ""]
        lines += [f"- {k}: {_f(v)}" for k, v in rg.get("metrics", {}).items()]
        lines += [f"- {k}: skipped ({why})" for k, why in rg.get("skipped", {}).items()]
    base_scores = {k: v["scores"] for k, v in (baseline_questions or {}).items()}
    worst = worst_regressions(ev, base_scores or None, mode)
    if worst:
        title = "Worst-regressed questions" if base_scores else "Questions with nothing relevant in the top 10"
        lines += ["", f"### {title} ({mode}, by MRR@10)", ""]
        by_id = {q.id: q for q in goldset.questions}
        mine = {q.question_id: q for q in ev.questions if q.mode == mode}
        ids = [c for qid, _ in worst for c in mine[qid].retrieved[:3]]
        ids += [c for qid, _ in worst for c in (baseline_questions or {}).get(qid, {}).get("retrieved", [])[:3]]
        src = lookup(ids) if lookup else {}
        for qid, delta in worst:
            q, r = by_id.get(qid), mine[qid]
            lines.append(f"- **{_snip(q.question if q else qid, 120)}** (`{qid}`, Δ {delta:+.3f}); gold: "
                         + (describe_gold(q) if q else ""))
            for label, chunk_ids in (("candidate", r.retrieved[:3]),
                                     ("baseline", (baseline_questions or {}).get(qid, {}).get("retrieved", [])[:3])):
                if label == "baseline" and not base_scores:
                    continue
                for rank, cid in enumerate(chunk_ids, start=1):
                    path, text = src.get(cid, ("(pruned)", ""))
                    lines.append(f"  - {label} #{rank}: `{path}`: {_snip(text)}")
    return "\n".join(lines) + "\n"


def history_svg(points: Sequence[Mapping[str, Any]], title: str, metrics: Sequence[str] = ("recall@5", "mrr@10"),
                width: int = 640, height: int = 260) -> str:
    """A line per metric over evaluations (x: evaluation order, labelled by generation; y: 0..1)."""
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    order = sorted({(p["evaluation_id"], p["generation"]) for p in points})
    pad_l, pad_r, pad_t, pad_b = 44, 110, 28, 34
    w, h = width - pad_l - pad_r, height - pad_t - pad_b

    def x(i: int) -> float:
        return pad_l + (w * i / max(len(order) - 1, 1))

    def y(v: float) -> float:
        return pad_t + h * (1.0 - max(0.0, min(1.0, v)))

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="11">', f'<text x="{pad_l}" y="16" font-size="13">{escape(title)}</text>']
    for v in (0.0, 0.25, 0.5, 0.75, 1.0):
        out.append(f'<line x1="{pad_l}" x2="{pad_l + w}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>'
                   f'<text x="{pad_l - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
    for i, (_, gen) in enumerate(order):
        out.append(f'<text x="{x(i):.1f}" y="{pad_t + h + 16}" text-anchor="middle">g{gen}</text>')
    index = {eid: i for i, (eid, _) in enumerate(order)}
    for n, metric in enumerate(metrics):
        pts = sorted((index[p["evaluation_id"]], float(p["value"])) for p in points if p["metric"] == metric)
        if not pts:
            continue
        colour = colours[n % len(colours)]
        path = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in pts)
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{path}"/>')
        out += [f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="3" fill="{colour}"/>' for i, v in pts]
        out.append(f'<text x="{pad_l + w + 8}" y="{pad_t + 14 * (n + 1)}" fill="{colour}">{escape(metric)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
