"""The BM25 tokenizer: scripts, Traditional folding, identifiers, query syntax, dictionaries, determinism.
Pure (no database), with the real jieba and OpenCC."""

from __future__ import annotations

import pickle
import time
from pathlib import Path
from types import SimpleNamespace

import jieba
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corpusync.core.errors import ConfigError
from corpusync.core.lexical import MAX_TOKEN_CHARS, Analyzer
from corpusync.core.query_syntax import STOPWORDS, ParsedQuery
from corpusync.core.unicode_text import CJK


@pytest.fixture(scope="module")
def an() -> Analyzer:
    return Analyzer()


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


# --- scripts -----------------------------------------------------------------------------------------


def test_russian_keeps_words_and_number(an: Analyzer) -> None:
    toks = an.tokens("Договор поставки №12")
    assert {"договор", "поставки", "12"} <= set(toks)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("한국어 계약서", ["한국어", "계약서"]),
        ("Η σύμβαση προμήθειας", ["η", "σύμβαση", "προμήθειασ"]),  # casefold: final sigma matches σ
        ("हिन्दी भाषा", ["हिन्दी", "भाषा"]),  # combining vowel signs stay inside the word
        ("العَرَبِيَّة لغة", ["العَرَبِيَّة", "لغة"]),
        ("naïve CAFÉ ﬁle", ["naïve", "café", "file"]),
    ],
)
def test_spaced_scripts_give_whole_words(an: Analyzer, text: str, expected: list[str]) -> None:
    assert an.tokens(text) == expected


def test_kana_bigrams_and_mixed_japanese(an: Analyzer) -> None:
    assert an.tokens("カタカナ") == ["カタ", "タカ", "カナ"]
    assert an.tokens("の") == ["の"]
    toks = an.tokens("東京タワー")
    assert toks[0] == "东京"  # the kanji go to jieba (after folding), the kana become bigrams
    assert toks[1:] == ["タワ", "ワー"]


def test_thai_bigrams_keep_marks_on_their_letter(an: Analyzer) -> None:
    assert an.tokens("ภาษา") == ["ภา", "าษ", "ษา"]
    assert an.tokens("ที่นี่") == ["ที่นี่"]  # two letters, each with its vowel and tone mark: one bigram


def test_han_outside_jieba_becomes_single_character_tokens(an: Analyzer) -> None:
    for ch in ("𠀀", "𪚥", "㐀"):  # Ext B, Ext B, Ext A
        assert ch in an.tokens(f"合同{ch}条款")
    assert an.tokens("𠀀") == ["𠀀"]


def test_cjk_class_covers_the_extensions() -> None:
    import re

    han = re.compile(f"[{CJK}]")
    for ch in ("合", "㐀", "𠀀", "𪚥", "\U00030000", "\uf900"):
        assert han.fullmatch(ch)
    for ch in ("a", "カ", "한", ","):
        assert not han.fullmatch(ch)


def test_traditional_folds_to_simplified(an: Analyzer) -> None:
    hant, hans = "臺灣銀行總行位於哪個城市？", "台湾银行总行位于哪个城市？"
    assert an.normalize(hant) == an.normalize(hans)
    assert an.tokens(hant) == an.tokens(hans)
    assert an.query(hant) == an.query(hans)
    assert "台湾银行" in an.query(hant).terms


def test_symbols_emoji_and_punctuation_are_not_tokens(an: Analyzer) -> None:
    assert an.tokens("😀 👍🏽 ！！ ... — © → ★ “” 【】") == []


def test_identifiers_stay_whole_and_add_parts(an: Analyzer) -> None:
    toks = an.tokens("合同编号 HT2023-0876，依据 ISO-9001:2015 与 v1.2.3")
    for t in ("ht2023-0876", "ht2023", "0876", "iso-9001:2015", "iso", "9001", "2015", "v1.2.3", "v1", "合同", "编号"):
        assert t in toks
    assert an.tokens("__init__") == ["init"]


