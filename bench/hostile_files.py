"""The files of the hostile corpus (bench/hostile.py): a small valid document of every supported type, and the
inputs that attack a parser by size rather than by damage (a pixel bomb, a zip bomb named .docx), written
without holding them in memory."""

from __future__ import annotations

import io
import random
import struct
import zipfile
import zlib
from pathlib import Path

IMAGE_EXTS = {".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".webp"}
OFFICE_EXTS = {".docx", ".pptx", ".xlsx", ".xlsm"}
WORDS = ("contract payment clause river forest harbour ledger invoice amendment warranty delivery "
         "budget audit schedule notice tender").split()


# ------------------------------------------------------------------------------------------------------
# valid samples of every type


def prose(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words)) + "."


def pdf_bytes(pages: list[str]) -> bytes:
    import pymupdf

    doc = pymupdf.open()
    for text in pages:
        page = doc.new_page()
        if text:
            page.insert_textbox(pymupdf.Rect(56, 56, 540, 780), text, fontsize=11)
    out: bytes = doc.tobytes()
    doc.close()
    return out


def image_bytes(text: str, fmt: str) -> bytes:
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", (900, 220), "white")
    ImageDraw.Draw(img).text((30, 60), text, fill="black", font=ImageFont.load_default(size=44))
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def office_bytes(ext: str, title: str, body: str) -> bytes:
    buf = io.BytesIO()
    if ext == ".docx":
        import docx

        d = docx.Document()
        d.add_heading(title, level=1)
        d.add_paragraph(body)
        d.save(buf)
    elif ext == ".pptx":
        import pptx

        p = pptx.Presentation()
        slide = p.slides.add_slide(p.slide_layouts[1])
        slide.shapes.title.text = title
        slide.placeholders[1].text = body
        p.save(buf)
    else:
        import openpyxl

        wb = openpyxl.Workbook()
        ws = wb.active
        ws.append(["item", "amount", "note"])
        for i, word in enumerate(body.split()[:20]):
            ws.append([f"{title} {i}", i * 10, word])
        wb.save(buf)
    return buf.getvalue()


def valid_sample(ext: str, rng: random.Random, label: str) -> bytes | None:
    """A small, well-formed document of this extension carrying `label` (None: cannot be made here)."""
    body = f"{label}. " + prose(rng, 120)
    if ext in {".txt", ".text"}:
        return f"{label}\n\n{body}\n".encode()
    if ext in {".md", ".markdown"}:
        return f"# {label}\n\n{body}\n\n## Terms\n\n{prose(rng, 80)}\n".encode()
    if ext in {".html", ".htm"}:
        return f"<html><body><h1>{label}</h1><p>{body}</p></body></html>".encode()
    if ext in {".csv", ".tsv"}:
        sep = "," if ext == ".csv" else "\t"
        rows = [sep.join(["id", "label", "note"])] + [sep.join([str(i), label, rng.choice(WORDS)]) for i in range(30)]
        return ("\n".join(rows) + "\n").encode()
    if ext == ".pdf":
        return pdf_bytes([f"{label}\n\n{body}", prose(rng, 200)])
    if ext in OFFICE_EXTS:
        return office_bytes(ext, label, body)
    if ext in IMAGE_EXTS:
        fmt = {".jpg": "JPEG", ".jpeg": "JPEG", ".tif": "TIFF", ".tiff": "TIFF"}.get(ext, ext[1:].upper())
        return image_bytes(label, fmt)
    return None  # legacy binary Office: LibreOffice would be needed to make one


# ------------------------------------------------------------------------------------------------------
# hostile inputs


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def pixel_bomb(path: Path, side: int, bit_depth: int = 1) -> None:
    """A grey PNG of side x side white pixels, compressed as it is written (a few hundred KB on disk)."""
    ihdr = struct.pack(">IIBBBBB", side, side, bit_depth, 0, 0, 0, 0)
    row = b"\x00" + b"\xff" * ((side * bit_depth + 7) // 8)
    comp = zlib.compressobj(9)
    with path.open("wb") as fh:
        fh.write(b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr))
        parts: list[bytes] = []
        for _ in range(side):
            if out := comp.compress(row):
                parts.append(out)
            if sum(map(len, parts)) > 1 << 20:
                fh.write(_png_chunk(b"IDAT", b"".join(parts)))
                parts = []
        parts.append(comp.flush())
        fh.write(_png_chunk(b"IDAT", b"".join(parts)))
        fh.write(_png_chunk(b"IEND", b""))


def zip_bomb_docx(path: Path, megabytes: int) -> None:
    """A .docx whose document.xml inflates to `megabytes` MB of paragraphs (about 1,000:1)."""
    ns = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'
    types = ('<?xml version="1.0"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
             '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
             '<Default Extension="xml" ContentType="application/xml"/><Override PartName="/word/document.xml" '
             'ContentType="application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/>'
             '</Types>')
    rels = ('<?xml version="1.0"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/'
            'relationships"><Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/'
            'relationships/officeDocument" Target="word/document.xml"/></Relationships>')
    para = ("<w:p><w:r><w:t>" + "bomb " * 12800 + "</w:t></w:r></w:p>").encode()  # 64 KB a paragraph
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        zf.writestr("[Content_Types].xml", types)
        zf.writestr("_rels/.rels", rels)
        with zf.open("word/document.xml", "w", force_zip64=True) as fh:
            fh.write(f'<?xml version="1.0"?><w:document {ns}><w:body>'.encode())
            for _ in range(megabytes * (1 << 20) // len(para)):
                fh.write(para)
            fh.write(b"</w:body></w:document>")
