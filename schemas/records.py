"""Typed records passed between stages. High-volume records are slotted dataclasses; summaries are
pydantic models (they are serialised into the runs table and printed as JSON)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
from pydantic import BaseModel, Field

from corpusync.core.vectors import SparseRows, dense_of, sparse_of

BlockKind = Literal["title", "text", "table", "list", "ocr"]


@dataclass(frozen=True)
class ParseOptions:
    """What parsing needs from the settings (picklable: it travels to the isolated parse worker)."""

    max_bytes: int = 200 * 1024 * 1024
    ocr_engine: str = "rapidocr"
    ocr_model_dir: str | None = None
    ocr_dpi: int = 200
    ocr_min_confidence: float = 0.80
    ocr_max_pages: int = 200
    pdf_tables: bool = False
    max_chars: int = 20_000_000  # most characters of text a document may yield (CORPUSYNC_PARSE_MAX_CHARS)
    markdown_parser: str = "direct"  # "direct" (markdown-it-py) or "unstructured" (CORPUSYNC_MARKDOWN_PARSER)
    office_pictures: bool = True  # OCR the pictures of DOCX/PPTX (CORPUSYNC_OCR_OFFICE_PICTURES)
    ocr_cache_dir: str | None = None  # where OCR readings are kept (corpusync/adapters/ocr_cache.py); None: not



@dataclass(frozen=True, slots=True)
class SourceFile:
    """A file found under the source root. `path` is the document identity (relative, POSIX)."""

    path: str
    abs_path: Path
    size: int
    mtime: datetime
    sha256: str
    meta_json: str = ""  # user metadata from a sidecar FILE.meta.json (canonical JSON), part of sha256


@dataclass(frozen=True, slots=True)
class LiveVersion:
    """The version of a document visible in the base generation."""

    document_id: int
    version_id: int
    path: str
    content_sha256: str
    pipeline_fingerprint: str
    chunk_count: int


class RunHolder(NamedTuple):
    """The newest run still marked running: who holds the writer lock (corpusync.store.runs.running_run)."""

    run_id: int
    started_at: datetime
    hostname: str | None
    pid: int | None


@dataclass(frozen=True, slots=True)
class QuarantineRecord:
    """A file set aside: the stage and reason code (tasks/diff.py TEMPORARY_REASONS says which can pass) and
    the full error. status, attempts, since and retry_at are what the run summary adds from the history."""

    path: str
    stage: str
    reason: str
    error: str
    content_sha256: str | None = None
    status: str = "quarantined"  # or "still quarantined": known from an earlier run, not tried again now
    attempts: int = 1  # identical failures in a row (same content, pipeline, stage and reason)
    since: datetime | None = None  # the first of them
    retry_at: datetime | None = None  # when it is tried again (temporary causes); None: not until it changes

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "stage": self.stage, "reason": self.reason, "error": self.error,
                "status": self.status, "attempts": self.attempts,
                "since": self.since.isoformat() if self.since else None,
                "retry_at": self.retry_at.isoformat() if self.retry_at else None}


@dataclass(slots=True)
class DiffPlan:
    """What a refresh has to do, relative to the base (published) generation."""

    new: list[SourceFile] = field(default_factory=list)
    changed: list[tuple[SourceFile, LiveVersion]] = field(default_factory=list)
    unchanged: list[LiveVersion] = field(default_factory=list)
    deleted: list[LiveVersion] = field(default_factory=list)
    renamed: list[tuple[LiveVersion, SourceFile]] = field(default_factory=list)
    still_quarantined: list[QuarantineRecord] = field(default_factory=list)
    # quarantined for a cause that can pass, back-off over: processed again (also listed in new/changed)
    retrying: list[QuarantineRecord] = field(default_factory=list)
    live_before: int = 0

    @property
    def removed(self) -> list[LiveVersion]:
        """The deleted documents whose content did not move to a new path (a rename removes nothing)."""
        moved = {old.path for old, _ in self.renamed}
        return [v for v in self.deleted if v.path not in moved]

    @property
    def added(self) -> list[SourceFile]:
        """The new files that are not a renamed document's new path."""
        moved = {new.path for _, new in self.renamed}
        return [f for f in self.new if f.path not in moved]

    @property
    def to_process(self) -> list[SourceFile]:
        return self.new + [f for f, _ in self.changed]

    @property
    def has_changes(self) -> bool:
        return bool(self.new or self.changed or self.deleted)


@dataclass(frozen=True, slots=True)
class Block:
    """A structural unit of a parsed document (cleaned text)."""

    kind: BlockKind
    text: str
    page: int | None = None
    level: int = 0

    def __reduce__(self) -> tuple[type[Block], tuple[BlockKind, str, int | None, int]]:
        """Pickled as the constructor's arguments: a parse worker hands back thousands of blocks a document, and
        a slots dataclass's default state (a dict per block, restored field by field) costs 3x as much."""
        return (Block, (self.kind, self.text, self.page, self.level))


