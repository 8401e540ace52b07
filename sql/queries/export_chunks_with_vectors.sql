-- export_chunks plus each chunk's dense embedding as real[].
SELECT {columns}, c.dense::vector::real[] AS dense FROM corpusync.chunks_at(%(generation)s) x
JOIN corpusync.chunks c ON c.id = x.chunk_id ORDER BY x.source_path, x.ordinal, x.chunk_id
