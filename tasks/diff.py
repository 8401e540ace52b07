"""diff: compare what is on disk with what the base generation serves, and decide which quarantined files
are due for another try.

Quarantine causes come in two kinds (TEMPORARY_REASONS is the one place that decides): a cause that can pass
(a timeout on a busy machine, a worker killed by the system) is retried with a bounded exponential back-off
in wall time (RetryPolicy, settings quarantine_retry_*); a permanent one (corrupt, encrypted, empty, ...) is
skipped until the file's content or the pipeline fingerprint changes. The back-off state is derived from the
quarantine history (corpusync.store.versions.latest_quarantine): how many identical failures in a row, the
last one when. Only open records count: a record is closed once it no longer describes the file
(closed_quarantine here; 'indexed' in the publish), and the same failure after that is a new one.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, NamedTuple

from schemas.records import DiffPlan, LiveVersion, QuarantineRecord, SourceFile

if TYPE_CHECKING:
    from schemas.settings import Settings

TEMPORARY_REASONS: frozenset[str] = frozenset({
    "timeout",         # the parse worker ran past parse_timeout_s (a busy machine, a slow network share)
    "crashed",         # the parse worker died (killed by the system, a native crash)
    "out-of-memory",   # parsing ran past the worker's memory limit (other work competing for memory)
    "ocr-error",       # the OCR engine failed (a model that did not load, a GPU that was busy)
    "database-error",  # the database failed while the file was being handled
    "unreadable",      # discover hashed the file, then it could not be read (moved, locked, a share that dropped)
    "changed-during-run",  # discover hashed the file, then it was written before the parse read it
})
"""Reason codes of causes that can pass: such a file is parsed again after a back-off. Every other code is
permanent (too-large/oversized, corrupt, encrypted, unsupported(-format), empty, no-text, data-quality,
outside-source, bad-file-name, path-too-long, bad-metadata, parser-error, ...): the file is skipped until its
content or the pipeline changes. A new reason code for a transient cause must be added here."""

RETRY_AT_ONCE: frozenset[str] = frozenset({"changed-during-run"})
"""Temporary causes that say nothing about the file, only about when it was read: due again at the next run,
without a back-off (the same bytes again, e.g. a file saved twice, are parsed; other bytes are a new version
anyway)."""

REREAD_STAGES: frozenset[str] = frozenset({"discover"})
"""Stages that meet every file again on every run (they decide before the diff can skip anything): their
records are re-checked each run instead of retried, and a repeat of one is not a new quarantine row."""


def is_temporary(reason: str) -> bool:
    return reason in TEMPORARY_REASONS


def counts_as_attempt(record: QuarantineRecord) -> bool:
    """Whether a record is a new attempt (always written) rather than a re-read of a known bad file (written
    only when it differs from the path's latest record)."""
    return record.stage not in REREAD_STAGES


class QuarantineState(NamedTuple):
    """A path's latest quarantine record and the streak of identical failures (same content, pipeline, stage
    and reason) it ends. A bare (content_sha256, pipeline_fingerprint) pair reads as a permanent quarantine."""

    content_sha256: str | None
    pipeline_fingerprint: str | None
    stage: str = "previous run"
    reason: str = "unknown"
    error: str = ""
    attempts: int = 1
    since: datetime | None = None  # the streak's first failure
    last_at: datetime | None = None  # its latest failure


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounded exponential back-off in wall time: after the n-th identical failure of a temporary cause, the
    file is tried again min(base_s * 2**(n-1), max_s) seconds later, at most max_attempts times (0: no limit)."""

    base_s: float = 3600.0
    max_s: float = 86400.0
    max_attempts: int = 8

    @classmethod
    def from_settings(cls, settings: Settings) -> RetryPolicy:
        return cls(settings.quarantine_retry_base_s, settings.quarantine_retry_max_s,
                   settings.quarantine_retry_attempts)

    def delay_s(self, attempts: int) -> float:
        return min(self.base_s * 2.0 ** min(max(attempts - 1, 0), 60), self.max_s)

    def retry_at(self, state: QuarantineState) -> datetime | None:
        """When the file is due for another try; None: not retried (a permanent cause, a stage that re-checks
        every run, or no attempts left) until its content or the pipeline changes."""
        last = state.last_at or state.since
        if not is_temporary(state.reason) or state.stage in REREAD_STAGES or last is None:
            return None
        if self.max_attempts and state.attempts >= self.max_attempts:
            return None
        if state.reason in RETRY_AT_ONCE:
            return last
        return last + timedelta(seconds=self.delay_s(state.attempts))


def with_state(record: QuarantineRecord, state: QuarantineState | None, policy: RetryPolicy, *,
               repeated: bool = False) -> QuarantineRecord:
    """The record as the run summary shows it: how long the file has failed this way, how many times, and
    when it is retried (temporary causes only)."""
    status = "still quarantined" if repeated else "quarantined"
    if state is None:
        return replace(record, status=status)
    return replace(record, status=status, attempts=state.attempts, since=state.since,
                   retry_at=policy.retry_at(state))


def diff(
    files: Iterable[SourceFile],
    live: Iterable[LiveVersion],
    fingerprint: str,
    quarantined: Mapping[str, QuarantineState | tuple[str, str]] | None = None,
    *,
    retry: RetryPolicy | None = None,
    now: datetime | None = None,
    stage_fingerprints: Mapping[str, str] | None = None,
    unreadable: Collection[str] = (),
) -> DiffPlan:
    """Classify every file as new, changed, unchanged or deleted.

    A live document is *changed* when its content hash differs or when it was built by another
    pipeline (parser/chunker/model fingerprint). A file whose exact content was already quarantined by
    this same pipeline is not parsed again (it is reported as still quarantined, with the stage, reason and
    error of its record) unless its cause can pass and its back-off has run out (`retry`, at `now`): then it
    is processed again and listed in plan.retrying. A deleted document whose content reappears under a new
    path is reported as a rename; it is still a delete plus a new document (identity = path), and the new
    one reuses the stored vectors of its identical chunks.

    `stage_fingerprints`: for a stage that depends on more than the pipeline fingerprint (validation: its
    settings and logic), the fingerprint its quarantine records were written with; a record of that stage is
    tried again when it differs (a looser threshold, validation off, a fixed check), without the live
    documents counting as changed.

    `unreadable`: paths discover found but could not read or rejected; their live documents are not deleted
    (bad input never removes a document), so neither are they renamed.
    """
    quarantined = quarantined or {}
    by_stage = stage_fingerprints or {}
    policy = retry or RetryPolicy()
    now = now or datetime.now(UTC)
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
        state = q if isinstance(q, QuarantineState) or q is None else QuarantineState(*q)
        if state is not None and (state.content_sha256, state.pipeline_fingerprint) == (
                f.sha256, by_stage.get(state.stage, fingerprint)):
            record = with_state(QuarantineRecord(f.path, state.stage, state.reason, state.error, f.sha256),
                                state, policy, repeated=True)
            if record.retry_at is None or record.retry_at > now:
                plan.still_quarantined.append(record)
                continue
            plan.retrying.append(record)
        if current is None:
            plan.new.append(f)
        else:
            plan.changed.append((f, current))
    plan.deleted = [v for p, v in sorted(live_by_path.items()) if p not in seen and p not in unreadable]
    plan.renamed = renames(plan.deleted, plan.new)
    return plan


def renames(deleted: Iterable[LiveVersion], new: Iterable[SourceFile]) -> list[tuple[LiveVersion, SourceFile]]:
    """Pair each deleted document with a new file of the same content, one to one: a folder moved or renamed
    is n renames, also where several of its files are copies of each other. Among candidates of the same
    content, the one whose path ends the same way for the most components is taken (`a/x.md` moved to
    `old/a/x.md` rather than to `old/b/x.md`), then path order."""
    by_hash: dict[str, list[SourceFile]] = {}
    for f in sorted(new, key=lambda f: f.path):
        by_hash.setdefault(f.sha256, []).append(f)
    pairs = []
    for gone in deleted:
        candidates = by_hash.get(gone.content_sha256)
        if not candidates:
            continue
        parts = gone.path.split("/")[::-1]
        moved = max(candidates, key=lambda f: _common_tail(parts, f.path.split("/")[::-1]))  # first of a tie
        candidates.remove(moved)
        pairs.append((gone, moved))
    return pairs


def _common_tail(a: list[str], b: list[str]) -> int:
    """How many leading items two lists share (paths' components, last first)."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def closed_quarantine(files: Iterable[SourceFile], unreadable: Collection[str], live: Iterable[LiveVersion],
                      open_records: Mapping[str, QuarantineState]) -> dict[str, str]:
    """The paths, of those with an open quarantine record, that the record no longer describes, and why:
    'gone' (no file at the path: deleted, renamed, or excluded by the globs; a file discover could not read or
    rejected is still there) or 'live-content' (the file is back to the content its live version has, and the
    record is about another one: restored, or the bad content replaced by the good one again). A record of
    the live content itself stays open: that content failed under this pipeline (the live version is an older
    pipeline's), and closing it would parse it again, and fail, on every other run. A record left open says the
    file still fails; closing it is what lets documents_current stop reporting a failure the corpus no longer
    has."""
    on_disk = {f.path: f.sha256 for f in files}
    live_sha = {v.path: v.content_sha256 for v in live}
    closed: dict[str, str] = {}
    for path, state in open_records.items():
        if path not in on_disk:
            if path not in unreadable:
                closed[path] = "gone"
        elif live_sha.get(path) == on_disk[path] != state.content_sha256:
            closed[path] = "live-content"
    return closed
