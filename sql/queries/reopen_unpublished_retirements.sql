-- Crash/rollback recovery: undo retirements made by a generation that is not live.
UPDATE corpusync.document_versions SET gen_to = NULL WHERE gen_to > %(published)s
