COPY corpusync.postings (term_id, version_id, ordinal, tf, dl) FROM STDIN WITH (FORMAT BINARY)
