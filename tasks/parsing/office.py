"""DOCX, PPTX and XLSX through `unstructured`, after the zip-bomb check, their pictures read by OCR in place
(tasks/parsing/office_pictures.py); legacy .doc/.xls/.ppt converted with LibreOffice first when it is
installed."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from corpusync.core.errors import ParseError
from schemas.records import ParsedDocument, ParseOptions, SourceFile
from tasks.parsing.common import _version
from tasks.parsing.limits import check_container
from tasks.parsing.markup import _blocks_from_elements, _unstructured_ready
from tasks.parsing.ocr import recorded_engine
from tasks.parsing.office_pictures import PictureReading, reading_pictures

_OFFICE = {".docx": ("docx", "partition_docx",
                     "application/vnd.openxmlformats-officedocument.wordprocessingml.document"),
           ".pptx": ("pptx", "partition_pptx",
                     "application/vnd.openxmlformats-officedocument.presentationml.presentation"),
           ".xlsx": ("xlsx", "partition_xlsx", "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"),
           ".xlsm": ("xlsx", "partition_xlsx", "application/vnd.ms-excel.sheet.macroEnabled.12")}


def _parse_office(src: SourceFile, data: bytes, options: ParseOptions) -> ParsedDocument:
    import importlib
    import io
    import zipfile

    module, func, media = _OFFICE[Path(src.path).suffix.lower()]
    if not zipfile.is_zipfile(io.BytesIO(data)):
        raise ParseError(src.path, "wrong-format" if not data.startswith(b"PK") else "corrupt",
                         f"not a valid {module.upper()} (Office Open XML) container")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as container:
            check_container(src.path, container.infolist())
    except zipfile.BadZipFile as exc:
        raise ParseError(src.path, "corrupt", f"not a valid {module.upper()} container: {exc}") from exc
    _unstructured_ready()
    partitioner = importlib.import_module(f"unstructured.partition.{module}")
    if module == "docx":
        _no_narrative_heuristic(partitioner)
    partition = getattr(partitioner, func)
    with reading_pictures(src.path, options) as pictures:
        try:
            elements = partition(file=io.BytesIO(data))
        except ParseError:  # OCR of a picture failed
            raise
        except Exception as exc:
            raise ParseError(src.path, "unparseable", f"{type(exc).__name__}: {exc}") from exc
    blocks = _blocks_from_elements(elements)
    if not blocks and pictures.pictures:
        raise ParseError(src.path, "no-text", _no_text_in_pictures(pictures))
    pages = [b.page for b in blocks if b.page is not None]
    engine, version = recorded_engine(pictures.record)
    return ParsedDocument(src, blocks, parser="unstructured", parser_version=_version("unstructured"),
                          media_type=media, page_count=max(pages) if pages else None,
                          ocr_engine=engine, ocr_engine_version=version, metadata=pictures.metadata())


def _no_text_in_pictures(p: PictureReading) -> str:
    """Why a document of pictures alone has no text."""
    why = [f"{n} {what}" for n, what in ((p.repeated, "repeated"), (p.undecodable, "in a format that cannot be "
           "decoded (EMF/WMF?)"), (p.oversized, "over the pixel limit"), (p.too_small, "too small to hold text"))
           if n]
    if p.not_read:
        o = p.options
        why.append(f"{p.not_read} not read: " + (
            "OCR is off (CORPUSYNC_OCR_ENGINE=none)" if o.ocr_engine == "none"
            else "OCR of pictures is off (CORPUSYNC_OCR_OFFICE_PICTURES=false)" if not o.office_pictures
            else f"past CORPUSYNC_OCR_MAX_PAGES={o.ocr_max_pages}"))
    read = f"OCR found no text in the {len(p.record)} read" if p.record else "none was read"
    return f"no text besides {p.pictures} picture(s); {read}" + (f" ({'; '.join(why)})" if why else "")


def _never_narrative(text: str, *args: object, **kwargs: object) -> bool:
    return False


def _no_narrative_heuristic(partitioner: ModuleType) -> None:
    """unstructured's DOCX partitioner tells NarrativeText from Text, for a paragraph with no heading or list
    style, by running spaCy's English pipeline over it: 44 of the 58 s of CPU the 872-page handbook took under
    cProfile (37-45 s -> 7 s without it), and meaningless on Chinese. Both become the same text block here
    (_blocks_from_elements), so the DOCX module's reference to the heuristic is replaced by one that says no;
    the blocks are identical (tests/test_office_parse.py compares them on every small DOCX of the test data)."""
    names = vars(partitioner)
    if "is_possible_narrative_text" in names:  # else a later unstructured classifies otherwise: nothing to skip
        names["is_possible_narrative_text"] = _never_narrative


_LEGACY = {".doc": ".docx", ".xls": ".xlsx", ".ppt": ".pptx"}


def _parse_legacy(src: SourceFile, data: bytes, options: ParseOptions) -> ParsedDocument:
    """Old binary Office formats: convert with LibreOffice when installed, else quarantine with the fix."""
    import shutil
    import subprocess
    import tempfile

    target = _LEGACY[Path(src.path).suffix.lower()]
    soffice = shutil.which("soffice") or shutil.which("libreoffice")
    if soffice is None:
        raise ParseError(src.path, "legacy-format",
                         f"{Path(src.path).suffix} (binary Office) needs LibreOffice to convert; install it "
                         f"(soffice on PATH) or save the file as {target}")
    with tempfile.TemporaryDirectory() as tmp:
        inp = Path(tmp) / ("in" + Path(src.path).suffix.lower())
        inp.write_bytes(data)
        proc = subprocess.run([soffice, "--headless", "--convert-to", target[1:], "--outdir", tmp, str(inp)],
                              capture_output=True, timeout=300, check=False)
        out = Path(tmp) / ("in" + target)
        if proc.returncode != 0 or not out.exists():
            raise ParseError(src.path, "legacy-format", f"LibreOffice could not convert it: {proc.stderr[-300:]!r}")
        converted = out.read_bytes()
    doc = _parse_office(src, converted, options)
    doc.parser = "libreoffice+unstructured"
    return doc
