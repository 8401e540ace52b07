-- Re-appliable evaluation views (dropped and re-created when sql/views/ changes).

DROP VIEW IF EXISTS corpusync.eval_results CASCADE;

CREATE VIEW corpusync.eval_results WITH (security_invoker = true) AS
    SELECT e.id AS evaluation_id, e.created_at, e.run_id, e.generation, g.status AS generation_status,
           e.goldset, e.goldset_sha256, e.n_questions, m.key AS mode, x.key AS metric,
           (x.value)::double precision AS value, e.passed, e.overridden, mo.name AS model_name
    FROM corpusync.evaluations e
    CROSS JOIN LATERAL jsonb_each(e.metrics) AS m(key, value)
    CROSS JOIN LATERAL jsonb_each(m.value) AS x(key, value)
    LEFT JOIN corpusync.generations g ON g.generation = e.generation
    LEFT JOIN corpusync.embedding_models mo ON mo.id = e.model_id;
COMMENT ON VIEW corpusync.eval_results IS
    'One row per (evaluation, retrieval mode, metric): metric history over generations, for analysts.';
