"""What a local model directory says about its model: the hash of its weights and its revision (the model's
identity, stored with every vector), and the languages its card names.

The card is the README.md beside the weights (Hugging Face's format); its YAML front matter's `language:` says
what the model was trained to read. A dense model trained on English ranks Chinese text by noise (MiniLM:
dense recall@5 0.16 on CMRC 2018 against 0.98 for BM25), although its vocabulary holds many Chinese
characters, so a query's words must also be in a script of a language the card names. A card that names
none, says `multilingual`, or is missing (bge-m3's names no language) puts no limit on what the model reads."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import unicodedata
from functools import lru_cache
from pathlib import Path

from corpusync.core.errors import ConfigError

log = logging.getLogger("corpusync.embed")

# The languages (ISO 639-1, or 639-3 where there is no two-letter code) written in each script other than
# Latin, as the first word of a letter's Unicode name gives it. A language here that is written in Latin too
# (Serbian, Kazakh, Azerbaijani, Uzbek, Kurdish, Malay, Tatar) is also in _LATIN_TOO.
_SCRIPT_LANGUAGES: dict[str, frozenset[str]] = {script: frozenset(codes.split()) for script, codes in {
    "CJK": "zh ja yue lzh wuu gan hak nan cdo cmn",
    "HIRAGANA": "ja", "KATAKANA": "ja", "HANGUL": "ko",
    "CYRILLIC": "ru uk be bg mk sr kk ky mn tg tt ba cv ce os sah ab cu uz az",
    "GREEK": "el grc",
    "ARABIC": "ar fa ur ps ug sd ckb ku arz ks pnb azb ms",
    "HEBREW": "he iw yi",
    "DEVANAGARI": "hi mr ne sa mai bho new kok",
    "BENGALI": "bn as", "GURMUKHI": "pa", "GUJARATI": "gu", "ORIYA": "or", "TAMIL": "ta", "TELUGU": "te",
    "KANNADA": "kn", "MALAYALAM": "ml", "SINHALA": "si", "THAI": "th", "LAO": "lo", "KHMER": "km",
    "MYANMAR": "my", "TIBETAN": "bo dz", "GEORGIAN": "ka", "ARMENIAN": "hy", "ETHIOPIC": "am ti",
}.items()}
_NOT_LATIN = frozenset().union(*_SCRIPT_LANGUAGES.values())
_LATIN_TOO = frozenset({"sr", "kk", "az", "uz", "ku", "ms", "tt"})
_EVERY_LANGUAGE = frozenset({"multilingual", "mul"})
# three-letter codes (ISO 639-2/3) some cards use, for languages with a two-letter code; any other code longer
# than two letters that the script table does not name is a language this module cannot place: then the card
# limits nothing (the benefit of the doubt unknown scripts get too)
_THREE_LETTER = {"eng": "en", "fra": "fr", "fre": "fr", "deu": "de", "ger": "de", "spa": "es", "por": "pt",
                 "ita": "it", "nld": "nl", "dut": "nl", "vie": "vi", "ind": "id", "tur": "tr", "pol": "pl",
                 "zho": "zh", "chi": "zh", "jpn": "ja", "kor": "ko", "rus": "ru", "ukr": "uk", "bul": "bg",
                 "ell": "el", "gre": "el", "ara": "ar", "fas": "fa", "per": "fa", "urd": "ur", "heb": "he",
                 "hin": "hi", "mar": "mr", "nep": "ne", "ben": "bn", "tam": "ta", "tel": "te", "tha": "th",
                 "khm": "km", "mya": "my", "bur": "my", "kat": "ka", "geo": "ka", "hye": "hy", "arm": "hy",
                 "amh": "am", "srp": "sr", "kaz": "kk", "mon": "mn"}
_CODE = re.compile("[a-z]{2,3}")
# the front matter: a first line of "---", then YAML up to a line of "---" (or "...")
_FRONT_MATTER = re.compile(r"---[ \t]*\r?\n(.*?)\r?\n(?:---|\.\.\.)[ \t]*(?:\r?\n|$)", re.S)


def declared_languages(model_dir: Path) -> frozenset[str] | None:
    """The languages the model's card names (lower case), or None when it names none, says multilingual or
    names one this module cannot place: then the model is taken to read every language. Read again when the
    card changes (a long-running query service sees a corrected card)."""
    card = model_dir.resolve() / "README.md"
    try:
        st = card.stat()
    except OSError:
        return None
    return _declared(card, st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=64)
def _declared(card: Path, _mtime_ns: int, _size: int) -> frozenset[str] | None:
    try:
        text = card.read_text(encoding="utf-8-sig", errors="replace")  # a BOM before the front matter too
    except OSError:
        return None
    m = _FRONT_MATTER.match(text)
    if m is None:
        return None
    import yaml

    try:  # BaseLoader: every value a string (YAML 1.1 would read Norwegian `no` as false)
        meta = yaml.load(m.group(1), Loader=yaml.BaseLoader)
    except yaml.YAMLError as exc:  # a damaged card limits nothing; said once per version of the card
        log.warning("%s: the model card's front matter is not YAML (%s); its languages are not read", card, exc)
        return None
    value = meta.get("language") if isinstance(meta, dict) else None
    codes = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    primary = {c.strip().lower().replace("_", "-").split("-")[0] for c in codes if isinstance(c, str) and c.strip()}
    if not primary or primary & _EVERY_LANGUAGE:
        return None
    languages = frozenset(_THREE_LETTER.get(code, code) for code in primary)
    if any(not _CODE.fullmatch(c) or (len(c) == 3 and c not in _NOT_LATIN) for c in languages):
        return None  # a code this module cannot place
    return languages


def script_of(word: str) -> str | None:
    """The script of the word's first letter (LATIN, CJK, HANGUL, ...), or None for a word without letters
    (a number, an identifier's digits): those every model reads."""
    for ch in word:
        if ch.isalpha():
            name = unicodedata.name(ch, "")
            return name.split(" ", 1)[0] if name else None
    return None


def reads_script(script: str | None, languages: frozenset[str] | None) -> bool:
    """Whether a model that reads `languages` (None: all) reads words in `script`. A script this module does
    not know is given the benefit of the doubt."""
    if languages is None or script is None:
        return True
    if script == "LATIN":
        return bool(languages - _NOT_LATIN or languages & _LATIN_TOO)
    written_in = _SCRIPT_LANGUAGES.get(script)
    return written_in is None or bool(languages & written_in)


def weights_hash(model_dir: Path, cache_dir: Path | None) -> str:
    """sha256 over the weight files, cached by (path, size, mtime) so big models are hashed once."""
    files = sorted(p for p in model_dir.rglob("*") if p.suffix in {".safetensors", ".bin", ".pt"} and p.is_file())
    if not files:
        raise ConfigError(f"no model weights (*.safetensors, *.bin) found under {model_dir}")
    stamp = hashlib.sha256(
        json.dumps([(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files]).encode()
    ).hexdigest()
    cache_file = (cache_dir / "weights-hash.json") if cache_dir else None
    cached: dict[str, str] = {}
    if cache_file and cache_file.exists():
        try:
            cached = json.loads(cache_file.read_text())
        except (OSError, ValueError):
            cached = {}
    if stamp in cached:
        return cached[stamp]
    h = hashlib.sha256()
    for p in files:
        with p.open("rb") as fh:
            while block := fh.read(1 << 22):
                h.update(block)
    digest = h.hexdigest()
    if cache_file:
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            cached[stamp] = digest
            cache_file.write_text(json.dumps(cached))
        except OSError:
            pass
    return digest


def read_revision(model_dir: Path) -> str | None:
    """The revision a revision.txt (or .revision) beside the weights names, if any."""
    for name in ("revision.txt", ".revision"):
        p = model_dir / name
        if p.exists():
            return p.read_text().strip() or None
    return None
