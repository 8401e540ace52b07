COPY corpusync.evaluation_questions (evaluation_id, mode, question_id, scores, first_rank, retrieved,
                                     relevant_count) FROM STDIN
