-- corpusync schema, version 9: the renames a generation was built with. Never edit after it has landed.
--
-- A refresh that finds a deleted document's content at a new path indexes it there (identity is the path) and
-- records the pair here, in the candidate it builds. Evaluation follows a gold set's reference to a document
-- through the renames of the generation's lineage (its own and those of the published generations before it),
-- so moving or renaming a gold document is not scored as a miss. A refused, discarded or rolled-back
-- candidate's rows are not part of any later generation's lineage (the generations' status says so). Paths,
-- not document ids: prune deletes documents without versions, and the history outlives them. Readers do
-- not get it (no grant, row-level security without a policy): a path can name a document a reader may not see.

CREATE TABLE corpusync.document_renames (
    generation  integer NOT NULL REFERENCES corpusync.generations (generation),
    from_path   text NOT NULL,
    to_path     text NOT NULL,
    run_id      bigint NOT NULL REFERENCES corpusync.runs (id),
    PRIMARY KEY (generation, from_path)
);
ALTER TABLE corpusync.document_renames ENABLE ROW LEVEL SECURITY;

COMMENT ON TABLE corpusync.document_renames IS
  'Documents whose content moved to another path, per generation that indexed the move; gold-set references follow them.';
COMMENT ON COLUMN corpusync.document_renames.generation IS
  'The generation built with the rename: from_path is not in it, to_path is (with the same content).';
COMMENT ON COLUMN corpusync.document_renames.from_path IS
  'The path the content had in the base generation (documents.path of the retired document).';
COMMENT ON COLUMN corpusync.document_renames.to_path IS
  'The path the same content (the same sha256) was found at and indexed under.';
COMMENT ON COLUMN corpusync.document_renames.run_id IS
  'The run that found the rename (runs.id).';
