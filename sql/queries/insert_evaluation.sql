INSERT INTO corpusync.evaluations (run_id, generation, model_id, goldset, goldset_sha256, n_questions, modes,
                                   metrics, ragas, config, baseline_id, gate, passed, overridden)
VALUES (%(run_id)s, %(generation)s, %(model_id)s, %(goldset)s, %(goldset_sha256)s, %(n_questions)s, %(modes)s,
        %(metrics)s, %(ragas)s, %(config)s, %(baseline_id)s, %(gate)s, %(passed)s, %(overridden)s)
RETURNING id
