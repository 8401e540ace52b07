"""DOCX, PPTX and XLSX through `unstructured`, after the zip-bomb check; legacy .doc/.xls/.ppt converted with
LibreOffice first when it is installed."""

from __future__ import annotations

from pathlib import Path

from corpusync.core.errors import ParseError
from schemas.records import ParsedDocument, ParseOptions, SourceFile
from tasks.parsing.common import _version
from tasks.parsing.limits import check_container
from tasks.parsing.markup import _blocks_from_elements, _unstructured_ready

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
    partition = getattr(importlib.import_module(f"unstructured.partition.{module}"), func)
    try:
        elements = partition(file=io.BytesIO(data))
    except Exception as exc:
        raise ParseError(src.path, "unparseable", f"{type(exc).__name__}: {exc}") from exc
    blocks = _blocks_from_elements(elements)
    pages = [b.page for b in blocks if b.page is not None]
    return ParsedDocument(src, blocks, parser="unstructured", parser_version=_version("unstructured"),
                          media_type=media, page_count=max(pages) if pages else None)


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
