INSERT INTO corpusync.document_versions (
    document_id, content_sha256, size_bytes, mtime, source_path, media_type, parser, parser_version,
    ocr_engine, ocr_engine_version, page_count, char_count, chunk_count, chunk_config, pipeline_fingerprint,
    model_id, run_id, metadata, cleaning, gen_from, lexical_tokens, acl, valid_from, valid_until, effective_date)
VALUES (%(document_id)s, %(content_sha256)s, %(size_bytes)s, %(mtime)s, %(source_path)s, %(media_type)s,
        %(parser)s, %(parser_version)s, %(ocr_engine)s, %(ocr_engine_version)s, %(page_count)s, %(char_count)s,
        %(chunk_count)s, %(chunk_config)s::jsonb, %(pipeline_fingerprint)s, %(model_id)s, %(run_id)s,
        %(metadata)s::jsonb, %(cleaning)s::jsonb, %(generation)s, %(lexical_tokens)s, %(acl)s, %(valid_from)s,
        %(valid_until)s, %(effective_date)s)
RETURNING id
