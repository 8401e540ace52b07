SELECT question_id, scores, first_rank, retrieved
FROM corpusync.evaluation_questions
WHERE evaluation_id = %(evaluation_id)s AND mode = %(mode)s
