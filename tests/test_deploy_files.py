"""prefect.yaml entrypoints import and match their flow's signature; docker-compose.yml is valid."""

from __future__ import annotations

import importlib
import inspect
import json

import jsonschema
import pytest
import yaml

from tests.conftest import REPO, SHARED_DATA


def test_prefect_yaml_entrypoints_match_flows() -> None:
    spec = yaml.safe_load((REPO / "prefect.yaml").read_text())
    assert spec["deployments"]
    for dep in spec["deployments"]:
        path, _, name = dep["entrypoint"].partition(":")
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        flow = getattr(module, name)
        params = inspect.signature(flow.fn).parameters
        for key in dep.get("parameters", {}):
            assert key in params, f"{dep['name']}: parameter {key} is not in {name}{inspect.signature(flow.fn)}"
        required = [p for p, v in params.items() if v.default is inspect.Parameter.empty]
        assert set(required) <= set(dep.get("parameters", {})), f"{dep['name']} misses required {required}"
        for sched in dep.get("schedules", []):
            from datetime import datetime

            from cronsim import CronSim

            next(CronSim(sched["cron"], datetime(2026, 1, 1)))  # the cron expression parses


def test_compose_file_validates_against_compose_spec() -> None:
    schema_path = SHARED_DATA.parent / "specs" / "compose-spec.json"
    if not schema_path.exists():
        pytest.skip(f"compose spec not found at {schema_path}")
    schema = json.loads(schema_path.read_text())
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    jsonschema.validate(compose, schema)
    assert {"postgres", "prefect-server", "worker"} <= set(compose["services"])
    assert compose["services"]["postgres"]["image"].startswith("pgvector/pgvector")


def test_gate_workflow_runs_refresh_on_corpus_changes() -> None:
    wf = yaml.safe_load((REPO / ".github" / "workflows" / "corpus-gate.yml").read_text())
    triggers = wf.get("on") or wf.get(True)  # YAML 1.1 reads a bare `on` key as true
    paths = triggers["pull_request"]["paths"]
    assert "examples/sample-corpus/**" in paths and "examples/goldset.jsonl" in paths and "tasks/**" in paths
    steps = [s.get("run", "") for s in wf["jobs"]["gate"]["steps"]]
    assert any("corpusync refresh" in s and "--skip-gate" not in s for s in steps)
    assert "goldset.jsonl" in wf["env"]["CORPUSYNC_GOLDSETS"]
