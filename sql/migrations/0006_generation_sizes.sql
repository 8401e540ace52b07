-- The number of live documents each generation published with: the mass-delete guard compares a refresh
-- with the largest recent generation, not only with the one before it (several allowed runs in a row
-- could otherwise empty the index a slice at a time).
ALTER TABLE corpusync.generations ADD COLUMN live_documents integer;
COMMENT ON COLUMN corpusync.generations.live_documents IS
  'Live documents when this generation was published (NULL for generations never published or published before 0006).';

UPDATE corpusync.generations g
SET live_documents = (SELECT count(*) FROM corpusync.document_versions v
                      WHERE v.gen_from <= g.generation AND (v.gen_to IS NULL OR v.gen_to > g.generation))
WHERE g.generation = (SELECT published_generation FROM corpusync.index_state);
