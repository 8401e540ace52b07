"""OCR readings kept on disk, keyed by the page image's pixels and by what reads them (engine, version,
models, parameters, the OCR reading logic's version): OCR is the dearest step of a parse (seconds a page), and
without it a refresh killed mid-way, a candidate the gate refused, a renamed or moved scan, or the same
scanned page in two files would be read again. The pixels are the key, so a hit is the reading OCR would
give (the render is deterministic) whatever file, path or run the page came from.

One JSON file per page image (`<root>/<2 hex>/<key>.json`), written to a temporary name and renamed, so
parse workers on one machine share it without locks and a reader never sees half a file. A file that does
not read back is a miss and is removed. A failure to write is logged and the parse goes on: the cache may
make a parse cheaper, never fail it. Each hit touches the file; `prune_ocr_cache` removes the files not
used for a while (a refresh and `corpusync prune` call it with CORPUSYNC_VECTOR_CACHE_TTL_H).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from corpusync.adapters.ocr import OcrEngine, OcrResult

log = logging.getLogger(__name__)

FORMAT = 1  # of the files; part of the key
_unwritable: set[Path] = set()


def page_key(engine: OcrEngine, image: np.ndarray, logic: str) -> str:
    """The cache key of one page image read by `engine`: sha256 over what decides the reading."""
    import numpy

    h = hashlib.sha256()
    params = getattr(engine, "params", {})
    h.update(json.dumps([FORMAT, logic, engine.name, engine.version, engine.model, params, image.shape,
                         str(image.dtype)], sort_keys=True, default=str).encode())
    h.update(numpy.ascontiguousarray(image).data)
    return h.hexdigest()


class OcrPageCache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def _file(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> OcrResult | None:
        from corpusync.adapters.ocr import OcrLine, OcrResult

        path = self._file(key)
        try:
            raw = json.loads(path.read_bytes())
            result = OcrResult([OcrLine(t, s, (b[0], b[1], b[2], b[3])) for t, s, b in raw["lines"]],
                               raw["engine"], raw["model"], raw["rotation"])
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
            log.warning("OCR cache file %s does not read back (%s); the page is read again", path, exc)
            try:
                path.unlink(missing_ok=True)
            except OSError:
                pass
            return None
        try:
            os.utime(path)  # used: pruning goes by the last use
        except OSError:
            pass
        return result

    def put(self, key: str, result: OcrResult) -> None:
        record: dict[str, Any] = {"lines": [[ln.text, ln.score, list(ln.box)] for ln in result.lines],
                                  "engine": result.engine, "model": result.model, "rotation": result.rotation}
        path = self._file(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(record, f, ensure_ascii=False)
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            if self.root not in _unwritable:  # once per process: not a line for every page of a scan
                _unwritable.add(self.root)
                log.warning("cannot keep OCR readings in %s (%s); parsing goes on without the OCR cache",
                            self.root, exc)


def prune_ocr_cache(root: Path, ttl_h: float, now: float | None = None, *, every_s: float = 0.0) -> int:
    """Remove the readings not used in the last `ttl_h` hours (and temporary files a killed writer left);
    the number removed. With `every_s`, nothing is done if the last pruning is more recent than that: a
    refresh prunes on every run, the no-change one too, and a cache of a large scanned corpus is a stat()
    per page."""
    if not root.is_dir():
        return 0
    now = time.time() if now is None else now
    marker = root / ".pruned"  # its mtime: the last pruning
    if every_s > 0:
        try:
            if now - marker.stat().st_mtime < every_s:
                return 0
        except OSError:  # never pruned
            pass
    try:
        marker.touch()
        os.utime(marker, (now, now))
    except OSError:
        pass
    cutoff = now - ttl_h * 3600
    removed = 0
    for path in root.glob("*/*"):
        try:
            if path.stat().st_mtime < cutoff:
                path.unlink()
                removed += path.suffix == ".json"  # readings; a killed writer's temporary files go uncounted
        except OSError:  # removed meanwhile
            continue
    return removed
