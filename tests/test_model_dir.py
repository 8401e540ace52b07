"""The languages a model's card names decide which query words its dense channel is trusted with: MiniLM's
card names English, so a Chinese query ranks by BM25 alone even where its tokenizer knows the characters."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from corpusync.adapters.model_dir import declared_languages, reads_script, script_of


def card(tmp_path: Path, front: str | None, name: str = "m") -> Path:
    d = tmp_path / name
    d.mkdir()
    if front is not None:
        (d / "README.md").write_text(f"---\n{front}\n---\n\n# A model\n", encoding="utf-8")
    return d


def test_declared_languages_from_the_cards_front_matter(tmp_path: Path, embedder: Any, caplog: Any) -> None:
    assert declared_languages(embedder.model_dir) == frozenset({"en"})  # the packaged MiniLM's own card
    assert declared_languages(card(tmp_path, "language:\n- zh\n- EN\nlicense: mit", "list")) == {"zh", "en"}
    assert declared_languages(card(tmp_path, "language: [zh-CN, ja_JP]", "regions")) == {"zh", "ja"}
    assert declared_languages(card(tmp_path, "language: [eng, zho]", "iso3")) == {"en", "zh"}
    assert declared_languages(card(tmp_path, "language: [no, zh]", "norwegian")) == {"no", "zh"}  # not YAML 1.1 false
    bom = tmp_path / "bom"
    bom.mkdir()
    (bom / "README.md").write_text("\ufeff---\r\nlanguage: zh\r\n---\r\n# A model\r\n", encoding="utf-8")
    assert declared_languages(bom) == {"zh"}
    # a code it cannot place (Belarusian by three letters, a number, a nested list) limits nothing
    for i, front in enumerate(("language: [bel]", "language: [en, 1]", "language: [[zh]]")):
        assert declared_languages(card(tmp_path, front, f"odd{i}")) is None, front
    # a corrected card is read again (a long-running query service sees it)
    fixed = card(tmp_path, "language: en", "fixed")
    assert declared_languages(fixed) == {"en"}
    (fixed / "README.md").write_text("---\nlanguage: [en, zh]\n---\n", encoding="utf-8")
    assert declared_languages(fixed) == {"en", "zh"}
    # no limit: no card, a card naming no language (bge-m3's), multilingual, a damaged card (with a warning)
    assert declared_languages(card(tmp_path, None, "none")) is None
    assert declared_languages(card(tmp_path, "license: mit\npipeline_tag: sentence-similarity", "bge")) is None
    assert declared_languages(card(tmp_path, "language:\n- multilingual\n- en", "multi")) is None
    with caplog.at_level(logging.WARNING, "corpusync.embed"):
        assert declared_languages(card(tmp_path, "language: [en\n  : : bad", "bad")) is None
    assert "front matter is not YAML" in caplog.text and "bad" in caplog.text


@pytest.mark.parametrize(("languages", "readable", "unreadable"), [
    ({"en"}, ["contract", "déjà", "2023"], ["合同", "москва", "契約の", "계약", "σύμβαση"]),
    ({"zh"}, ["合同", "2023"], ["contract", "москва"]),
    ({"ja"}, ["契約", "けいやく", "ケイヤク"], ["계약", "contract"]),
    ({"sr"}, ["уговор", "ugovor"], ["合同"]),
    (None, ["合同", "contract", "москва", "계약"], []),
])
def test_reads_script(languages: set[str] | None, readable: list[str], unreadable: list[str]) -> None:
    langs = frozenset(languages) if languages is not None else None
    assert [w for w in readable if not reads_script(script_of(w), langs)] == []
    assert [w for w in unreadable if reads_script(script_of(w), langs)] == []
    assert reads_script("RUNIC", frozenset({"en"}))  # a script the table does not know: benefit of the doubt


def test_dense_coverage_follows_the_card_not_only_the_vocabulary(tmp_path: Path, embedder: Any) -> None:
    from corpusync.adapters.embedders import FlagEmbedder

    # MiniLM's vocabulary has both characters of 中国: by its tokenizer alone it would read the word
    assert embedder.counter.unk_token_id not in embedder.counter.ids(["中国"])[0]
    assert embedder.coverage(["中国", "payment"]) == 0.5
    assert embedder.coverage(["中国", "1998"]) == 0.0  # a number tells no language: the query is Chinese
    assert embedder.coverage(["1998"]) == 1.0
    assert embedder.coverage(["payment", "terms"]) == 1.0
    # the same weights under a card that says multilingual: the tokenizer decides alone again
    multi = card(tmp_path, "language: multilingual")
    for f in embedder.model_dir.iterdir():
        if f.name != "README.md":
            (multi / f.name).symlink_to(f)
    other = FlagEmbedder(multi, name="multi", kind="flag", pooling="mean", device="cpu", fp16=False,
                         max_tokens=128, cache_dir=tmp_path)
    assert other.coverage(["中国", "payment"]) == 1.0
