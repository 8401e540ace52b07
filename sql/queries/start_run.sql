INSERT INTO corpusync.runs (kind, source_root, config, config_hash, code_version, base_generation, model_id,
                            prefect_flow_run_id, hostname, pid)
VALUES (%(kind)s, %(source_root)s, %(config)s::jsonb, %(config_hash)s, %(code_version)s, %(base_generation)s,
        %(model_id)s, %(prefect_flow_run_id)s, %(hostname)s, %(pid)s)
RETURNING id
