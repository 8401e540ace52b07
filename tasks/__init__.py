"""Pipeline stages: pure functions, one module per stage (no Prefect imports here; see tasks/prefect.py)."""
