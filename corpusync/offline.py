"""Moved to corpusync.core.offline; this name stays importable for scripts written against the earlier layout (the peer
benchmark in ../shared/peers among them)."""

from __future__ import annotations

import importlib
from typing import Any

_TARGET = "corpusync.core.offline"


def __getattr__(name: str) -> Any:
    return getattr(importlib.import_module(_TARGET), name)