@dataclass(slots=True)
class ParsedDocument:
    source: SourceFile
    blocks: list[Block]
    parser: str
    parser_version: str
    media_type: str
    page_count: int | None = None
    ocr_engine: str | None = None
    ocr_engine_version: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    cleaning: dict[str, Any] = field(default_factory=dict)

    SEPARATOR = "\n\n"

    def layout(self) -> tuple[str, list[tuple[int, int]]]:
        """The cleaned document text and each block's (start, end) span in it."""
        spans: list[tuple[int, int]] = []
        pos = 0
        parts: list[str] = []
        for i, b in enumerate(self.blocks):
            if i:
                parts.append(self.SEPARATOR)
                pos += len(self.SEPARATOR)
            spans.append((pos, pos + len(b.text)))
            parts.append(b.text)
            pos += len(b.text)
        return "".join(parts), spans


@dataclass(frozen=True, slots=True)
class Chunk:
    ordinal: int
    key: str
    text: str
    text_sha256: str
    token_count: int
    char_start: int
    char_end: int
    page_start: int | None
    page_end: int | None
    section_path: tuple[str, ...] = ()
    chunk_type: str = "text"
    # Text prepended to the span (a table's header row repeated in each piece of a split table):
    # text == prefix + document_text[char_start:char_end], in the document's own characters.
    prefix: str = ""
    # The section breadcrumb ("民法典 > 第五编 婚姻家庭 > 第五章 收养"), less the headings the text opens with.
    context: str = ""

    @property
    def model_text(self) -> str:
        """What is embedded and lexically indexed (and what text_sha256 and token_count are of): the
        breadcrumb, a line break, then the text."""
        return f"{self.context}\n{self.text}" if self.context else self.text


@dataclass(slots=True)
class ChunkedDocument:
    parsed: ParsedDocument
    chunks: list[Chunk]
    char_count: int
    replaces: LiveVersion | None = None


@dataclass(slots=True)
class EmbeddedDocument:
    """Chunks plus their vectors: one Arrow record batch, row i for chunk i (columns `dense`, and
    `sparse_indices` / `sparse_values` for models with a trained sparse head). The loader encodes the
    columns straight into binary COPY; no per-chunk vector objects are built."""

    doc: ChunkedDocument
    vectors: Any  # pyarrow.RecordBatch

    @property
    def dense(self) -> np.ndarray:
        """(n, d) float32 view of the dense column."""
        return dense_of(self.vectors)

    @property
    def sparse(self) -> SparseRows | None:
        return sparse_of(self.vectors)


class DocumentCounts(BaseModel):
    new: int = 0
    changed: int = 0
    unchanged: int = 0
    deleted: int = 0
    renamed: int = 0
    quarantined: int = 0


class ChunkCounts(BaseModel):
    embedded: int = 0
    reused: int = 0
    retired: int = 0
    inserted: int = 0
    pruned: int = 0


class RunSummary(BaseModel):
    """What `corpusync refresh --json` prints, and what the runs table keeps."""

    run_id: int
    status: str
    generation: int = Field(description="The generation built (if any), else the one that stays live.")
    published: bool
    base_generation: int
    candidate_generation: int | None = Field(
        None, description="The candidate this run built (published, refused or discarded); None: nothing to build.")
    documents: DocumentCounts = Field(default_factory=DocumentCounts)
    chunks: ChunkCounts = Field(default_factory=ChunkCounts)
    quarantined: list[dict[str, Any]] = Field(default_factory=list)
    renamed: list[dict[str, str]] = Field(default_factory=list)
    quarantine_closed: list[dict[str, str]] = Field(
        default_factory=list, description="Quarantined paths whose failure this run found gone, each with why: gone "
        "(the file left the source), live-content (the file is back to its live version's content) or indexed (a "
        "version of the path went live in this run's publish).")
    timings: dict[str, float] = Field(
        default_factory=dict, description="Seconds per stage, summed over its batches. Stages overlap (one batch "
        "is embedded while the next is parsed) and batches parse side by side: they do not add up to elapsed_s.")
    elapsed_s: float = Field(0.0, description="Seconds from the start of the run (writer lock taken) to its end.")
    model: str = ""
    message: str = ""
    validation: dict[str, Any] = Field(
        default_factory=dict, description="The chunk data-quality suite's results (great-expectations)."
    )
    evaluation: list[dict[str, Any]] = Field(
        default_factory=list, description="Gold-set evaluations of the candidate and the gate's verdict."
    )
    fusion: dict[str, Any] = Field(
        default_factory=dict, description="The fusion tuned before this run's evaluation, when one was (auto-tune)."
    )
