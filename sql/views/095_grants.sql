-- Re-appliable: what the reader role (corpusync db grant-reader) may use. Views are re-created when this
-- folder changes, which drops their grants, so the grants are re-applied with them. The views run with the
-- reader's rights (security_invoker), so row-level security on the tables decides what a reader sees.
GRANT SELECT ON corpusync.live_chunks, corpusync.documents_current, corpusync.run_summary, corpusync.eval_results
    TO corpusync_reader;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA corpusync TO corpusync_reader;
