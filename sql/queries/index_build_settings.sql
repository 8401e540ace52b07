-- For the transaction that builds a model's HNSW indexes: memory for the graph (a build that outgrows it
-- goes on on disk, much slower) and the parallel workers PostgreSQL may use (NULL: the server's own setting;
-- either way capped by its max_worker_processes and max_parallel_workers).
SELECT set_config('maintenance_work_mem', %(memory)s, true),
       set_config('max_parallel_maintenance_workers',
                  coalesce(%(workers)s::text, current_setting('max_parallel_maintenance_workers')), true)
