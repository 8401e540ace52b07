"""A minimal progress hook: stages report through it, the CLI attaches a progress bar. No-op by default."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class Reporter(Protocol):
    def start(self, stage: str, total: int | None) -> None: ...
    def advance(self, n: int = 1) -> None: ...
    def finish(self) -> None: ...


class _Null:
    def start(self, stage: str, total: int | None) -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass

    def finish(self) -> None:
        pass


_current: Reporter = _Null()


def current() -> Reporter:
    return _current


@contextmanager
def use(reporter: Reporter) -> Iterator[Reporter]:
    global _current
    previous, _current = _current, reporter
    try:
        yield reporter
    finally:
        _current = previous


@contextmanager
def stage(name: str, total: int | None = None) -> Iterator[Reporter]:
    r = current()
    r.start(name, total)
    try:
        yield r
    finally:
        r.finish()
