"""Offline and telemetry defaults, applied once at every entry point (CLI, flow module, tests).

Only sets variables the user has not set. onnxruntime, Prefect, ragas, unstructured and the Hugging Face
libraries otherwise try to reach the network at run time (see ../shared/STACK.md).
"""

from __future__ import annotations

import os

DEFAULTS = {
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "RAGAS_DO_NOT_TRACK": "true",
    "ORT_DISABLE_TELEMETRY": "1",
    "SCARF_NO_ANALYTICS": "true",
    "UNSTRUCTURED_DISABLE_NOTICE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "GX_ANALYTICS_ENABLED": "false",
    # corpusync's own log records (quarantines, overrides, recoveries) reach the Prefect run's logs
    "PREFECT_LOGGING_EXTRA_LOGGERS": "corpusync",
    # ...and outside a flow run (a query from an application, a store call before the flow starts) they go to
    # the console only: the API takes no record without a run, and Prefect would add a UserWarning per record
    "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",
}


def apply_offline_defaults() -> None:
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)
