"""Hostile names and links in the source folder: each becomes a quarantine record that names the file and
the reason, and the walk goes on (each of these used to take the whole refresh down or leak a file)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tasks.discover import MAX_PATH_BYTES, discover


def test_links_out_of_the_source_folder_are_not_followed(tmp_path: Path) -> None:
    root = tmp_path / "src"
    root.mkdir()
    (root / "ok.md").write_text("# fine", encoding="utf-8")
    secret = tmp_path / "secret.txt"
    secret.write_text("password=hunter2", encoding="utf-8")
    (root / "passwd-link.txt").symlink_to(secret)
    (root / "inside-link.md").symlink_to(root / "ok.md")  # a link that stays inside is a document
    files, problems = discover(root)
    assert {f.path for f in files} == {"ok.md", "inside-link.md"}
    (p,) = problems
    assert p.path == "passwd-link.txt" and p.reason == "outside-source" and "outside the source folder" in p.error


def test_invalid_utf8_and_overlong_names_are_quarantined(tmp_path: Path) -> None:
    root = tmp_path / "src"
    root.mkdir()
    (root / "ok.md").write_text("# fine", encoding="utf-8")
    with open(os.path.join(os.fsencode(root), b"bad-\xff\xfe-name.md"), "wb") as fh:
        fh.write(b"# bad name")
    deep = root
    while len(deep.relative_to(root).as_posix().encode()) <= MAX_PATH_BYTES:
        deep = deep / ("d" * 200)
    deep.mkdir(parents=True)
    (deep / "long.md").write_text("# long", encoding="utf-8")
    files, problems = discover(root)
    assert [f.path for f in files] == ["ok.md"]
    reasons = {p.reason: p for p in problems}
    assert set(reasons) == {"bad-file-name", "path-too-long"}
    assert "bad-\\xff\\xfe-name.md" in reasons["bad-file-name"].path
    assert "not valid UTF-8" in reasons["bad-file-name"].error
    assert len(reasons["path-too-long"].path.encode()) < 1000 and "bytes" in reasons["path-too-long"].error
    for p in problems:
        p.path.encode("utf-8")  # storable in PostgreSQL


def test_a_sidecar_nested_a_thousand_deep_is_bad_metadata(tmp_path: Path) -> None:
    root = tmp_path / "src"
    root.mkdir()
    (root / "a.md").write_text("# a", encoding="utf-8")
    (root / "a.md.meta.json").write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    (root / "b.md").write_text("# b", encoding="utf-8")
    (root / "b.md.meta.json").write_text(json.dumps({"region": "East"}), encoding="utf-8")
    files, problems = discover(root)
    assert [f.path for f in files] == ["b.md"]
    (p,) = problems
    assert p.path == "a.md" and p.reason == "bad-metadata" and "a.md.meta.json" in p.error
