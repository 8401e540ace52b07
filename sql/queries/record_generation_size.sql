-- At publish: how many documents the generation shows.
UPDATE corpusync.generations g
SET live_documents = (SELECT count(*) FROM corpusync.document_versions v
                      WHERE corpusync.visible_in(v.gen_from, v.gen_to, g.generation))
WHERE g.generation = %(generation)s
