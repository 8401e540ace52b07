-- corpusync schema, version 7: vectors outlive the run that computed them. Never edit after it has landed.
--
-- A refresh writes each embedded batch here at once, in its own committed transaction, keyed by what a
-- vector depends on: the embedding model and the sha256 of the model input (chunks.text_sha256). Crash
-- recovery deletes an unpublished candidate's versions and chunks, but not these rows, so a run killed while
-- embedding, or a candidate the gate refused, costs the next run only the text that has no vector yet
-- (tasks/load.py stored_vectors reads chunks and this table). Nothing here is visible in any generation:
-- readers never get it (no grant, and row-level security without a policy). Prune deletes rows a published
-- chunk already holds and rows nothing holds that are older than CORPUSYNC_VECTOR_CACHE_TTL_H.

CREATE TABLE corpusync.vector_cache (
    model_id     integer NOT NULL REFERENCES corpusync.embedding_models (id),
    text_sha256  text NOT NULL,
    dense        halfvec NOT NULL,
    sparse       sparsevec,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (model_id, text_sha256)
);
ALTER TABLE corpusync.vector_cache ENABLE ROW LEVEL SECURITY;

COMMENT ON TABLE corpusync.vector_cache IS
  'Vectors by model and model-input hash, written as each embedding batch finishes, so work a crashed or refused run did is reused by the next; not part of any generation, not readable by reader roles.';
COMMENT ON COLUMN corpusync.vector_cache.model_id IS
  'Embedding model that computed the vectors (embedding_models.id): reused only for the same model identity.';
COMMENT ON COLUMN corpusync.vector_cache.text_sha256 IS
  'sha256 of the model input (breadcrumb then text), the same as chunks.text_sha256 of the chunks it serves.';
COMMENT ON COLUMN corpusync.vector_cache.dense IS
  'Dense vector, as chunks.dense stores it (halfvec of the model''s dimension).';
COMMENT ON COLUMN corpusync.vector_cache.sparse IS
  'Sparse token weights, as chunks.sparse stores them; NULL for a model without a sparse head.';
COMMENT ON COLUMN corpusync.vector_cache.created_at IS
  'When the batch was embedded; prune deletes rows no chunk holds once older than CORPUSYNC_VECTOR_CACHE_TTL_H.';
