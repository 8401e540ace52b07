"""The house layering, checked on the source (AST; nothing is imported):

- tasks/** (the stages) never reach the database: no import, at any level (module, function, TYPE_CHECKING),
  of psycopg / psycopg_pool / pgvector.psycopg or corpusync.store (its db module included).
- corpusync/store/** (the one data-access layer) sits below everything that calls it: it imports its own
  modules, the low-level corpusync.core modules, the model identity (corpusync.adapters.embedding), schemas,
  and from tasks only the pure helpers it encodes with; never flows, query, evaluation or corpusync.app / cli.
- SQL lives in sql/: no string literal that starts like an SQL statement in the Python packages, except in
  corpusync/store/migrations.py (the migration bookkeeping, which runs before any named query can) and
  corpusync/store/embedded.py (the embedded server's listener, checked before the schema exists).
- No import cycle at all, counting every import (module level, in functions, under TYPE_CHECKING):
  * between modules;
  * between packages, corpusync's role packages counted apart (LAYERS, bottom first: corpusync.core, schemas,
    corpusync.adapters, evaluation, tasks, corpusync.store, query, corpusync.app, flows, corpusync.cli); and
    each imports only packages listed before it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("corpusync", "tasks", "schemas", "query", "evaluation", "flows")
DATABASE = ("psycopg", "psycopg_pool", "pgvector.psycopg", "corpusync.store.db", "corpusync.store")
# what corpusync.store may import from this repository's packages (prefixes)
STORE_MAY_IMPORT = ("corpusync.store", "corpusync.core.errors", "corpusync.core.pgcopy", "corpusync.core.vectors",
                    "corpusync.adapters.embedding", "schemas", "tasks.diff", "tasks.discover", "tasks.load")
# the packages from the bottom up: each may import only those before it (corpusync, the root, holds no code)
LAYERS = ("corpusync", "corpusync.core", "schemas", "corpusync.adapters", "evaluation", "tasks", "corpusync.store",
          "query", "corpusync.app", "flows", "corpusync.cli",
          # earlier import paths, kept for scripts written against them (the peer benchmark): on top of all
          "corpusync.offline", "corpusync.pipeline", "corpusync.runtime")
SQL_BOOKKEEPING = ("corpusync.store.migrations", "corpusync.store.embedded")  # the modules that may hold SQL
SQL_START = re.compile(r"^\s*(SELECT|INSERT\s+INTO|UPDATE\s+\w|DELETE\s+FROM|CREATE\s|ALTER\s|DROP\s|GRANT\s|"
                       r"SET\s+(LOCAL\s+)?[\w.]+\s*(=|TO\s)|SHOW\s+\w+$|COPY\s|TRUNCATE\s|WITH\s+\w+\s+AS\s*\()", re.I)


@dataclass(frozen=True)
class Import:
    name: str  # the dotted name as written, with `from X import y` giving X.y
    line: int
    module_level: bool  # runs at import time (not in a function, not under TYPE_CHECKING)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(path: Path, module: str = "") -> list[Import]:
    """Every import statement of a file; `from X import y` yields X.y (y may be a module or a name)."""
    found: list[Import] = []

    def visit(body: Iterable[ast.stmt], top: bool) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.extend(Import(a.name, node.lineno, top) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: against the file's package
                    parts = module.split(".")[: -node.level]
                    base = ".".join([*parts, base] if base else parts)
                found.extend(Import(f"{base}.{a.name}", node.lineno, top) for a in node.names)
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                visit(node.body, False)
                visit(node.orelse, top)
                continue
            nested = not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                children = getattr(node, field, None)
                if isinstance(children, list):
                    visit([c for c in children if isinstance(c, ast.stmt | ast.excepthandler | ast.match_case)],
                          top and nested)

    visit(ast.parse(path.read_text(), str(path)).body, True)
    return found


def _matches(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def database_imports(path: Path) -> list[str]:
    """'file:line name' for each import of the database in a file (what a stage must not have)."""
    return [f"{path}:{i.line} {i.name}" for i in imports_of(path) if _matches(i.name, DATABASE)]


def modules(root: Path = REPO) -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def module_graph(known: dict[str, Path], *, module_level_only: bool) -> dict[str, set[str]]:
    """Edges between this repository's modules (an import of a name resolves to the module defining it)."""
    graph: dict[str, set[str]] = {m: set() for m in known}
    for mod, path in known.items():
        for imp in imports_of(path, mod if path.name != "__init__.py" else mod + ".__init__"):
            if module_level_only and not imp.module_level:
                continue
            target = imp.name
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != mod:
                graph[mod].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected sets of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in graph:
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(component)
    return found


