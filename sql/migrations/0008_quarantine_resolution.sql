-- corpusync schema, version 8: a quarantine record is closed once it no longer describes the file. Never edit
-- after it has landed.
--
-- A record says "this content of this path failed". It stops being true of the corpus when the path's file
-- is gone from the source, when the file is back to the content its live version has, or when a later
-- content of the path goes live. A refresh then closes the record (resolved_at, resolved_by_run, resolution)
-- instead of leaving documents_current to report the failure for ever; a closed record is history: the diff
-- does not skip the file for it, and the same failure again writes a new, open record.

ALTER TABLE corpusync.quarantine
    ADD COLUMN resolved_at     timestamptz,
    ADD COLUMN resolved_by_run bigint REFERENCES corpusync.runs (id),
    ADD COLUMN resolution      text CHECK (resolution IN ('gone', 'live-content', 'indexed'));
CREATE INDEX quarantine_open ON corpusync.quarantine (path) WHERE resolved_at IS NULL;
