"""What a character is and what text becomes before it is tokenized: the script classes (Han, the unspaced
scripts read as bigrams, combining marks) and normalize(). Kept apart from the lexical analyzer because parsing,
OCR and chunking use the same definition of Han without tokenizing anything. Every rule here decides tokens: a
change bumps corpusync.core.lexical.TOKENIZER_VERSION (part of the analyzer's fingerprint)."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterable
from functools import cache
from typing import Any

# Han, the one unspaced script jieba segments: iteration marks, Ext A, URO, compatibility, Ext B..I, G/H.
CJK = r"\u3005\u3007\u303b\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f\U00030000-\U000323af"
HAN = re.compile(f"[{CJK}]")


def is_cjk(ch: str) -> bool:
    """Whether a character is Han (the project's one definition: parse, OCR and chunking use it too)."""
    return bool(HAN.match(ch))


def _class(ranges: Iterable[tuple[int, int]], keep: Callable[[str], bool]) -> str:
    """Character-class body of the code points in `ranges` for which keep(char) holds, as compact ranges."""
    spans: list[list[int]] = []
    for lo, hi in ranges:
        for cp in range(lo, hi + 1):
            if keep(chr(cp)):
                if spans and spans[-1][1] == cp - 1:
                    spans[-1][1] = cp
                else:
                    spans.append([cp, cp])
    return "".join(f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}" for a, b in spans)


def _is_mark(ch: str) -> bool:
    return unicodedata.category(ch)[0] == "M"


# Combining marks: Python's \w leaves them out, which would cut Devanagari, Arabic or Thai words apart.
MARKS = _class([(0x0300, 0x1FFFF)], _is_mark)
# Unspaced scripts jieba does not know (kana, Thai, Lao, Myanmar, Khmer): letters, digits and marks only.
BIGRAM = _class(
    [(0x0E00, 0x0EFF), (0x1000, 0x109F), (0x1780, 0x17FF), (0x19E0, 0x19FF), (0x3041, 0x30FF), (0x31F0, 0x31FF),
     (0xA9E0, 0xA9FF), (0xAA60, 0xAA7F), (0x1B000, 0x1B16F)],
    lambda ch: ch.isalnum() or _is_mark(ch),
)
# Invisible characters that split words in extracted text: soft hyphen, zero-width space, word joiner, BOM,
# variation selectors. Dropped by normalize so both the stored text and the tokens ignore them.
_INVISIBLE = dict.fromkeys([0xAD, 0x200B, 0x2060, 0xFEFF, *range(0xFE00, 0xFE10), *range(0xE0100, 0xE01F0)])


def normalize(text: str) -> str:
    """NFKC, case-folded, Traditional->Simplified, single spaces: the stored search text and phrase surface."""
    text = unicodedata.normalize("NFKC", text.translate(_INVISIBLE).replace("№", "no ")).casefold()
    try:
        text = _opencc().convert(text)
    except UnicodeEncodeError:  # lone surrogates (undecodable bytes kept by surrogateescape): drop them
        text = _opencc().convert(text.encode("utf-8", "ignore").decode("utf-8"))
    # casefold and OpenCC can leave text that is not NFKC (Greek ΐ decomposes): normalise last, so that
    # SQL's NFKC of what we send changes nothing
    return " ".join(unicodedata.normalize("NFKC", text).split())


@cache
def _opencc() -> Any:
    import opencc

    return opencc.OpenCC("t2s")
