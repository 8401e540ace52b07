"""DOCX through unstructured without its spaCy narrative-text heuristic (tasks/parsing/office.py): the blocks
are those the heuristic would have given, on every DOCX of the test data but the 872-page handbook (37 s of
CPU with the heuristic, 7 s without)."""

from __future__ import annotations

import hashlib
import io
from datetime import UTC, datetime
from pathlib import Path

import pytest

from schemas.records import ParseOptions, SourceFile
from tests.conftest import REPO, TEST_DATA

DOCX = sorted([*TEST_DATA.joinpath("corpus").rglob("*.docx"), *REPO.joinpath("examples").rglob("*.docx")])
SMALL = [p for p in DOCX if p.stat().st_size < 200_000]


def test_docx_blocks_are_those_the_narrative_heuristic_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    import unstructured.partition.docx as docx_module
    from unstructured.partition.text_type import is_possible_narrative_text

    from tasks.parsing.markup import _blocks_from_elements, _unstructured_ready
    from tasks.parsing.office import _never_narrative, _parse_office

    _unstructured_ready()
    assert SMALL, f"no DOCX under {TEST_DATA / 'corpus'}"
    narrative = 0
    for path in SMALL:
        data = path.read_bytes()
        monkeypatch.setattr(docx_module, "is_possible_narrative_text", is_possible_narrative_text)
        elements = docx_module.partition_docx(file=io.BytesIO(data))
        narrative += sum(type(e).__name__ == "NarrativeText" for e in elements)
        with_heuristic = _blocks_from_elements(elements)
        src = SourceFile(path.name, path, len(data), datetime.now(UTC), hashlib.sha256(data).hexdigest())
        without = _parse_office(src, data, ParseOptions(ocr_engine="none")).blocks  # pictures: not compared
        assert docx_module.is_possible_narrative_text is _never_narrative  # the parse skipped the heuristic
        assert without == with_heuristic, f"{path}: the blocks depend on the narrative-text heuristic"
    # the heuristic had something to decide: paragraphs it calls NarrativeText are Text without it, same block
    assert narrative > 0, [Path(p).name for p in SMALL]
