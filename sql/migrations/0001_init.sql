-- corpusync schema, version 1. Never edit this file after it has landed: add a new numbered migration.
--
-- Visibility: a document version (and so every chunk of it) is visible in generation x when
--   gen_from <= x AND (gen_to IS NULL OR gen_to > x).
-- Generations live on document_versions, not on chunks: retiring a document updates one small row and
-- never rewrites a chunk (its vectors stay where they are in HNSW). Chunks are immutable; prune deletes
-- them with their version.

CREATE EXTENSION IF NOT EXISTS vector;
CREATE SCHEMA IF NOT EXISTS corpusync;

CREATE TABLE corpusync.embedding_models (
    id              serial PRIMARY KEY,
    identity_hash   text NOT NULL UNIQUE,
    name            text NOT NULL,
    revision        text,
    weights_sha256  text,
    dimension       integer NOT NULL CHECK (dimension > 0),
    pooling         text NOT NULL,
    normalized      boolean NOT NULL,
    sparse_trained  boolean NOT NULL DEFAULT false,
    sparse_dim      integer,
    max_tokens      integer NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE corpusync.embedding_models IS 'Every embedding model identity that produced vectors in this index.';

CREATE TABLE corpusync.runs (
    id                  bigserial PRIMARY KEY,
    kind                text NOT NULL DEFAULT 'refresh',
    status              text NOT NULL DEFAULT 'running'
                        CHECK (status IN ('running', 'published', 'no_changes', 'refused', 'failed', 'crashed')),
    source_root         text,
    started_at          timestamptz NOT NULL DEFAULT now(),
    finished_at         timestamptz,
    generation          integer,
    base_generation     integer,
    published           boolean NOT NULL DEFAULT false,
    model_id            integer REFERENCES corpusync.embedding_models (id),
    config              jsonb NOT NULL DEFAULT '{}'::jsonb,
    config_hash         text,
    code_version        text,
    counts              jsonb NOT NULL DEFAULT '{}'::jsonb,
    timings             jsonb NOT NULL DEFAULT '{}'::jsonb,
    message             text,
    prefect_flow_run_id text,
    hostname            text,
    pid                 integer
);
COMMENT ON TABLE corpusync.runs IS 'One row per pipeline run: its config (and hash), counts, timings and outcome.';

CREATE TABLE corpusync.generations (
    generation    integer PRIMARY KEY CHECK (generation > 0),
    run_id        bigint NOT NULL REFERENCES corpusync.runs (id),
    model_id      integer NOT NULL REFERENCES corpusync.embedding_models (id),
    status        text NOT NULL DEFAULT 'candidate'
                  CHECK (status IN ('candidate', 'published', 'superseded', 'rolled_back', 'refused', 'discarded', 'expired')),
    created_at    timestamptz NOT NULL DEFAULT now(),
    published_at  timestamptz
);
COMMENT ON TABLE corpusync.generations IS 'Index generations: built as candidates, published by flipping index_state.';

CREATE TABLE corpusync.index_state (
    singleton             boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    published_generation  integer NOT NULL DEFAULT 0,
    model_id              integer REFERENCES corpusync.embedding_models (id),
    updated_at            timestamptz NOT NULL DEFAULT now()
);
INSERT INTO corpusync.index_state (singleton) VALUES (true);
COMMENT ON TABLE corpusync.index_state IS 'The one-row pointer readers follow: which generation is live, and with which model.';

CREATE TABLE corpusync.documents (
    id            bigserial PRIMARY KEY,
    path          text NOT NULL UNIQUE,
    first_run_id  bigint REFERENCES corpusync.runs (id),
    created_at    timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE corpusync.documents IS 'Document identity: the path relative to the source root (POSIX separators).';

CREATE TABLE corpusync.document_versions (
    id                    bigserial PRIMARY KEY,
    document_id           bigint NOT NULL REFERENCES corpusync.documents (id),
    content_sha256        text NOT NULL,
    size_bytes            bigint NOT NULL,
    mtime                 timestamptz,
    source_path           text NOT NULL,
    media_type            text,
    parser                text NOT NULL,
    parser_version        text,
    ocr_engine            text,
    ocr_engine_version    text,
    page_count            integer,
    char_count            integer NOT NULL DEFAULT 0,
    chunk_count           integer NOT NULL DEFAULT 0,
    chunk_config          jsonb NOT NULL DEFAULT '{}'::jsonb,
    pipeline_fingerprint  text NOT NULL,
    model_id              integer NOT NULL REFERENCES corpusync.embedding_models (id),
    run_id                bigint NOT NULL REFERENCES corpusync.runs (id),
    metadata              jsonb NOT NULL DEFAULT '{}'::jsonb,
    cleaning              jsonb NOT NULL DEFAULT '{}'::jsonb,
    gen_from              integer NOT NULL CHECK (gen_from > 0),
    gen_to                integer CHECK (gen_to IS NULL OR gen_to > gen_from),
    created_at            timestamptz NOT NULL DEFAULT now()
);
-- At most one open version per document: no duplicates, whatever a crash left behind.
CREATE UNIQUE INDEX document_versions_one_open ON corpusync.document_versions (document_id) WHERE gen_to IS NULL;
CREATE INDEX document_versions_document ON corpusync.document_versions (document_id, gen_from);
CREATE INDEX document_versions_gen ON corpusync.document_versions (gen_from, gen_to);
COMMENT ON TABLE corpusync.document_versions IS 'One row per indexed content of a document, with its parse lineage and generation range.';

CREATE TABLE corpusync.chunks (
    id            bigserial PRIMARY KEY,
    version_id    bigint NOT NULL REFERENCES corpusync.document_versions (id) ON DELETE CASCADE,
    document_id   bigint NOT NULL,
    ordinal       integer NOT NULL,
    chunk_key     text NOT NULL,
    text          text NOT NULL,
    text_sha256   text NOT NULL,
    token_count   integer NOT NULL,
    page_start    integer,
    page_end      integer,
    char_start    integer NOT NULL,
    char_end      integer NOT NULL,
    section_path  text[] NOT NULL DEFAULT '{}',
    chunk_type    text NOT NULL DEFAULT 'text',
    metadata      jsonb NOT NULL DEFAULT '{}'::jsonb,
    model_id      integer NOT NULL REFERENCES corpusync.embedding_models (id),
    dense         halfvec NOT NULL,
    sparse        sparsevec,
    search_text   text NOT NULL DEFAULT '',
    tsv           tsvector GENERATED ALWAYS AS (to_tsvector('simple'::regconfig, search_text)) STORED,
    run_id        bigint NOT NULL REFERENCES corpusync.runs (id),
    gen_from      integer NOT NULL,
    UNIQUE (version_id, ordinal),
    CHECK (char_start >= 0 AND char_end > char_start),
    CHECK (page_start IS NULL OR page_end >= page_start)
);
CREATE INDEX chunks_version ON corpusync.chunks (version_id);
CREATE INDEX chunks_reuse ON corpusync.chunks (model_id, text_sha256);
CREATE INDEX chunks_tsv ON corpusync.chunks USING gin (tsv);
COMMENT ON TABLE corpusync.chunks IS 'Immutable chunks with their vectors; visibility comes from their document version.';
-- Dense (and sparse) HNSW indexes are partial expression indexes per embedding model, created when the
-- model is registered (dimension differs by model): see corpusync/db.py ensure_model_indexes().

CREATE TABLE corpusync.quarantine (
    id              bigserial PRIMARY KEY,
    run_id          bigint NOT NULL REFERENCES corpusync.runs (id),
    document_id     bigint REFERENCES corpusync.documents (id),
    path            text NOT NULL,
    content_sha256  text,
    pipeline_fingerprint text,
    stage           text NOT NULL,
    reason          text NOT NULL,
    error           text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX quarantine_path ON corpusync.quarantine (path, created_at DESC);
COMMENT ON TABLE corpusync.quarantine IS 'Files that could not be indexed: which stage, a short reason code and the full error.';
