"""discover: walk the source root, stat and hash every file that the include/exclude globs select."""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import json
import os
from collections.abc import Callable, Iterable
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from corpusync.core.errors import ConfigError
from schemas.records import QuarantineRecord, SourceFile

_HASH_BLOCK = 1 << 20
# Metadata for FILE lives in FILE.meta.json: a JSON object, stored with the document version and
# filterable at query time (--filter region=East). Editing it makes a new version.
SIDECAR = ".meta.json"


def _sidecar(path: Path) -> str:
    """Canonical JSON of FILE.meta.json (raises ValueError with the reason when it is not a JSON object or its
    access and validity fields are malformed)."""
    data = json.loads(path.with_name(path.name + SIDECAR).read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError("must be a JSON object")
    access_of(data)
    return json.dumps(data, sort_keys=True, ensure_ascii=False)


DATE_KEYS = ("valid_from", "valid_until", "effective_date")


def access_of(meta: dict[str, Any]) -> dict[str, Any]:
    """The typed access and validity columns of a version from its metadata: "acl" (a group name or a list of
    them; absent = every reader), "valid_from" / "valid_until" / "effective_date" (ISO dates; the document is
    in force from valid_from until the day before valid_until). ValueError names the bad field."""
    out: dict[str, Any] = {"acl": None} | dict.fromkeys(DATE_KEYS)
    acl = meta.get("acl")
    if acl is not None:
        groups = [acl] if isinstance(acl, str) else acl
        if not isinstance(groups, list) or not all(isinstance(g, str) and g.strip() for g in groups):
            raise ValueError('"acl" must be a group name or a list of group names')
        out["acl"] = sorted({g.strip() for g in groups})
    for key in DATE_KEYS:
        value = meta.get(key)
        if value is None:
            continue
        try:
            out[key] = date.fromisoformat(str(value))
        except ValueError:
            raise ValueError(f'"{key}" must be an ISO date (2024-06-01), got {value!r}') from None
    if out["valid_from"] and out["valid_until"] and out["valid_until"] <= out["valid_from"]:
        raise ValueError('"valid_until" must be after "valid_from"')
    return out


MAX_PATH_BYTES = 2000  # a document's path is its identity, indexed by a btree (at most ~2,700 bytes a key)


def _bad_name(rel: str) -> QuarantineRecord | None:
    """A path PostgreSQL cannot hold as the document's identity: not UTF-8 (the file system gave bytes that
    decode to surrogates) or too long for the index."""
    try:
        size = len(rel.encode("utf-8"))
    except UnicodeEncodeError:
        shown = rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        return QuarantineRecord(shown, "discover", "bad-file-name",
                                f"{shown}: the file name is not valid UTF-8; rename the file")
    if size > MAX_PATH_BYTES:
        return QuarantineRecord(rel[:200] + "…", "discover", "path-too-long",
                                f"{rel[:200]}…: the path is {size} bytes (at most {MAX_PATH_BYTES}); shorten it")
    return None


def document_sha256(file_sha256: str, meta_json: str = "") -> str:
    """A document's content hash: its file's sha256, combined with its sidecar's canonical JSON when it has one
    (new metadata is a new version). The parse checks the bytes it reads against it (tasks/parsing/limits.py)."""
    return hashlib.sha256(f"{file_sha256}:{meta_json}".encode()).hexdigest() if meta_json else file_sha256


def sha256_file(path: Path) -> tuple[str, int]:
    """The file's sha256 and the number of bytes it was taken over: the size recorded with the hash, not the
    one a stat saw before a writer appended (the parse compares both with what it reads)."""
    h = hashlib.sha256()
    size = 0
    with path.open("rb") as fh:
        while block := fh.read(_HASH_BLOCK):
            h.update(block)
            size += len(block)
    return h.hexdigest(), size


def _matches(rel: str, patterns: Iterable[str]) -> bool:
    # fnmatch's '*' crosses '/', so '**/x' also needs the root-level form 'x'.
    for pat in patterns:
        if fnmatch.fnmatchcase(rel, pat):
            return True
        if pat.startswith("**/") and fnmatch.fnmatchcase(rel, pat[3:]):
            return True
    return False


def discover(
    root: Path,
    include: Iterable[str] = ("**/*",),
    exclude: Iterable[str] = (),
    on_file: Callable[[int], None] | None = None,
) -> tuple[list[SourceFile], list[QuarantineRecord]]:
    """Every selected regular file under root, sorted by path, with size, mtime and sha256.

    Unreadable files are returned as quarantine records instead of failing the walk. Directory
    symlinks are not followed (no loops); file symlinks are read.
    """
    root = root.expanduser()
    if not root.exists():
        raise ConfigError(f"source folder {root} does not exist")
    if not root.is_dir():
        raise ConfigError(f"source {root} is not a folder")
    include, exclude = list(include), list(exclude)
    real_root = root.resolve()
    files: list[SourceFile] = []
    problems: list[QuarantineRecord] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        names = set(filenames)
        for name in sorted(filenames):
            if name.endswith(SIDECAR) and name[: -len(SIDECAR)] in names:
                continue  # the metadata of its neighbour, not a document
            abs_path = Path(dirpath) / name
            rel = abs_path.relative_to(root).as_posix()
            if not _matches(rel, include) or _matches(rel, exclude):
                continue
            if problem := _bad_name(rel):
                problems.append(problem)
                continue
            if abs_path.is_symlink() and _is_loop(abs_path):
                problems.append(QuarantineRecord(rel, "discover", "symlink-loop",
                                                 f"{rel} is a link that leads back to itself "
                                                 f"({os.readlink(abs_path)}): not indexed"))
                continue
            try:
                if abs_path.is_symlink() and not abs_path.resolve().is_relative_to(real_root):
                    problems.append(QuarantineRecord(rel, "discover", "outside-source",
                                                     f"{rel} is a link to {os.readlink(abs_path)}, outside the "
                                                     f"source folder {real_root}: not indexed"))
                    continue
                st = abs_path.stat()
                if not abs_path.is_file():
                    continue
                digest, size = sha256_file(abs_path)
                meta = _sidecar(abs_path) if name + SIDECAR in names else ""
            except OSError as exc:
                problems.append(QuarantineRecord(rel, "discover", "unreadable", f"{type(exc).__name__}: {exc}"))
                continue
            except (ValueError, RecursionError) as exc:  # RecursionError: a JSON sidecar nested too deep
                reason = str(exc) if isinstance(exc, ValueError) else "nested too deeply to read"
                problems.append(QuarantineRecord(rel, "discover", "bad-metadata", f"{name}{SIDECAR}: {reason}"))
                continue
            files.append(
                SourceFile(
                    path=rel,
                    abs_path=abs_path,
                    size=size,
                    mtime=datetime.fromtimestamp(st.st_mtime, tz=UTC),
                    sha256=document_sha256(digest, meta),
                    meta_json=meta,
                )
            )
            if on_file:
                on_file(1)
    files.sort(key=lambda f: f.path)
    return files, problems


def _is_loop(link: Path) -> bool:
    """A chain of links that never reaches a file (Path.resolve raises RuntimeError on 3.11, OSError ELOOP
    on 3.13; stat fails with ELOOP either way)."""
    try:
        link.resolve(strict=False)
        link.stat()
    except RuntimeError:
        return True
    except OSError as exc:
        return exc.errno == errno.ELOOP
    return False
