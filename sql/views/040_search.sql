-- Re-appliable search functions (re-created when sql/views/ changes; corpusync.db.migrate). The Python API (query/search.py) calls
-- corpusync.search_hybrid too, so SQL users and Python get the same hits for the same inputs.

DROP FUNCTION IF EXISTS corpusync.search_text(text, integer, jsonb) CASCADE;
DROP FUNCTION IF EXISTS corpusync.search_hybrid(text, halfvec, sparsevec, integer, jsonb, integer, double precision,
                                                double precision, double precision, double precision, integer) CASCADE;
DROP FUNCTION IF EXISTS corpusync.search_hybrid(text, halfvec, sparsevec, integer, jsonb, integer, double precision,
                                                double precision, double precision, double precision, integer,
                                                double precision, double precision) CASCADE;
DROP FUNCTION IF EXISTS corpusync.matches_filter(jsonb, text, text, timestamptz, jsonb, text) CASCADE;
DROP FUNCTION IF EXISTS corpusync.matches_filter(jsonb, text, text, timestamptz, jsonb) CASCADE;
DROP FUNCTION IF EXISTS corpusync.matches_filter(jsonb, text, text, timestamptz, jsonb, date, date) CASCADE;
DROP FUNCTION IF EXISTS corpusync.json_compare(jsonb, text, jsonb) CASCADE;
DROP FUNCTION IF EXISTS corpusync.matches_ranges(jsonb, jsonb) CASCADE;
DROP FUNCTION IF EXISTS corpusync.lexical_query(text) CASCADE;
DROP FUNCTION IF EXISTS corpusync.lexical_parse(text) CASCADE;