def test_normalize_is_the_stored_search_text(an: Analyzer) -> None:
    assert an.normalize("  ＡＢＣ\u00a0 合\u00ad同\n\t條款  ") == "abc 合同 条款"


# --- query syntax ------------------------------------------------------------------------------------


def test_stopwords_dropped_from_query_terms_only(an: Analyzer) -> None:
    assert "的" in an.tokens("合同的付款方式")
    assert "的" not in an.query("合同的付款方式").terms
    q = an.query("What is the payment term of 合同 哪个")
    assert q.terms == ["payment", "term", "合同"]
    assert {"什么", "哪个", "谁", "如何", "多少", "几", "what", "which", "who"} <= STOPWORDS


@pytest.mark.parametrize(
    ("text", "expected", "sql"),
    [
        ('合同 -违约 "不可抗力"', ParsedQuery(["合同", "不可抗力"], ["不可抗力"], ["违约"], []),
         '合同 不可抗力 "不可抗力" -违约'),
        ('付款 -"不可抗力 条款" -HT2023-0876', ParsedQuery(["付款"], [], ["ht2023-0876"], ["不可抗力 条款"]),
         '付款 -ht2023-0876 -"不可抗力 条款"'),
        ("付款 -违约条款", ParsedQuery(["付款"], [], [], ["违约条款"]), '付款 -"违约条款"'),
        ("“违约金”的比例", ParsedQuery(["违约金", "比例"], ["违约金"], [], []), '违约金 比例 "违约金"'),
        ('"Force Majeure" clause', ParsedQuery(["force", "majeure", "clause"], ["force majeure"], [], []),
         'force majeure clause "force majeure"'),
        ("-的 - -!!", ParsedQuery([], [], ["的"], []), "-的"),
        ("", ParsedQuery([], [], [], []), ""),
    ],
)
def test_query_syntax(an: Analyzer, text: str, expected: ParsedQuery, sql: str) -> None:
    q = an.query(text)
    assert q == expected
    assert q.sql_text() == sql


def test_hyphen_inside_an_identifier_is_not_an_exclusion(an: Analyzer) -> None:
    q = an.query("合同 HT2023-0876 违约-金")
    assert q.excluded_terms == [] and q.excluded_phrases == []
    assert q.terms[:4] == ["合同", "ht2023-0876", "ht2023", "0876"]


def test_unbalanced_quote_is_plain_text(an: Analyzer) -> None:
    q = an.query('合同 "不可抗力')
    assert q == ParsedQuery(["合同", "不可抗力"], [], [], [])
    assert an.query('-"不可抗力') == ParsedQuery(["不可抗力"], [], [], [])
    assert an.query('"a" "b c').phrases == ["a"]


def test_empty_query() -> None:
    assert ParsedQuery([], [], ["x"], []).empty
    assert not ParsedQuery([], ["x"], [], []).empty
    assert not ParsedQuery(["x"], [], [], []).empty


def test_query_mode_is_selectable() -> None:
    cut, search = Analyzer(query_mode="cut"), Analyzer(query_mode="search")
    assert cut.query("中华人民共和国").terms == ["中华人民共和国"]
    assert "中华" in search.query("中华人民共和国").terms
    assert "中华" in cut.query("中华人民共和国", mode="search").terms
    with pytest.raises(ValueError):
        Analyzer(query_mode="all")  # type: ignore[arg-type]


_text = st.text(
    st.one_of(st.characters(), st.sampled_from(list('-"“” \t\n_./:合同カタ한ไทย𠀀HT2023-0876'))), max_size=80
)


