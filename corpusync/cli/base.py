"""The Typer application, the options every command shares and the settings a command builds (with the
--home it was given). The commands live by subject in this package's other modules."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from corpusync.core.offline import apply_offline_defaults

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Keep a pgvector retrieval index exactly in step with a document corpus.")

HomeOpt = Annotated[
    Path | None, typer.Option("--home", help="State folder (default: $CORPUSYNC_HOME or ./.corpusync).")
]


class State:
    """What the top-level options set for the command that runs."""

    home: Path | None = None


def load_settings(**overrides: Any) -> Any:
    """The command's settings: the environment's, with --home."""
    from schemas.settings import Settings

    if State.home is not None:
        overrides["home"] = State.home
    return Settings(**overrides)


@app.callback()
def _main(home: HomeOpt = None) -> None:
    apply_offline_defaults()
    quiet_libraries()
    State.home = home


def quiet_libraries() -> None:
    """Libraries that log INFO lines about themselves (great_expectations' temporary docs folder,
    transformers, langdetect, jieba's dictionary) speak only on warnings."""
    import logging

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    for name in ("great_expectations", "transformers", "langdetect", "jieba", "unstructured", "httpx"):
        logging.getLogger(name).setLevel(logging.WARNING)
