-- corpusync schema, version 2: retrieval evaluations. Never edit after it has landed.
--
-- One evaluation = one gold set run against one generation with one query model. Per-question scores
-- are kept so a later candidate can be compared question by question (paired bootstrap), and so the
-- worst-regressed questions can be shown with what they retrieved.

CREATE TABLE corpusync.evaluations (
    id               bigserial PRIMARY KEY,
    run_id           bigint REFERENCES corpusync.runs (id),
    generation       integer NOT NULL,
    model_id         integer REFERENCES corpusync.embedding_models (id),
    goldset          text NOT NULL,
    goldset_sha256   text NOT NULL,
    n_questions      integer NOT NULL,
    modes            text[] NOT NULL,
    metrics          jsonb NOT NULL,           -- {mode: {metric: value}}
    ragas            jsonb NOT NULL DEFAULT '{}'::jsonb,
    config           jsonb NOT NULL DEFAULT '{}'::jsonb,
    baseline_id      bigint REFERENCES corpusync.evaluations (id),
    gate             jsonb,                    -- checks with deltas and intervals; NULL when not gated
    passed           boolean,
    overridden       boolean NOT NULL DEFAULT false,
    report_path      text,
    created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX evaluations_lookup ON corpusync.evaluations (goldset, generation, created_at DESC);
COMMENT ON TABLE corpusync.evaluations IS
    'Gold-set evaluations of a generation: aggregate metrics per retrieval mode, RAGAS scores, gate outcome.';

CREATE TABLE corpusync.evaluation_questions (
    evaluation_id   bigint NOT NULL REFERENCES corpusync.evaluations (id) ON DELETE CASCADE,
    mode            text NOT NULL,
    question_id     text NOT NULL,
    scores          jsonb NOT NULL,            -- {metric: value} for this question
    first_rank      integer,                   -- rank of the first relevant chunk (NULL: none retrieved)
    retrieved       bigint[] NOT NULL,         -- chunk ids, best first
    relevant_count  integer NOT NULL,
    PRIMARY KEY (evaluation_id, mode, question_id)
);
COMMENT ON TABLE corpusync.evaluation_questions IS 'Per-question scores of an evaluation (for paired comparisons).';