@settings(max_examples=300, deadline=None)
@given(_text)
def test_tokens_never_hold_space_quote_or_leading_dash(an: Analyzer, text: str) -> None:
    q = an.query(text)
    toks = an.tokens(text)
    assert toks == an.tokens(text)
    for t in [*toks, *q.terms, *q.excluded_terms]:
        assert t and len(t) <= MAX_TOKEN_CHARS
        assert not any(c.isspace() or c == '"' for c in t) and not t.startswith("-")
    for p in [*q.phrases, *q.excluded_phrases]:
        assert p and '"' not in p and p == p.strip()


# --- long input --------------------------------------------------------------------------------------


def test_long_unbroken_string_is_dropped_quickly(an: Analyzer) -> None:
    start = time.perf_counter()
    assert an.tokens("x" * 5_000_000) == []
    assert an.tokens("é" * 3_000_000 + " ok") == ["ok"]
    assert an.tokens("कि" * 1_000_000) == []  # letters and combining marks alternating: still linear
    assert an.tokens("a" * (MAX_TOKEN_CHARS + 1) + "-b") == ["b"]
    assert an.tokens("a" * MAX_TOKEN_CHARS) == ["a" * MAX_TOKEN_CHARS]
    assert time.perf_counter() - start < 5


# --- dictionaries ------------------------------------------------------------------------------------


def test_lexicon_keeps_domain_terms_whole_and_does_not_leak(tmp_path: Path, an: Analyzer) -> None:
    assert an.tokens("履约保函") == ["履约", "保函"]
    lex = _write(tmp_path, "lex.txt", "# domain terms\n\n履約保函 50 n\n缺陷责任期\n")
    custom = Analyzer(lexicon=lex)
    assert "履约保函" in custom.tokens("提交履约保函")  # written Traditional, folded like the text
    assert custom.query("提交履约保函").terms == ["提交", "履约保函"]
    assert custom.query("缺陷责任期多长").terms[0] == "缺陷责任期"
    assert an.tokens("履约保函") == ["履约", "保函"]  # the other Analyzer and the global jieba are untouched
    assert jieba.lcut("履约保函") == ["履约", "保函"]
    other = Analyzer(lexicon=_write(tmp_path, "other.txt", "保函金额\n"))
    assert other.tokens("履约保函") == ["履约", "保函"]


def test_regex_lines_keep_identifiers_whole(tmp_path: Path) -> None:
    lex = _write(tmp_path, "lex.txt", r"re:GB/T\s?\d+(?:\.\d+)*-\d{4}" + "\n")
    a = Analyzer(lexicon=lex)
    toks = a.tokens("依据GB/T 2828.1-2012抽样")
    assert "gb/t2828.1-2012" in toks and {"2828.1-2012", "2828", "2012", "抽样"} <= set(toks)
    assert a.query("gb/t2828.1-2012").terms[0] == "gb/t2828.1-2012"
    assert a.query('-"GB/T 2828.1-2012"').excluded_terms == ["gb/t2828.1-2012"]
    assert "gb/t2828.1-2012" not in Analyzer().tokens("依据GB/T 2828.1-2012抽样")


def test_non_han_lexicon_words_become_tokens(tmp_path: Path) -> None:
    a = Analyzer(lexicon=_write(tmp_path, "lex.txt", "C++\nT恤\n"))
    assert "c++" in a.tokens("会 C++ 的人")
    assert "t恤" in a.tokens("白色T恤衫")
    assert "c++" not in a.tokens("abc++")


def test_synonyms_map_to_canonical_at_index_and_query_time(tmp_path: Path) -> None:
    syn = _write(tmp_path, "syn.txt", "合同, 契約, contract\n质保金，保修金\n")
    a = Analyzer(synonyms=syn)
    assert a.tokens("契约条款") == ["合同", "条款"]
    assert a.tokens("The Contract") == ["the", "合同"]
    assert a.query("契約 -保修金").terms == ["合同"]
    assert a.query("契約 -保修金").excluded_terms == ["质保金"]
    assert "保修金" not in a.tokens("保修金")


