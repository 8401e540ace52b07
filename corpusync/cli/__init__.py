"""The `corpusync` command line. Imports of Prefect, torch and the parsers happen inside commands, so
`corpusync --help` and `corpusync db status` start fast. Each command is one library call (modules by
subject: refresh, search, database, evaluation, operations); failures are reported here, once, for all."""

from __future__ import annotations

import importlib
import json
import os
import sys

import typer

from corpusync.cli.base import app

# the command modules register their commands on `app` as they load: in this order, the order of --help
for _module in ("refresh", "search", "database", "evaluation", "operations"):
    importlib.import_module(f"corpusync.cli.{_module}")

__all__ = ["app", "main", "run"]


def main(argv: list[str] | None = None) -> int:
    """Run one command; every outcome maps to a documented exit code (corpusync.core.errors), and under --json
    to exactly one JSON document on stdout. Errors are handled here, once, for every command."""
    from corpusync.core.errors import EXIT_INTERRUPTED

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        # standalone_mode=False: click returns a typer.Exit's code instead of raising it
        rv = app(args=args, standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except SystemExit as exc:  # click exits this way for --help
        return int(exc.code or 0)
    except _click_classes("Abort"):
        return EXIT_INTERRUPTED
    except _click_classes("ClickException") as exc:  # usage errors
        exc.show()  # type: ignore[attr-defined]
        return int(exc.exit_code)  # type: ignore[attr-defined]
    except KeyboardInterrupt:
        typer.secho("interrupted", fg=typer.colors.RED, err=True)
        return EXIT_INTERRUPTED
    except Exception as exc:  # the one place every command's failure is reported
        return _report_failure(exc, as_json="--json" in args)


def _click_classes(name: str) -> tuple[type[BaseException], ...]:
    """click's exception class and the copy typer vendors (typer._click) that its commands raise."""
    import importlib

    found = []
    for module in ("click.exceptions", "typer._click.exceptions"):
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def _report_failure(exc: Exception, *, as_json: bool) -> int:
    """One line naming what failed (a traceback too when it is not an error corpusync knows); under --json
    the same as a JSON document, with the run summary when a refresh got that far."""
    import traceback

    from corpusync.core.errors import EXIT_INTERNAL, as_user_error

    known = as_user_error(exc)
    if known is None:
        traceback.print_exception(exc, file=sys.stderr)
        code = EXIT_INTERNAL
        reason = (f"internal error: {type(exc).__name__}: {exc}. This is a bug in corpusync (or an unexpected "
                  "failure of its environment): the traceback is above; please report it.")
    else:
        code, reason = known.exit_code, str(known)
    summary = getattr(exc, "summary", None)
    if as_json:
        doc = dict(summary) if isinstance(summary, dict) else {}
        doc.update(status="refused" if code == 1 else "error", reason=reason, exit_code=code,
                   error=type(known or exc).__name__)
        typer.echo(json.dumps(doc, ensure_ascii=False, indent=2, default=str))
    else:
        typer.secho(("refused: " if code == 1 else "error: ") + reason, fg=typer.colors.RED, err=True)
    return code


def run() -> None:
    """The console script."""
    _exit(main())


def _exit(code: int) -> None:
    """Exit as the interpreter would, less its teardown of loaded extension modules (after torch: 2.5 s of
    wall time on 2 cores, doing nothing a user needs): threads are joined and exit handlers run first."""
    import atexit
    import threading

    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing left to say
            pass
    os._exit(code)
