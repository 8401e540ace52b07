"""diff: compare what is on disk with what the base generation serves."""

from __future__ import annotations

from collections.abc import Iterable

from schemas.records import DiffPlan, LiveVersion, QuarantineRecord, SourceFile


def diff(
    files: Iterable[SourceFile],
    live: Iterable[LiveVersion],
    fingerprint: str,
    quarantined: dict[str, tuple[str, str]] | None = None,
) -> DiffPlan:
    """Classify every file as new, changed, unchanged or deleted.

    A live document is *changed* when its content hash differs or when it was built by another
    pipeline (parser/chunker/model fingerprint). A file whose exact content was already quarantined by
    this same pipeline is not parsed again (it is reported as still quarantined). A deleted document
    whose content reappears under a new path is reported as a rename; it is still a delete plus a new
    document (identity = path), and the new one reuses the stored vectors of its identical chunks.
    """
    quarantined = quarantined or {}
    live_by_path = {v.path: v for v in live}
    plan = DiffPlan(live_before=len(live_by_path))
    seen: set[str] = set()
    for f in files:
        seen.add(f.path)
        current = live_by_path.get(f.path)
        if current is not None and current.content_sha256 == f.sha256 and (
            current.pipeline_fingerprint == fingerprint
        ):
            plan.unchanged.append(current)
            continue
        q = quarantined.get(f.path)
        if q is not None and q == (f.sha256, fingerprint):
            plan.still_quarantined.append(
                QuarantineRecord(f.path, "previous run", "still quarantined",
                                 "content unchanged since it was quarantined", f.sha256)
            )
            continue
        if current is None:
            plan.new.append(f)
        else:
            plan.changed.append((f, current))
    plan.deleted = [v for p, v in sorted(live_by_path.items()) if p not in seen]
    by_hash: dict[str, SourceFile] = {}
    for f in plan.new:
        by_hash.setdefault(f.sha256, f)
    for gone in plan.deleted:
        if (moved := by_hash.pop(gone.content_sha256, None)) is not None:
            plan.renamed.append((gone, moved))
    return plan
