-- Re-appliable analyst views (dropped and re-created when sql/views/ changes; never store data here).

DROP VIEW IF EXISTS corpusync.live_chunks CASCADE;
DROP FUNCTION IF EXISTS corpusync.chunks_at(integer) CASCADE;
DROP VIEW IF EXISTS corpusync.documents_current CASCADE;
DROP VIEW IF EXISTS corpusync.run_summary CASCADE;

CREATE FUNCTION corpusync.chunks_at(generation integer)
RETURNS TABLE (
    chunk_id bigint, document_id bigint, version_id bigint, ordinal integer, chunk_key text, text text,
    token_count integer, page_start integer, page_end integer, char_start integer, char_end integer,
    section_path text[], chunk_type text, source_path text, content_sha256 text, media_type text,
    parser text, parser_version text, ocr_engine text, ocr_engine_version text, chunk_config jsonb,
    model_id integer, model_name text, model_revision text, run_id bigint, gen_from integer, gen_to integer
) LANGUAGE sql STABLE AS $$
    SELECT c.id, c.document_id, c.version_id, c.ordinal, c.chunk_key, c.text,
           c.token_count, c.page_start, c.page_end, c.char_start, c.char_end,
           c.section_path, c.chunk_type, v.source_path, v.content_sha256, v.media_type,
           v.parser, v.parser_version, v.ocr_engine, v.ocr_engine_version, v.chunk_config,
           c.model_id, m.name, m.revision, c.run_id, v.gen_from, v.gen_to
    FROM corpusync.chunks c
    JOIN corpusync.document_versions v ON v.id = c.version_id
    JOIN corpusync.embedding_models m ON m.id = c.model_id
    WHERE corpusync.visible_in(v.gen_from, v.gen_to, generation)
$$;
COMMENT ON FUNCTION corpusync.chunks_at(integer) IS 'Every chunk of a given generation, with its lineage.';

CREATE VIEW corpusync.live_chunks WITH (security_invoker = true) AS
    SELECT * FROM corpusync.chunks_at(corpusync.published_generation());
COMMENT ON VIEW corpusync.live_chunks IS
  'Chunks of the published generation with full lineage: source path, content hash, pages, character span, '
  'parser and OCR versions, chunker config, embedding model and the run that produced them.';

CREATE VIEW corpusync.documents_current WITH (security_invoker = true) AS
    SELECT d.id AS document_id,
           d.path,
           v.id AS version_id,
           v.content_sha256,
           v.size_bytes,
           v.mtime,
           v.media_type,
           v.parser,
           v.parser_version,
           v.ocr_engine,
           v.page_count,
           v.char_count,
           v.chunk_count,
           v.gen_from AS live_since_generation,
           v.run_id AS indexed_by_run,
           v.acl,
           v.valid_from,
           v.valid_until,
           v.effective_date,
           q.reason AS last_quarantine_reason,
           q.error AS last_quarantine_error,
           q.created_at AS last_quarantined_at,
           CASE  -- a closed quarantine record (migration 0008) no longer describes the file
               WHEN v.id IS NOT NULL AND q.id IS NOT NULL AND q.resolved_at IS NULL AND q.created_at > v.created_at
                    THEN 'live (newer content quarantined)'
               WHEN v.id IS NOT NULL THEN 'live'
               WHEN q.id IS NOT NULL AND q.resolved_at IS NULL THEN 'quarantined'
               ELSE 'not live'
           END AS status,
           q.resolved_at AS last_quarantine_resolved_at,
           q.resolution AS last_quarantine_resolution
    FROM corpusync.documents d
    LEFT JOIN corpusync.document_versions v
           ON v.document_id = d.id
          AND corpusync.visible_in(v.gen_from, v.gen_to, corpusync.published_generation())
    LEFT JOIN LATERAL (
        SELECT * FROM corpusync.quarantine q
        WHERE q.path = d.path ORDER BY q.created_at DESC LIMIT 1
    ) q ON true;
COMMENT ON VIEW corpusync.documents_current IS
  'Every known document with its live version (if any) and its latest quarantine record (if any).';

CREATE VIEW corpusync.run_summary WITH (security_invoker = true) AS
    SELECT r.id AS run_id, r.kind, r.status, r.started_at, r.finished_at,
           r.finished_at - r.started_at AS duration,
           r.generation, r.published, r.source_root,
           (r.counts -> 'documents' ->> 'new')::int AS docs_new,
           (r.counts -> 'documents' ->> 'changed')::int AS docs_changed,
           (r.counts -> 'documents' ->> 'unchanged')::int AS docs_unchanged,
           (r.counts -> 'documents' ->> 'deleted')::int AS docs_deleted,
           (r.counts -> 'documents' ->> 'quarantined')::int AS docs_quarantined,
           (r.counts -> 'chunks' ->> 'embedded')::int AS chunks_embedded,
           (r.counts -> 'chunks' ->> 'reused')::int AS chunks_reused,
           (r.counts -> 'chunks' ->> 'retired')::int AS chunks_retired,
           m.name AS model_name, r.config_hash, r.code_version, r.message
    FROM corpusync.runs r
    LEFT JOIN corpusync.embedding_models m ON m.id = r.model_id;
COMMENT ON VIEW corpusync.run_summary IS 'Run history: outcome, generation, document and chunk counts, duration.';
