"""Typed, validated parameters of the corpusync flows and their Prefect deployments (prefect.yaml).

A deployment advertises these types as its parameter schema (the Prefect server checks a new run's parameters
against it) and the flow validates them again when it starts, including what a JSON schema cannot say: the
metric names of a tolerance or floor key. Settings never is a parameter: database URLs, API keys and every
other knob come from the worker's environment (CORPUSYNC_* variables, schemas/settings.py), so no secret is
stored with a flow run. A parameter left at None keeps the value the environment gives.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, Field

from corpusync.core.errors import ConfigError
from schemas.eval import check_thresholds
from schemas.settings import Settings


def _tolerances(value: dict[str, float] | None) -> dict[str, float] | None:
    return _thresholds("gate_tolerances", value, tolerance=True)


def _floors(value: dict[str, float] | None) -> dict[str, float] | None:
    return _thresholds("gate_floors", value, tolerance=False)


def _thresholds(name: str, value: dict[str, float] | None, *, tolerance: bool) -> dict[str, float] | None:
    """Metric names checked as the settings check them; a ValueError, so Prefect reports the parameter."""
    if value is not None:
        try:
            check_thresholds(name, value, tolerance=tolerance)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
    return value


Source = Annotated[str, Field(min_length=1)]
GoldSets = Annotated[list[Annotated[str, Field(min_length=1)]] | None, Field(min_length=1)]
Tolerances = Annotated[dict[str, Annotated[float, Field(ge=0)]] | None, AfterValidator(_tolerances)]
Floors = Annotated[dict[str, Annotated[float, Field(ge=0)]] | None, AfterValidator(_floors)]
LockTimeout = Annotated[float | None, Field(ge=0, le=7 * 86400)]
Questions = Annotated[int | None, Field(gt=0)]
Generation = Annotated[int | None, Field(ge=0)]


def with_overrides(base: Settings, **overrides: Any) -> Settings:
    """`base` with the parameters that were given (None: keep base's), validated as one Settings.

    Only fields set on `base` are carried over, so what was left at its default stays "not set" (the
    evaluation's mode planning looks at that); the environment is not read again."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if not given:
        return base
    carried = {name: getattr(base, name) for name in base.model_fields_set}
    return Settings.model_validate(carried | given)
