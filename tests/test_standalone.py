"""The suite stands on its own: without ../shared the tests read the data bundled in tests/data, and every
bundled file (and every sample-corpus file) is accounted for in its SOURCE.md, both ways, so provenance and
licence cannot silently go missing and a bundled file cannot vanish unnoticed where ../shared hides it."""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import BUNDLED_DATA, REPO, SAMPLE

BUDGET_BYTES = 8_000_000  # the bundled excerpts are meant to stay small; the full data lives in ../shared


def listed(source_md: Path, *, first_column: bool = False) -> set[str]:
    """The paths a SOURCE.md names in backticks (with `first_column`, only those in the path column of its tables),
    `{a,b}` groups expanded; globs such as `en/*.md` stay globs."""
    text = source_md.read_text(encoding="utf-8")
    if first_column:
        text = "\n".join(line.split("|")[1] for line in text.splitlines() if line.startswith("| `"))
    out: set[str] = set()
    for token in re.findall(r"`([^`\s]+)`", text):
        group = re.search(r"\{([^}]*)\}", token)
        alts = group.group(1).split(",") if group else [""]
        out.update(token[:group.start()] + alt + token[group.end():] if group else token for alt in alts)
    return out


def files_under(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and p.name != "SOURCE.md")


def test_every_bundled_file_has_provenance_and_every_listed_file_is_there() -> None:
    source_md = BUNDLED_DATA / "SOURCE.md"
    present = files_under(BUNDLED_DATA)
    assert [f for f in present if f not in listed(source_md)] == [], f"bundled files missing from {source_md}"
    assert sorted(listed(source_md, first_column=True) - set(present)) == [], f"{source_md} lists absent files"
    assert sum((BUNDLED_DATA / f).stat().st_size for f in present) < BUDGET_BYTES


def test_every_sample_corpus_file_has_provenance() -> None:
    patterns = listed(SAMPLE / "SOURCE.md", first_column=True)
    present = files_under(SAMPLE)
    assert [f for f in present if not any(fnmatch.fnmatch(f, p) for p in patterns)] == []
    assert [p for p in patterns if not any(fnmatch.fnmatch(f, p) for f in present)] == []


def test_without_shared_data_the_tests_read_the_bundled_data() -> None:
    code = "from tests.conftest import TEST_DATA, USING_SHARED_DATA; print(TEST_DATA, USING_SHARED_DATA)"
    env = {**os.environ, "CORPUSYNC_TEST_DATA": str(REPO / "no-such-folder")}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(BUNDLED_DATA), "False"]
