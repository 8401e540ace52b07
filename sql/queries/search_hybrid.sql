-- Hybrid retrieval over ONE generation (the published one unless %(generation)s is given):
-- dense HNSW (iterative scan keeps filtered queries at k rows) + full-text over jieba-segmented text,
-- fused with reciprocal rank fusion. {dim} and {model_id} are literals matching the partial HNSW index.
WITH state AS (
    SELECT coalesce(%(generation)s::int, published_generation) AS gen FROM corpusync.index_state
),
live AS (
    SELECT v.id FROM corpusync.document_versions v, state
    WHERE corpusync.visible_in(v.gen_from, v.gen_to, state.gen)
),
dense AS (
    SELECT id, row_number() OVER (ORDER BY distance, id) AS rnk, 1 - distance AS score
    FROM (
        SELECT c.id, c.dense::halfvec({dim}) <=> %(qvec)s::halfvec({dim}) AS distance
        FROM corpusync.chunks c
        WHERE %(w_dense)s > 0 AND c.model_id = {model_id} AND c.version_id IN (SELECT id FROM live)
        ORDER BY c.dense::halfvec({dim}) <=> %(qvec)s::halfvec({dim})
        LIMIT %(pool)s
    ) d
),
lexq AS (
    SELECT (SELECT string_agg(quote_literal(l), ' | ')
            FROM unnest(tsvector_to_array(to_tsvector('simple', %(qtext)s))) AS l)::tsquery AS tsq
),
lexical AS (
    SELECT id, row_number() OVER (ORDER BY score DESC, id) AS rnk, score
    FROM (
        SELECT c.id, ts_rank_cd(c.tsv, lexq.tsq, 1) AS score
        FROM corpusync.chunks c, lexq
        WHERE %(w_lex)s > 0 AND lexq.tsq IS NOT NULL AND c.tsv @@ lexq.tsq
          AND c.model_id = {model_id} AND c.version_id IN (SELECT id FROM live)
        ORDER BY score DESC, c.id
        LIMIT %(pool)s
    ) l
),
fused AS (
    SELECT coalesce(d.id, l.id) AS id,
           coalesce(%(w_dense)s / (%(rrf_k)s + d.rnk), 0) + coalesce(%(w_lex)s / (%(rrf_k)s + l.rnk), 0) AS score,
           d.rnk AS dense_rank, d.score AS dense_score, l.rnk AS lexical_rank, l.score AS lexical_score
    FROM dense d FULL OUTER JOIN lexical l ON l.id = d.id
)
SELECT f.id AS chunk_id, f.score, f.dense_rank, f.dense_score, f.lexical_rank, f.lexical_score,
       c.text, c.document_id, c.version_id, d.path AS source, c.page_start, c.page_end, c.char_start,
       c.char_end, c.section_path, c.chunk_type, v.content_sha256, v.parser, v.parser_version, c.run_id,
       c.model_id, (SELECT gen FROM state) AS generation
FROM fused f
JOIN corpusync.chunks c ON c.id = f.id
JOIN corpusync.document_versions v ON v.id = c.version_id
JOIN corpusync.documents d ON d.id = c.document_id
ORDER BY f.score DESC, f.id
LIMIT %(k)s
