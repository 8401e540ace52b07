"""The regression gate: absolute floors, and tolerated drops against the baseline judged with a paired
bootstrap over questions, so a drop inside the noise passes and a real one fails.

Thresholds name metrics ('metric' or 'goldset:metric', the gold set by name or by its stable key): retrieval
metrics and the offline RAGAS context metrics. A key naming no metric or no configured gold set is a
ConfigError, never a silent pass. The baseline must be an evaluation of the same question set (same content
hash, same question ids, not an ad-hoc --limit run) that has every gated metric per question
(`baseline_mismatch`)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path

from corpusync.core.errors import ConfigError
from evaluation.metrics import is_quality_metric, paired_bootstrap
from schemas.eval import GateCheck, check_thresholds, split_threshold_key

PerQuestion = Mapping[str, Mapping[str, float]]  # question id -> {metric: value}


def lookup(table: Mapping[str, float], goldset: str, metric: str, key: str | None = None) -> float | None:
    """A threshold for `key:metric` (the gold set's stable key) overrides one for `goldset:metric` (its name),
    which overrides one for `metric`."""
    for prefix in (key, goldset):
        if prefix and f"{prefix}:{metric}" in table:
            return table[f"{prefix}:{metric}"]
    return table.get(metric)


def _applies(k: str, names: Collection[str]) -> bool:
    prefix, _ = split_threshold_key(k)
    return prefix is None or prefix in names


def gated_metrics(tables: Iterable[Mapping[str, float]], names: Collection[str]) -> list[str]:
    """The quality metrics that have a threshold for the gold set known by `names` (its name and key)."""
    return sorted({split_threshold_key(k)[1] for t in tables for k in t
                   if _applies(k, names) and is_quality_metric(split_threshold_key(k)[1])})


def ignored_thresholds(tables: Iterable[Mapping[str, float]], names: Collection[str]) -> list[str]:
    """Keys for this gold set that name latency: reported beside the quality metrics, never gated."""
    return sorted({k for t in tables for k in t
                   if _applies(k, names) and not is_quality_metric(split_threshold_key(k)[1])})


def check_threshold_goldsets(tolerances: Mapping[str, float], floors: Mapping[str, float], specs: Sequence[str],
                             configured: Sequence[str] = (), search_dirs: Iterable[Path] = ()) -> None:
    """ConfigError for a 'goldset:metric' key whose gold set (by name or key) is neither one of `specs` (being
    evaluated) nor `configured` (CORPUSYNC_GOLDSETS): it would gate nothing. Resolves paths, reads no gold set;
    a spec being evaluated that does not exist is the loader's ConfigError."""
    from evaluation.goldsets import goldset_identity

    known: set[str] = set()
    for spec in dict.fromkeys([*specs, *configured]):
        try:
            known.update(goldset_identity(spec, search_dirs))
        except ConfigError:
            if spec in specs:
                raise
            known.update((Path(spec).name, Path(spec).stem))  # configured, not evaluated now, not found here
    for setting, table in (("CORPUSYNC_GATE_TOLERANCES", tolerances), ("CORPUSYNC_GATE_FLOORS", floors)):
        for k in table:
            prefix, _ = split_threshold_key(k)
            if prefix is not None and prefix not in known:
                raise ConfigError(f"{setting}: key {k!r} names gold set {prefix!r}, which is not configured "
                                  f"(CORPUSYNC_GOLDSETS or --goldset); known gold set names and keys: "
                                  f"{', '.join(sorted(known))}")


def baseline_mismatch(stored: Mapping[str, object], goldset_sha256: str, question_ids: Collection[str],
                      rows: Callable[[], PerQuestion], needed: Iterable[str]) -> str | None:
    """Why a stored evaluation (id, goldset_sha256, n_questions, question_limit) cannot be the baseline of a
    candidate with this content hash and these question ids, or None when it can. `rows` loads its
    per-question scores in the gate's mode (only called when the hash matches); `needed`: gated metrics."""
    eid, n = stored["id"], stored["n_questions"]
    if stored.get("question_limit") is not None:
        return f"evaluation {eid} was an ad-hoc --limit run ({n} questions)"
    if stored["goldset_sha256"] != goldset_sha256:
        return (f"evaluation {eid} is of other gold-set content or questions ({n} questions, sha256 "
                f"{str(stored['goldset_sha256'])[:12]}; now {goldset_sha256[:12]})")
    scored = rows()
    if set(scored) != set(question_ids):
        common = len(set(scored) & set(question_ids))
        return f"evaluation {eid} scored other questions ({common} of {len(question_ids)} in common)"
    missing = [m for m in needed if any(m not in s for s in scored.values())]
    if missing:
        return f"evaluation {eid} has no per-question {', '.join(missing)} scores"
    return None


def gate_checks(
    goldset: str,
    mode: str,
    candidate: PerQuestion,
    baseline: PerQuestion | None,
    *,
    tolerances: Mapping[str, float],
    floors: Mapping[str, float],
    key: str | None = None,
    samples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> list[GateCheck]:
    """One check per gated metric (those with a tolerance or a floor for this gold set, by name or `key`;
    latency thresholds are ignored: latency is reported beside the quality metrics, but a floor or a
    tolerated drop does not apply to it). ConfigError for a key that names no metric.

    Fails on a floor when the candidate's mean is below it, and on any threshold when the candidate has no
    score for the metric (it was not computed: a gate that cannot judge does not pass). Fails on a tolerance
    when the mean paired drop is larger than the tolerance AND the bootstrap interval lies wholly below zero
    (the drop is not noise). Questions are paired by id; questions only on one side are left out.
    """
    check_thresholds("gate tolerances", tolerances, tolerance=True)
    check_thresholds("gate floors", floors, tolerance=False)
    names = {goldset} | ({key} if key else set())
    checks = []
    for metric in gated_metrics((tolerances, floors), names):
        cand_vals = [q[metric] for q in candidate.values() if metric in q]
        cand_mean = sum(cand_vals) / len(cand_vals) if cand_vals else 0.0
        tol, floor = lookup(tolerances, goldset, metric, key), lookup(floors, goldset, metric, key)
        check = GateCheck(goldset=goldset, mode=mode, metric=metric, candidate=cand_mean, tolerance=tol,
                          floor=floor, passed=True)
        reasons = []
        if not cand_vals:
            check.passed = False
            reasons.append("not computed for this evaluation (see the RAGAS section): cannot be judged")
        elif floor is not None and cand_mean < floor:
            check.passed = False
            reasons.append(f"{cand_mean:.3f} is below the floor {floor:.3f}")
        if baseline is not None and tol is not None and cand_vals:
            paired = [qid for qid, q in candidate.items() if metric in q and metric in baseline.get(qid, {})]
            c = [candidate[qid][metric] for qid in paired]
            b = [baseline[qid][metric] for qid in paired]
            delta, lo, hi = paired_bootstrap(c, b, samples=samples, confidence=confidence, seed=seed)
            check.baseline = sum(b) / len(b) if b else None
            check.delta, check.ci_low, check.ci_high, check.n_paired = delta, lo, hi, len(paired)
            if not paired:
                reasons.append("no question in common with the baseline: not compared")
            elif delta < -tol and hi < 0:
                check.passed = False
                reasons.append(f"dropped {-delta:.3f} (95% CI {lo:+.3f}..{hi:+.3f}), more than the "
                               f"tolerated {tol:.3f}")
            elif delta < -tol:
                reasons.append(f"dropped {-delta:.3f} but the interval {lo:+.3f}..{hi:+.3f} includes 0 (noise)")
        check.reason = "; ".join(reasons)
        checks.append(check)
    return checks
