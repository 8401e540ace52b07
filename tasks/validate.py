"""validate: a great-expectations suite over every chunk batch before it is loaded.

One row per chunk (text, tokens, key, span, pages, OCR confidence, vector checks). A document with any
failing row is quarantined with the names of the expectations it failed; the others load. The suite's
results are returned for the run record and the Prefect artifact.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schemas.records import EmbeddedDocument

log = logging.getLogger("corpusync.validate")


@dataclass(frozen=True)
class Thresholds:
    max_tokens: int
    dimension: int
    normalized: bool
    norm_tolerance: float = 0.01
    min_ocr_confidence: float = 0.8


# Bump when a check changes what it accepts: documents it quarantined are tried again.
VALIDATE_LOGIC_VERSION = "2"


@dataclass
class ValidationOutcome:
    passed: list[EmbeddedDocument]
    failures: dict[str, list[str]]  # path -> failed expectation descriptions
    results: list[dict[str, Any]] = field(default_factory=list)  # per expectation: name, success, unexpected

    def markdown(self) -> str:
        lines = ["# corpusync chunk validation (great-expectations)", "",
                 "| expectation | column | result | unexpected rows |", "|---|---|---|---|"]
        for r in self.results:
            lines.append(f"| {r['expectation']} | {r['column']} | {'pass' if r['success'] else '**FAIL**'} "
                         f"| {r['unexpected_count']} |")
        if self.failures:
            lines += ["", "Quarantined documents:", ""]
            lines += [f"- `{p}`: {', '.join(f)}" for p, f in sorted(self.failures.items())]
        return "\n".join(lines) + "\n"


def chunk_rows(docs: list[EmbeddedDocument], t: Thresholds) -> list[dict[str, Any]]:
    """One row per chunk, the columns the suite checks (plain values: the suite may run in another process)."""
    rows = []
    for ed in docs:
        parsed = ed.doc.parsed
        text, _ = parsed.layout()
        # the OCR confidence of pages indexed from OCR (not of one whose text layer was kept: OCR read nothing)
        ocr = {p.get("page"): p.get("confidence") for p in parsed.metadata.get("ocr_pages", [])
               if not p.get("kept_text_layer")}
        low = set(parsed.metadata.get("low_confidence_pages", []))
        dense = ed.dense  # one view of the record batch's dense column
        norms = np.linalg.norm(dense, axis=1)
        finite = np.isfinite(dense).all(axis=1)
        for i, c in enumerate(ed.doc.chunks):
            pages = range(c.page_start or 0, (c.page_end or 0) + 1)
            conf = min((ocr[p] for p in pages if p in ocr), default=None)
            rows.append({
                "path": parsed.source.path,
                "text": c.text,
                "token_count": c.token_count,
                "chunk_key": c.key,
                "span_ok": 0 <= c.char_start < c.char_end <= len(text)
                           and c.text == c.prefix + text[c.char_start:c.char_end],
                "pages_ok": c.page_start is None or (
                    parsed.page_count is None or 1 <= c.page_start <= (c.page_end or 0) <= parsed.page_count),
                "ocr_ok": conf is None or conf >= t.min_ocr_confidence or any(p in low for p in pages),
                "dim": int(dense.shape[1]),
                "finite": bool(finite[i]),
                "norm": float(norms[i]),
            })
    return rows


def _suite(t: Thresholds) -> Any:
    import great_expectations as gx

    e = gx.expectations
    suite = gx.ExpectationSuite(name="corpusync-chunks")
    for exp in (
        e.ExpectColumnValuesToNotBeNull(column="text"),
        e.ExpectColumnValueLengthsToBeBetween(column="text", min_value=1),
        e.ExpectColumnValuesToBeBetween(column="token_count", min_value=1, max_value=t.max_tokens),
        e.ExpectColumnValuesToBeUnique(column="chunk_key"),
        e.ExpectColumnValuesToBeInSet(column="span_ok", value_set=[True]),
        e.ExpectColumnValuesToBeInSet(column="pages_ok", value_set=[True]),
        e.ExpectColumnValuesToBeInSet(column="ocr_ok", value_set=[True]),
        e.ExpectColumnValuesToBeInSet(column="dim", value_set=[t.dimension]),
        e.ExpectColumnValuesToBeInSet(column="finite", value_set=[True]),
    ):
        suite.add_expectation(exp)
    if t.normalized:
        suite.add_expectation(e.ExpectColumnValuesToBeBetween(
            column="norm", min_value=1 - t.norm_tolerance, max_value=1 + t.norm_tolerance))
    return suite


SuiteResult = tuple[dict[str, list[str]], list[dict[str, Any]]]  # failures by path, results per expectation


def run_suite(rows: list[dict[str, Any]], t: Thresholds) -> SuiteResult:
    """The great-expectations suite over the rows: the failed expectations of each path, and per expectation
    its name, column, success and count of unexpected rows."""
    import great_expectations as gx
    import pandas as pd

    # great_expectations sets some of its module loggers to INFO itself (its temporary docs folder): quiet
    for name in ("great_expectations", "great_expectations.data_context.types.base"):
        logging.getLogger(name).setLevel(logging.ERROR)
    context = gx.get_context(mode="ephemeral")
    try:
        from great_expectations.data_context.types.base import ProgressBarsConfig

        context.variables.progress_bars = ProgressBarsConfig(globally=False)
    except ImportError:
        pass
    asset = context.data_sources.add_pandas("corpusync").add_dataframe_asset("chunks")
    batch = asset.add_batch_definition_whole_dataframe("batch").get_batch(
        batch_parameters={"dataframe": pd.DataFrame(rows)})
    res = batch.validate(_suite(t), result_format={"result_format": "COMPLETE",
                                                   "unexpected_index_column_names": ["path"]})
    failures: dict[str, list[str]] = {}
    results = []
    for r in res.results:
        cfg = r.expectation_config
        column = cfg.kwargs.get("column")
        bad = r.result.get("unexpected_index_list") or []
        results.append({"expectation": cfg.type, "column": column, "success": bool(r.success),
                        "unexpected_count": len(bad)})
        for row in bad:
            name = f"{cfg.type}({column})"
            failures.setdefault(row["path"], [])
            if name not in failures[row["path"]]:
                failures[row["path"]].append(name)
    return failures, results


def validate_chunks(docs: list[EmbeddedDocument], t: Thresholds,
                    suite: Callable[[list[dict[str, Any]], Thresholds], SuiteResult] = run_suite) -> ValidationOutcome:
    """Run the suite (in this process, or wherever `suite` runs it); quarantine (by path) every document with a
    failing row."""
    if not docs:
        return ValidationOutcome([], {})
    failures, results = suite(chunk_rows(docs, t), t)
    passed = [d for d in docs if d.doc.parsed.source.path not in failures]
    return ValidationOutcome(passed, failures, results)
