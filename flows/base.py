"""What every corpusync flow shares: typed public parameters only (a Settings object passed in process is
kept out of the flow run's parameters), and the pull step of the deployments in prefect.yaml."""

from __future__ import annotations

import os
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from prefect import Flow

from corpusync.core.errors import ConfigError
from schemas.params import with_overrides
from schemas.settings import Settings

P = ParamSpec("P")
R = TypeVar("R")
_IN_PROCESS: ContextVar[Settings | None] = ContextVar("corpusync_in_process_settings", default=None)
CHECKOUT = Path(__file__).resolve().parent.parent


class SettingsFlow(Flow[P, R]):
    """A flow whose in-process caller may pass `settings=`, kept out of the flow run's parameters."""

    def __call__(self, *args: Any, settings: Settings | None = None, **kwargs: Any) -> Any:  # type: ignore[override]
        token = _IN_PROCESS.set(settings)
        try:
            return super().__call__(*args, **kwargs)
        finally:
            _IN_PROCESS.reset(token)


def settings_flow(name: str, **options: Any) -> Callable[[Callable[P, R]], SettingsFlow[P, R]]:
    """`@flow` for corpusync: parameters validated against their types, `settings=` in process."""

    def wrap(fn: Callable[P, R]) -> SettingsFlow[P, R]:
        return SettingsFlow(fn=fn, name=name, validate_parameters=True, **options)

    return wrap


def caller_settings() -> Settings:
    """The in-process caller's Settings object, else the environment's."""
    return _IN_PROCESS.get() or Settings()


def flow_settings(**overrides: Any) -> Settings:
    """The settings of this flow run: caller_settings(), then the parameters that were given (None: not
    given)."""
    return with_overrides(caller_settings(), **overrides)


def enter_checkout(directory: str = "") -> dict[str, str]:
    """Prefect pull step: work in the corpusync checkout, where the entrypoints and relative paths resolve.

    `directory` (prefect.yaml passes CORPUSYNC_CHECKOUT, empty when unset) overrides the default: the checkout
    this module was imported from (the editable install the worker runs, /opt/corpusync in the Docker image).
    A folder without flows/refresh.py and pyproject.toml fails the run here, naming the folder."""
    root = Path(directory).expanduser() if directory.strip() else CHECKOUT
    missing = [p for p in ("flows/refresh.py", "pyproject.toml") if not (root / p).is_file()]
    if missing:
        origin = "CORPUSYNC_CHECKOUT" if directory.strip() else f"the checkout of {__file__}"
        raise ConfigError(f"{root} ({origin}) is not a corpusync checkout: {', '.join(missing)} not found. Set "
                          "CORPUSYNC_CHECKOUT on the worker to the folder holding prefect.yaml and flows/, or "
                          "leave it unset to use the checkout corpusync is installed from")
    os.chdir(root)
    return {"directory": str(root.resolve())}
