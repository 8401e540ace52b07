"""The model's tokenizer read straight from its tokenizer.json with the `tokenizers` library.

The chunker counts tokens with the embedding model's own tokenizer. transformers' AutoTokenizer wraps this
very file, but importing it pulls in torch and scikit-learn (about 6 s of CPU on 2 cores) before the first
count: in a small refresh that was the chunker's whole wait. `tokenizers` loads the file in milliseconds.
The counts and offsets are the same (tests/test_embed.py compares them with AutoTokenizer's); a model
without a tokenizer.json (a slow-only tokenizer) keeps AutoTokenizer.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class FastTokenizer:
    """Token counts, offsets and the unknown token of a model folder's tokenizer.json."""

    def __init__(self, backend: Any, unk_id: int | None) -> None:
        self._tok = backend
        self.unk_token_id = unk_id

    @classmethod
    def load(cls, model_dir: Path) -> FastTokenizer | None:
        """The folder's tokenizer, or None when it has no tokenizer.json."""
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            return None
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(path))
        # a tokenizer.json may carry the truncation and padding it was saved with (MiniLM's: 128 tokens,
        # padded to 128); AutoTokenizer turns both off for a call with truncation=False and no padding
        tok.no_truncation()
        tok.no_padding()
        return cls(tok, _unk_id(tok, model_dir))

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Token counts including the model's special tokens."""
        if not texts:
            return []
        return [len(e.ids) for e in self._tok.encode_batch(list(texts), add_special_tokens=True)]

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        """Character (start, end) of each token, special tokens excluded."""
        return [(int(a), int(b)) for a, b in self._tok.encode(text, add_special_tokens=False).offsets]

    def ids(self, words: Sequence[str]) -> list[list[int]]:
        """Each word's token ids, special tokens excluded."""
        return [e.ids for e in self._tok.encode_batch(list(words), add_special_tokens=False)]


def _unk_id(tok: Any, model_dir: Path) -> int | None:
    """The unknown token's id as transformers finds it: tokenizer_config.json / special_tokens_map.json name
    it; else the tokenizer model's own (WordPiece and BPE name it, Unigram gives its id)."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        p = model_dir / name
        if p.is_file():
            unk = json.loads(p.read_text(encoding="utf-8")).get("unk_token")
            if isinstance(unk, dict):
                unk = unk.get("content")
            if isinstance(unk, str) and (found := tok.token_to_id(unk)) is not None:
                return int(found)
    model = json.loads(tok.to_str()).get("model", {})
    if isinstance(model.get("unk_id"), int):
        return int(model["unk_id"])
    unk = model.get("unk_token")
    found = tok.token_to_id(unk) if isinstance(unk, str) else None
    return int(found) if found is not None else None
