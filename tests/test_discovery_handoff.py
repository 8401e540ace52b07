"""The CLI's check for changes hands the folder it just walked and hashed to the flow run that follows
(corpusync/app/pipeline.py `discovered`), so a small refresh does not discover twice. The snapshot is taken once,
by a discover of the same folder and globs; anything else discovers afresh."""

from __future__ import annotations

from pathlib import Path

import pytest

from corpusync.app import pipeline
from corpusync.app.fastpath import refresh_if_unchanged
from tests.test_refresh_flow import live, run

pytestmark = [pytest.mark.flow, pytest.mark.db]


def test_the_flow_takes_the_checks_snapshot_once(prefect_harness, settings, corpus: Path, conn) -> None:  # type: ignore[no-untyped-def]
    run(settings, corpus)
    added = corpus / "en" / "handoff.md"
    added.write_text("# Handoff\n\nA new page about the snapshot the check hands on.\n", encoding="utf-8")
    checked = refresh_if_unchanged(settings, corpus)
    assert checked.summary is None and checked.found is not None  # work to do: no run recorded here
    assert "en/handoff.md" in {f.path for f in checked.found.files}

    # what the flow is handed is what it builds from: a snapshot without the new file leaves it out
    without = pipeline.Discovered([f for f in checked.found.files if f.path != "en/handoff.md"],
                                  checked.found.problems)
    edited = sorted(corpus.rglob("*.md"))[0]
    edited.write_text(edited.read_text(encoding="utf-8") + "\n\nAn edit after the check.\n", encoding="utf-8")
    with pipeline.discovered(settings, corpus, without):
        summary = run(settings, corpus)
    # taken, not walked again (no timing: a busy machine made a 0.01 s bound fail): the new file and the edit
    # the walk would have found are not in the run
    assert summary["documents"]["new"] == 0 and summary["documents"]["changed"] == 0, summary["documents"]
    assert "en/handoff.md" not in live(conn)

    # the next run walks the folder again: the new file and the edit made after the check
    again = run(settings, corpus)
    assert again["documents"]["new"] == 1 and again["documents"]["changed"] == 1, again["documents"]
    assert "en/handoff.md" in live(conn)


def test_a_snapshot_of_another_folder_or_other_globs_is_not_taken(  # type: ignore[no-untyped-def]
        prefect_harness, settings, corpus: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    empty = pipeline.Discovered([], [])
    with pipeline.discovered(settings, other, empty):
        assert run(settings, corpus)["documents"]["new"] > 0
    narrower = settings.model_copy(update={"include_globs": ["**/*.txt"]})
    (corpus / "en" / "more.md").write_text("# More\n\nAnother page.\n", encoding="utf-8")
    with pipeline.discovered(narrower, corpus, empty):
        assert run(settings, corpus)["documents"]["new"] == 1
