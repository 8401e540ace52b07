SELECT pg_try_advisory_lock(%(key)s) AS locked
-- The single writer's session-level advisory lock, taken if it is free (released when the session ends).
-- The statement comes first: operators (and tests/test_deploy_recipe.py) find a waiting writer in
-- pg_stat_activity by the start of its text.
