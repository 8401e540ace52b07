"""How many CPUs this process may use: the one answer the parse pool, the OCR engine's threads and the
HNSW index build's default workers all size themselves by."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, where the platform has one)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # macOS, Windows
        return max(os.cpu_count() or 1, 1)
