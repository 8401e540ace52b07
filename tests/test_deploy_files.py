"""prefect.yaml entrypoints import and match their flow's signature; docker-compose.yml is valid."""

from __future__ import annotations

import importlib
import inspect
import json
import re
from typing import Any

import jsonschema
import yaml

from tests.conftest import BUNDLED_DATA, REPO, SHARED_DATA


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
    # the shared copy beside the checkout, else the identical one bundled in tests/data/specs
    shared = SHARED_DATA.parent / "specs" / "compose-spec.json"
    schema_path = shared if shared.is_file() else BUNDLED_DATA / "specs" / "compose-spec.json"
    schema = json.loads(schema_path.read_text())
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    jsonschema.validate(compose, schema)
    assert {"postgres", "prefect-server", "worker"} <= set(compose["services"])
    assert compose["services"]["postgres"]["image"].startswith("pgvector/pgvector")


def _compose() -> dict[str, Any]:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def test_compose_requires_secrets_model_and_gold_sets_without_defaults() -> None:
    """A `${VAR:-}` became an empty CORPUSYNC_MODEL_PATH (read as the current folder); a password default sat on
    a published port. Every value the stack cannot guess is `${VAR:?message}`."""
    text = (REPO / "docker-compose.yml").read_text()
    assert not re.search(r"\$\{\w+:?-\}", text), "an empty default"
    for var in ("POSTGRES_PASSWORD", "PREFECT_DB_PASSWORD", "BGE_M3_DIR", "CORPUS_DIR", "GOLDSETS_DIR", "GOLDSETS"):
        uses = re.findall(rf"\$\{{{var}(?!\w)(:?[-?]?)", text)
        assert uses and set(uses) == {":?"}, f"{var}: {uses}"
    services = _compose()["services"]
    for name, svc in services.items():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond this host"
    worker = services["worker"]
    env, mounts = worker["environment"], {re.sub(r"\$\{[^}]*\}", "x", v).split(":")[1] for v in worker["volumes"]}
    assert env["CORPUSYNC_EMBEDDER"] == "bge-m3" and env["CORPUSYNC_MODEL_PATH"] in mounts
    assert json.loads(env["CORPUSYNC_GOLDSET_DIRS"])[0] in mounts and "GOLDSETS" in env["CORPUSYNC_GOLDSETS"]


def test_compose_prefect_has_its_own_database_and_a_healthcheck() -> None:
    services = _compose()["services"]
    server = services["prefect-server"]
    db_url = server["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"]
    assert "@prefect-db:" in db_url and db_url.startswith("postgresql+asyncpg://prefect:")
    assert "corpusync" not in db_url and "prefect-db" in services and "ports" not in services["prefect-db"]
    assert "/api/health" in " ".join(server["healthcheck"]["test"])
    for name in ("register", "worker"):
        assert services[name]["depends_on"]["prefect-server"]["condition"] == "service_healthy"


def test_compose_registers_the_deployments_once_before_the_worker_starts() -> None:
    services = _compose()["services"]
    register, worker = services["register"], services["worker"]
    assert register["command"][-1] == "scripts/register.sh" and register["restart"] == "no"
    assert worker["depends_on"]["register"]["condition"] == "service_completed_successfully"
    pools = {d["work_pool"]["name"] for d in yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]}
    assert worker["command"][:5] == ["prefect", "worker", "start", "--pool", next(iter(pools))] and len(pools) == 1
    # the gpu profile: the CUDA build, a GPU reservation, and the deployments moved to the GPU worker's pool
    gpu, moved = services["worker-gpu"], services["register-gpu"]
    assert gpu["profiles"] == ["gpu"] == moved["profiles"] and gpu["build"]["args"]["TORCH"] == "cuda"
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert moved["command"][-1] == gpu["command"][gpu["command"].index("--pool") + 1] != next(iter(pools))
    assert worker["build"]["args"]["TORCH"] == "cpu"


def test_dockerfile_runs_the_install_script_and_ships_the_deployments() -> None:
    text = (REPO / "Dockerfile").read_text()
    run = [line for line in text.splitlines() if line.startswith("RUN") and ("pip " in line or "install.sh" in line)]
    assert len(run) == 1 and "scripts/install.sh" in run[0] and "--extras eval" in run[0], run
    for path in ("prefect.yaml", "scripts"):
        assert re.search(rf"^COPY .*\b{re.escape(path)}\b", text, re.M), f"Dockerfile does not copy {path}"
    make = (REPO / "Makefile").read_text()
    assert "scripts/install.sh" in make.split("$(STAMP):", 1)[1].split("\n\n", 1)[0]


def test_gate_workflow_runs_refresh_on_corpus_changes() -> None:
    wf = yaml.safe_load((REPO / ".github" / "workflows" / "corpus-gate.yml").read_text())
    triggers = wf.get("on") or wf.get(True)  # YAML 1.1 reads a bare `on` key as true
    paths = triggers["pull_request"]["paths"]
    assert "examples/sample-corpus/**" in paths and "examples/goldset.jsonl" in paths and "tasks/**" in paths
    steps = [s.get("run", "") for s in wf["jobs"]["gate"]["steps"]]
    assert any("corpusync refresh" in s and "--skip-gate" not in s for s in steps)
    assert "goldset.jsonl" in wf["env"]["CORPUSYNC_GOLDSETS"]
