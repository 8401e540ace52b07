COPY corpusync.chunks (version_id, document_id, ordinal, chunk_key, text, text_sha256, token_count, page_start,
                       page_end, char_start, char_end, section_path, chunk_type, metadata, model_id, dense, sparse,
                       search_text, run_id, gen_from)
FROM STDIN WITH (FORMAT BINARY)