def package_of(module: str) -> str:
    """The package a module counts in: corpusync's role package (corpusync.core, ...; the CLI module is one of
    its own), else the top-level package."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "corpusync" and len(parts) > 1 else parts[0]


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for mod, targets in graph.items():
        here = package_of(mod)
        out.setdefault(here, set()).update(package_of(t) for t in targets if package_of(t) != here)
    return out


# ---------------------------------------------------------------------------------------------------------


def test_tasks_never_import_the_database() -> None:
    offenders = [o for path in sorted((REPO / "tasks").rglob("*.py")) for o in database_imports(path)]
    assert offenders == [], "tasks/ must stay pure (SQL goes through corpusync.store):\n" + "\n".join(offenders)


def test_the_checker_sees_a_stage_that_uses_the_database(tmp_path: Path) -> None:
    stage = tmp_path / "stage.py"
    stage.write_text("from __future__ import annotations\nimport psycopg\nfrom corpusync.store import db\n\n"
                     "def f() -> None:\n    from corpusync.store import versions\n")
    assert [o.split(" ")[1] for o in database_imports(stage)] == ["psycopg", "corpusync.store.db",
                                                                  "corpusync.store.versions"]


def test_store_imports_only_what_sits_below_it() -> None:
    offenders = [f"{path.relative_to(REPO)}:{i.line} {i.name}"
                 for path in sorted((REPO / "corpusync" / "store").rglob("*.py")) for i in imports_of(path)
                 if _matches(i.name, PACKAGES) and not _matches(i.name, STORE_MAY_IMPORT)]
    assert offenders == [], "corpusync.store must not import the layers above it:\n" + "\n".join(offenders)


def sql_literals(root: Path = REPO) -> list[str]:
    """'file:line text' for each string literal (docstrings aside) that starts like an SQL statement."""
    found = []
    for mod, path in modules(root).items():
        if mod in SQL_BOOKKEEPING:
            continue
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        found += [f"{path.relative_to(root)}:{node.lineno} {node.value[:60]!r}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                  and SQL_START.match(node.value)]
    return found


def test_sql_statements_live_in_sql_files() -> None:
    offenders = sql_literals()
    assert offenders == [], "SQL belongs in sql/queries/*.sql (corpusync.store.db.q):\n" + "\n".join(offenders)


def test_no_import_cycle_between_modules() -> None:
    assert cycles(module_graph(modules(), module_level_only=False)) == []


def test_no_import_cycle_between_packages() -> None:
    assert cycles(package_graph(module_graph(modules(), module_level_only=False))) == []


def test_each_package_imports_only_the_layers_below_it() -> None:
    graph = package_graph(module_graph(modules(), module_level_only=False))
    assert set(graph) <= set(LAYERS), f"a package missing from LAYERS: {set(graph) - set(LAYERS)}"
    upward = {f"{p} -> {t}" for p, targets in graph.items() for t in targets if LAYERS.index(t) > LAYERS.index(p)}
    assert upward == set(), "imports that reach up the layers:\n" + "\n".join(sorted(upward))


def test_the_cycle_finder_finds_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_earlier_import_paths_still_work() -> None:
    """What ../shared/peers/peer_corpusync.py imports, from before the layout moved these modules."""
    from corpusync.app.pipeline import chunk_config as new_chunk_config
    from corpusync.core.offline import apply_offline_defaults as new_offline
    from corpusync.offline import apply_offline_defaults
    from corpusync.pipeline import chunk_config
    from corpusync.runtime import open_database
    from corpusync.store.db import open_database as new_open_database

    assert (apply_offline_defaults, chunk_config, open_database) == (new_offline, new_chunk_config, new_open_database)
