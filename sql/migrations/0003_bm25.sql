-- corpusync schema, version 3: an exact Okapi BM25 lexical channel with pgvector as the only extension,
-- and the fusion chosen for an index. Never edit after it has landed.
--
-- The lexical channel is computed from postings: one row per (term, chunk) with the term's frequency in
-- the chunk and the chunk's length in tokens (the tokens are corpusync.lexical's, the same lists a BM25
-- reference library gets in the tests). Document frequency, the number of chunks and their average length
-- are counted at query time over the generation being queried, so a candidate is scored exactly as it
-- would be once published. Postings belong to a document version: they are written with it, never
-- updated, and deleted with it (prune, crash recovery). The full-text tsvector column it replaces goes.

CREATE TABLE corpusync.lexicon (
    id    serial PRIMARY KEY,
    term  text COLLATE "C" NOT NULL UNIQUE
);
COMMENT ON TABLE corpusync.lexicon IS
  'Stable term ids for the lexical index: every distinct token ever indexed (tokens are corpusync.lexical''s).';

CREATE TABLE corpusync.postings (
    term_id     integer NOT NULL,
    version_id  bigint NOT NULL,
    ordinal     integer NOT NULL,
    tf          integer NOT NULL CHECK (tf > 0),
    dl          integer NOT NULL CHECK (dl > 0)
);
-- Index-only scans of one term's postings (the query path) and deletes by version (prune, recovery).
-- No foreign keys: they cost a lookup per posting on load; rows go in and out with their version, in the
-- same transaction (tasks/load.py, sql/queries/prune_versions.sql, discard_unpublished_versions.sql).
CREATE INDEX postings_term ON corpusync.postings (term_id) INCLUDE (version_id, ordinal, tf, dl);
CREATE INDEX postings_version ON corpusync.postings (version_id);
COMMENT ON TABLE corpusync.postings IS
  'Lexical postings: term frequency (tf) of a term in the chunk (version_id, ordinal) and that chunk''s '
  'length in tokens (dl). BM25 statistics are counted over the generation queried.';

-- NULL: a version indexed before BM25 (no postings; the next refresh re-indexes it, since the pipeline
-- fingerprint includes the lexical analyzer): left out of BM25's statistics, as it cannot match.
ALTER TABLE corpusync.document_versions ADD COLUMN lexical_tokens bigint;
COMMENT ON COLUMN corpusync.document_versions.lexical_tokens IS
  'Sum of the lexical lengths (tokens) of the version''s chunks: with chunk_count, the BM25 average length '
  '(NULL: indexed before the BM25 postings existed).';

-- search_text now holds the normalised text (NFKC, lower case, Traditional folded to Simplified, breadcrumb
-- first) that quoted phrases are matched against; tokens live in postings.
ALTER TABLE corpusync.chunks DROP COLUMN tsv;
COMMENT ON COLUMN corpusync.chunks.search_text IS
  'The chunk''s breadcrumb and text as the lexical index normalises them (quoted phrases match against it).';

CREATE TABLE corpusync.fusions (
    id              bigserial PRIMARY KEY,
    model_id        integer NOT NULL REFERENCES corpusync.embedding_models (id),
    method          text NOT NULL CHECK (method IN ('rrf', 'score')),
    weights         jsonb NOT NULL,
    rrf_k           double precision NOT NULL CHECK (rrf_k > 0),
    goldset         text,
    goldset_sha256  text,
    generation      integer,                 -- the generation it was tuned on: in force from there on
    folds           integer,
    report          jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX fusions_model ON corpusync.fusions (model_id, created_at DESC);
COMMENT ON TABLE corpusync.fusions IS
  'Fusion settings tuned on gold sets (corpusync tune, or the first gated refresh): for a generation, the '
  'newest row of its model tuned on it or an earlier generation that was not refused or discarded is what '
  'search_hybrid, the CLI and the gate use unless weights are given explicitly.';
