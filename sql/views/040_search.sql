-- Re-appliable search functions (recreated on every start). The Python API (query/search.py) calls
-- corpusync.search_hybrid too, so SQL users and Python get the same hits for the same inputs.

DROP FUNCTION IF EXISTS corpusync.search_text(text, integer, jsonb) CASCADE;
DROP FUNCTION IF EXISTS corpusync.search_hybrid(text, halfvec, sparsevec, integer, jsonb, integer, double precision,
                                                double precision, double precision, double precision, integer) CASCADE;
DROP FUNCTION IF EXISTS corpusync.matches_filter(jsonb, text, text, timestamptz, jsonb, text) CASCADE;
DROP FUNCTION IF EXISTS corpusync.matches_filter(jsonb, text, text, timestamptz, jsonb) CASCADE;
DROP FUNCTION IF EXISTS corpusync.lexical_query(text) CASCADE;

CREATE FUNCTION corpusync.matches_filter(f jsonb, path text, media_type text, mtime timestamptz,
                                         metadata jsonb)
RETURNS boolean LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT (f ->> 'path' IS NULL OR starts_with(path, f ->> 'path'))
       AND (f ->> 'glob' IS NULL OR path LIKE replace(replace(replace(replace(replace(
                f ->> 'glob', '\', '\\'), '%', '\%'), '_', '\_'), '*', '%'), '?', '_'))
       AND (f ->> 'type' IS NULL OR lower(right(path, length(f ->> 'type') + 1)) = '.' || lower(f ->> 'type')
            OR media_type = f ->> 'type')
       AND (f ->> 'modified_after' IS NULL OR mtime >= (f ->> 'modified_after')::timestamptz)
       AND (f ->> 'modified_before' IS NULL OR mtime < (f ->> 'modified_before')::timestamptz)
       AND (f -> 'metadata' IS NULL OR metadata @> (f -> 'metadata'))
$$;
COMMENT ON FUNCTION corpusync.matches_filter(jsonb, text, text, timestamptz, jsonb) IS
  'Document-level search filter: {"path": prefix, "glob": "contracts/*.pdf", "type": "pdf", '
  '"modified_after"/"modified_before": timestamp, "metadata": {jsonb containment}} ("chunk_type" is '
  'checked per chunk by search_hybrid).';

CREATE FUNCTION corpusync.lexical_query(q text) RETURNS tsquery LANGUAGE sql IMMUTABLE AS $$
    -- any of the query's tokens (OR), ranked by ts_rank_cd; CJK text must be segmented (space-separated
    -- words, as `corpusync segment` or the Python API produce) to match the jieba-segmented index
    SELECT (SELECT string_agg(quote_literal(l), ' | ') FROM unnest(tsvector_to_array(to_tsvector('simple', q))) AS l)::tsquery
$$;

CREATE FUNCTION corpusync.search_hybrid(
    q_text text,
    q_dense halfvec,
    q_sparse sparsevec DEFAULT NULL,
    k integer DEFAULT 10,
    filter jsonb DEFAULT '{}',
    at_generation integer DEFAULT NULL,
    w_dense double precision DEFAULT 1,
    w_lexical double precision DEFAULT 1,
    w_sparse double precision DEFAULT 1,
    rrf_k double precision DEFAULT 60,
    pool integer DEFAULT 50
)
RETURNS TABLE (
    chunk_id bigint, score double precision, dense_rank bigint, dense_score double precision,
    lexical_rank bigint, lexical_score double precision, sparse_rank bigint, sparse_score double precision,
    text text, document_id bigint, version_id bigint, source text, page_start integer, page_end integer,
    char_start integer, char_end integer, section_path text[], chunk_type text, content_sha256 text,
    parser text, parser_version text, run_id bigint, model_id integer, generation integer
)
LANGUAGE plpgsql STABLE
SET hnsw.iterative_scan = 'relaxed_order'  -- a filtered dense query still returns min(k, matching) rows
AS $fn$
DECLARE
    gen integer;
    mid integer;
    dim integer;
    sdim integer;
    unknown text[];
    sparse_cte text;
BEGIN
    SELECT array_agg(key) INTO unknown FROM jsonb_object_keys(coalesce(filter, '{}'::jsonb)) AS key
    WHERE key NOT IN ('path', 'glob', 'type', 'chunk_type', 'modified_after', 'modified_before', 'metadata');
    IF unknown IS NOT NULL THEN
        RAISE EXCEPTION 'unknown filter key(s): %', array_to_string(unknown, ', ')
            USING HINT = 'use path, glob, type, chunk_type, modified_after, modified_before, or metadata: {...}';
    END IF;
    gen := coalesce(at_generation, (SELECT s.published_generation FROM corpusync.index_state s));
    SELECT g.model_id INTO mid FROM corpusync.generations g WHERE g.generation = gen;
    IF mid IS NULL THEN
        RAISE EXCEPTION 'generation % does not exist (is the index empty?)', gen;
    END IF;
    SELECT m.dimension, m.sparse_dim INTO dim, sdim FROM corpusync.embedding_models m WHERE m.id = mid;
    IF q_dense IS NOT NULL AND vector_dims(q_dense) <> dim THEN
        RAISE EXCEPTION 'q_dense has % dimensions; generation % was embedded with % dimensions',
            vector_dims(q_dense), gen, dim;
    END IF;
    IF sdim IS NULL THEN
        sparse_cte := 'SELECT NULL::bigint AS id, NULL::bigint AS rnk, NULL::float8 AS score WHERE false';
    ELSE
        sparse_cte := format($s$
        SELECT id, row_number() OVER (ORDER BY ip, id) AS rnk, -ip AS score FROM (
            SELECT c.id, c.sparse::sparsevec(%1$s) <#> $3::sparsevec(%1$s) AS ip
            FROM corpusync.chunks c
            WHERE $9 > 0 AND $3 IS NOT NULL AND c.model_id = %2$s AND c.sparse IS NOT NULL
              AND c.version_id IN (SELECT id FROM live)
              AND ($5 ->> 'chunk_type' IS NULL OR c.chunk_type = $5 ->> 'chunk_type')
            ORDER BY c.sparse::sparsevec(%1$s) <#> $3::sparsevec(%1$s)
            LIMIT $11) s$s$, sdim, mid);
    END IF;
    RETURN QUERY EXECUTE format($q$
    WITH live AS (  -- visible versions that pass the document-level filter (a hashed lookup per chunk below)
        SELECT v.id
        FROM corpusync.document_versions v JOIN corpusync.documents d ON d.id = v.document_id
        WHERE corpusync.visible_in(v.gen_from, v.gen_to, $6)
          AND corpusync.matches_filter($5, d.path, v.media_type, v.mtime, v.metadata)
    ),
    dense AS (
        SELECT id, row_number() OVER (ORDER BY distance, id) AS rnk, 1 - distance AS score FROM (
            SELECT c.id, c.dense::halfvec(%1$s) <=> $2::halfvec(%1$s) AS distance
            FROM corpusync.chunks c
            WHERE $7 > 0 AND $2 IS NOT NULL AND c.model_id = %2$s
              AND c.version_id IN (SELECT id FROM live)
              AND ($5 ->> 'chunk_type' IS NULL OR c.chunk_type = $5 ->> 'chunk_type')
            ORDER BY c.dense::halfvec(%1$s) <=> $2::halfvec(%1$s)
            LIMIT $11) d
    ),
    lexical AS (
        SELECT id, row_number() OVER (ORDER BY score DESC, id) AS rnk, score FROM (
            SELECT c.id, ts_rank_cd(c.tsv, corpusync.lexical_query($1), 1)::float8 AS score
            FROM corpusync.chunks c
            WHERE $8 > 0 AND corpusync.lexical_query($1) IS NOT NULL AND c.tsv @@ corpusync.lexical_query($1)
              AND c.model_id = %2$s
              AND c.version_id IN (SELECT id FROM live)
              AND ($5 ->> 'chunk_type' IS NULL OR c.chunk_type = $5 ->> 'chunk_type')
            ORDER BY score DESC, c.id
            LIMIT $11) l
    ),
    sparse AS (%3$s),
    fused AS (
        SELECT coalesce(d.id, l.id, s.id) AS id,
               coalesce($7 / ($10 + d.rnk), 0) + coalesce($8 / ($10 + l.rnk), 0)
                 + coalesce($9 / ($10 + s.rnk), 0) AS score,
               d.rnk AS dense_rank, d.score AS dense_score, l.rnk AS lexical_rank, l.score AS lexical_score,
               s.rnk AS sparse_rank, s.score AS sparse_score
        FROM dense d
        FULL OUTER JOIN lexical l ON l.id = d.id
        FULL OUTER JOIN sparse s ON s.id = coalesce(d.id, l.id)
    )
    SELECT f.id, f.score::float8, f.dense_rank, f.dense_score::float8, f.lexical_rank, f.lexical_score::float8,
           f.sparse_rank, f.sparse_score::float8, c.text, c.document_id, c.version_id, d.path, c.page_start,
           c.page_end, c.char_start, c.char_end, c.section_path, c.chunk_type, v.content_sha256, v.parser,
           v.parser_version, c.run_id, c.model_id, $6
    FROM fused f
    JOIN corpusync.chunks c ON c.id = f.id
    JOIN corpusync.document_versions v ON v.id = c.version_id
    JOIN corpusync.documents d ON d.id = c.document_id
    ORDER BY f.score DESC, f.id
    LIMIT $4
    $q$, dim, mid, sparse_cte)
    USING q_text, q_dense, q_sparse, k, coalesce(filter, '{}'::jsonb), gen, w_dense, w_lexical, w_sparse,
          rrf_k, greatest(pool, k);
END
$fn$;
COMMENT ON FUNCTION corpusync.search_hybrid(text, halfvec, sparsevec, integer, jsonb, integer, double precision,
                                            double precision, double precision, double precision, integer) IS
  'Hybrid retrieval over one generation (default: the published one): dense HNSW + full-text (+ sparse when '
  'the model has trained sparse weights), each channel filtered, fused by weighted reciprocal rank fusion. '
  'Bring your own query embedding (q_dense) from the index model; q_text should be jieba-segmented for CJK.';

CREATE FUNCTION corpusync.search_text(q text, k integer DEFAULT 10, filter jsonb DEFAULT '{}')
RETURNS TABLE (chunk_id bigint, score double precision, text text, source text, page_start integer,
               page_end integer, section_path text[], chunk_type text, generation integer)
LANGUAGE sql STABLE AS $$
    SELECT h.chunk_id, h.lexical_score, h.text, h.source, h.page_start, h.page_end, h.section_path,
           h.chunk_type, h.generation
    FROM corpusync.search_hybrid(q, NULL::halfvec, NULL::sparsevec, k, filter, NULL, 0, 1, 0) h
$$;
COMMENT ON FUNCTION corpusync.search_text(text, integer, jsonb) IS
  'Full-text search over the published generation (no embeddings needed). Segment CJK queries first: '
  'SELECT * FROM corpusync.search_text(''合同 编号 HT2023-0876'', 5, ''{"type": "md"}'').';
