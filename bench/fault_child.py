"""The fault campaign's child process (bench/faults.py): the real `corpusync` CLI, plus a mark in a file at
every stage start and progress item, and an optional SIGSTOP at a chosen point, so that a kill lands exactly
there. Run by Proc (bench/fault_procs.py) as `python bench/fault_child.py MARKS PAUSE -- CLI ARGS`."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

STAGES = ("startup", "recover", "discover", "diff", "parse", "chunk", "embed", "validate", "load", "evaluate",
          "publish", "prune", "finish")
# where each stage starts: (module, function); the build's stages are called once per document or batch
STEPS = {"discover": ("pipeline", "step_discover"), "diff": ("pipeline", "step_diff"),
         "parse": ("build", "_parsed"), "chunk": ("build", "_chunk"), "embed": ("build", "step_embed"),
         "validate": ("build", "step_validate"), "load": ("build", "step_load_batch"),
         "evaluate": ("pipeline", "step_evaluate"), "publish": ("pipeline", "step_publish"),
         "prune": ("pipeline", "step_prune")}
PROGRESS = {"discover", "parse", "chunk", "embed", "load"}  # stages that report per item (mid-stage pauses)
PER_CALL = {"chunk", "embed", "load"}  # their items are calls (a document, a batch)
BUILD = ("parse", "chunk", "embed", "validate", "load")  # interleaved, batch by batch (corpusync/app/build.py)


# ------------------------------------------------------------------------------------------------------
# the child: the real CLI, plus stage marks and an optional pause


def child(argv: list[str]) -> int:
    """`_child MARKS PAUSE -- CLI ARGS`: marks every stage start (and each progress item) in MARKS, stops
    itself (SIGSTOP) at PAUSE ('stage' = its start, 'stage@k' = after its k-th item, '-' = never)."""
    marks, pause, _, *cli_args = argv
    from corpusync.core.offline import apply_offline_defaults

    apply_offline_defaults()
    if marks != "-":
        _install_hooks(marks, "" if pause == "-" else pause)
    from corpusync import cli

    sys.argv = ["corpusync", *cli_args]
    return int(cli.main(cli_args) or 0)


def _install_hooks(marks: str, pause: str) -> None:
    import contextlib
    import functools

    import tasks.parse_worker
    from corpusync.app import build, pipeline, runtime
    from corpusync.core import progress
    from corpusync.store import runs

    fd = os.open(marks, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    where, _, nth = pause.partition("@")
    done = threading.Event()

    def mark(event: str, stage: str, n: int = 0, path: str = "") -> None:
        tail = f" {json.dumps(path)}" if path else ""
        os.write(fd, f"{time.monotonic():.6f} {event} {stage} {n}{tail}\n".encode())
        hit = stage == where and ((event == "start" and not nth) or (event == "advance" and nth and n == int(nth)))
        if hit and not done.is_set():
            done.set()
            os.write(fd, f"{time.monotonic():.6f} paused {stage} {n}\n".encode())
            os.kill(os.getpid(), signal.SIGSTOP)

    def wrap(stage: str, fn: Any) -> Any:
        """The stage starts at the first call; each call of a per-document or per-batch step is an item."""
        calls = [0]

        @functools.wraps(fn)
        def marked(*a: Any, **kw: Any) -> Any:
            calls[0] += 1
            if calls[0] == 1:
                mark("start", stage)
            if stage in PER_CALL:
                mark("advance", stage, calls[0])
            return fn(*a, **kw)
        return marked

    class Counting:
        def __init__(self, inner: Any, stage: str) -> None:
            self.inner, self.stage, self.n = inner, stage, 0

        def start(self, stage: str, total: int | None) -> None:
            self.inner.start(stage, total)

        def advance(self, n: int = 1) -> None:
            self.inner.advance(n)
            self.n += 1
            if self.stage in STEPS and self.stage not in PER_CALL:  # the build's bar: its steps count
                mark("advance", self.stage, self.n)

        def finish(self) -> None:
            self.inner.finish()

    original_stage = progress.stage

    @contextlib.contextmanager
    def stage(name: str, total: int | None = None) -> Any:
        with original_stage(name, total) as reporter:
            yield Counting(reporter, name)

    pool = getattr(tasks.parse_worker, "ParsePool", None)
    if pool is not None and hasattr(pool, "parse_many"):  # mark each file as the worker pool finishes it
        original_many = pool.parse_many

        def parse_many(self: Any, *a: Any, **kw: Any) -> Any:
            for n, (src, result) in enumerate(original_many(self, *a, **kw), 1):
                mark("file", "parse", 0, src.path)
                mark("advance", "parse", n)
                yield src, result

        pool.parse_many = parse_many
    else:
        original_parse = tasks.parse_worker.ParseWorker.parse

        def parse(self: Any, src: Any) -> Any:
            try:
                return original_parse(self, src)
            finally:
                mark("file", "parse", 0, src.path)

        tasks.parse_worker.ParseWorker.parse = parse  # type: ignore[method-assign]

    mark("start", "startup")
    modules = {"pipeline": pipeline, "build": build}
    for step, (module, name) in STEPS.items():
        setattr(modules[module], name, wrap(step, getattr(modules[module], name)))
    runs.recover = wrap("recover", runs.recover)
    runtime._finish = wrap("finish", runtime._finish)
    progress.stage = stage


if __name__ == "__main__":
    sys.exit(child(sys.argv[1:]))
