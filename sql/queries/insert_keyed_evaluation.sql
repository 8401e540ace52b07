-- An evaluation with the identity of its gold set (key, path) and its ad-hoc question limit, if any.
INSERT INTO corpusync.evaluations (run_id, generation, model_id, goldset, goldset_key, goldset_source, goldset_sha256,
                                   n_questions, question_limit, modes, metrics, ragas, config, baseline_id, gate,
                                   passed, overridden)
VALUES (%(run_id)s, %(generation)s, %(model_id)s, %(goldset)s, %(goldset_key)s, %(goldset_source)s,
        %(goldset_sha256)s, %(n_questions)s, %(question_limit)s, %(modes)s, %(metrics)s, %(ragas)s, %(config)s,
        %(baseline_id)s, %(gate)s, %(passed)s, %(overridden)s)
RETURNING id