CREATE FUNCTION corpusync.json_compare(a jsonb, op text, b jsonb)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    -- a metadata value against a filter value: numerically when the filter value is a number (a numeric
    -- string in the metadata counts), else as text (ISO dates compare correctly); a missing value is false
    SELECT CASE
        WHEN a IS NULL OR jsonb_typeof(a) = 'null' THEN false
        WHEN jsonb_typeof(b) = 'number' THEN
            CASE WHEN jsonb_typeof(a) = 'number' OR (jsonb_typeof(a) = 'string' AND (a #>> '{}') ~ '^\s*-?[0-9]+(\.[0-9]+)?\s*$')
                 THEN CASE op WHEN '>' THEN (a #>> '{}')::numeric > (b #>> '{}')::numeric
                              WHEN '>=' THEN (a #>> '{}')::numeric >= (b #>> '{}')::numeric
                              WHEN '<' THEN (a #>> '{}')::numeric < (b #>> '{}')::numeric
                              WHEN '<=' THEN (a #>> '{}')::numeric <= (b #>> '{}')::numeric
                              WHEN '!=' THEN (a #>> '{}')::numeric <> (b #>> '{}')::numeric
                              ELSE (a #>> '{}')::numeric = (b #>> '{}')::numeric END
                 ELSE false END
        ELSE CASE op WHEN '>' THEN (a #>> '{}') > (b #>> '{}') WHEN '>=' THEN (a #>> '{}') >= (b #>> '{}')
                     WHEN '<' THEN (a #>> '{}') < (b #>> '{}') WHEN '<=' THEN (a #>> '{}') <= (b #>> '{}')
                     WHEN '!=' THEN (a #>> '{}') <> (b #>> '{}') ELSE (a #>> '{}') = (b #>> '{}') END
    END
$$;
COMMENT ON FUNCTION corpusync.json_compare(jsonb, text, jsonb) IS
  'Compare a metadata value with a filter value (op: >, >=, <, <=, =, !=): numbers numerically, else as text.';

CREATE FUNCTION corpusync.matches_ranges(metadata jsonb, ranges jsonb)
RETURNS boolean LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT NOT EXISTS (SELECT 1 FROM jsonb_array_elements(ranges) c
                       WHERE NOT corpusync.json_compare(metadata -> (c ->> 'key'), c ->> 'op', c -> 'value'))
$$;
COMMENT ON FUNCTION corpusync.matches_ranges(jsonb, jsonb) IS
  'Whether document metadata passes every comparison of a filter''s metadata_cmp list.';

CREATE FUNCTION corpusync.matches_filter(f jsonb, path text, media_type text, mtime timestamptz,
                                         metadata jsonb, valid_from date, valid_until date)
RETURNS boolean LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT (f ->> 'path' IS NULL OR starts_with(path, f ->> 'path'))
       AND (f ->> 'glob' IS NULL OR path LIKE replace(replace(replace(replace(replace(
                f ->> 'glob', '\', '\\'), '%', '\%'), '_', '\_'), '*', '%'), '?', '_'))
       AND (f ->> 'type' IS NULL OR lower(right(path, length(f ->> 'type') + 1)) = '.' || lower(f ->> 'type')
            OR media_type = f ->> 'type')
       AND (f ->> 'modified_after' IS NULL OR mtime >= (f ->> 'modified_after')::timestamptz)
       AND (f ->> 'modified_before' IS NULL OR mtime < (f ->> 'modified_before')::timestamptz)
       AND (f -> 'metadata' IS NULL OR metadata @> (f -> 'metadata'))
       AND (f ->> 'valid_at' IS NULL OR (
            (valid_from IS NULL OR valid_from <= CASE f ->> 'valid_at' WHEN 'today' THEN current_date
                                                   ELSE (f ->> 'valid_at')::date END)
            AND (valid_until IS NULL OR valid_until > CASE f ->> 'valid_at' WHEN 'today' THEN current_date
                                                        ELSE (f ->> 'valid_at')::date END)))
       AND (f -> 'metadata_cmp' IS NULL OR corpusync.matches_ranges(metadata, f -> 'metadata_cmp'))
$$;  -- no sub-SELECT here: PostgreSQL inlines this function into the search query (a call per row is slow)
COMMENT ON FUNCTION corpusync.matches_filter(jsonb, text, text, timestamptz, jsonb, date, date) IS
  'Document-level search filter: {"path": prefix, "glob": "contracts/*.pdf", "type": "pdf", '
  '"modified_after"/"modified_before": timestamp, "metadata": {jsonb containment}, "valid_at": date or '
  '"today" (valid_from <= d < valid_until, open bounds when NULL), "metadata_cmp": [{"key", "op", "value"}] '
  '(ranges on metadata: op >, >=, <, <=, =, !=)} ("chunk_type" is checked per chunk by search_hybrid).';

CREATE FUNCTION corpusync.lexical_parse(q text, OUT terms text[], OUT phrases text[],
                                        OUT excluded_terms text[], OUT excluded_phrases text[])
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
-- The lexical query syntax over segmented text (what `corpusync segment` prints): terms separated by
-- spaces are scored; "a quoted phrase" must appear in the chunk's search text (`corpusync segment` lists
-- its segmented words as terms too; a query of phrases only is scored by their words); -term excludes
-- chunks holding that term; -"a phrase" excludes chunks containing the phrase.
DECLARE
    m text[];
    p text;
    tok text;
    rest text;
BEGIN
    q := lower(normalize(coalesce(q, ''), NFKC));
    terms := '{}'; phrases := '{}'; excluded_terms := '{}'; excluded_phrases := '{}';
    FOR m IN SELECT regexp_matches(q, '(^|\s)(-?)"([^"]*)"', 'g') LOOP
        p := btrim(regexp_replace(m[3], '\s+', ' ', 'g'));
        CONTINUE WHEN p = '';
        IF m[2] = '-' THEN
            excluded_phrases := excluded_phrases || p;
        ELSE
            phrases := phrases || p;
        END IF;
    END LOOP;
    rest := btrim(regexp_replace(q, '(^|\s)-?"[^"]*"', ' ', 'g'));
    IF rest <> '' THEN
        FOREACH tok IN ARRAY regexp_split_to_array(rest, '\s+') LOOP
            tok := replace(tok, '"', '');  -- an unbalanced quote is plain text
            CONTINUE WHEN tok = '' OR tok = '-';
            IF left(tok, 1) = '-' THEN
                excluded_terms := excluded_terms || substr(tok, 2);
            ELSE
                terms := terms || tok;
            END IF;
        END LOOP;
    END IF;
    IF cardinality(terms) = 0 THEN  -- only phrases, typed by hand: their words find the candidates
        terms := string_to_array(array_to_string(phrases, ' '), ' ');
    END IF;
    terms := ARRAY(SELECT t FROM unnest(terms) WITH ORDINALITY AS u(t, i) GROUP BY t ORDER BY min(i));
END
$$;
COMMENT ON FUNCTION corpusync.lexical_parse(text) IS
  'Parse the lexical query syntax: scored terms, "required phrases", -excluded terms, -"excluded phrases".';

CREATE FUNCTION corpusync.search_hybrid(
    q_text text,
    q_dense halfvec,
    q_sparse sparsevec DEFAULT NULL,
    k integer DEFAULT 10,
    filter jsonb DEFAULT '{}',
    at_generation integer DEFAULT NULL,
    w_dense double precision DEFAULT NULL,
    w_lexical double precision DEFAULT NULL,
    w_sparse double precision DEFAULT NULL,
    rrf_k double precision DEFAULT NULL,
    pool integer DEFAULT NULL,
    bm25_k1 double precision DEFAULT 1.2,
    bm25_b double precision DEFAULT 0.75
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
    lq record;
    fz record;
    checks boolean;
    syntax text;
    live_ids bigint[];
    in_live text;
BEGIN
    IF filter IS NULL OR jsonb_typeof(filter) = 'null' THEN
        filter := '{}';
    ELSIF jsonb_typeof(filter) <> 'object' THEN
        RAISE EXCEPTION 'filter must be a JSON object, not %', jsonb_typeof(filter);
    END IF;
    SELECT array_agg(key) INTO unknown FROM jsonb_object_keys(filter) AS key
    WHERE key NOT IN ('path', 'glob', 'type', 'chunk_type', 'modified_after', 'modified_before', 'metadata',
                      'valid_at', 'metadata_cmp');
    IF unknown IS NOT NULL THEN
        RAISE EXCEPTION 'unknown filter key(s): %', array_to_string(unknown, ', ')
            USING HINT = 'use path, glob, type, chunk_type, modified_after, modified_before, valid_at, '
                         'metadata: {...} or metadata_cmp: [{"key", "op", "value"}]';
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
    -- weights not given come from the fusion tuned for this model (corpusync eval --tune-fusion), else 1
    SELECT f.weights, f.rrf_k INTO fz FROM corpusync.fusions f
    LEFT JOIN corpusync.generations fg ON fg.generation = f.generation
    WHERE f.model_id = mid
      AND (f.generation IS NULL OR (f.generation <= gen AND fg.status NOT IN ('refused', 'discarded')))
    ORDER BY f.created_at DESC, f.id DESC LIMIT 1;
    w_dense := coalesce(w_dense, (fz.weights ->> 'dense')::float8, 1);
    w_lexical := coalesce(w_lexical, (fz.weights ->> 'lexical')::float8, 1);
    w_sparse := coalesce(w_sparse, (fz.weights ->> 'sparse')::float8, 1);
    rrf_k := coalesce(rrf_k, fz.rrf_k, 60);
    pool := coalesce(pool, greatest(50, k));
    bm25_k1 := coalesce(bm25_k1, 1.2);
    bm25_b := coalesce(bm25_b, 0.75);  -- each channel's candidates (k fused rows come from them)
    IF rrf_k <= 0 OR w_dense < 0 OR w_lexical < 0 OR w_sparse < 0 OR pool < 1 OR k < 0
       OR bm25_k1 < 0 OR bm25_b < 0 OR bm25_b > 1 THEN
        RAISE EXCEPTION 'bad search parameters: rrf_k must be > 0, weights >= 0, pool >= 1, k >= 0, '
                        'bm25_k1 >= 0 and 0 <= bm25_b <= 1';
    END IF;
    -- Under a document filter the matching versions are collected first and passed as an array constant,
    -- which PostgreSQL probes by hashing; a semi-join against a CTE becomes a nested loop under the HNSW
    -- scan's LIMIT (840 x 2,900 comparisons for a 2% path filter at 100k chunks). Without a filter every
    -- version of the generation passes.
    IF filter - 'chunk_type' = '{}'::jsonb THEN
        in_live := 'IN (SELECT id FROM gen_versions)';
    ELSE
        SELECT array_agg(v.id) INTO live_ids
        FROM corpusync.document_versions v JOIN corpusync.documents d ON d.id = v.document_id
        WHERE corpusync.visible_in(v.gen_from, v.gen_to, gen) AND v.model_id = mid
          AND corpusync.matches_filter(filter, d.path, v.media_type, v.mtime, v.metadata, v.valid_from,
                                       v.valid_until);
        in_live := '= ANY($19)';
    END IF;
    lq := corpusync.lexical_parse(q_text);
    checks := filter ->> 'chunk_type' IS NOT NULL OR cardinality(lq.phrases) > 0
              OR cardinality(lq.excluded_terms) > 0 OR cardinality(lq.excluded_phrases) > 0;
    -- the query syntax holds in every channel: a dense or sparse hit must pass it too
    syntax := CASE WHEN cardinality(lq.phrases) + cardinality(lq.excluded_terms) + cardinality(lq.excluded_phrases) = 0
              THEN 'true' ELSE $x$NOT EXISTS (SELECT 1 FROM excluded x WHERE x.version_id = c.version_id
                                                   AND x.ordinal = c.ordinal)
              AND NOT EXISTS (SELECT 1 FROM unnest($15) ph WHERE strpos(c.search_text, ph) = 0)
              AND NOT EXISTS (SELECT 1 FROM unnest($17) ph WHERE strpos(c.search_text, ph) > 0)$x$ END;
    IF sdim IS NULL THEN
        sparse_cte := 'SELECT NULL::bigint AS id, NULL::bigint AS rnk, NULL::float8 AS score WHERE false';
    ELSE
        sparse_cte := format($s$
        SELECT id, row_number() OVER (ORDER BY ip, id) AS rnk, -ip AS score FROM (
            SELECT c.id, c.sparse::sparsevec(%1$s) <#> $3::sparsevec(%1$s) AS ip
            FROM corpusync.chunks c
            WHERE $9 > 0 AND $3 IS NOT NULL AND c.model_id = %2$s AND c.sparse IS NOT NULL
              AND c.version_id %4$s
              AND ($5 ->> 'chunk_type' IS NULL OR c.chunk_type = $5 ->> 'chunk_type')
              AND %3$s
            ORDER BY c.sparse::sparsevec(%1$s) <#> $3::sparsevec(%1$s)
            LIMIT $11) s$s$, sdim, mid, syntax, in_live);
    END IF;
    RETURN QUERY EXECUTE format($q$
    WITH gen_versions AS (  -- the whole generation: BM25's statistics are counted over it
        SELECT v.id, v.chunk_count, v.lexical_tokens
        FROM corpusync.document_versions v
        WHERE corpusync.visible_in(v.gen_from, v.gen_to, $6) AND v.model_id = %2$s
    ),
    excluded AS MATERIALIZED (
        SELECT DISTINCT p.version_id, p.ordinal FROM corpusync.postings p
        WHERE cardinality($16) > 0 AND p.term_id IN (SELECT l.id FROM corpusync.lexicon l WHERE l.term = ANY($16))
    ),
    dense AS (
        SELECT id, row_number() OVER (ORDER BY distance, id) AS rnk, 1 - distance AS score FROM (
            SELECT c.id, c.dense::halfvec(%1$s) <=> $2::halfvec(%1$s) AS distance
            FROM corpusync.chunks c
            WHERE $7 > 0 AND $2 IS NOT NULL AND c.model_id = %2$s
              AND c.version_id %5$s
              AND ($5 ->> 'chunk_type' IS NULL OR c.chunk_type = $5 ->> 'chunk_type')
              AND %4$s
            ORDER BY c.dense::halfvec(%1$s) <=> $2::halfvec(%1$s)
            LIMIT $11) d
    ),
    stats AS (
        SELECT greatest(sum(chunk_count), 1)::float8 AS n,
               greatest(sum(lexical_tokens)::float8 / greatest(sum(chunk_count), 1), 1e-9) AS avgdl
        FROM gen_versions WHERE lexical_tokens IS NOT NULL  -- versions indexed before BM25 cannot match
    ),
    post AS MATERIALIZED (  -- every posting of a query term in the generation (index-only scan per term)
        SELECT p.term_id, p.version_id, p.ordinal, p.tf, p.dl
        FROM corpusync.postings p
        WHERE $8 > 0 AND p.term_id IN (SELECT l.id FROM corpusync.lexicon l WHERE l.term = ANY($14))
          AND p.version_id IN (SELECT id FROM gen_versions)
    ),
    idf AS (  -- Lucene's BM25 idf, never negative
        SELECT p.term_id, ln(1 + (s.n - count(*) + 0.5) / (count(*) + 0.5)) AS w
        FROM post p CROSS JOIN stats s GROUP BY p.term_id, s.n
    ),
    bm25 AS (
        SELECT p.version_id, p.ordinal,
               sum(i.w * p.tf / (p.tf + $12 * (1 - $13 + $13 * p.dl / s.avgdl)))::float8 AS score
        FROM post p JOIN idf i ON i.term_id = p.term_id CROSS JOIN stats s
        WHERE p.version_id %5$s
        GROUP BY p.version_id, p.ordinal
    ),
    lex_top AS (  -- without per-chunk checks only the top `pool` need their chunk row
        SELECT b.version_id, b.ordinal, b.score FROM bm25 b
        ORDER BY b.score DESC, b.version_id, b.ordinal
        LIMIT CASE WHEN $18 THEN NULL ELSE $11 END
    ),
    lexical AS (
        SELECT id, row_number() OVER (ORDER BY score DESC, version_id, ordinal) AS rnk, score FROM (
            SELECT c.id, c.version_id, c.ordinal, t.score
            FROM lex_top t
            JOIN corpusync.chunks c ON c.version_id = t.version_id AND c.ordinal = t.ordinal
            LEFT JOIN excluded x ON x.version_id = t.version_id AND x.ordinal = t.ordinal
            WHERE x.version_id IS NULL
              AND ($5 ->> 'chunk_type' IS NULL OR c.chunk_type = $5 ->> 'chunk_type')
              AND NOT EXISTS (SELECT 1 FROM unnest($15) ph WHERE strpos(c.search_text, ph) = 0)
              AND NOT EXISTS (SELECT 1 FROM unnest($17) ph WHERE strpos(c.search_text, ph) > 0)
            ORDER BY t.score DESC, c.version_id, c.ordinal
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
    $q$, dim, mid, sparse_cte, syntax, in_live)
    USING q_text, q_dense, q_sparse, k, coalesce(filter, '{}'::jsonb), gen, w_dense, w_lexical, w_sparse,
          rrf_k, pool, bm25_k1, bm25_b, lq.terms, lq.phrases, lq.excluded_terms,
          lq.excluded_phrases, checks, live_ids;
END
$fn$;
COMMENT ON FUNCTION corpusync.search_hybrid(text, halfvec, sparsevec, integer, jsonb, integer, double precision,
                                            double precision, double precision, double precision, integer,
                                            double precision, double precision) IS
  'Hybrid retrieval over one generation (default: the published one): dense HNSW, Okapi BM25 over the '
  'lexical postings (statistics of that generation), and sparse when the model has trained sparse weights; '
  'each channel filtered, fused by weighted reciprocal rank fusion (weights not given: the fusion tuned for '
  'the model, else 1). Bring your own query embedding (q_dense) from the index model; q_text is segmented '
  'text in the lexical query syntax (corpusync segment prints it): terms, "phrase", -term, -"phrase".';

CREATE FUNCTION corpusync.search_text(q text, k integer DEFAULT 10, filter jsonb DEFAULT '{}')
RETURNS TABLE (chunk_id bigint, score double precision, text text, source text, page_start integer,
               page_end integer, section_path text[], chunk_type text, generation integer)
LANGUAGE sql STABLE AS $$
    SELECT h.chunk_id, h.lexical_score, h.text, h.source, h.page_start, h.page_end, h.section_path,
           h.chunk_type, h.generation
    FROM corpusync.search_hybrid(q, NULL::halfvec, NULL::sparsevec, k, filter, NULL, 0, 1, 0, 60, greatest(k, 1)) h
$$;
COMMENT ON FUNCTION corpusync.search_text(text, integer, jsonb) IS
  'Okapi BM25 search over the published generation (no embeddings needed). Segment CJK queries first '
  '(corpusync segment): SELECT * FROM corpusync.search_text(''合同 编号 ht2023-0876 -草案'', 5, ''{"type": "md"}'').';
