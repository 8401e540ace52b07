"""What every format parser shares: the options, the logic version, text cleaning and Markdown tables."""

from __future__ import annotations

import re
import unicodedata
from functools import cache
from importlib import metadata

from corpusync.core.unicode_text import CJK

# Bump when the parse/clean output for the same input changes: documents are re-processed.
PARSE_LOGIC_VERSION = "11"
# The OCR cache's key takes this instead: a reading depends on the page image (in the key) and on how
# corpusync.adapters.ocr.recognise_page reads it, not on the rest of the parse, so a parse logic change does
# not discard readings. Bump when recognise_page's result for the same pixels changes. ("10" is the parse
# logic version the key took before it had its own: caches written then stay valid.)
OCR_READ_VERSION = "10"


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b\ufeff]")
_SPACE_CHARS = r"\t\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000"  # besides " "
# A run of spaces to fold into one " ": two or more, or one that is not " " (a lone " " stays as it is,
# not replaced by itself once per word). With control characters out and line breaks as "\n", these are
# all the whitespace left besides "\n" (str.isspace).
_SPACES = re.compile(rf"[ {_SPACE_CHARS}]{{2,}}|[{_SPACE_CHARS}]")
_ODD_SPACE = re.compile(f"[{_SPACE_CHARS}]")
_SPACE_RUNS = re.compile("  +")  # _SPACES where " " is the only space (the engine scans for its prefix)
_BLANK_LINES = re.compile(r"\n{3,}")
_HYPHEN_BREAK = re.compile(r"(?<=[A-Za-zÀ-ÖØ-öø-ÿ])-\n(?=[a-zß-öø-ÿ])")  # "exam-\nple" -> "example"
_COMPOUND_BREAK = re.compile(r"(?<=[A-Za-zÀ-ÖØ-öø-ÿ])-\n(?=[A-ZÀ-ÖØ-Þ])")  # "Schwarz-\nWeiß" -> "Schwarz-Weiß"
_CJK = CJK + r"\u3000-\u303f\uff00-\uffef"  # Han and CJK/full-width punctuation
# Chinese lines re-join, except before a line that opens a legal unit (第X章 / 第X条 + space, （一）, 一、)
# ("\n" first and the character before it looked behind at: the engine then skips from one "\n" to the next
# instead of trying the look-behind at every position; the same matches)
_CJK_BREAK = re.compile(rf"\n(?<=[{_CJK}]\n)(?!第[0-9０-９一二三四五六七八九十百千零〇两]+[编章节条]\s"
                        rf"|[（(][一二三四五六七八九十]+[）)]|[一二三四五六七八九十]+、)(?=[{_CJK}])")
# Glyph artefacts of PDF text layers, folded to the characters they draw: Kangxi / CJK radicals ("⾦" for
# "金") and Latin ligatures ("ﬁ"). Everything else keeps the document's own characters (full-width
# punctuation and digits included): compatibility folding belongs to the search text and the model input.
_GLYPH_ARTEFACTS = re.compile("[\u2e80-\u2fdf\ufb00-\ufb06]")


def _fold_glyph(m: re.Match[str]) -> str:
    return unicodedata.normalize("NFKC", m.group())


def clean_text(text: str) -> str:
    """NFC (canonical forms only), PDF glyph artefacts folded, control characters out, English
    de-hyphenation, Chinese lines re-joined, whitespace collapsed. Called once per block of every format:
    a step that cannot apply is skipped by a substring test (or, for the steps that only concern other
    characters, by str.isascii, which costs nothing; a single printable line needs only its spaces folded),
    whitespace folded in one pass over the text."""
    ascii = text.isascii()
    if not ascii:
        text = unicodedata.normalize("NFC", text)
        text = _GLYPH_ARTEFACTS.sub(_fold_glyph, text)
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not ascii:
        text = text.replace("\u2028", "\n").replace("\u2029", "\n")
    if text.isprintable():  # one line, no control character, no space but " ": only runs of " " to fold
        return (_SPACE_RUNS.sub(" ", text) if "  " in text else text).strip()
    text = _CONTROL.sub("", text)
    if "-\n" in text:
        text = _HYPHEN_BREAK.sub("", text)
        text = _COMPOUND_BREAK.sub("-", text)
    if not ascii:
        text = _CJK_BREAK.sub("", text)
    # every line stripped: after the fold, a line's edges hold at most one " " (the text's ends: strip below)
    if "\t" in text if ascii else _ODD_SPACE.search(text):
        text = _SPACES.sub(" ", text)
    elif "  " in text:
        text = _SPACE_RUNS.sub(" ", text)
    text = text.replace(" \n", "\n").replace("\n ", "\n")
    if "\n\n\n" in text:
        text = _BLANK_LINES.sub("\n\n", text)
    return text.strip()


@cache
def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def rows_to_markdown(rows: list[list[str]]) -> str:
    """Rows (first = header) as a Markdown table; ragged rows padded, cell pipes escaped (once: a pipe
    that came escaped, as from a code span, is not escaped again)."""
    rows = [[clean_text(c).replace("\\|", "|").replace("|", "\\|").replace("\n", " ") for c in r] for r in rows]
    rows = [r for r in rows if any(r)]
    if not rows:
        return ""
    width = max(len(r) for r in rows)
    rows = [r + [""] * (width - len(r)) for r in rows]
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * width]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows[1:]])
