SELECT greatest(coalesce(max(generation), 0), (SELECT published_generation FROM corpusync.index_state)) + 1
       AS generation
FROM corpusync.generations
