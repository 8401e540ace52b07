-- Re-appliable documentation (applied last, after every view and function exists): COMMENT ON every table,
-- view, function and column an analyst sees in schema corpusync (\d+ and \df+ in psql show them).
-- Everything is guarded: a comment is written only for a relation, column or function that exists, so this
-- file applies whatever migrations have landed yet (e.g. 0004's access columns) and whatever columns the
-- views above define. Comments of tables and columns written by migrations are kept as they are, unless
-- listed here; functions keep the comment their file gives them (only those without one get one here).
-- Note: sql/views/ is re-applied only when its checksum changes, so a migration landing later gets its
-- columns' comments with the next change to this folder.

-- Relations without a comment of their own (tables' comments live in their migrations, views' in their files).
DO $comments$
DECLARE
    r record;
    kind "char";
BEGIN
    FOR r IN SELECT * FROM (VALUES
        ('access_groups', 'Reader groups: which groups each login role (a member of corpusync_reader) belongs to; '
                          'a reader sees a document version when its acl is NULL or names one of its groups.')
    ) AS t(rel, note) LOOP
        SELECT c.relkind INTO kind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'corpusync' AND c.relname = r.rel;
        CONTINUE WHEN kind IS NULL OR obj_description(format('corpusync.%I', r.rel)::regclass, 'pg_class') IS NOT NULL;
        EXECUTE format('COMMENT ON %s corpusync.%I IS %L',
                       CASE kind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE 'TABLE' END,
                       r.rel, r.note);
    END LOOP;
END
$comments$;

-- Columns of tables and views: written when the column exists.
DO $comments$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT * FROM (VALUES
        -- embedding_models
        ('embedding_models', 'id', 'Model id: the model_id of chunks, document_versions, generations, runs, fusions and evaluations.'),
        ('embedding_models', 'identity_hash', 'sha256 of the model identity (name, revision, weights hash, dimension, pooling, normalized, sparse head; not max_tokens): vectors are comparable only within one identity.'),
        ('embedding_models', 'name', 'Model name, e.g. sentence-transformers/all-MiniLM-L6-v2 or BAAI/bge-m3.'),
        ('embedding_models', 'revision', 'Model revision (e.g. the Hugging Face commit) read from the model folder; NULL: unknown.'),
        ('embedding_models', 'weights_sha256', 'sha256 of the model''s weight files; NULL: not known.'),
        ('embedding_models', 'dimension', 'Dense embedding dimension: the length of chunks.dense (and of a q_dense for search_hybrid) for this model.'),
        ('embedding_models', 'pooling', 'How token embeddings become one vector: mean or cls.'),
        ('embedding_models', 'normalized', 'True when dense vectors are L2-normalised (cosine similarity equals the inner product).'),
        ('embedding_models', 'sparse_trained', 'True when the model has a trained sparse head (e.g. BGE-M3): chunks.sparse is filled and search_hybrid uses the sparse channel.'),
        ('embedding_models', 'sparse_dim', 'Dimension of chunks.sparse (the tokenizer''s vocabulary size); NULL: no sparse head.'),
        ('embedding_models', 'max_tokens', 'Longest input the model is served, in model tokens (caps the chunk budget); a serving limit, not part of identity_hash, updated when the model is registered again.'),
        ('embedding_models', 'created_at', 'When the model was first registered.'),
        -- runs
        ('runs', 'id', 'Run id: the run_id of generations, document_versions, chunks, quarantine and evaluations.'),
        ('runs', 'kind', 'What ran: refresh (the indexing pipeline; the only kind written today).'),
        ('runs', 'status', 'Outcome: running, published (its generation went live), no_changes (nothing to index; the base generation stays live), refused (model mismatch, mass delete or failed gate), failed (error; see message), crashed (the process died; set by the next refresh).'),
        ('runs', 'source_root', 'Absolute path of the source folder the run read.'),
        ('runs', 'started_at', 'When the run started.'),
        ('runs', 'finished_at', 'When the run ended; NULL while it runs (or until a crashed run is marked crashed).'),
        ('runs', 'generation', 'The generation the run built (published or not), else the one that stayed live; NULL while running.'),
        ('runs', 'base_generation', 'The published generation when the run started: what it compared the source against (0: empty index).'),
        ('runs', 'published', 'True when this run made its generation the published one.'),
        ('runs', 'model_id', 'Embedding model of the published index when the run started (NULL: empty index); the model a run embedded with is generations.model_id of its generation.'),
        ('runs', 'config', 'The settings that define lineage (parser, chunker, lexical analyzer, model, gate) plus the allow_mass_delete, reembed and skip_gate flags, as JSON.'),
        ('runs', 'config_hash', 'Hash of config: two runs with the same hash ran with the same settings.'),
        ('runs', 'code_version', 'corpusync package version, plus +<git commit> when run from a checkout.'),
        ('runs', 'counts', 'JSON counts: documents {new, changed, unchanged, deleted, renamed, quarantined}, chunks {embedded, reused, retired, inserted, pruned}, the quarantined and renamed files, evaluation and validation results; {} until the run finishes.'),
        ('runs', 'timings', 'JSON seconds of wall time per stage (discover, diff, parse, chunk, embed, load, evaluate, publish, prune, ...); {} until the run finishes.'),
        ('runs', 'message', 'Human-readable note: the error or refusal, a gate overridden with --skip-gate, recovery from an interrupted run; NULL: none.'),
        ('runs', 'prefect_flow_run_id', 'Prefect flow run id of the run; NULL when not started through Prefect.'),
        ('runs', 'hostname', 'Host the run executed on.'),
        ('runs', 'pid', 'Operating-system process id of the run on hostname.'),
        -- generations
        ('generations', 'generation', 'Generation number (1, 2, ...): a document version is in generation x when gen_from <= x AND (gen_to IS NULL OR gen_to > x).'),
        ('generations', 'run_id', 'The run that built this generation.'),
        ('generations', 'model_id', 'Embedding model of every chunk in this generation (one model per generation; query embeddings must come from it).'),
        ('generations', 'status', 'candidate (being built or evaluated), published (live: index_state.published_generation), superseded (was live; retained for rollback), rolled_back (undone by a rollback), refused (failed the gate or a check), discarded (its run failed or crashed), expired (past retention; its retired rows are pruned).'),
        ('generations', 'created_at', 'When the candidate was created.'),
        ('generations', 'published_at', 'When the generation was (last) published; NULL: never published.'),
        -- index_state
        ('index_state', 'singleton', 'Always true: the table holds exactly one row.'),
        ('index_state', 'published_generation', 'The generation readers and search see now (0: nothing published yet); what published_generation() returns.'),
        ('index_state', 'model_id', 'Embedding model of the published generation (query embeddings must come from it); NULL before the first publish.'),
        ('index_state', 'updated_at', 'When the pointer last moved (publish or rollback).'),
        -- documents
        ('documents', 'id', 'Document id, stable across versions and generations (document_versions.document_id, chunks.document_id).'),
        ('documents', 'path', 'Path relative to the source root, POSIX separators; unique: the document''s identity.'),
        ('documents', 'first_run_id', 'The run that first saw this path (indexed or quarantined it).'),
        ('documents', 'created_at', 'When the path was first seen.'),
        -- document_versions
        ('document_versions', 'id', 'Version id: one indexed content of a document (chunks.version_id, postings.version_id).'),
        ('document_versions', 'document_id', 'The document (documents.id) this is a version of.'),
        ('document_versions', 'content_sha256', 'sha256 (hex) of the file''s bytes as indexed.'),
        ('document_versions', 'size_bytes', 'File size in bytes as indexed.'),
        ('document_versions', 'mtime', 'File modification time as indexed (the filter keys modified_after/modified_before test it); NULL: unknown.'),
        ('document_versions', 'source_path', 'Path (relative to the source root, POSIX) the content was read from: its document''s path.'),
        ('document_versions', 'media_type', 'Media type the parser assigned (text/plain, application/pdf, image/png, ...); NULL: unknown. The filter key type matches it or the file extension.'),
        ('document_versions', 'parser', 'Parser that extracted the text: text, pymupdf, unstructured, csv, ocr, ...'),
        ('document_versions', 'parser_version', 'Version of that parser (its library, or corpusync''s parse logic); NULL: unknown.'),
        ('document_versions', 'ocr_engine', 'OCR engine used on pages or images of this version; NULL: no OCR ran.'),
        ('document_versions', 'ocr_engine_version', 'Version of the OCR engine; NULL: no OCR ran (or unknown).'),
        ('document_versions', 'page_count', 'Number of pages of paginated formats (PDF, ...); NULL: the format has no pages.'),
        ('document_versions', 'char_count', 'Length in characters of the parsed, cleaned text: the text chunks'' char_start/char_end index into.'),
        ('document_versions', 'chunk_count', 'Number of chunks of this version.'),
        ('document_versions', 'chunk_config', 'Chunker settings used, as JSON: max_tokens (budget in model tokens), overlap, strategy, min_tokens.'),
        ('document_versions', 'pipeline_fingerprint', 'Hash of parser, chunker, lexical analyzer and model identity: a version is up to date while content_sha256 and this match the current pipeline; otherwise the next refresh re-indexes it.'),
        ('document_versions', 'model_id', 'Embedding model of this version''s chunks (embedding_models.id).'),
        ('document_versions', 'run_id', 'The run that indexed this version and wrote its chunks.'),
        ('document_versions', 'metadata', 'Parser metadata (pages_without_text, ocr_pages, low_confidence_pages, ...) merged with the sidecar FILE.meta.json; the parser''s own keys win (the sidecar''s values for them are kept under sidecar_conflicts); the filter key metadata matches it by jsonb containment.'),
        ('document_versions', 'cleaning', 'What text cleaning removed, e.g. {"removed_running_lines": [...]} (repeated headers/footers); {}: nothing.'),
        ('document_versions', 'gen_from', 'First generation this version is visible in (the candidate its run built).'),
        ('document_versions', 'gen_to', 'First generation it is no longer visible in (changed or deleted there); NULL: still current. Visible in x when gen_from <= x AND (gen_to IS NULL OR gen_to > x).'),
        ('document_versions', 'created_at', 'When the version row was written.'),
        ('document_versions', 'acl', 'Groups (access_groups.group_name) allowed to read this version, from the sidecar "acl"; NULL: public. Row-level security hides the version, its chunks and postings from readers in none of them.'),
        ('document_versions', 'valid_from', 'Date from which the content is valid, from the sidecar "valid_from"; NULL: not given.'),
        ('document_versions', 'valid_until', 'Date until which the content is valid, from the sidecar "valid_until"; NULL: not given (no end).'),
        ('document_versions', 'effective_date', 'Date the content takes effect (e.g. of a contract or regulation), from the sidecar "effective_date"; NULL: not given.'),
        -- chunks
        ('chunks', 'id', 'Chunk id: chunk_id of search results and live_chunks, evaluation_questions.retrieved.'),
        ('chunks', 'version_id', 'The document version (document_versions.id) the chunk belongs to: its visibility and lineage.'),
        ('chunks', 'document_id', 'The document (documents.id), copied from its version.'),
        ('chunks', 'ordinal', 'Position of the chunk in its version, from 0 (with version_id: the postings key).'),
        ('chunks', 'chunk_key', '32-hex key from path, content hash, chunker settings and character span: the same chunk of the same content gets the same key in every run.'),
        ('chunks', 'text', 'The chunk''s text as shown: the span of the document text (a split table''s repeated header row first), without the breadcrumb.'),
        ('chunks', 'text_sha256', 'sha256 of the embedded text (breadcrumb line, then text): a chunk with the same hash and model reuses the stored vectors.'),
        ('chunks', 'token_count', 'Length of the embedded text (breadcrumb and text) in the embedding model''s tokens.'),
        ('chunks', 'page_start', 'First page the chunk is on (page numbers as the parser reports them, 1-based); NULL: no page information.'),
        ('chunks', 'page_end', 'Last page the chunk is on; NULL: no page information.'),
        ('chunks', 'char_start', 'Start of the chunk''s span in its version''s parsed text, in characters from 0.'),
        ('chunks', 'char_end', 'End of the span (exclusive), in characters: the span is char_start <= i < char_end.'),
        ('chunks', 'section_path', 'Headings of the section the chunk is in, outermost first ({}: none).'),
        ('chunks', 'chunk_type', 'text, table or ocr (the filter key chunk_type).'),
        ('chunks', 'metadata', 'Per-chunk extras: {"prefix_chars": n} when text starts with n characters of a repeated table header that are not in the span; {} otherwise.'),
        ('chunks', 'model_id', 'Embedding model of dense and sparse (embedding_models.id).'),
        ('chunks', 'dense', 'Dense embedding of the embedded text (halfvec of the model''s dimension; HNSW index per model).'),
        ('chunks', 'sparse', 'Sparse token weights over the tokenizer vocabulary from a trained sparse head; NULL: the model has none.'),
        ('chunks', 'run_id', 'The run that embedded and wrote the chunk (its version''s run_id).'),
        ('chunks', 'gen_from', 'Generation the chunk was written in (its version''s gen_from); visibility comes from the version''s gen_from/gen_to.'),
        -- quarantine
        ('quarantine', 'id', 'Quarantine record id.'),
        ('quarantine', 'run_id', 'The run that quarantined the file.'),
        ('quarantine', 'document_id', 'The document (documents.id) of the path, registered when quarantined.'),
        ('quarantine', 'path', 'Path of the file relative to the source root.'),
        ('quarantine', 'content_sha256', 'sha256 of the file''s bytes that failed; NULL: not read (e.g. unreadable).'),
        ('quarantine', 'pipeline_fingerprint', 'Pipeline fingerprint at the time. A permanent cause (corrupt, encrypted, empty, oversized, ...) is retried only when the file''s content or the pipeline changes; a temporary one (timeout, crashed, out-of-memory, ocr-error, unreadable) after an exponential back-off (CORPUSYNC_QUARANTINE_RETRY_*).'),
        ('quarantine', 'stage', 'Stage that rejected the file: discover, parse, chunk or validate.'),
        ('quarantine', 'reason', 'Short reason code, e.g. timeout, crashed, out-of-memory, ocr-error (temporary: retried after a back-off), corrupt, encrypted, empty, oversized, bad-metadata, outside-source, data-quality (permanent).'),
        ('quarantine', 'error', 'The full error message.'),
        ('quarantine', 'created_at', 'When the file was quarantined.'),
        ('quarantine', 'resolved_at', 'When a refresh closed the record because it no longer describes the file (resolution says why); NULL: open. The diff skips a file only for an open record.'),
        ('quarantine', 'resolved_by_run', 'The run that closed the record (runs.id); NULL: open.'),
        ('quarantine', 'resolution', 'Why the record was closed: gone (the file left the source), live-content (the file is back to its live version''s content), indexed (a content of the path went live); NULL: open.'),
        -- evaluations
        ('evaluations', 'id', 'Evaluation id.'),
        ('evaluations', 'run_id', 'The refresh run whose gate evaluated; NULL: a standalone corpusync eval.'),
        ('evaluations', 'generation', 'The generation evaluated.'),
        ('evaluations', 'model_id', 'Embedding model of the generation, used for the query embeddings.'),
        ('evaluations', 'goldset', 'Gold set name.'),
        ('evaluations', 'goldset_sha256', 'Hash of the gold set''s questions: evaluations are comparable when it matches.'),
        ('evaluations', 'n_questions', 'Number of questions evaluated.'),
        ('evaluations', 'modes', 'Retrieval modes evaluated, e.g. {dense,lexical,hybrid}.'),
        ('evaluations', 'metrics', 'JSON {mode: {metric: value}}: recall@1/5/10/20 (over gold units), mrr@10, ndcg@10, hit@10 (0..1) and latency_ms_p50/p95 (milliseconds); one row per value in eval_results.'),
        ('evaluations', 'ragas', 'RAGAS scores when they were computed; {}: not computed.'),
        ('evaluations', 'config', 'Evaluation settings (retrieval and gate parameters) and notes, as JSON.'),
        ('evaluations', 'baseline_id', 'The evaluation compared against (same gold set, last published generation); NULL: no baseline.'),
        ('evaluations', 'gate', 'JSON list of gate checks: metric, floor or tolerance, delta against the baseline with its bootstrap interval, passed; NULL: not gated.'),
        ('evaluations', 'passed', 'Whether every gate check passed; NULL: not gated.'),
        ('evaluations', 'overridden', 'True when the gate failed and the generation was published anyway (--skip-gate).'),
        ('evaluations', 'report_path', 'Path of the evaluation report written; NULL: none.'),
        ('evaluations', 'created_at', 'When the evaluation was stored.'),
        -- evaluation_questions
        ('evaluation_questions', 'evaluation_id', 'The evaluation (evaluations.id).'),
        ('evaluation_questions', 'mode', 'Retrieval mode (dense, lexical, hybrid, ...).'),
        ('evaluation_questions', 'question_id', 'Question id in the gold set.'),
        ('evaluation_questions', 'scores', 'JSON {metric: value} of this question in this mode (quality metrics, 0..1).'),
        ('evaluation_questions', 'first_rank', 'Rank (from 1) of the first relevant chunk retrieved; NULL: none retrieved.'),
        ('evaluation_questions', 'retrieved', 'Retrieved chunk ids (chunks.id), best first.'),
        ('evaluation_questions', 'relevant_count', 'Number of chunks relevant to the question in the evaluated generation.'),
        -- lexicon, postings
        ('lexicon', 'id', 'Term id (postings.term_id), stable once assigned.'),
        ('lexicon', 'term', 'A token as corpusync.lexical normalises it (collation C: byte order).'),
        ('postings', 'term_id', 'The term (lexicon.id).'),
        ('postings', 'version_id', 'Document version of the chunk (document_versions.id): postings are visible with it.'),
        ('postings', 'ordinal', 'Ordinal of the chunk in its version: the chunk is chunks (version_id, ordinal).'),
        ('postings', 'tf', 'Term frequency: times the term occurs in the chunk.'),
        ('postings', 'dl', 'The chunk''s length in lexical tokens (BM25''s document length).'),
        -- fusions
        ('fusions', 'id', 'Fusion id.'),
        ('fusions', 'model_id', 'Embedding model the fusion applies to.'),
        ('fusions', 'method', 'rrf: weighted reciprocal rank fusion (what search_hybrid computes); score: a normalised score combination.'),
        ('fusions', 'weights', 'JSON channel weights {dense, lexical, sparse} (>= 0); a channel missing counts 1.'),
        ('fusions', 'rrf_k', 'RRF constant: a hit at rank r in a channel adds weight / (rrf_k + r) to its score.'),
        ('fusions', 'goldset', 'Gold set(s) it was tuned on; NULL: not tuned on a gold set.'),
        ('fusions', 'goldset_sha256', 'Hash of the gold set''s questions it was tuned on; NULL: none.'),
        ('fusions', 'generation', 'Generation tuned on: in force for it and later ones unless it was refused or discarded; NULL: every generation.'),
        ('fusions', 'folds', 'Cross-validation folds used in tuning; NULL: none.'),
        ('fusions', 'report', 'Tuning report as JSON: per gold set, scores of the default, the best and single-channel settings.'),
        ('fusions', 'created_at', 'When it was stored: the newest applicable row of a model is the one in force.'),
        -- access_groups
        ('access_groups', 'role_name', 'A login role that reads the index (a member of corpusync_reader).'),
        ('access_groups', 'group_name', 'A group of that role: it sees document versions whose acl contains the group.'),

        -- live_chunks (the published generation) and chunks_at(generation) share these columns
        ('live_chunks', 'chunk_id', 'Chunk id (chunks.id).'),
        ('live_chunks', 'document_id', 'Document id (documents.id).'),
        ('live_chunks', 'version_id', 'Document version id (document_versions.id): its lineage.'),
        ('live_chunks', 'ordinal', 'Position of the chunk in its version, from 0.'),
        ('live_chunks', 'chunk_key', 'Stable 32-hex key from path, content hash, chunker settings and character span.'),
        ('live_chunks', 'text', 'The chunk''s text as shown (no breadcrumb).'),
        ('live_chunks', 'token_count', 'Length of the embedded text (breadcrumb and text) in the model''s tokens.'),
        ('live_chunks', 'page_start', 'First page the chunk is on (1-based); NULL: no page information.'),
        ('live_chunks', 'page_end', 'Last page the chunk is on; NULL: no page information.'),
        ('live_chunks', 'char_start', 'Start of the span in the version''s parsed text, in characters from 0.'),
        ('live_chunks', 'char_end', 'End of the span (exclusive), in characters.'),
        ('live_chunks', 'section_path', 'Headings of the section the chunk is in, outermost first ({}: none).'),
        ('live_chunks', 'chunk_type', 'text, table or ocr.'),
        ('live_chunks', 'source_path', 'Path of the source file relative to the source root, POSIX separators.'),
        ('live_chunks', 'content_sha256', 'sha256 of the source file''s bytes as indexed.'),
        ('live_chunks', 'media_type', 'Media type the parser assigned; NULL: unknown.'),
        ('live_chunks', 'parser', 'Parser that extracted the text.'),
        ('live_chunks', 'parser_version', 'Version of that parser; NULL: unknown.'),
        ('live_chunks', 'ocr_engine', 'OCR engine used on the version; NULL: no OCR ran.'),
        ('live_chunks', 'ocr_engine_version', 'Version of the OCR engine; NULL: no OCR ran.'),
        ('live_chunks', 'chunk_config', 'Chunker settings used (max_tokens, overlap, strategy, min_tokens).'),
        ('live_chunks', 'model_id', 'Embedding model (embedding_models.id).'),
        ('live_chunks', 'model_name', 'Embedding model name.'),
        ('live_chunks', 'model_revision', 'Embedding model revision; NULL: unknown.'),
        ('live_chunks', 'run_id', 'The run that indexed the version and wrote the chunk.'),
        ('live_chunks', 'gen_from', 'First generation the chunk''s version is visible in.'),
        ('live_chunks', 'gen_to', 'First generation it is no longer visible in; NULL: still current.'),
        ('live_chunks', 'acl', 'Groups allowed to read the version; NULL: public.'),
        ('live_chunks', 'valid_from', 'Date from which the content is valid (sidecar); NULL: not given.'),
        ('live_chunks', 'valid_until', 'Date until which the content is valid (sidecar); NULL: not given.'),
        ('live_chunks', 'effective_date', 'Date the content takes effect (sidecar); NULL: not given.'),
        ('live_chunks', 'metadata', 'The version''s metadata: parser metadata merged with the sidecar FILE.meta.json.'),
        -- documents_current
        ('documents_current', 'document_id', 'Document id (documents.id).'),
        ('documents_current', 'path', 'Path relative to the source root, POSIX separators.'),
        ('documents_current', 'version_id', 'The version live in the published generation; NULL: not live (deleted, or only quarantined).'),
        ('documents_current', 'content_sha256', 'sha256 of the live version''s bytes; NULL: not live.'),
        ('documents_current', 'size_bytes', 'File size of the live version in bytes; NULL: not live.'),
        ('documents_current', 'mtime', 'File modification time of the live version; NULL: not live or unknown.'),
        ('documents_current', 'media_type', 'Media type of the live version; NULL: not live or unknown.'),
        ('documents_current', 'parser', 'Parser of the live version; NULL: not live.'),
        ('documents_current', 'parser_version', 'Parser version of the live version; NULL: not live or unknown.'),
        ('documents_current', 'ocr_engine', 'OCR engine of the live version; NULL: no OCR, or not live.'),
        ('documents_current', 'page_count', 'Pages of the live version; NULL: unpaginated format, or not live.'),
        ('documents_current', 'char_count', 'Characters of the live version''s parsed text; NULL: not live.'),
        ('documents_current', 'chunk_count', 'Chunks of the live version; NULL: not live.'),
        ('documents_current', 'live_since_generation', 'Generation the live version first appeared in (its gen_from); NULL: not live.'),
        ('documents_current', 'indexed_by_run', 'Run that indexed the live version (runs.id); NULL: not live.'),
        ('documents_current', 'last_quarantine_reason', 'Reason code of the path''s latest quarantine record; NULL: never quarantined.'),
        ('documents_current', 'last_quarantine_error', 'Full error of the latest quarantine record; NULL: never quarantined.'),
        ('documents_current', 'last_quarantined_at', 'When the path was last quarantined; NULL: never.'),
        ('documents_current', 'status', 'live, live (newer content quarantined) (a later content failed and the file still has it; the older version stays live), quarantined (nothing live; the file still fails), or not live (deleted, or its failure closed: the file is gone).'),
        ('documents_current', 'last_quarantine_resolved_at', 'When the latest quarantine record was closed: the file was gone from the source, back to its live content, or a later content went live; NULL: open (it still describes the file), or never quarantined.'),
        ('documents_current', 'last_quarantine_resolution', 'Why the latest quarantine record was closed: gone, live-content or indexed; NULL: open, or never quarantined.'),
        ('documents_current', 'acl', 'Groups allowed to read the live version; NULL: public, or not live.'),
        ('documents_current', 'valid_from', 'Date from which the live content is valid (sidecar); NULL: not given, or not live.'),
        ('documents_current', 'valid_until', 'Date until which the live content is valid (sidecar); NULL: not given, or not live.'),
        ('documents_current', 'effective_date', 'Date the live content takes effect (sidecar); NULL: not given, or not live.'),
        -- run_summary
        ('run_summary', 'run_id', 'Run id (runs.id).'),
        ('run_summary', 'kind', 'What ran: refresh.'),
        ('run_summary', 'status', 'Outcome: running, published, no_changes, refused, failed or crashed.'),
        ('run_summary', 'started_at', 'When the run started.'),
        ('run_summary', 'finished_at', 'When it ended; NULL: still running.'),
        ('run_summary', 'duration', 'finished_at - started_at (interval); NULL: still running.'),
        ('run_summary', 'generation', 'Generation built (published or not), else the one that stayed live; NULL while running.'),
        ('run_summary', 'published', 'True when this run published its generation.'),
        ('run_summary', 'source_root', 'Absolute path of the source folder.'),
        ('run_summary', 'docs_new', 'Documents indexed for the first time; NULL until the run finishes.'),
        ('run_summary', 'docs_changed', 'Documents re-indexed (content or pipeline changed); NULL until the run finishes.'),
        ('run_summary', 'docs_unchanged', 'Documents kept as they were; NULL until the run finishes.'),
        ('run_summary', 'docs_deleted', 'Documents removed from the new generation; NULL until the run finishes.'),
        ('run_summary', 'docs_quarantined', 'Files quarantined by this run; NULL until the run finishes.'),
        ('run_summary', 'chunks_embedded', 'Chunks embedded by the model in this run; NULL until the run finishes.'),
        ('run_summary', 'chunks_reused', 'Chunks whose vectors were reused from stored ones (same text hash and model); NULL until the run finishes.'),
        ('run_summary', 'chunks_retired', 'Chunks of retired versions (gone from the new generation); NULL until the run finishes.'),
        ('run_summary', 'model_name', 'Model of the published index when the run started; NULL: empty index.'),
        ('run_summary', 'config_hash', 'Hash of the run''s settings.'),
        ('run_summary', 'code_version', 'corpusync version (and git commit) that ran.'),
        ('run_summary', 'message', 'Error, refusal or other note; NULL: none.'),
        -- eval_results
        ('eval_results', 'evaluation_id', 'Evaluation id (evaluations.id).'),
        ('eval_results', 'created_at', 'When the evaluation was stored.'),
        ('eval_results', 'run_id', 'The refresh run whose gate evaluated; NULL: a standalone corpusync eval.'),
        ('eval_results', 'generation', 'The generation evaluated.'),
        ('eval_results', 'generation_status', 'That generation''s status now (candidate, published, superseded, refused, ...); NULL: generation gone.'),
        ('eval_results', 'goldset', 'Gold set name.'),
        ('eval_results', 'goldset_sha256', 'Hash of the gold set''s questions (values are comparable when it matches).'),
        ('eval_results', 'n_questions', 'Number of questions evaluated.'),
        ('eval_results', 'mode', 'Retrieval mode: dense, lexical, hybrid, ...'),
        ('eval_results', 'metric', 'Metric name: recall@k, mrr@10, ndcg@10, hit@10, latency_ms_p50, latency_ms_p95.'),
        ('eval_results', 'value', 'Metric value: 0..1 for quality metrics, milliseconds for latency_ms_*.'),
        ('eval_results', 'passed', 'Whether the evaluation passed the gate; NULL: not gated.'),
        ('eval_results', 'overridden', 'True when a failed gate was overridden with --skip-gate.'),
        ('eval_results', 'model_name', 'Embedding model name; NULL: unknown model.')
    ) AS t(rel, col, note) LOOP
        IF EXISTS (SELECT 1 FROM pg_attribute a
                   JOIN pg_class c ON c.oid = a.attrelid
                   JOIN pg_namespace n ON n.oid = c.relnamespace
                   WHERE n.nspname = 'corpusync' AND c.relname = r.rel AND a.attname = r.col
                     AND a.attnum > 0 AND NOT a.attisdropped) THEN
            EXECUTE format('COMMENT ON COLUMN corpusync.%I.%I IS %L', r.rel, r.col, r.note);
        END IF;
    END LOOP;
END
$comments$;

-- Functions (every overload of the name) that have no comment from their own file.
DO $comments$
DECLARE
    r record;
    f regprocedure;
BEGIN
    FOR r IN SELECT * FROM (VALUES
        ('published_generation', 'The generation readers see now (index_state.published_generation; 0: nothing published).'),
        ('visible_in', 'True when a row with this generation range (gen_from, gen_to; NULL gen_to: open) is part of the given generation.'),
        ('chunks_at', 'Every chunk of a given generation, with its lineage (the columns of live_chunks).'),
        ('matches_filter', 'Document-level search filter: path prefix, glob, type, modified_after/modified_before, metadata containment.'),
        ('lexical_parse', 'Parse the lexical query syntax: scored terms, "required phrases", -excluded terms, -"excluded phrases".'),
        ('search_hybrid', 'Hybrid retrieval (dense, BM25, sparse; weighted reciprocal rank fusion) over one generation, default the published one.'),
        ('search_text', 'Okapi BM25 search over the published generation (no embeddings needed).'),
        ('reader_groups', 'The access groups (access_groups) of the role running the query: row-level security shows it versions whose acl is NULL or overlaps them.')
    ) AS t(fn, note) LOOP
        FOR f IN SELECT p.oid::regprocedure FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                 WHERE n.nspname = 'corpusync' AND p.proname = r.fn
                   AND obj_description(p.oid, 'pg_proc') IS NULL LOOP
            EXECUTE format('COMMENT ON FUNCTION %s IS %L', f, r.note);
        END LOOP;
    END LOOP;
END
$comments$;
