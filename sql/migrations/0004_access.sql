-- corpusync schema, version 4: who may read what, and until when it is valid. Never edit after it has landed.
--
-- Access lists and validity dates live on document versions (from the sidecar FILE.meta.json: "acl":
-- ["group", ...], "valid_from" / "valid_until" / "effective_date": ISO dates). Readers are login roles in
-- the NOLOGIN role corpusync_reader (corpusync db grant-reader); their groups are rows of access_groups.
-- Row-level security makes a reader see only versions whose acl is NULL (public) or shares a group with
-- it, in the tables themselves, so the views and search functions (SECURITY INVOKER) and every BM25
-- statistic counted through them see the same rows. The pipeline's own role owns the tables and is not
-- subject to the policies.

ALTER TABLE corpusync.document_versions
    ADD COLUMN acl             text[],
    ADD COLUMN valid_from      date,
    ADD COLUMN valid_until     date,
    ADD COLUMN effective_date  date;

CREATE TABLE corpusync.access_groups (
    role_name   text NOT NULL,
    group_name  text NOT NULL,
    PRIMARY KEY (role_name, group_name)
);

-- The groups of a role (SECURITY DEFINER: readers cannot read access_groups itself), asked for by the
-- policies with the role running the query; only a role's own groups (or those of a role it belongs to).
CREATE FUNCTION corpusync.reader_groups(role_name name) RETURNS text[]
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, corpusync AS $$
    SELECT coalesce(array_agg(g.group_name), '{}') FROM corpusync.access_groups g
    WHERE g.role_name = reader_groups.role_name::text
      AND (reader_groups.role_name = session_user OR pg_has_role(session_user, reader_groups.role_name, 'MEMBER'))
$$;

ALTER TABLE corpusync.document_versions ENABLE ROW LEVEL SECURITY;
CREATE POLICY reader_acl ON corpusync.document_versions FOR SELECT
    USING (acl IS NULL OR acl && corpusync.reader_groups(current_user));

ALTER TABLE corpusync.chunks ENABLE ROW LEVEL SECURITY;
CREATE POLICY reader_acl ON corpusync.chunks FOR SELECT
    USING (EXISTS (SELECT 1 FROM corpusync.document_versions v WHERE v.id = chunks.version_id));

ALTER TABLE corpusync.postings ENABLE ROW LEVEL SECURITY;
CREATE POLICY reader_acl ON corpusync.postings FOR SELECT
    USING (EXISTS (SELECT 1 FROM corpusync.document_versions v WHERE v.id = postings.version_id));

ALTER TABLE corpusync.documents ENABLE ROW LEVEL SECURITY;
CREATE POLICY reader_acl ON corpusync.documents FOR SELECT
    USING (EXISTS (SELECT 1 FROM corpusync.document_versions v WHERE v.document_id = documents.id));

-- A quarantine record shows to a reader only with a document the reader may see (readers never read
-- access_groups).
ALTER TABLE corpusync.quarantine ENABLE ROW LEVEL SECURITY;
CREATE POLICY reader_acl ON corpusync.quarantine FOR SELECT
    USING (EXISTS (SELECT 1 FROM corpusync.documents d WHERE d.path = quarantine.path));

DO $$
BEGIN
    IF to_regrole('corpusync_reader') IS NULL THEN
        CREATE ROLE corpusync_reader NOLOGIN;
    END IF;
END
$$;
GRANT USAGE ON SCHEMA corpusync TO corpusync_reader;
GRANT SELECT ON corpusync.documents, corpusync.document_versions, corpusync.chunks, corpusync.postings,
                corpusync.lexicon, corpusync.fusions, corpusync.generations, corpusync.index_state,
                corpusync.embedding_models, corpusync.runs, corpusync.evaluations, corpusync.evaluation_questions,
                corpusync.quarantine
    TO corpusync_reader;
GRANT EXECUTE ON FUNCTION corpusync.reader_groups(name) TO corpusync_reader;