def test_fingerprint_follows_file_contents(tmp_path: Path) -> None:
    lex = _write(tmp_path, "lex.txt", "履约保函\n")
    fp = Analyzer(lexicon=lex).fingerprint
    assert len(fp) == 16 and fp == Analyzer(lexicon=lex).fingerprint
    assert fp != Analyzer().fingerprint
    lex.write_text("履约保函\n缺陷责任期\n", encoding="utf-8")
    assert Analyzer(lexicon=lex).fingerprint != fp
    syn = _write(tmp_path, "syn.txt", "合同, 契约\n")
    assert Analyzer(lexicon=lex, synonyms=syn).fingerprint != Analyzer(lexicon=lex).fingerprint


def test_from_settings_caches_by_content(tmp_path: Path) -> None:
    lex = _write(tmp_path, "lex.txt", "履约保函\n")
    s = SimpleNamespace(lexicon=lex, synonyms=None)
    a = Analyzer.from_settings(s)
    assert Analyzer.from_settings(s) is a
    lex.write_text("缺陷责任期\n", encoding="utf-8")
    b = Analyzer.from_settings(s)
    assert b is not a and b.query("缺陷责任期").terms == ["缺陷责任期"]


@pytest.mark.parametrize(
    ("kind", "text", "where"),
    [
        ("lexicon", "ok\nre:([a-z\n", ":2:"),
        ("lexicon", "# c\nre:x*\n", ":2:"),
        ("lexicon", "two words here\n", ":1:"),
        ("lexicon", "词 0\n", ":1:"),
        ("synonyms", "合同, 契约\n契约, 协议\n", ":2:"),
        ("synonyms", "合同, force majeure\n", ":1:"),
    ],
)
def test_bad_dictionary_files_name_file_and_line(tmp_path: Path, kind: str, text: str, where: str) -> None:
    p = _write(tmp_path, f"{kind}.txt", text)
    with pytest.raises(ConfigError, match=rf"{kind}\.txt{where}"):
        Analyzer(lexicon=p) if kind == "lexicon" else Analyzer(synonyms=p)


def test_unreadable_dictionary_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.txt"):
        Analyzer(lexicon=tmp_path / "missing.txt")
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("ok\nné\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1\.txt:2:"):
        Analyzer(synonyms=bad)


# --- batches -----------------------------------------------------------------------------------------


def test_index_texts_in_processes_equals_single_process(tmp_path: Path) -> None:
    a = Analyzer(lexicon=_write(tmp_path, "lex.txt", "履约保函\nre:gb/t\\s?\\d+\n"),
                 synonyms=_write(tmp_path, "syn.txt", "合同, 契约\n"))
    assert pickle.loads(pickle.dumps(a)).tokens("契约 GB/T 2828") == a.tokens("契约 GB/T 2828")
    texts = [f"第{i}条 契約 履约保函 GB/T {i} Договор №{i} カタカナ" for i in range(40)]
    single = a.index_texts(texts)
    assert single[0] == (a.normalize(texts[0]), a.tokens(texts[0]))
    assert a.index_texts(texts, processes=2, min_per_process=5) == single


def test_jieba_loads_at_the_first_chinese_text_only(tmp_path: Path) -> None:
    """The check for changes needs only the fingerprint, and text without Han characters never segments: neither
    pays for jieba's dictionary. A lexicon's Chinese words are still there once it loads, and a bad lexicon is
    still refused when the analyzer is made (not at its first use)."""
    lex = tmp_path / "lexicon.txt"
    lex.write_text("付款方式 100\n", encoding="utf-8")
    a = Analyzer(lexicon=lex)
    assert a.fingerprint and a._state._jieba is None
    assert a.tokens("Payment is due within thirty days, HT2023-0876.")
    assert a._state._jieba is None
    assert "付款方式" in a.tokens("合同的付款方式")
    assert a._state._jieba is not None
    (tmp_path / "bad.txt").write_text("re:(\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="bad pattern"):
        Analyzer(lexicon=tmp_path / "bad.txt")
