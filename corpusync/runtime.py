"""Moved to corpusync.app.runtime, and open_database to corpusync.store.db; this name stays importable for
scripts written against the earlier layout (the peer benchmark in ../shared/peers among them)."""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    if name == "open_database":
        return importlib.import_module("corpusync.store.db").open_database
    return getattr(importlib.import_module("corpusync.app.runtime"), name)
