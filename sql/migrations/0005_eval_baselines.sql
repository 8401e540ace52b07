-- corpusync schema, version 5: which gold set and which question set an evaluation scored, so the gate's
-- baseline is an evaluation of the same gold set and the same questions. Never edit after it has landed.
--
-- goldset stays the readable name (file stem or folder name); goldset_key tells apart two gold sets of
-- that name in different folders (name plus a short hash of the absolute path). An evaluation run with an
-- ad-hoc question limit (corpusync eval --limit) records it in question_limit and is never a baseline.
-- Rows stored before this version have no key: the gate matches them by name and content hash.

ALTER TABLE corpusync.evaluations
    ADD COLUMN goldset_key     text,
    ADD COLUMN goldset_source  text,
    ADD COLUMN question_limit  integer CHECK (question_limit > 0);

CREATE INDEX evaluations_by_key ON corpusync.evaluations (goldset_key, generation, created_at DESC);

COMMENT ON COLUMN corpusync.evaluations.goldset_key IS
    'Stable identity of the gold set: its name plus 8 hex digits of the sha256 of its absolute path (a/gold.jsonl and b/gold.jsonl differ). NULL: stored before version 5.';
COMMENT ON COLUMN corpusync.evaluations.goldset_source IS 'The gold set''s path (file or folder) as loaded.';
COMMENT ON COLUMN corpusync.evaluations.question_limit IS
    'The ad-hoc question limit (corpusync eval --limit) of a run that left out questions the gate evaluates; such an evaluation is never a gate baseline. NULL: the gate''s question set.';
