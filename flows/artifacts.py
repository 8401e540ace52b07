"""What a refresh shows in Prefect's UI: a run-summary artifact for every run (published, no changes,
refused, failed) and the evaluation report inline, also when the gate refused the candidate.

Artifacts carry counts, timings, paths and reasons only: never settings, URLs or credentials.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("corpusync.refresh")


def summary_markdown(summary: dict[str, Any]) -> str:
    """The run summary as Markdown: outcome, document and chunk counts, timings, quarantined files."""
    d, c = summary.get("documents", {}), summary.get("chunks", {})
    status = summary.get("status", "?")
    verdict = (f"published generation {summary.get('generation')}" if summary.get("published")
               else f"generation {summary.get('base_generation')} stays live")
    lines = [f"# corpusync refresh, run {summary.get('run_id')}: {status}", "", f"**{verdict}**", ""]
    if summary.get("message"):
        lines += [f"> {summary['message']}", ""]
    if summary.get("candidate_generation") and not summary.get("published"):
        lines += [f"Candidate generation {summary['candidate_generation']} was not published.", ""]
    lines += ["| documents | new | changed | unchanged | deleted | renamed | quarantined |",
              "|---|---|---|---|---|---|---|",
              "| | " + " | ".join(str(d.get(k, 0)) for k in
                                 ("new", "changed", "unchanged", "deleted", "renamed", "quarantined")) + " |", "",
              "| chunks | embedded | reused | inserted | retired | pruned |", "|---|---|---|---|---|---|",
              "| | " + " | ".join(str(c.get(k, 0)) for k in
                                 ("embedded", "reused", "inserted", "retired", "pruned")) + " |", ""]
    timings = summary.get("timings") or {}
    if summary.get("elapsed_s"):
        lines += [f"Run time {summary['elapsed_s']:.2f} s" + ("; the stage times overlap (one batch is embedded "
                                                              "while the next is parsed)." if timings else "."), ""]
    if timings:
        lines += ["| stage | seconds |", "|---|---|"] + [f"| {k} | {v:.2f} |" for k, v in timings.items()] + [""]
    quarantined = summary.get("quarantined") or []
    if quarantined:
        lines += [f"## Quarantined files ({len(quarantined)})", "", "| file | stage | reason | error | status |",
                  "|---|---|---|---|---|"]
        lines += [f"| {_cell(q.get('path'))} | {q.get('stage')} | {q.get('reason')} | {_cell(q.get('error'))} | "
                  f"{q.get('status', '')} |" for q in quarantined]
        lines.append("")
    for e in summary.get("evaluation") or []:
        gate = {True: "passed", False: "FAILED", None: "not gated"}.get(e.get("passed"), "?")
        lines.append(f"- evaluation on {e.get('goldset')}: gate {gate}" + (" (overridden)" if e.get("overridden")
                                                                         else ""))
    return "\n".join(lines).rstrip() + "\n"


def _cell(value: Any) -> str:
    text = " ".join(str(value or "").split())
    return (text[:300] + "…" if len(text) > 300 else text).replace("|", "\\|")


def publish_run_summary(summary: dict[str, Any]) -> None:
    """The run-summary artifact of this flow run (best effort: a run's outcome never depends on its UI)."""
    from prefect.artifacts import create_markdown_artifact

    try:
        create_markdown_artifact(summary_markdown(summary), key="corpusync-run-summary",
                                 description=f"corpusync refresh: {summary.get('status')}")
    except Exception as exc:
        log.warning("could not create the run-summary artifact: %s", exc)


def publish_evaluation(report: str, *, refused: bool) -> None:
    """The evaluation report (metrics per mode, the gate with deltas, worst-regressed questions), inline."""
    from prefect.artifacts import create_markdown_artifact

    try:
        create_markdown_artifact(report, key="corpusync-evaluation",
                                 description="Gold-set evaluation and gate" + (": REFUSED" if refused else ""))
    except Exception as exc:
        log.warning("could not create the evaluation artifact: %s", exc)


def tag_run(tags: list[str]) -> None:
    """Add tags (source folder, gold sets) to the current flow run, so runs can be filtered in Prefect."""
    from uuid import UUID

    from prefect import get_client
    from prefect.runtime import flow_run

    raw = flow_run.get_id()
    if not raw:
        return
    run_id = UUID(str(raw))
    try:
        with get_client(sync_client=True) as client:
            current = client.read_flow_run(run_id)
            client.update_flow_run(run_id, tags=sorted(set(current.tags) | {t[:100] for t in tags}))
    except Exception as exc:
        log.warning("could not tag the flow run: %s", exc)
